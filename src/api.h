/* api.h - what the public entry points (src/) share: the device check at
 * the top of every call, the kernel registry, profiles. Nothing below the
 * API layer includes this.
 */
#ifndef RUDA_SRC_API_H
#define RUDA_SRC_API_H

#include <stdatomic.h>

#include "base/backend.h"
#include "base/error.h"
#include "ruda/ruda.h"
#include "scheduler/device.h"

/* Shared check at the top of every public call. */
#define RUDA__CHECK_DEV(dev, fn)                                                  \
  do {                                                                            \
    if ((dev) == NULL) return ruda__fail(RUDA_EINVAL, "%s: device is NULL", fn);  \
    if (atomic_load_explicit(&(dev)->closed, memory_order_relaxed))               \
      return ruda__fail(RUDA_ECLOSED, "%s: device is closed", fn);                \
  } while (0)

/* Kernel registry (kernels.c): name -> kernel, lock-free lookups. */
typedef struct ruda__kernel_table ruda__kernel_table;
ruda__kernel_table *ruda__kernels_new(void); /* NULL without memory */
void ruda__kernels_destroy(ruda_device *dev);
ruda__kernel *ruda__kernel_find(ruda_device *dev, const char *name);
/* Adds or replaces a kernel; takes ownership of k. */
int ruda__kernel_add(ruda_device *dev, ruda__kernel *k);

/* Frees a stream's open profiles (profile.c), at close; arg unused. */
void ruda__profiles_free(ruda__stream *s, void *arg);

#endif /* RUDA_SRC_API_H */

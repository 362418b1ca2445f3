/* api.h - what the public entry points (src/) share beyond the device
 * (src/device.h, with the check at the top of every call): the kernel
 * registry, profiles. Nothing below the API layer includes this.
 */
#ifndef RUDA_SRC_API_H
#define RUDA_SRC_API_H

#include "base/backend.h"
#include "ruda/ruda.h"
#include "src/device.h"

/* Kernel registry (kernels.c): name -> kernel, lock-free lookups. */
typedef struct ruda__kernel_table ruda__kernel_table;
ruda__kernel_table *ruda__kernels_new(void); /* NULL without memory */
void ruda__kernels_destroy(ruda_device *dev);
ruda__kernel *ruda__kernel_find(ruda_device *dev, const char *name);
/* The kernel a ruda_kernel_ref names now, and its name; NULL when the
 * reference is not one of dev's. */
ruda__kernel *ruda__kernel_of_ref(ruda_device *dev, const ruda_kernel_ref *ref, const char **name);
/* Adds or replaces a kernel; takes ownership of k. */
int ruda__kernel_add(ruda_device *dev, ruda__kernel *k);

/* Frees a stream's open profiles (profile.c), at close; arg unused. */
void ruda__profiles_free(ruda__stream *s, void *arg);

#endif /* RUDA_SRC_API_H */

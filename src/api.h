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

/* Calls in progress (see RUDA__CHECK_DEV). A call counts itself in its
 * thread's slot, then reads `closed`; ruda_device_close sets `closed`, then
 * waits for every slot to read zero. Both sides use sequentially consistent
 * operations, so a call either sees the device closed or is waited for:
 * nothing a call accepted is dropped by a close that races it. */
extern _Thread_local unsigned ruda__call_slot_id; /* 0: not assigned yet */
unsigned ruda__call_slot_assign(void);

static inline _Atomic unsigned long *ruda__call_enter(ruda_device *dev) {
  unsigned id = ruda__call_slot_id;
  if (id == 0) id = ruda__call_slot_assign();
  _Atomic unsigned long *n = &dev->calls[(id - 1) % RUDA__CALL_SLOTS].n;
  atomic_fetch_add_explicit(n, 1, memory_order_seq_cst);
  return n;
}

static inline void ruda__call_leave(_Atomic unsigned long **n) {
  if (*n != NULL) atomic_fetch_sub_explicit(*n, 1, memory_order_release);
}

/* A call that entered its slot and found dev closing: leaves the slot
 * (*slot becomes NULL) and fails with RUDA_ECLOSED naming fn, touching
 * nothing of dev after the leave: close frees the device as soon as no
 * slot is held (src/device.c). */
int ruda__call_closed(ruda_device *dev, _Atomic unsigned long **slot, const char *fn);

/* Test points: a unit test linking ruda_internal may define this function
 * to hold a thread at a named point (tests/unit/closed.c). Nothing else
 * defines it: libruda.so resolves it to a null address (weak, hidden), so
 * each point costs a test of that address, and only on cold paths. */
enum {
  RUDA__HOOK_CALL_CLOSED,  /* a call counted in its slot found dev closing */
  RUDA__HOOK_CLOSE_WAITED, /* close waited for the calls in progress */
  RUDA__HOOK_CLOSE_WAITING, /* close waits for a call counted in its slot */
  RUDA__HOOK_CLOSE_FREE,   /* close is about to free the device */
};
void ruda__test_hook(int point, ruda_device *dev) __attribute__((weak, visibility("hidden")));
static inline void ruda__test_point(int point, ruda_device *dev) {
  if (ruda__test_hook != NULL) ruda__test_hook(point, dev);
}

/* Shared check at the top of every public call that takes a device: a
 * statement list, not a block, because the call stays counted until the
 * function returns (the variable's cleanup, a GCC and Clang extension). */
#define RUDA__CHECK_DEV(dev, fn)                                               \
  if ((dev) == NULL) return ruda__fail(RUDA_EINVAL, "%s: device is NULL", fn); \
  RUDA__IN_CALL(dev);                                                          \
  if (ruda__closing(dev)) return ruda__call_closed(dev, &ruda__in_call, fn)

/* Counts the enclosing function as a call in progress on dev until it
 * returns; then ruda__closing(dev) says whether close has begun. */
#define RUDA__IN_CALL(dev) \
  _Atomic unsigned long *ruda__in_call __attribute__((cleanup(ruda__call_leave), unused)) = ruda__call_enter(dev)
static inline int ruda__closing(ruda_device *dev) {
  return atomic_load_explicit(&dev->closed, memory_order_seq_cst);
}

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

/* device.h - struct ruda_device, assembled from each layer's root object.
 *
 * The device is what every public call starts from, and only the API
 * layer (src/) sees it: the scheduler is handed its ruda__sched (sched,
 * scheduler/sched.h), memory its ruda__memory (memory/memory.h) and the
 * handle table, the backend an environment at open (base/backend.h).
 * src/device.c fills the parts and hands each what it uses of the
 * others. Here too: the call slots every public call counts itself in,
 * so that close waits for the calls in progress (RUDA__CHECK_DEV). Fields
 * are written once at open unless marked.
 */
#ifndef RUDA_SRC_DEVICE_H
#define RUDA_SRC_DEVICE_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/backend.h"
#include "base/error.h"
#include "memory/handles.h"
#include "memory/memory.h"
#include "ruda/ruda.h"
#include "scheduler/sched.h"
#include "scheduler/scheduler.h"

struct ruda__kernel_table; /* the kernel registry (src/kernels.c) */

struct ruda_device {
  /* First, so that handing the scheduler its root costs nothing. It
   * owns the device's serial, config and backend (scheduler/sched.h). */
  ruda__sched sched;
  ruda__limits limits;
  char fallback[320]; /* why auto chose host over cuda ("" when it did not) */
  _Atomic int closed;
  ruda__call_slot *calls; /* RUDA__CALL_SLOTS, cache-line aligned (scheduler/grace.h) */
  _Atomic unsigned call_phase; /* which counter of its slot a call counts in */
  ruda__handles handles;
  ruda__memory memory; /* pools, arena, fences (memory/memory.h) */
  struct ruda__kernel_table *kernels;
  /* Live communicators this device is a rank of (src/comm.c): close is
   * refused while any is. */
  _Atomic uint32_t comms;
};

/* Calls in progress (see RUDA__CHECK_DEV). A call counts itself in its
 * thread's slot, then reads `closed`; ruda_device_close sets `closed`, then
 * waits for every slot to read zero (both its counters). Both sides use sequentially consistent
 * operations, so a call either sees the device closed or is waited for:
 * nothing a call accepted is dropped by a close that races it. */
extern _Thread_local unsigned ruda__call_slot_id; /* 0: not assigned yet */
unsigned ruda__call_slot_assign(void);

static inline _Atomic unsigned long *ruda__call_enter(ruda_device *dev) {
  unsigned id = ruda__call_slot_id;
  if (id == 0) id = ruda__call_slot_assign();
  /* The phase only steers new calls away from the counter a grace period
   * waits on (scheduler/grace.c); a stale one is safe. */
  const unsigned ph = atomic_load_explicit(&dev->call_phase, memory_order_relaxed) & 1;
  _Atomic unsigned long *n = &dev->calls[(id - 1) % RUDA__CALL_SLOTS].n[ph];
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

#endif /* RUDA_SRC_DEVICE_H */

/* device.h - struct ruda_device, assembled from each layer's root object.
 *
 * The device is what every public call starts from, and only the API
 * layer (src/) sees it: the scheduler is handed its ruda__sched (sched,
 * scheduler/sched.h), memory its ruda__memory (memory/memory.h) and the
 * handle table, the backend an environment at open (base/backend.h).
 * src/device.c fills the parts and hands each what it uses of the
 * others. Fields are written once at open unless marked.
 */
#ifndef RUDA_SRC_DEVICE_H
#define RUDA_SRC_DEVICE_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/backend.h"
#include "memory/handles.h"
#include "memory/memory.h"
#include "ruda/ruda.h"
#include "scheduler/sched.h"
#include "scheduler/scheduler.h"

struct ruda__kernel_table; /* the kernel registry (src/kernels.c) */

/* Public calls in progress on a device, counted in one of RUDA__CALL_SLOTS
 * slots per calling thread (a cache line each, so threads do not share
 * one): ruda_device_close waits until every slot reads zero (src/api.h). */
#define RUDA__CALL_SLOTS 64
typedef struct ruda__call_slot {
  _Atomic unsigned long n;
  char pad[RUDA__CACHELINE - sizeof(unsigned long)];
} ruda__call_slot;

struct ruda_device {
  /* First, so that handing the scheduler its root costs nothing. */
  ruda__sched sched;
  uint64_t serial; /* distinguishes devices in thread-local caches */
  ruda_config cfg;
  const ruda__backend_ops *ops;
  void *bstate;
  ruda__limits limits;
  char fallback[320]; /* why auto chose host over cuda ("" when it did not) */
  _Atomic int closed;
  ruda__call_slot *calls; /* RUDA__CALL_SLOTS, cache-line aligned */
  ruda__handles handles;
  ruda__memory memory; /* pools, arena, fences (memory/memory.h) */
  struct ruda__kernel_table *kernels;
  /* Live communicators this device is a rank of (src/comm.c): close is
   * refused while any is. */
  _Atomic uint32_t comms;
};

#endif /* RUDA_SRC_DEVICE_H */

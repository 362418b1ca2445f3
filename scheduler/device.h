/* device.h - the device: one backend, its workers and streams, its memory.
 *
 * struct ruda_device is the root every public call starts from. It lives
 * in the scheduler layer because the scheduler is what it mostly is
 * (workers, streams, ordering, graphs); memory sits below and is handed
 * what it needs (memory/pool.h: ruda__memory), the backend below that is
 * handed an environment at open (base/backend.h), and the API layer above
 * (src/) builds on it. Fields are written once at open unless marked.
 */
#ifndef RUDA_SCHEDULER_DEVICE_H
#define RUDA_SCHEDULER_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "base/backend.h"
#include "base/error.h"
#include "memory/handles.h"
#include "memory/pool.h"
#include "ruda/ruda.h"
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
  uint64_t serial; /* distinguishes devices in thread-local caches */
  ruda_config cfg;
  const ruda__backend_ops *ops;
  void *bstate;
  ruda__limits limits;
  char fallback[320]; /* why auto chose host over cuda ("" when it did not) */
  _Atomic int closed;
  ruda__call_slot *calls; /* RUDA__CALL_SLOTS, cache-line aligned */
  /* Tracing (scheduler/trace.h): per-worker buffers and the open file,
   * or NULL; set and cleared under trace_lock. `tracing` tells clients to
   * stamp their commands' submit time. */
  struct ruda__trace **traces;
  FILE *trace_file;
  char *trace_path;
  uint64_t trace_start_ns;
  pthread_mutex_t trace_lock;
  _Atomic int tracing;
  _Atomic int faulted; /* sticky device error: every stream reports it */
  ruda_error *fault;   /* the error that faulted it (set once) */
  ruda__worker *workers;
  uint32_t nworkers;
  ruda__stream_table streams;
  ruda__handles handles;
  ruda__memory memory; /* pools and arena (memory/pool.h) */
  /* Per worker: the private stream carrying memory's fences
   * (scheduler/fence.c). */
  ruda__stream **fence_streams;
  struct ruda__kernel_table *kernels;
  /* Cross-stream ordering (scheduler/order.c): MARKs pushed, requests
   * that shared an existing MARK, WAITs pushed. For tests and reports. */
  struct {
    _Atomic uint64_t marks, shared, waits;
  } order;
  /* Live communicators this device is a rank of (src/comm.c): close is
   * refused while any is. */
  _Atomic uint32_t comms;
  /* Futures handed to the caller (ruda_read, ruda_sync_async,
   * ruda_graph_replay_async) and not freed yet: close refuses while any
   * is held, since freeing one needs the device. */
  _Atomic uint64_t held_futures;
  /* Graphs not destroyed yet (scheduler/graph.c), freed at close. */
  pthread_mutex_t graph_lock;
  struct ruda_graph *graphs;
};

/* Marks the device faulted by err (first one wins; err is consumed). Any
 * thread. */
void ruda__device_fault(ruda_device *dev, ruda_error *err);

/* The stream's pools (memory/pool.h), made at first use. NULL without host
 * memory. */
static inline ruda__pools *ruda__stream_pools(ruda_device *dev, ruda__stream *s) {
  ruda__pools *p = atomic_load_explicit(&s->pools, memory_order_acquire);
  return p != NULL ? p : ruda__pools_of(&dev->memory, &s->pools, s->worker->index, s->id);
}

/* Memory's view of worker progress (base/progress.h), served by fences on
 * private streams (scheduler/fence.c). init after the workers started,
 * before ruda__memory_init; destroy after ruda__memory_destroy. */
int ruda__fences_init(ruda_device *dev);
void ruda__fences_destroy(ruda_device *dev);

#endif /* RUDA_SCHEDULER_DEVICE_H */

/* sched.h - the scheduler's root object: struct ruda__sched, one per
 * device, embedded in struct ruda_device (src/device.h) the way memory's
 * ruda__memory is. It holds what the scheduler owns (workers, the stream
 * table, cross-stream ordering, graphs, tracing, the device fault) and the
 * device's state every command reads: its serial, configuration and
 * backend, which the other layers read from here (memory and the handle
 * table through a pointer to `backend`). It is handed pointers to
 * memory's handle table and root. The scheduler never sees struct
 * ruda_device. Fields are written once at open unless marked.
 */
#ifndef RUDA_SCHEDULER_SCHED_H
#define RUDA_SCHEDULER_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "base/backend.h"
#include "base/error.h"
#include "memory/handles.h"
#include "memory/memory.h"
#include "memory/pool.h"
#include "ruda/ruda.h"
#include "scheduler/scheduler.h"

typedef struct ruda__sched {
  uint64_t serial; /* distinguishes devices in thread-local caches */
  /* The device's public handle, opaque here: handed to library calls
   * (ruda_call_ctx.dev, scheduler/libcall.c) so their code can issue. */
  ruda_device *handle;
  ruda_config cfg; /* the device's, as open checked it (the one copy) */
  /* The device's backend (the one copy): memory and the handle table
   * point here. */
  ruda__backend backend;
  const _Atomic int *closed; /* the device's: 1 once ruda_device_close began */
  ruda__handles *handles;    /* memory's (memory/handles.h) */
  ruda__memory *memory;      /* memory's root (memory/memory.h) */
  ruda__worker *workers;
  uint32_t nworkers;
  /* Every worker's device streams (scheduler.h, ruda__lane): nlanes per
   * worker, lanes_total in all, worker w's at [w * nlanes]. */
  ruda__lane *lanes;
  uint32_t nlanes, lanes_total;
  /* How many of each worker's lanes a stream id first used now is spread
   * over (ruda__lane_of): nlanes, or with cfg.lanes left at 0, 1 until a
   * library is registered (scheduler/libcall.c), then nlanes. A stream
   * keeps the lane it was made on. */
  _Atomic uint32_t lanes_spread;
  int lanes_auto;
  ruda__stream_table streams;
  /* Per lane: the private stream carrying memory's fences
   * (scheduler/progress.c). */
  ruda__stream **fence_streams;
  /* Tracing (scheduler/trace.h): per-worker buffers and the open file,
   * or NULL; set and cleared under trace_lock. `tracing` tells clients to
   * stamp their commands' submit time. */
  struct ruda__trace **traces;
  FILE *trace_file;
  char *trace_path;
  uint64_t trace_start_ns;
  pthread_mutex_t trace_lock;
  _Atomic int tracing;
  /* The backend's in_place_pays: streams left at RUDA__IN_PLACE_AUTO run
   * request loops' commands in place (scheduler/submit.h). */
  int auto_in_place;
  _Atomic int faulted; /* sticky device error: every stream reports it */
  ruda_error *fault;   /* the error that faulted it (set once) */
  /* Cross-stream ordering (scheduler/order.c): MARKs pushed, requests
   * that shared an existing MARK, WAITs pushed. For tests and reports. */
  struct {
    _Atomic uint64_t marks, shared, waits;
  } order;
  /* Futures handed to the caller (ruda_read, ruda_sync_async,
   * ruda_graph_replay_async) and not freed yet (scheduler/future.c):
   * close completes them, and they outlive the device. */
  struct ruda__future_home *futures;
  /* Libraries registered for ruda_call and each worker's state of them
   * (scheduler/libcall.c): made at the first registration, freed after
   * the workers stopped. */
  _Atomic(struct ruda__libraries *) libs;
  /* Graphs not destroyed yet (scheduler/graph.c), freed at close. */
  pthread_mutex_t graph_lock;
  struct ruda_graph *graphs;
  /* The graph builder (scheduler/builder.h), made at its first template
   * under builder_lock; auto_built counts the graphs it made. */
  pthread_mutex_t builder_lock;
  struct ruda__builder *builder;
  _Atomic uint64_t auto_built;
} ruda__sched;

/* Marks the device faulted by err (first one wins; err is consumed), so
 * every stream's flush and sync reports it (scheduler/stream.c).
 * Thread-safe, non-blocking. */
void ruda__sched_fault(ruda__sched *sch, ruda_error *err);

/* The stream's pools (memory/pool.h), made at first use. NULL without host
 * memory. Thread-safe. */
static inline ruda__pools *ruda__stream_pools(ruda__sched *sch, ruda__stream *s) {
  ruda__pools *p = atomic_load_explicit(&s->pools, memory_order_acquire);
  return p != NULL ? p : ruda__pools_of(sch->memory, &s->pools, s->lane->index, s->id);
}

/* The lane stream id `id` is served by: worker id % nworkers, and of its
 * first lanes_spread lanes the next digit, so consecutive ids (a thread
 * each) get a device stream each until every lane is taken. The top bit
 * (thread streams) is left out. */
static inline ruda__lane *ruda__lane_of(ruda__sched *sch, ruda_stream_id id) {
  const uint64_t n = id & ~(1ull << 63);
  const uint32_t w = (uint32_t)(n % sch->nworkers);
  const uint32_t spread = atomic_load_explicit(&sch->lanes_spread, memory_order_relaxed);
  return &sch->lanes[(size_t)w * sch->nlanes + (uint32_t)((n / sch->nworkers) % spread)];
}

/* RUDA_LAUNCH_BLOCKING: waits until the device ran what lane l was given,
 * so a failure is reported on the command that caused it (a command's,
 * scheduler/worker.c; a replayed graph's, scheduler/graph.c). On l's
 * worker thread, or a client holding its exec; blocks. */
static inline int ruda__wait_device(ruda__lane *l, ruda_error **err) {
  const ruda__backend_ops *ops = l->worker->sch->backend.ops;
  void *state = l->worker->sch->backend.state;
  ruda__completion c = {0};
  int rc = ops->record(l->wstate, &c, err);
  if (rc == 0 && c.event != NULL) {
    rc = ops->event_wait(state, c.event, err);
    if (ops->event_release != NULL) ops->event_release(state, c.event);
  }
  return rc;
}

/* Memory's view of worker progress (base/progress.h), served by fences on
 * private streams (scheduler/progress.c). init after the workers started,
 * before ruda__memory_init; destroy after ruda__memory_destroy. Not
 * thread-safe; block. */
int ruda__progress_init(ruda__sched *sch);
void ruda__progress_destroy(ruda__sched *sch);

#endif /* RUDA_SCHEDULER_SCHED_H */

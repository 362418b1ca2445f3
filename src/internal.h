/* internal.h - the device object and what the modules share. */
#ifndef RUDA_INTERNAL_H
#define RUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "../memory/handles.h"
#include "../memory/pool.h"
#include "../scheduler/capture.h"
#include "../scheduler/order.h"
#include "../scheduler/scheduler.h"
#include "backend.h"
#include "error_internal.h"
#include "ruda/ruda.h"

/* Kernel registry: name -> kernel, lock-free reads (see kernels.c). */
typedef struct ruda__kernel_table {
  struct ruda__kernel_slots *_Atomic current;
  struct ruda__kernel_slots *retired;
  pthread_mutex_t lock;
} ruda__kernel_table;

struct ruda_device {
  uint64_t serial; /* distinguishes devices in thread-local caches */
  ruda_config cfg;
  const ruda__backend_ops *ops;
  void *bstate;
  ruda__limits limits;
  _Atomic int closed;
  _Atomic int faulted; /* sticky device error: every stream reports it */
  ruda_error *fault;   /* the error that faulted it (set once) */
  ruda__worker *workers;
  uint32_t nworkers;
  ruda__stream_table streams;
  ruda__handles handles;
  ruda__memory memory; /* pools and arena (memory/pool.h) */
  ruda__kernel_table kernels;
  /* Cross-stream ordering (scheduler/order.c): MARKs pushed, requests
   * that shared an existing MARK, WAITs pushed. For tests and reports. */
  struct {
    _Atomic uint64_t marks, shared, waits;
  } order;
  /* Graphs not destroyed yet (scheduler/capture.c), freed at close. */
  pthread_mutex_t graph_lock;
  struct ruda_graph *graphs;
};

/* Logging to stderr, filtered by the device's level. */
void ruda__log(const ruda_device *dev, ruda_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void ruda__kernels_init(ruda__kernel_table *t);
void ruda__kernels_destroy(ruda_device *dev);
ruda__kernel *ruda__kernel_find(ruda_device *dev, const char *name);
/* Adds or replaces a kernel; takes ownership of k. */
int ruda__kernel_add(ruda_device *dev, ruda__kernel *k);

/* Pins b's buffer for a command of stream s and checks the range: *addr is
 * the device address of the binding's first byte, *len its size; o notes
 * the ordering the command needs. what/index name the binding in errors
 * ("argument 3"); hold marks the buffer kept by a graph (capture.h). */
int ruda__pin_binding(ruda_device *dev, ruda__stream *s, ruda_binding b, const char *fn, const char *what,
                      int index, uint64_t *addr, uint64_t *len, ruda__order *o, int hold);

/* Pushes cmd on s's worker after the other streams' work o says it must
 * follow, and records its buffer uses (the launch path's own, for other
 * parts of the library). */
int ruda__submit(ruda_device *dev, ruda__stream *s, ruda__cmd *cmd, ruda__order *o);

/* Pushes a control command (flush, sync, profile stamp) of kind on s,
 * outside the queue bound, with a new future in *out; drains: waiting on
 * it hands back the stream's errors. */
int ruda__push_control(ruda_device *dev, ruda__stream *s, int kind, int drains, const char *fn,
                       ruda_future **out);

/* Marks the device faulted by err (first one wins; err is consumed). */
void ruda__device_fault(ruda_device *dev, ruda_error *err);

/* Shared check at the top of every public call. */
#define RUDA__CHECK_DEV(dev, fn)                                                  \
  do {                                                                            \
    if ((dev) == NULL) return ruda__fail(RUDA_EINVAL, "%s: device is NULL", fn);  \
    if (atomic_load_explicit(&(dev)->closed, memory_order_relaxed))               \
      return ruda__fail(RUDA_ECLOSED, "%s: device is closed", fn);                \
  } while (0)

#endif /* RUDA_INTERNAL_H */

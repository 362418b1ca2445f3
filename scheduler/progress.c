/* fence.c - how memory learns that a worker's work passed a point
 * (base/progress.h), with fences: internal sync commands on a private
 * stream of each worker, one future each, polled and never waited on.
 * Any thread, workers included: a worker whose unpin retires a buffer
 * issues fences on other workers' queues (unbounded pushes, no waiting).
 */
#include <stdlib.h>

#include "scheduler/device.h"
#include "scheduler/scheduler.h"

static void *fence_issue(void *ctx, uint32_t w) {
  ruda_device *dev = ctx;
  ruda__stream *s = dev->fence_streams[w];
  ruda__cmd *cmd = ruda__cmd_alloc(0);
  struct ruda_future *fut = cmd ? ruda__future_new(dev, s, 0) : NULL;
  if (fut == NULL) {
    if (cmd) ruda__cmd_free(cmd);
    return NULL;
  }
  cmd->kind = RUDA__CMD_SYNC;
  cmd->future = fut;
  cmd->stream = s;
  cmd->seq = 0;
  ruda__queue_push_unbounded(s->worker, cmd);
  return fut;
}

static int fence_reached(void *ctx, void *fence) {
  (void)ctx;
  struct ruda_future *f = fence;
  return atomic_load_explicit(&f->state, memory_order_acquire) == RUDA__FUT_SUBMITTED;
}

static int fence_done(void *ctx, void *fence) {
  (void)ctx;
  return ruda_future_poll(fence) == 1;
}

static void fence_free(void *ctx, void *fence) {
  (void)ctx;
  ruda_future_free(fence);
}

/* On a backend without events (the host), work is complete once its
 * worker ran it, so a worker seen asleep with an empty queue and nobody
 * running a command in its place (inline.c) has passed everything pushed
 * before: no fence is needed. The epoch is read on both sides of those
 * checks, so a batch taken in between shows. */
static int idle(void *ctx, uint32_t w) {
  ruda_device *dev = ctx;
  if (dev->ops->event_query != NULL) return 0;
  ruda__worker *wk = &dev->workers[w];
  uint32_t e = atomic_load_explicit(&wk->idle_epoch, memory_order_seq_cst);
  if (!(e & 1) || !cds_wfcq_empty(&wk->head, &wk->tail) ||
      atomic_load_explicit(&wk->exec, memory_order_seq_cst) != 0)
    return 0;
  return atomic_load_explicit(&wk->idle_epoch, memory_order_seq_cst) == e;
}

static uint32_t ticket(void *ctx, uint32_t w) {
  ruda_device *dev = ctx;
  return ruda__queue_ticket(&dev->workers[w]);
}

static int closing(void *ctx) {
  ruda_device *dev = ctx;
  return atomic_load_explicit(&dev->closed, memory_order_acquire);
}

static const ruda__progress_ops fence_ops = {
    .fence_issue = fence_issue,
    .fence_reached = fence_reached,
    .fence_done = fence_done,
    .fence_free = fence_free,
    .idle = idle,
    .ticket = ticket,
    .closing = closing,
};

int ruda__fences_init(ruda_device *dev) {
  dev->memory.progress.ops = &fence_ops;
  dev->memory.progress.ctx = dev;
  dev->fence_streams = calloc(dev->nworkers, sizeof *dev->fence_streams);
  if (dev->fence_streams == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  for (uint32_t w = 0; w < dev->nworkers; w++) {
    dev->fence_streams[w] = ruda__stream_private(UINT64_MAX - 1 - w, &dev->workers[w]);
    if (dev->fence_streams[w] == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  }
  return 0;
}

void ruda__fences_destroy(ruda_device *dev) {
  for (uint32_t w = 0; dev->fence_streams != NULL && w < dev->nworkers; w++)
    ruda__stream_private_free(dev, dev->fence_streams[w], "memory fence");
  free(dev->fence_streams);
  dev->fence_streams = NULL;
}

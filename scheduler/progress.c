/* progress.c - how memory learns that a worker's work passed a point
 * (base/progress.h), with fences: internal sync commands on a private
 * stream of each lane, one future each, polled and never waited on.
 * Memory's "worker" w is a lane (scheduler.h): what one device stream
 * ran, in order.
 * Any thread, workers included: a worker whose unpin retires a buffer
 * issues fences on other workers' queues (unbounded pushes, no waiting).
 */
#include <stdlib.h>

#include "scheduler/sched.h"
#include "scheduler/scheduler.h"

static void *fence_issue(void *ctx, uint32_t w) {
  struct ruda__sched *sch = ctx;
  ruda__stream *s = sch->fence_streams[w];
  ruda__cmd *cmd = ruda__cmd_alloc(0);
  struct ruda_future *fut = cmd ? ruda__future_new(sch, s, 0) : NULL;
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
 * worker ran it, so a worker seen asleep with an empty queue, nobody
 * running a command in its place and no command held for a wait point
 * (inline.c) has passed everything pushed before: no fence is needed. The epoch is read on both sides of those
 * checks, so a batch taken in between shows. */
static int idle(void *ctx, uint32_t w) {
  struct ruda__sched *sch = ctx;
  if (sch->backend.ops->event_query != NULL) return 0;
  ruda__worker *wk = sch->lanes[w].worker;
  uint32_t e = atomic_load_explicit(&wk->idle_epoch, memory_order_seq_cst);
  if (!(e & 1) || !cds_wfcq_empty(&wk->head, &wk->tail) ||
      atomic_load_explicit(&wk->exec, memory_order_seq_cst) != 0 ||
      atomic_load_explicit(&wk->nheld, memory_order_seq_cst) != 0) /* claimed, not yet run (inline.c) */
    return 0;
  return atomic_load_explicit(&wk->idle_epoch, memory_order_seq_cst) == e;
}

static uint32_t ticket(void *ctx, uint32_t w) {
  struct ruda__sched *sch = ctx;
  return ruda__queue_ticket(sch->lanes[w].worker);
}

static int closing(void *ctx) {
  struct ruda__sched *sch = ctx;
  return atomic_load_explicit(sch->closed, memory_order_acquire);
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

int ruda__progress_init(struct ruda__sched *sch) {
  sch->memory->progress.ops = &fence_ops;
  sch->memory->progress.ctx = sch;
  sch->fence_streams = calloc(sch->lanes_total, sizeof *sch->fence_streams);
  if (sch->fence_streams == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  for (uint32_t w = 0; w < sch->lanes_total; w++) {
    sch->fence_streams[w] = ruda__stream_private(UINT64_MAX - 1 - w, &sch->lanes[w]);
    if (sch->fence_streams[w] == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  }
  return 0;
}

void ruda__progress_destroy(struct ruda__sched *sch) {
  for (uint32_t w = 0; sch->fence_streams != NULL && w < sch->lanes_total; w++)
    ruda__stream_private_free(sch, sch->fence_streams[w], "memory fence");
  free(sch->fence_streams);
  sch->fence_streams = NULL;
}

/* queue.c - the multi-producer command queue of one worker.
 *
 * liburcu's wfcqueue gives a wait-free enqueue (one atomic exchange) and a
 * consumer that takes the whole queue in one splice. The queue itself is
 * unbounded, so the bound lives in a depth counter: a push that would pass
 * queue_bound either sleeps on the worker's `space` event count or fails
 * with RUDA_EQUEUEFULL, as the device's backpressure policy says. Nothing
 * is ever dropped.
 *
 * Every enqueue also counts itself in the worker's tickets (commands
 * pushed ever, scheduler/order.h) just before it links the command.
 */
#include <stdlib.h>

#include "scheduler/sched.h"
#include "scheduler/order.h"
#include "base/sync.h"

static inline __attribute__((always_inline)) void push(ruda__worker *w, ruda__cmd *cmd) {
  RUDA__TSAN_RELEASE(&cmd->node);
  /* Before the exchange that links it (a full barrier): whoever reads the
   * count after a later push's exchange sees this one counted. */
  atomic_fetch_add_explicit(&w->tickets, 1, memory_order_relaxed);
  /* cds_wfcq_enqueue returns false when the queue was empty: only then can
   * the worker be asleep (or about to be), so only then is it woken. A
   * worker re-checks the queue after reading the event count and before
   * sleeping, so this wake-up cannot be lost. */
  if (!cds_wfcq_enqueue(&w->head, &w->tail, &cmd->node)) ck_ec32_inc(&w->wake, &ruda__ec_mp);
}

void ruda__queue_push_unbounded(ruda__worker *w, ruda__cmd *cmd) {
  atomic_fetch_add_explicit(&w->depth, 1, memory_order_relaxed);
  push(w, cmd);
}

int ruda__queue_admit_as(ruda__worker *w, ruda_stream_id stream, int nowait) {
  const ruda_config *cfg = &w->sch->cfg;
  for (;;) {
    uint32_t d = atomic_fetch_add_explicit(&w->depth, 1, memory_order_relaxed);
    if (d < cfg->queue_bound) return 0;
    atomic_fetch_sub_explicit(&w->depth, 1, memory_order_relaxed);
    if (cfg->backpressure == RUDA_BACKPRESSURE_ERROR || nowait)
      return ruda__fail(RUDA_EQUEUEFULL, "%s: queue of worker %u holds %u commands (bound %u)",
                        RUDA__SNAME(stream), w->index, d, cfg->queue_bound);
    /* Sleep until the worker retires a batch. Reading the count before
     * re-checking depth closes the window where the worker drains between
     * our check and our sleep. */
    uint32_t seen = ck_ec32_value(&w->space);
    if (ruda__queue_depth(w) < cfg->queue_bound) continue;
    ck_ec32_wait(&w->space, &ruda__ec_mp, seen, NULL);
  }
}

int ruda__queue_admit(ruda__worker *w, ruda_stream_id stream) { return ruda__queue_admit_as(w, stream, 0); }

void ruda__queue_unadmit(ruda__worker *w) {
  atomic_fetch_sub_explicit(&w->depth, 1, memory_order_relaxed);
  ck_ec32_inc(&w->space, &ruda__ec_mp);
}

void ruda__queue_push_admitted(ruda__worker *w, ruda__cmd *cmd) { push(w, cmd); }

int ruda__queue_push(ruda__worker *w, ruda__cmd *cmd) {
  int rc = ruda__queue_admit_as(w, cmd->stream->id, cmd->nowait);
  if (rc == 0) push(w, cmd);
  return rc;
}

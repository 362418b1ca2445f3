/* inline.c - a client running its own command in place of its worker.
 *
 * A client that waits for a command right after issuing it (ruda_graph_run;
 * any command on a stream set with ruda_stream_set_in_place) gains nothing
 * from handing it to the worker thread and waiting for the hand-back, and
 * pays for it: two threads touch the driver's state for one request. So
 * when the stream's worker has nothing queued and is not running anything,
 * the client takes the worker's exec word and runs the command itself, on
 * the worker's state, exactly as the worker would. The
 * command still takes the worker's next ticket, so tickets and `done` keep
 * counting the same commands in the same order (scheduler/order.h) and
 * cross-stream ordering cannot tell the difference. Anything queued or
 * running (a WAIT for another worker included), a push racing with ours,
 * or observed workers (RUDA_TRACE, NVTX, RUDA_WORKER_STATS, which are kept on
 * the worker thread) send the command the usual way.
 *
 * The claim (exec and the ticket) and the run are two steps: a command
 * with buffers claims its place while it holds their issue locks, exactly
 * where a push would be, publishes its ordering record and releases the
 * locks (a graph replay also its graph's issue lock), and only then runs.
 * The claimed ticket is the command's place in the worker's order: a
 * later command on this worker queues behind it (exec is held), one on
 * another worker orders after it through a MARK, which the worker reaches
 * after we let go. So the user code a command runs (a host kernel) may
 * issue commands on the buffers its own command uses, or replay its own
 * graph, as it may on the worker thread: no lock of ruda's is held.
 *
 * Thread-safe; never blocks on the device (the backend's calls return once
 * the work is submitted). The caller pays the driver calls the worker
 * would have made.
 */
#include "scheduler/sched.h"
#include "scheduler/graph.h"

#define PROGRESS_EVERY 16u

int ruda__inline_claim(ruda__worker *w, const ruda__cmd *cmd, ruda__exec_guard *guard) {
  struct ruda__sched *sch = w->sch;
  /* Anyone running on the worker (the worker, or another client in place:
   * streams sharing a worker share its device stream) means the command
   * queues behind them; waiting for a turn instead spun clients against
   * each other under load. */
  if (w->observed || sch->cfg.launch_blocking || !cds_wfcq_empty(&w->head, &w->tail) ||
      ruda__exec_try(w, RUDA__EXEC_CLIENT) != 0)
    return 0;
  *guard = (ruda__exec_guard){0};
  /* Holding exec: nothing runs on the worker, so `done` is stable; equal
   * to the tickets, nothing pushed is left to run (a push counts its
   * ticket before it links the command, and one racing with us fails the
   * compare-and-swap below). */
  uint64_t t = atomic_load_explicit(&w->tickets, memory_order_seq_cst);
  if (w->trace != NULL || atomic_load_explicit(&w->done, memory_order_relaxed) != t ||
      (sch->backend.ops->exec_enter != NULL && sch->backend.ops->exec_enter(sch->backend.state, guard) != 0)) {
    ruda__exec_release(w);
    return 0;
  }
  /* Take the next ticket unless a push took it first (that command is
   * then ahead of ours, so ours goes behind it through the queue). */
  if (!atomic_compare_exchange_strong_explicit(&w->tickets, &t, t + 1, memory_order_seq_cst,
                                               memory_order_relaxed)) {
    if (sch->backend.ops->exec_leave != NULL) sch->backend.ops->exec_leave(sch->backend.state, guard);
    ruda__exec_release(w);
    return 0;
  }
  return 1;
}

void ruda__inline_finish(ruda__worker *w, ruda__cmd *cmd, ruda__exec_guard *guard) {
  struct ruda__sched *sch = w->sch;
  ruda__execute(w, cmd); /* reports a failure on the stream, completes the future */
  ruda__cmd_free(cmd);
  /* What commands left retiring (write staging whose copy ran) goes back
   * when a wait sees a later event complete, at the worker's next batch,
   * or here every PROGRESS_EVERY commands run in place (each poll is a
   * driver query per pending event). The worker is not woken for it: it
   * would take exec from the next command issued in place. */
  if (++w->in_place_runs % PROGRESS_EVERY == 0 && sch->backend.ops->progress != NULL) sch->backend.ops->progress(w->wstate, 0);
  if (sch->backend.ops->exec_leave != NULL) sch->backend.ops->exec_leave(sch->backend.state, guard);
  ruda__queue_unadmit(w); /* the place the caller's admission took */
  ruda__exec_release(w);
}

int ruda__inline_run(ruda__worker *w, ruda__cmd *cmd) {
  ruda__exec_guard guard;
  if (!ruda__inline_claim(w, cmd, &guard)) return 0;
  ruda__inline_finish(w, cmd, &guard);
  return 1;
}

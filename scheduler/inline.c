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
 * A request issued in place is held for its wait point when automatic
 * graphs are on (cfg.auto_graphs): a launch, copy or contiguous write is
 * claimed as above, but parked in the worker's `held` list instead of
 * issued, and its stream's read issues the whole run with itself as one
 * automatic graph (auto_graph.h), on the calling thread (a sync or flush,
 * which always go to the worker, has the worker do the same): one driver
 * launch for the request's upload and kernels, as the worker's batches
 * already got. Whoever takes exec next (the worker thread for a queued
 * command, another stream's client) issues a held run first, since its
 * tickets come first; the worker thread, told by `holding`, also issues
 * one its stream left held for 100-200 us (a launch not followed by a
 * wait), and such a stream is not held again for a while
 * (ruda__held_flush). Nothing is held on a stream of another shape than a
 * request's: only the eligible commands of one stream, at most
 * RUDA__AUTO_MAX, starting at a request's start (not right after a
 * launch or copy of the stream), and none while that stream's last runs
 * missed. On cuda
 * (hold_with_peers) a run is begun only while another worker issued in
 * the last 200 us: one thread alone starts its kernels sooner by
 * launching them as they come.
 *
 * Thread-safe; never blocks on the device (the backend's calls return once
 * the work is submitted). The caller pays the driver calls the worker
 * would have made.
 */
#include "scheduler/sched.h"
#include "scheduler/auto_graph.h"
#include "scheduler/graph.h"
#include "base/sync.h"

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
  /* Holding exec: nothing runs on the worker, so `done` is stable; with
   * the held commands, equal to the tickets, nothing pushed is left to
   * run (a push counts its ticket before it links the command, and one
   * racing with us fails the compare-and-swap below). */
  uint64_t t = atomic_load_explicit(&w->tickets, memory_order_seq_cst);
  if (w->trace != NULL ||
      atomic_load_explicit(&w->done, memory_order_relaxed) + atomic_load_explicit(&w->nheld, memory_order_relaxed) !=
          t ||
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
  if (sch->backend.ops->hold_with_peers) atomic_store_explicit(&w->issue_ns, ruda__now_ns(), memory_order_relaxed);
  return 1;
}

/* Other workers issued within this long: the driver is shared (see the
 * top), so a request's launches are held to go as one graph. */
#define PEERS_NS (200u * 1000u)

/* Whether a worker other than w took its exec to issue within PEERS_NS. */
static int peers_issuing(const ruda__worker *w) {
  const struct ruda__sched *sch = w->sch;
  const uint64_t now = ruda__now_ns();
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    const ruda__worker *o = &sch->workers[i];
    if (o != w && now - atomic_load_explicit(&o->issue_ns, memory_order_relaxed) < PEERS_NS) return 1;
  }
  return 0;
}

/* Holding exec: parks cmd in w's held run when it may wait for its
 * stream's wait point (see the top); 1 when held. */
static int hold(ruda__worker *w, ruda__cmd *cmd) {
  const uint32_t n = atomic_load_explicit(&w->nheld, memory_order_relaxed);
  if (!w->sch->cfg.auto_graphs || !ruda__auto_eligible(cmd) || n == RUDA__AUTO_MAX ||
      (n > 0 && w->held[0]->stream != cmd->stream))
    return 0;
  if (n == 0 && cmd->stream->hold_miss != 0) { /* a run of it missed: issued at once for a while */
    cmd->stream->hold_miss--;
    return 0;
  }
  if (n == 0 && cmd->stream->mid_request) return 0; /* not a request's start */
  if (n == 0 && w->sch->backend.ops->hold_with_peers && !peers_issuing(w)) return 0;
  if (n == 0) w->held_run++;
  w->held[n] = cmd;
  atomic_store_explicit(&w->nheld, n + 1, memory_order_relaxed);
  return 1;
}

void ruda__inline_finish(ruda__worker *w, ruda__cmd *cmd, ruda__exec_guard *guard) {
  struct ruda__sched *sch = w->sch;
  if (hold(w, cmd)) {
    /* Its admission stays taken until the run is issued. */
    if (sch->backend.ops->exec_leave != NULL) sch->backend.ops->exec_leave(sch->backend.state, guard);
    ruda__exec_release(w);
    /* The worker thread watches held runs (sleeping with a deadline)
     * once told; it stops after a quiet spell, under exec, so a hold
     * after that sees 0 here. */
    if (!atomic_load_explicit(&w->holding, memory_order_seq_cst)) {
      atomic_store_explicit(&w->holding, 1, memory_order_seq_cst);
      ck_ec32_inc(&w->wake, &ruda__ec_mp);
    }
    return;
  }
  /* A held run goes first (its tickets do); with cmd when cmd is its
   * stream's wait point. */
  if (atomic_load_explicit(&w->nheld, memory_order_relaxed) > 0) ruda__held_flush(w, cmd);
  void *ws = cmd->stream->lane->wstate;
  ruda__execute(w, cmd); /* reports a failure on the stream, completes the future */
  ruda__cmd_free(cmd);
  /* What commands left retiring (write staging whose copy ran) goes back
   * when a wait sees a later event complete, at the worker's next batch,
   * or here every PROGRESS_EVERY commands run in place (each poll is a
   * driver query per pending event). The worker is not woken for it: it
   * would take exec from the next command issued in place. */
  if (++w->in_place_runs % PROGRESS_EVERY == 0 && sch->backend.ops->progress != NULL) sch->backend.ops->progress(ws, 0);
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

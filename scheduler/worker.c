/* worker.c - one thread per worker stream: pop batches, run them on the
 * backend, queue failures on their stream, complete futures. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>

#include "scheduler/sched.h"
#include "base/env.h"
#include "base/log.h"
#include "scheduler/auto_graph.h"
#include "scheduler/graph.h"
#include "scheduler/libcall.h"
#include "scheduler/nvtx.h"
#include "scheduler/order.h"
#include "scheduler/trace.h"
#include "base/sync.h"

static const char *cmd_name(int kind) {
  switch (kind) {
    case RUDA__CMD_WRITE: return "write";
    case RUDA__CMD_READ: return "read";
    case RUDA__CMD_COPY: return "copy";
    case RUDA__CMD_LAUNCH: return "launch";
    case RUDA__CMD_FENCE: return "flush";
    case RUDA__CMD_SYNC: return "sync";
    case RUDA__CMD_MARK: return "mark";
    case RUDA__CMD_WAIT: return "order";
    case RUDA__CMD_GRAPH: return "graph_replay";
    case RUDA__CMD_STAMP: return "profile";
    case RUDA__CMD_COLL: return "collective";
    case RUDA__CMD_CALL: return "call";
    case RUDA__CMD_TRACE: return "trace";
    default: return "stop";
  }
}

/* Gives a backend error the command's context: which call, which stream,
 * which command number. */
static void report(ruda__worker *w, ruda__cmd *cmd, int code, ruda_error *err) {
  ruda__stream *s = cmd->stream;
  if (err == NULL) err = ruda__error_new(code, 0, "%s failed", cmd_name(cmd->kind));
  if (err != NULL) {
    char ctx[RUDA__MSG_MAX];
    const char *what = cmd->kind == RUDA__CMD_LAUNCH ? cmd->u.launch.kernel->name
                       : cmd->kind == RUDA__CMD_CALL ? cmd->u.call.name
                                                     : "";
    /* A replay is named by the call that issued it (ruda_graph_run_with...). */
    const int replay = cmd->kind == RUDA__CMD_GRAPH;
    snprintf(ctx, sizeof ctx, "%s%s%s%.64s%s (%s, command #%llu): %.380s", replay ? "" : "ruda_",
             replay ? cmd->u.graph.call : cmd_name(cmd->kind),
             *what ? " \"" : "", what, *what ? "\"" : "", RUDA__SNAME(s->id),
             (unsigned long long)cmd->seq, err->msg);
    memcpy(err->msg, ctx, sizeof err->msg);
    err->stream = s->id;
    if (cmd->origin != NULL) { /* blocking mode: where the client enqueued it */
      memcpy(err->frames, cmd->origin->frames, sizeof cmd->origin->frames);
      err->nframes = cmd->origin->nframes;
    }
  }
  ruda__log(w->sch->cfg.log_level, RUDA_LOG_DEBUG, "worker %u: %s", w->index, err ? err->msg : "error lost");
  ruda__stream_push_error(s, err);
}

static int finish(ruda__worker *w, ruda__cmd *cmd, int rc, ruda_error *err);

/* The lane of cmd's stream, whose backend state (ws) its work goes to.
 * Not for close's FENCE and STOP (no stream, nothing issued) nor a MARK
 * (its stream is the waiting one, another worker's, maybe gone: it runs
 * on the lane it marks). */
#define LANE(cmd) ((cmd)->stream->lane)
#define WS(cmd) (LANE(cmd)->wstate)

int ruda__execute(ruda__worker *w, ruda__cmd *cmd) {
  struct ruda__sched *sch = w->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  ruda_error *err = NULL;
  int rc = 0;
  switch (cmd->kind) {
    case RUDA__CMD_WRITE:
      rc = ops->write(WS(cmd), cmd->u.write.dst, &cmd->u.write.layout, cmd->u.write.staged, &err);
      break;
    case RUDA__CMD_READ:
      rc = ops->read(WS(cmd), cmd->u.read.dst, cmd->u.read.src, &cmd->u.read.layout,
                     &cmd->future->completion, &err);
      break;
    case RUDA__CMD_COPY:
      rc = ops->copy(WS(cmd), cmd->u.copy.dst, cmd->u.copy.src, cmd->u.copy.size, &err);
      break;
    case RUDA__CMD_LAUNCH:
      if (!(cmd->u.launch.flags & RUDA_LAUNCH_DRY_RUN))
        rc = ops->launch(WS(cmd), &cmd->u.launch, &err);
      break;
    case RUDA__CMD_SYNC:
      rc = ops->record(WS(cmd), &cmd->future->completion, &err);
      break;
    case RUDA__CMD_MARK:
      ruda__order_mark(sch, cmd->u.mark.dep); /* on the lane it marks */
      break;
    case RUDA__CMD_WAIT:
      rc = ruda__order_wait(LANE(cmd), cmd->u.wait.deps, cmd->u.wait.n, &err);
      break;
    case RUDA__CMD_GRAPH:
      rc = ruda__graph_execute(cmd, &err);
      /* ruda_graph_replay_async: the future completes after the replay. */
      if (rc == 0 && cmd->future != NULL) rc = ops->record(WS(cmd), &cmd->future->completion, &err);
      if (cmd->u.graph.ran != NULL) cmd->u.graph.ran(cmd->u.graph.ran_arg, LANE(cmd)->index);
      /* The replay's reference; the error report below names no graph. */
      ruda__graph_unref(cmd->u.graph.g, WS(cmd));
      break;
    case RUDA__CMD_STAMP:
      if (ops->stamp != NULL) rc = ops->stamp(WS(cmd), &cmd->future->completion, &err);
      cmd->future->stamp_ns = ruda__now_ns();
      break;
    case RUDA__CMD_COLL:
      rc = ops->collective(WS(cmd), cmd->u.coll.rank_handle, &cmd->u.coll, &err);
      break;
    case RUDA__CMD_CALL:
      rc = ruda__libcall_run(LANE(cmd), cmd, 0, &err);
      break;
    case RUDA__CMD_TRACE:
      w->trace = cmd->u.trace.t;
      break;
    case RUDA__CMD_FENCE:
    case RUDA__CMD_STOP:
      break;
  }
  return finish(w, cmd, rc, err);
}

/* What follows a command's issue: RUDA_LAUNCH_BLOCKING's wait, the error
 * report, its pins, `done`, its future. Returns rc (or the wait's code). */
static int finish(ruda__worker *w, ruda__cmd *cmd, int rc, ruda_error *err) {
  struct ruda__sched *sch = w->sch;
  if (__builtin_expect(sch->cfg.launch_blocking, 0) && rc == 0 && cmd->kind != RUDA__CMD_MARK &&
      cmd->kind != RUDA__CMD_WAIT && cmd->kind != RUDA__CMD_STOP && cmd->kind != RUDA__CMD_FENCE &&
      cmd->kind != RUDA__CMD_TRACE)
    rc = ruda__wait_device(LANE(cmd), &err);
  if (rc != 0) report(w, cmd, rc, err);
  for (uint32_t i = 0; i < cmd->npins; i++) /* commands with pins have streams, never a MARK */
    ruda__handles_unpin(sch->handles, ruda__pin_slot(cmd->pins[i]), WS(cmd));
  /* A write's staging retires on its lane once its copy ran: progress
   * looks there (a dropped future's event marks its lane itself). */
  if (cmd->kind == RUDA__CMD_WRITE) ruda__lane_dirty(LANE(cmd));
  /* Before `done` moves: once it did, an exited thread's stream may go.
   * Not for a MARK: it runs on the worker whose work it marks, for a
   * stream of another worker, which may be gone once the MARK published
   * (its WAIT went on). Every other command runs on its stream's worker. */
  if (cmd->kind != RUDA__CMD_MARK && cmd->stream != NULL)
    cmd->stream->mid_request = cmd->kind == RUDA__CMD_LAUNCH || cmd->kind == RUDA__CMD_COPY;
  /* Counted run before its future completes, so a caller back from a
   * sync or read sees this worker past the command (scheduler/order.c). */
  uint64_t pos = atomic_load_explicit(&w->done, memory_order_relaxed) + 1;
  atomic_store_explicit(&w->done, pos, memory_order_release);
  if (cmd->future != NULL) {
    if (rc == 0 && cmd->future->completion.event != NULL) {
      cmd->future->order_lane = LANE(cmd); /* commands with futures have streams */
      cmd->future->order_pos = pos;
    }
    ruda__future_submitted(cmd->future, rc);
    ruda__future_unref(cmd->future);
  }
  return rc;
}

/* cfg.auto_graphs: a run of one stream's launches, copies and writes, issued as
 * one graph where it is known (auto_graph.h), each command then finished
 * as if it had run alone; what the graph did not issue runs one by one. */
/* Returns the first failure of the run (already reported on its stream).
 * RUDA_TRACE records the run as one span. */
static int run_commands(ruda__worker *w, ruda__cmd *const *run, uint32_t n);
static int execute_run(ruda__worker *w, ruda__cmd *const *run, uint32_t n) {
  ruda__trace *t = w->trace;
  if (t != NULL) ruda__trace_begin_run(w, run, n);
  const int rc = run_commands(w, run, n);
  if (t != NULL) ruda__trace_end(w, t, rc);
  return rc;
}

static int run_commands(ruda__worker *w, ruda__cmd *const *run, uint32_t n) {
  int rc = 0;
  ruda_error *err = NULL;
  uint32_t ok = ruda__auto_run(w, run, n, &rc, &err);
  int first = rc;
  const uint32_t issued = ok + (rc != 0); /* the failed one was issued too */
  /* What a write does with its staged block after its copy, the graph's
   * uploads did not: they read the block when the graph runs. */
  void (*const retire_stage)(void *, void *, uint64_t) = w->sch->backend.ops->stage_retire;
  void *ws = run[0]->stream->lane->wstate; /* a run is one stream's */
  for (uint32_t i = 0; i < issued; i++)
    if (run[i]->kind == RUDA__CMD_WRITE) retire_stage(ws, run[i]->u.write.staged, run[i]->u.write.layout.bytes);
  for (uint32_t i = 0; i < ok; i++) finish(w, run[i], 0, NULL);
  if (rc != 0) finish(w, run[ok++], rc, err);
  for (uint32_t i = ok; i < n; i++) {
    const int r = ruda__execute(w, run[i]);
    if (first == 0) first = r;
  }
  return first;
}

#define RETIRE_EVERY 256u

/* Held runs (scheduler/inline.c): a run the worker finds held this long
 * (between one and two of its checks) is issued without its wait point;
 * the worker checks at this interval while runs were held within the
 * last HOLD_WATCH_NS, and sleeps without a deadline otherwise. A stream
 * whose run was issued without its wait point (so, or for another
 * stream's command) has its next HOLD_PENALTY launches and copies issued
 * at once. */
#define HOLD_NS (100u * 1000u)
#define HOLD_WATCH_NS (20ull * 1000u * 1000u)
#define HOLD_PENALTY 64u

/* Gives n executed commands' places back to the bound and wakes blocked
 * producers. The increment is unconditional: a producer that saw the queue
 * full and is about to sleep then finds the count changed (ck_ec only
 * enters the kernel when someone sleeps). */
static void retire(ruda__worker *w, uint32_t *n) {
  if (*n == 0) return;
  atomic_fetch_sub_explicit(&w->depth, *n, memory_order_relaxed);
  *n = 0;
  ck_ec32_inc(&w->space, &ruda__ec_mp);
}

void ruda__held_flush(ruda__worker *w, const ruda__cmd *next) {
  uint32_t n = atomic_load_explicit(&w->nheld, memory_order_relaxed);
  if (n == 0) return;
  ruda__stream *s = w->held[0]->stream;
  const int own_wait = next != NULL && ruda__auto_wait_point(next, s);
  /* Issued for another stream's command or for waiting too long: a miss.
   * Broken by the stream's own next command (a write, a call): a request
   * of another shape, no miss. Noted first: once its commands ran, an
   * exited thread's stream may be retired. */
  if (next == NULL || next->stream != s) s->hold_miss = HOLD_PENALTY;
  if (n >= 2 && own_wait) {
    execute_run(w, w->held, n);
  } else {
    for (uint32_t i = 0; i < n; i++) ruda__execute(w, w->held[i]);
  }
  for (uint32_t i = 0; i < n; i++) ruda__cmd_free(w->held[i]);
  atomic_store_explicit(&w->nheld, 0, memory_order_release);
  retire(w, &n); /* the places their admissions took */
}

/* Worker thread, holding exec with nothing queued: issues a held run
 * that waited past HOLD_NS for its wait point; clears `holding` once no
 * run was held for HOLD_WATCH_NS. */
static void held_check(ruda__worker *w, uint64_t now) {
  if (atomic_load_explicit(&w->nheld, memory_order_relaxed) > 0) {
    w->held_active_ns = now;
    if (w->held_run != w->held_seen_run) {
      w->held_seen_run = w->held_run;
      w->held_seen_ns = now;
    } else if (now - w->held_seen_ns >= HOLD_NS) {
      ruda__held_flush(w, NULL);
    }
  } else if (atomic_load_explicit(&w->holding, memory_order_relaxed) && now - w->held_active_ns >= HOLD_WATCH_NS) {
    /* Under exec: a client holding after this sees 0 and wakes us. */
    atomic_store_explicit(&w->holding, 0, memory_order_seq_cst);
  }
}

static int queue_nonempty(const void *p) {
  ruda__worker *w = (ruda__worker *)p;
  return !cds_wfcq_empty(&w->head, &w->tail);
}

/* CPU time of the calling thread (a system call: RUDA_WORKER_STATS only). */
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ruda__execute with RUDA_TRACE's record, an NVTX range and
 * RUDA_WORKER_STATS' time, each when enabled. */
static void execute_observed(ruda__worker *w, ruda__cmd *cmd, int stats, int nvtx) {
  const uint8_t kind = cmd->kind;
  const uint64_t t0 = stats ? ruda__now_ns() : 0;
  /* Not the TRACE command itself: its future (a stop) hands the buffer to
   * the client the moment it completes, inside ruda__execute. */
  ruda__trace *t = kind == RUDA__CMD_TRACE ? NULL : w->trace;
  if (kind == RUDA__CMD_TRACE) ruda__trace_batch_end(w, w->trace); /* a stop takes the buffer */
  if (t != NULL) ruda__trace_begin(w, cmd);
  if (nvtx) ruda__nvtx_begin(cmd);
  const uint64_t c0 = stats ? thread_cpu_ns() : 0;
  int rc = ruda__execute(w, cmd);
  if (nvtx) ruda__nvtx_end();
  if (t != NULL) ruda__trace_end(w, t, rc);
  if (stats) {
    const uint64_t d = ruda__now_ns() - t0;
    w->stats.ns[kind] += d;
    w->stats.n[kind]++;
    if (d > w->stats.max_ns[kind]) w->stats.max_ns[kind] = d;
    if (d > 1000000) {
      w->stats.slow_n++;
      w->stats.slow_ns += d;
      w->stats.slow_cpu_ns += thread_cpu_ns() - c0;
    }
  }
}

static int worker_stats_on(void) {
  int on = 0;
  return ruda__env_bool("RUDA_WORKER_STATS", &on) > 0 && on;
}

/* The backend's state of w's first n lanes goes, last first. */
static void stop_lanes(ruda__worker *w, uint32_t n) {
  void (*const stop)(void *, void *) = w->sch->backend.ops->worker_stop;
  for (uint32_t k = n; k-- > 0;) {
    if (stop != NULL) stop(w->sch->backend.state, w->lanes[k].wstate);
    w->lanes[k].wstate = NULL;
  }
}

/* The backend's progress on each lane that may have work retiring;
 * non-zero while some still is. Exec holder. */
static int progress_lanes(ruda__worker *w, int idle) {
  int (*const progress)(void *, int) = w->sch->backend.ops->progress;
  if (progress == NULL) return 0;
  int pending = 0;
  for (uint32_t d = atomic_load_explicit(&w->dirty, memory_order_acquire); d != 0; d &= d - 1) {
    const uint32_t k = (uint32_t)__builtin_ctz(d);
    /* Cleared first: a retire added meanwhile sets it again. */
    atomic_fetch_and_explicit(&w->dirty, ~(1u << k), memory_order_acq_rel);
    if (progress(w->lanes[k].wstate, idle)) {
      pending = 1;
      ruda__lane_dirty(&w->lanes[k]);
    }
  }
  return pending;
}

static void *worker_main(void *arg) {
  ruda__worker *w = arg;
  struct ruda__sched *sch = w->sch;
  const int stats = worker_stats_on();
  const int nvtx = ruda__nvtx_on();
  ruda__nvtx_name_worker(w->index);
  const int autog = sch->cfg.auto_graphs && !sch->cfg.launch_blocking && !stats && !nvtx;

  int stop = 0;
  uint64_t idle_since = 0; /* when the worker last ran out of work (0: busy) */
  while (!stop) {
    struct cds_wfcq_head batch_head;
    struct cds_wfcq_tail batch_tail;
    cds_wfcq_init(&batch_head, &batch_tail);
    /* Read the event count first: a push after this point changes it, so
     * the wait below returns at once instead of missing the push. */
    uint32_t seen = ck_ec32_value(&w->wake);
    /* A client may be running its own command in place (inline.c): it
     * holds the worker's state for that one command. Yield the CPU if it
     * takes long (the client was descheduled). */
    for (unsigned spins = 0; ruda__exec_try(w, RUDA__EXEC_WORKER) != 0;)
      if (++spins < 64) ruda__cpu_relax();
      else sched_yield();
    enum cds_wfcq_ret r =
        __cds_wfcq_splice_nonblocking(&batch_head, &batch_tail, &w->head, &w->tail);
    if (r == CDS_WFCQ_RET_SRC_EMPTY) {
      const uint64_t now = ruda__now_ns(), spin = (uint64_t)sch->cfg.spin_us * 1000;
      held_check(w, now); /* before the epoch turns odd: it may run commands */
      atomic_fetch_add_explicit(&w->idle_epoch, 1, memory_order_seq_cst); /* odd: idle */
      if (idle_since == 0) idle_since = now;
      const uint64_t idle_start = idle_since;
      int retiring = progress_lanes(w, 0);
      const int watching = atomic_load_explicit(&w->holding, memory_order_relaxed) != 0;
      ruda__exec_release(w);
      /* Poll before sleeping while work has been coming back within the
       * spin time (a client waiting on a result is about to send the next
       * request): the push then costs the client no wake-up system call,
       * and the command no wake-up latency. A worker left idle longer
       * sleeps at once next time. */
      if (spin != 0 && w->last_idle_ns <= spin && ruda__spin_bounded(queue_nonempty, w, spin)) {
        const uint64_t t = ruda__now_ns();
        w->last_idle_ns = t - idle_start;
        w->stats.poll_ns += t - now;
        atomic_fetch_add_explicit(&w->idle_epoch, 1, memory_order_seq_cst);
        continue;
      }
      /* Before sleeping, all that is retiring is looked at (the backend
       * defers it between batches), unless a client is running a command
       * in place meanwhile. While some is still retiring (write staging
       * held until its copy ran), sleep only briefly so it is returned
       * promptly. */
      if (retiring && ruda__exec_try(w, RUDA__EXEC_WORKER) == 0) {
        retiring = progress_lanes(w, 1);
        ruda__exec_release(w);
      }
      if (retiring || watching) { /* both look again after HOLD_NS */
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += HOLD_NS;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        ck_ec32_wait(&w->wake, &ruda__ec_mp, seen, &dl);
      } else {
        ck_ec32_wait(&w->wake, &ruda__ec_mp, seen, NULL);
      }
      const uint64_t t = ruda__now_ns();
      w->last_idle_ns = t - idle_start; /* the whole idle spell, its looks at held runs included */
      w->stats.sleep_ns += t - now;
      if (t - now > w->stats.max_sleep_ns) w->stats.max_sleep_ns = t - now;
      atomic_fetch_add_explicit(&w->idle_epoch, 1, memory_order_seq_cst);
      continue;
    }
    if (r == CDS_WFCQ_RET_WOULDBLOCK) { /* a producer is mid-push */
      ruda__exec_release(w);
      ruda__cpu_relax();
      continue;
    }
    idle_since = 0;
    if (sch->backend.ops->hold_with_peers) atomic_store_explicit(&w->issue_ns, ruda__now_ns(), memory_order_relaxed);
    /* A run held for its wait point goes first: it took its tickets
     * before anything queued. */
    if (atomic_load_explicit(&w->nheld, memory_order_relaxed) > 0) {
      struct cds_wfcq_node *first = __cds_wfcq_first_blocking(&batch_head, &batch_tail);
      RUDA__TSAN_ACQUIRE(first);
      ruda__held_flush(w, caa_container_of(first, ruda__cmd, node));
    }
    uint32_t unretired = 0;
    struct cds_wfcq_node *node, *next;
    __cds_wfcq_for_each_blocking_safe(&batch_head, &batch_tail, node, next) {
      ruda__cmd *cmd = caa_container_of(node, ruda__cmd, node);
      RUDA__TSAN_ACQUIRE(&cmd->node);
      if (cmd->kind == RUDA__CMD_STOP) stop = 1;
      unretired++;
      /* Leave the bound before completing a future, so a caller returning
       * from flush or sync never finds its queue still counted full; and
       * every RETIRE_EVERY commands, so a producer blocked on a full queue
       * waits for a slice of a long batch, not all of it. */
      if (cmd->future != NULL || unretired >= RETIRE_EVERY) retire(w, &unretired);
      if (__builtin_expect(autog, 0) && next != NULL && ruda__auto_eligible(cmd) && !cmd->stream->mid_request) {
        /* The run this command starts: what follows it in the batch. */
        ruda__cmd *run[RUDA__AUTO_MAX];
        uint32_t n = 0;
        struct cds_wfcq_node *nd;
        run[n++] = cmd;
        for (nd = next; nd != NULL && n < RUDA__AUTO_MAX;
             nd = __cds_wfcq_next_blocking(&batch_head, &batch_tail, nd)) {
          ruda__cmd *c = caa_container_of(nd, ruda__cmd, node);
          RUDA__TSAN_ACQUIRE(&c->node);
          if (!ruda__auto_eligible(c) || c->stream != cmd->stream) break;
          run[n++] = c;
        }
        /* The command after the run is read too: at the length limit the
         * loop stopped before its acquire. */
        if (nd != NULL) RUDA__TSAN_ACQUIRE(nd);
        if (n >= 2 && nd != NULL &&
            ruda__auto_wait_point(caa_container_of(nd, ruda__cmd, node), cmd->stream)) {
          unretired += n - 1;
          execute_run(w, run, n);
          for (uint32_t i = 0; i < n; i++) ruda__cmd_free(run[i]);
          next = nd; /* the loop goes on after the run */
          continue;
        }
      }
      if (__builtin_expect(w->trace == NULL && !stats && !nvtx, 1)) ruda__execute(w, cmd);
      else execute_observed(w, cmd, stats, nvtx);
      ruda__cmd_free(cmd);
    }
    if (w->trace != NULL) ruda__trace_batch_end(w, w->trace);
    progress_lanes(w, 0);
    retire(w, &unretired);
    /* Kept after STOP: no client runs anything in place on a stopped
     * worker's state. */
    if (!stop) ruda__exec_release(w);
  }
  if (stats) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) w->stats.vcsw = ru.ru_nvcsw, w->stats.ivcsw = ru.ru_nivcsw;
  }
  ruda__auto_free(w);
  /* Every command of this worker ran (close's FENCE and STOP came last):
   * the libraries' states go now, on this thread, with the stream alive. */
  ruda__libcall_worker_end(w);
  stop_lanes(w, w->nlanes);
  return NULL;
}

/* Start-up handshake: the backend's state of each lane (a CUDA stream) is
 * made on the worker thread itself, and open() waits for every result. */
typedef struct start_arg {
  ruda__worker *w;
  pthread_mutex_t *lock;
  pthread_cond_t *cond;
  uint32_t *pending;
} start_arg;

static void *worker_boot(void *p) {
  start_arg a = *(start_arg *)p;
  free(p);
  ruda__worker *w = a.w;
  char name[16]; /* named first: the backend's start-up calls are the worker's too */
  snprintf(name, sizeof name, "ruda-w%u", w->index);
  pthread_setname_np(pthread_self(), name);
  const ruda__backend_ops *ops = w->sch->backend.ops;
  w->start_code = 0;
  for (uint32_t k = 0; k < w->nlanes && w->start_code == 0 && ops->worker_start != NULL; k++)
    if ((w->start_code = ops->worker_start(w->sch->backend.state, w->lanes[k].index, &w->lanes[k].wstate)) != 0)
      stop_lanes(w, k);
  pthread_mutex_lock(a.lock);
  (*a.pending)--;
  pthread_cond_broadcast(a.cond);
  pthread_mutex_unlock(a.lock);
  if (w->start_code != 0) return NULL;
  return worker_main(w);
}

static void release_reserve(ruda__worker *w) {
  ruda__cmd_free(w->reserve_fence);
  ruda__cmd_free(w->reserve_stop);
  if (w->reserve_future != NULL) {
    ruda__future_unref(w->reserve_future); /* both references: never queued */
    ruda__future_unref(w->reserve_future);
  }
  w->reserve_fence = w->reserve_stop = NULL;
  w->reserve_future = NULL;
}

void ruda__lanes_init(struct ruda__sched *sch) {
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    ruda__worker *w = &sch->workers[i];
    w->nlanes = sch->nlanes;
    w->lanes = &sch->lanes[(size_t)i * sch->nlanes];
    for (uint32_t k = 0; k < w->nlanes; k++) {
      ruda__lane *l = &w->lanes[k];
      l->worker = w;
      l->wstate = NULL;
      l->index = i * sch->nlanes + k;
      l->k = k;
    }
  }
}

int ruda__workers_start(struct ruda__sched *sch) {
  uint32_t n = sch->nworkers;
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
  uint32_t pending = 0;
  uint32_t started = 0;
  int rc = 0;
  for (uint32_t i = 0; i < n; i++) {
    ruda__worker *w = &sch->workers[i];
    cds_wfcq_init(&w->head, &w->tail);
    ruda__order_worker_init(w);
    ck_ec32_init(&w->wake, 0);
    ck_ec32_init(&w->space, 0);
    w->index = i;
    w->sch = sch;
    atomic_init(&w->dirty, 0);
    for (uint32_t k = 0; k < w->nlanes; k++) { /* order state: after the backend is known */
      ruda__lane *l = &w->lanes[k];
      l->order_id = sch->backend.ops->stream_wait != NULL ? l->index : i * sch->nlanes;
      l->own_bit = sch->lanes_total <= 64 ? UINT64_C(1) << l->order_id : 0;
      ruda__order_lane_init(l);
    }
    atomic_init(&w->exec, 0);
    w->observed = worker_stats_on() || ruda__nvtx_on();
    w->reserve_fence = ruda__cmd_alloc(0);
    w->reserve_stop = ruda__cmd_alloc(0);
    w->reserve_future = ruda__future_new(sch, NULL, 0);
    start_arg *a = malloc(sizeof *a);
    if (a == NULL || w->reserve_fence == NULL || w->reserve_stop == NULL || w->reserve_future == NULL) {
      free(a);
      release_reserve(w);
      rc = ruda__fail(RUDA_ENOMEM, "ruda_device_open: no memory for worker %u", i);
      break;
    }
    *a = (start_arg){w, &lock, &cond, &pending};
    pthread_mutex_lock(&lock);
    pending++;
    pthread_mutex_unlock(&lock);
    if (pthread_create(&w->thread, NULL, worker_boot, a) != 0) {
      free(a);
      release_reserve(w);
      pthread_mutex_lock(&lock);
      pending--;
      pthread_mutex_unlock(&lock);
      rc = ruda__fail(RUDA_ENOMEM, "ruda_device_open: cannot start worker thread %u", i);
      break;
    }
    started++;
  }
  pthread_mutex_lock(&lock);
  while (pending > 0) pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);
  for (uint32_t i = 0; i < started && rc == 0; i++)
    if (sch->workers[i].start_code != 0) rc = sch->workers[i].start_code;
  if (rc != 0) {
    /* Stop the ones that run, join all that started. */
    for (uint32_t i = 0; i < started; i++) {
      ruda__worker *w = &sch->workers[i];
      if (w->start_code == 0) {
        ruda__cmd *stop = w->reserve_stop; /* skipping it would hang the join */
        w->reserve_stop = NULL;
        stop->kind = RUDA__CMD_STOP;
        stop->stream = NULL;
        stop->seq = 0;
        ruda__queue_push_unbounded(w, stop);
      }
      pthread_join(w->thread, NULL);
      release_reserve(w);
    }
    return rc;
  }
  return 0;
}

/* RUDA_WORKER_STATS=1: where each worker's time went, on stderr at close:
 * milliseconds and commands per kind, then polling and asleep. */
static void print_stats(struct ruda__sched *sch) {
  if (!worker_stats_on()) return;
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    ruda__worker *w = &sch->workers[i];
    char line[2048];
    int at = snprintf(line, sizeof line, "ruda: worker %u:", i);
    for (int k = 0; k < RUDA__CMD_NKINDS && at < (int)sizeof line; k++)
      if (w->stats.n[k] != 0)
        at += snprintf(line + at, sizeof line - (size_t)at, " %s %.1f ms/%llu (longest %.2f)", cmd_name(k),
                       w->stats.ns[k] / 1e6, (unsigned long long)w->stats.n[k], w->stats.max_ns[k] / 1e6);
    if (at < (int)sizeof line)
      snprintf(line + at, sizeof line - (size_t)at,
               "; polling %.1f ms, asleep %.1f ms (longest %.2f); %llu commands over 1 ms, %.1f ms, %.1f of it "
               "on the CPU; context switches %ld voluntary, %ld involuntary",
               w->stats.poll_ns / 1e6, w->stats.sleep_ns / 1e6, w->stats.max_sleep_ns / 1e6,
               (unsigned long long)w->stats.slow_n, w->stats.slow_ns / 1e6, w->stats.slow_cpu_ns / 1e6,
               w->stats.vcsw, w->stats.ivcsw);
    fprintf(stderr, "%s\n", line);
  }
}

void ruda__workers_stop(struct ruda__sched *sch) {
  /* First let every worker run everything queued on it. A worker running
   * a command may push onto another worker's queue (scheduler/fence.c:
   * a fence for a buffer retired by its last unpin); had that worker
   * already reached its STOP and exited, the pushed command would never
   * run and its memory would leak. Once every worker passed this FENCE,
   * no client command is left to run, so no worker pushes any more. */
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    ruda__worker *w = &sch->workers[i];
    ruda__cmd *fence = w->reserve_fence;
    fence->kind = RUDA__CMD_FENCE;
    fence->stream = NULL;
    fence->seq = 0;
    fence->future = w->reserve_future;
    w->reserve_fence = NULL;
    ruda__queue_push_unbounded(w, fence);
  }
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    ruda__worker *w = &sch->workers[i];
    ruda_future_wait(w->reserve_future, NULL);
    ruda_future_free(w->reserve_future);
    w->reserve_future = NULL;
  }
  /* Each STOP goes behind everything already queued, so every enqueued
   * command runs (and reports) before its worker exits. */
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    ruda__worker *w = &sch->workers[i];
    ruda__cmd *stop = w->reserve_stop;
    w->reserve_stop = NULL;
    stop->kind = RUDA__CMD_STOP;
    stop->stream = NULL;
    stop->seq = 0;
    ruda__queue_push_unbounded(w, stop);
  }
  for (uint32_t i = 0; i < sch->nworkers; i++) pthread_join(sch->workers[i].thread, NULL);
  ruda__libraries_free(sch);
  print_stats(sch);
  for (uint32_t i = 0; i < sch->lanes_total; i++) ruda__order_lane_fini(sch, &sch->lanes[i]);
}

/* scheduler.h - commands, stream queues, workers, error queues, futures.
 *
 * A command travels: client validates and builds it (api.c), pushes it on
 * its worker's queue (queue.c: wait-free, bounded by a depth counter), the
 * worker (worker.c) pops batches and runs them on the backend, failures go
 * to the stream's error queue (stream.c), futures complete (future.c).
 */
#ifndef RUDA_SCHEDULER_H
#define RUDA_SCHEDULER_H

#include <ck_ec.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <urcu/wfcqueue.h>

#include "base/backend.h"
#include "scheduler/grace.h"
#include "ruda/ruda.h"

typedef struct ruda__worker ruda__worker;
typedef struct ruda__stream ruda__stream;

/* ---- commands ---- */

typedef enum ruda__cmd_kind {
  RUDA__CMD_WRITE,
  RUDA__CMD_READ,
  RUDA__CMD_COPY,
  RUDA__CMD_LAUNCH,
  RUDA__CMD_FENCE, /* flush: complete the future once reached */
  RUDA__CMD_SYNC,  /* record completion of everything before it */
  RUDA__CMD_STOP,  /* worker exits after it (close) */
  RUDA__CMD_MARK,  /* cross-stream ordering: mark this worker's work so far */
  RUDA__CMD_WAIT,  /* cross-stream ordering: order after other workers' marks */
  RUDA__CMD_GRAPH, /* replay a captured graph (scheduler/graph.c) */
  RUDA__CMD_STAMP, /* profiling: mark the time the stream reaches this point */
  RUDA__CMD_COLL,  /* a collective or point-to-point transfer (backend op) */
  RUDA__CMD_CALL,  /* the caller's library function (scheduler/libcall.c) */
  RUDA__CMD_TRACE, /* tracing starts or stops on this worker (scheduler/trace.c) */
  RUDA__CMD_NKINDS
} ruda__cmd_kind;

#define RUDA__MAX_PINS (RUDA_MAX_ARGS + 1)

/* A command's pin: the buffer's slot, with RUDA__PIN_READ when the command
 * only reads the buffer (a graph's replay orders each buffer by how its
 * commands use it). Slots stay below 2^22 (handles.h). */
#define RUDA__PIN_READ (UINT32_C(1) << 31)
static inline uint32_t ruda__pin_slot(uint32_t pin) { return pin & ~RUDA__PIN_READ; }

/* A library call (ruda/call.h), its arrays in the command's trailing
 * bytes. */
typedef struct ruda__libcall_cmd {
  ruda_call_fn fn;
  void *user;
  const uint64_t *addr, *size; /* nbuf each */
  const void *data;            /* data_size bytes, or NULL (RUDA_CALL_DATA_ALIGN-aligned) */
  uint32_t nbuf, data_size;
  ruda_stream_id stream; /* ctx->stream: the id, as a recorded call keeps no stream record */
  uint32_t library;            /* ruda_library_register's id, 0: none */
  char name[RUDA_CALL_NAME_MAX];
} ruda__libcall_cmd;

typedef struct ruda__cmd {
  struct cds_wfcq_node node; /* intrusive: the queue allocates nothing */
  uint8_t kind;
  uint8_t npins;
  uint8_t nowait; /* a full queue refuses it (RUDA_LAUNCH_NOWAIT) instead of waiting */
  ruda__stream *stream;
  uint64_t seq; /* per-stream number, quoted in error messages */
  struct ruda_future *future;
  uint32_t *pins; /* slots pinned by this command, unpinned after it ran */
  /* RUDA_LAUNCH_BLOCKING only: where the client enqueued it. */
  struct ruda__origin *origin;
  uint64_t enq_ns; /* RUDA_TRACE only: when the client submitted it (0: not stamped) */
  union {
    struct {
      uint64_t dst;
      void *staged;
      ruda__layout layout;
    } write;
    struct {
      uint64_t src;
      void *dst;
      ruda__layout layout;
    } read;
    struct {
      uint64_t dst, src, size;
    } copy;
    ruda__launch_cmd launch;
    struct {
      struct ruda__dep *dep;
    } mark;
    struct {
      struct ruda__dep **deps; /* in the command's trailing bytes */
      uint32_t n;
    } wait;
    struct {
      struct ruda_graph *g; /* holds a reference until it ran */
      /* ruda_graph_replay_with: this replay's patches, sorted by command,
       * in the command's trailing bytes (scheduler/graph.h). */
      const struct ruda__graph_fix *fix;
      uint32_t nfix;
      const char *call; /* the public call that replayed it, for reports */
      /* Optional, called with the worker's index once the replay ran (the
       * API layer's hold on the host blocks it uses, src/stage_hold.h). */
      void (*ran)(void *arg, uint32_t worker);
      void *ran_arg;
    } graph;
    ruda__coll coll;
    ruda__libcall_cmd call;
    struct {
      struct ruda__trace *t; /* the worker's buffer from now on, or NULL */
    } trace;
  } u;
} ruda__cmd;

/* The call stack of a client's enqueue, kept with its command in
 * RUDA_LAUNCH_BLOCKING mode so a failure shows where the work came from. */
typedef struct ruda__origin {
  int nframes;
  void *frames[24];
} ruda__origin;

/* Allocates a command with extra trailing bytes (pins, args, scalars). */
ruda__cmd *ruda__cmd_alloc(size_t extra);
void ruda__cmd_free(ruda__cmd *cmd);
/* The trailing bytes of a command. */
static inline unsigned char *ruda__cmd_extra(ruda__cmd *cmd) { return (unsigned char *)(cmd + 1); }

/* ---- futures ---- */

/* A future's state word: PENDING until the worker ran its command, then
 * SUBMITTED; SLEEPING while a waiter sleeps on it (the worker then wakes
 * it; without a sleeper it skips the system call). */
enum { RUDA__FUT_PENDING = 0, RUDA__FUT_SUBMITTED = 1, RUDA__FUT_SLEEPING = 2 };

struct ruda_future {
  _Atomic uint32_t state; /* futex word */
  _Atomic uint32_t refs;  /* client + worker */
  int code;               /* submission result; the waiter's result once finished */
  /* Set by the waiter once it finished the completion. Atomic because
   * ruda_future_poll reads it from another thread; the event stays until
   * the future is freed, so a poll racing with the wait never queries a
   * released event. */
  _Atomic int finished;
  ruda_error *err;
  ruda__completion completion;
  struct ruda__sched *sch;
  ruda__stream *stream;
  int drains_errors;
  /* Handed to the caller (ruda__future_hand_out): listed in the device's
   * home of held futures, which close completes (scheduler/future.c). */
  struct ruda__future_home *home;
  struct ruda_future *hnext, *hprev;
  _Atomic uint32_t detached; /* futex word: close completed it, the device is gone */
  /* Set by the worker when the completion has an event: the event covers
   * its lane's commands up to order_pos, which ordering may take as done
   * once a waiter saw it complete (scheduler/order.c). */
  struct ruda__lane *order_lane;
  uint64_t order_pos;
  /* RUDA__CMD_STAMP: when the worker ran it (CLOCK_MONOTONIC), the time on
   * a backend whose work is done once its worker ran it (host). */
  uint64_t stamp_ns;
};

struct ruda_future *ruda__future_new(struct ruda__sched *sch, ruda__stream *s, int drains);
/* A public call hands f (may be NULL) to its caller: listed until
 * ruda_future_free, so close can complete it. Thread-safe; takes one of
 * the home's stripe locks. */
void ruda__future_hand_out(struct ruda_future *f);
/* Device open: the home of held futures (RUDA_ENOMEM). */
int ruda__futures_open(struct ruda__sched *sch);
/* Device close, after the workers stopped and before the streams and the
 * backend go: marks the home closed (no wait, poll or free of a held
 * future starts on the device after it), waits for those in progress
 * (each has its event and its completion: all work ran), then completes
 * every held future not yet waited with RUDA_ECLOSED, dropping its result,
 * and detaches all of them from the device: they stay valid to wait,
 * poll and free. The home itself goes with the last of them. Blocks only
 * for waits in progress. */
void ruda__futures_close(struct ruda__sched *sch);
/* Worker: the command ran (code 0) or failed; wakes the waiter. */
void ruda__future_submitted(struct ruda_future *f, int code);
void ruda__future_unref(struct ruda_future *f);

/* ---- workers and their queues ---- */

/* Ways of the per-worker cache of marks already waited for (order.c). */
#define RUDA__COVER_WAYS 8u

/* Commands in one automatic graph's run, at most (auto_graph.h), and so
 * commands a worker holds for one (inline.c). */
#define RUDA__AUTO_MAX 16u

/* A worker's fields and who may touch them. "exec holder" is whoever holds
 * `exec` (the worker side of base/backend.h: the worker thread, or a client
 * running one command in place).
 *
 *   field                          written by               read by
 *   tail, depth, tickets           any pusher (atomics)     worker, ordering clients
 *   head                           worker thread (splice)   in-place clients (empty?)
 *   wake / space                   pushers / worker         worker / pushers (event counts)
 *   index, thread, sch, lanes,     open (before the worker  anyone
 *     nlanes, observed, reserve_*   starts)
 *   in_place_runs, held, held_run  exec holder              exec holder
 *   dirty                          exec holder, retirers    exec holder (atomic)
 *   nheld                          exec holder (atomic)     exec holder; scheduler/progress.c
 *   holding                        clients, worker thread   worker thread (atomic)
 *   issue_ns                       exec takers (atomic)     clients in place
 *   done                           exec holder (atomic)     anyone
 *   exec                           compare-and-swap         anyone
 *   last_idle_ns, stats, trace,    worker thread only       worker; stats and traces
 *     idle_epoch (written),                                 after it stopped; idle_epoch
 *     held_seen_*                                           by scheduler/progress.c
 */
struct ruda__worker {
  /* Producer side, on its own cache line. */
  struct cds_wfcq_tail tail __attribute__((aligned(RUDA__CACHELINE)));
  _Atomic uint32_t depth; /* commands queued, for the bound */
  /* Commands pushed ever: the worker's tickets for cross-stream ordering
   * (order.h). Every push counts itself here before its enqueue, so after
   * a push the count is at least the command's position in the queue. On
   * a line of its own that the worker never writes: a producer reads it
   * right after its push, when the worker may have taken the tail's line
   * to splice the queue. */
  _Atomic uint64_t tickets __attribute__((aligned(RUDA__CACHELINE)));
  /* Consumer side. */
  struct cds_wfcq_head head __attribute__((aligned(RUDA__CACHELINE)));
  ck_ec32_t wake;  /* bumped when a push finds the queue empty */
  ck_ec32_t space; /* bumped when the worker drained a batch */
  uint32_t index;
  pthread_t thread;
  /* Its device streams (sch->lanes[index * nlanes ...]), see ruda__lane. */
  struct ruda__lane *lanes;
  uint32_t nlanes;
  /* Lanes whose backend state may have work retiring (bit k: lanes[k]),
   * looked at by progress (ruda__lane_dirty). */
  _Atomic uint32_t dirty;
  int start_code;
  uint64_t last_idle_ns; /* worker only: how long its last idle spell lasted */
  /* Made at start for stopping the worker, so close never needs memory it
   * may not get: the last FENCE, its future, the STOP. */
  ruda__cmd *reserve_fence, *reserve_stop;
  struct ruda_future *reserve_future;
  /* With RUDA_WORKER_STATS=1: time spent running each kind of command and
   * the longest, polling and asleep; commands over a millisecond and the
   * CPU time they took (the rest the thread was off its CPU: blocked in
   * the driver or preempted); context switches (worker only; printed when
   * the device closes). */
  struct {
    uint64_t ns[RUDA__CMD_NKINDS], n[RUDA__CMD_NKINDS], max_ns[RUDA__CMD_NKINDS];
    uint64_t poll_ns, sleep_ns, max_sleep_ns;
    uint64_t slow_n, slow_ns, slow_cpu_ns;
    long vcsw, ivcsw;
  } stats;
  struct ruda__sched *sch;
  struct ruda__trace *trace; /* RUDA_TRACE only (scheduler/trace.h); worker only */
  /* Odd while the worker sleeps with every batch it took run; read by
   * scheduler/progress.c to tell memory, on a backend whose work completes when
   * it runs, that everything pushed earlier is done. */
  _Atomic uint32_t idle_epoch;
  /* Progress, on its own line: the worker stores `done` after each command
   * (commands run, in queue order, the same count as the tickets). Read
   * by clients only when they order a command after this worker's work. */
  _Atomic uint64_t done __attribute__((aligned(RUDA__CACHELINE)));
  /* Who runs this worker's commands now: 0 nobody, RUDA__EXEC_WORKER (for
   * a batch and its progress) or RUDA__EXEC_CLIENT (a client issuing its
   * own command in place, scheduler/inline.c). The holder owns wstate and
   * `done`. */
  _Atomic uint32_t exec;
  uint32_t in_place_runs; /* commands clients ran in place; under exec */
  /* A request issued in place, held for its wait point (inline.c): one
   * stream's launches and copies, claimed (tickets taken, not yet run) and
   * not issued until that stream's read, sync or flush issues them with it
   * as one automatic graph, or anyone else taking exec issues them first
   * (ruda__held_flush). held_run counts the runs begun; `holding` is 1
   * while the worker thread watches for runs held too long (it then sleeps
   * with a deadline). */
  ruda__cmd *held[RUDA__AUTO_MAX];
  _Atomic uint64_t issue_ns; /* when this worker's exec was last taken to issue (peers, inline.c) */
  _Atomic uint32_t nheld;
  uint32_t held_run;
  _Atomic uint32_t holding;
  uint32_t held_seen_run;   /* worker thread: the run it last saw held, */
  uint64_t held_seen_ns;    /* since when, */
  uint64_t held_active_ns;  /* and when a run was last seen held */
  /* cfg.auto_graphs (scheduler/auto_graph.c; the runs each lane recorded
   * are in its autog): how many commands went as part of one, how many
   * templates this worker made and how many noted shapes a new one
   * replaced (a lane's cache holds a few shapes: more that take turns are
   * never replayed). */
  _Atomic uint64_t auto_cmds, auto_templates, auto_replaced;
  /* Set at start: commands are observed (RUDA_WORKER_STATS, NVTX), so they
   * all run on the worker thread, where those are kept. */
  int observed;
} __attribute__((aligned(RUDA__CACHELINE)));

/* ---- lanes ---- */

/* A lane is one device stream of a worker (cuda: a CUstream), with the
 * backend's state for it (wstate, from worker_start). Stream ids served by
 * one worker are spread over its lanes (ruda__lane_of), so their work
 * overlaps on the device as a CUstream per client would, while one thread
 * issues it. A lane is what ordering and memory call a "worker": its
 * device-wide index is the id of buffer use records (order.h) and of
 * memory's fences (memory/fence.h), since only one lane's work is known
 * to run in queue order. Its worker's tickets and `done` count for it.
 *
 *   field                          written by               read by
 *   worker, wstate, index, k,      open                     anyone
 *     order_id, own_bit
 *   autog                          exec holder              exec holder
 *   completed                      any waiter (atomic max)  anyone
 *   covered                        pushers of WAITs         pushers (atomic, lossy)
 *   mark_lock, last_mark           clients, under mark_lock
 */
typedef struct ruda__lane {
  ruda__worker *worker;
  void *wstate;
  uint32_t index; /* worker->index * nlanes + k */
  uint32_t k;     /* which of its worker's lanes */
  /* The lane whose index ordering records for this one (order.h): its
   * own, where each device stream runs apart (cuda); its worker's first,
   * on a backend whose work is done as its worker runs it (host), where
   * the worker's queue alone orders all its lanes. */
  uint32_t order_id;
  /* The order lane's reader bit (order.h), or 0 when more than 64 lanes
   * share the bits: a writer then cannot skip its own bit. */
  uint64_t own_bit;
  /* Of its worker's commands up to here, this lane's are known finished
   * on the device (raised when a waiter sees a sync's or read's event of
   * this lane complete); clients ordering after the lane read it. */
  _Atomic uint64_t completed __attribute__((aligned(RUDA__CACHELINE)));
  /* cfg.auto_graphs: the runs recorded on this lane and their templates
   * (scheduler/auto_graph.c); exec holder. */
  struct ruda__auto *autog;
  /* Cross-stream ordering (order.c), off the hot path. last_mark: the
   * newest mark pushed for this lane, which later requests may share. */
  pthread_mutex_t mark_lock;
  struct ruda__dep *last_mark;
  /* Marks of other lanes that a WAIT already pushed for this lane waits
   * for: (source lane + 1) << 32 | that lane's worker's `done` when the
   * mark was pushed. A direct-mapped cache by source lane. */
  _Atomic uint64_t covered[RUDA__COVER_WAYS];
} __attribute__((aligned(RUDA__CACHELINE))) ruda__lane;

/* Lane l has work its backend state retires (write staging, an event of a
 * dropped future): its worker's progress looks at it. Any thread; one
 * load when already so. */
static inline void ruda__lane_dirty(ruda__lane *l) {
  const uint32_t bit = 1u << l->k;
  if (!(atomic_load_explicit(&l->worker->dirty, memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(&l->worker->dirty, bit, memory_order_release);
}

/* Commands queued on w, for the bound. */
static inline uint32_t ruda__queue_depth(ruda__worker *w) {
  return atomic_load_explicit(&w->depth, memory_order_relaxed);
}

/* w's ticket counter, read after a push (order.h). */
static inline uint32_t ruda__queue_ticket(ruda__worker *w) {
  return (uint32_t)atomic_load_explicit(&w->tickets, memory_order_seq_cst);
}

/* Pushes cmd on w's queue, applying the device's backpressure policy
 * (cmd->nowait: as RUDA_BACKPRESSURE_ERROR). Wait-free unless the queue
 * is full under RUDA_BACKPRESSURE_BLOCK. */
int ruda__queue_push(ruda__worker *w, ruda__cmd *cmd);
/* Pushes without the bound (close, internal markers). */
void ruda__queue_push_unbounded(ruda__worker *w, ruda__cmd *cmd);
/* Takes one place under the bound (per the backpressure policy) for a
 * command pushed later with ruda__queue_push_admitted, or given back with
 * ruda__queue_unadmit. A write split into pieces admits once, so it is
 * either refused whole or queued whole. */
int ruda__queue_admit(ruda__worker *w, ruda_stream_id stream);
/* The same; nowait: a full queue fails with RUDA_EQUEUEFULL as under
 * RUDA_BACKPRESSURE_ERROR (RUDA_LAUNCH_NOWAIT). */
int ruda__queue_admit_as(ruda__worker *w, ruda_stream_id stream, int nowait);
void ruda__queue_push_admitted(ruda__worker *w, ruda__cmd *cmd);
void ruda__queue_unadmit(ruda__worker *w);

/* Device open, before anything names a lane: ties each lane to its
 * worker (sch->lanes, sch->workers allocated and zeroed). Its ordering
 * state is made by ruda__workers_start and goes in ruda__workers_stop. */
void ruda__lanes_init(struct ruda__sched *sch);
int ruda__workers_start(struct ruda__sched *sch);
/* Runs everything queued, stops and joins every worker. */
void ruda__workers_stop(struct ruda__sched *sch);

/* Runs one command on the worker; used by the worker loop. Returns the
 * command's result (already reported on its stream). The caller holds
 * w->exec. */
int ruda__execute(ruda__worker *w, ruda__cmd *cmd);

enum { RUDA__EXEC_WORKER = 1, RUDA__EXEC_CLIENT = 2 };

/* w->exec: try once to take it for who; returns 0 when taken, else the
 * holder. Released by ruda__exec_release. Acquire and release: what one
 * holder did to wstate is seen by the next. */
static inline uint32_t ruda__exec_try(ruda__worker *w, uint32_t who) {
  uint32_t held = atomic_load_explicit(&w->exec, memory_order_relaxed);
  if (held != 0) return held;
  if (atomic_compare_exchange_strong_explicit(&w->exec, &held, who, memory_order_acquire, memory_order_relaxed))
    return 0;
  return held;
}
static inline void ruda__exec_release(ruda__worker *w) { atomic_store_explicit(&w->exec, 0, memory_order_release); }

/* Exec holder: issues the commands held for a wait point (inline.c), in
 * order, before anything after them. next: what the holder runs next
 * (NULL: nothing, the worker found the run held too long); when it is the
 * held stream's wait point the run goes as one automatic graph. Each
 * held command is finished (errors reported), freed and its admission
 * given back. */
void ruda__held_flush(ruda__worker *w, const ruda__cmd *next);

/* Client, its admission for cmd taken: runs cmd on the calling thread
 * when w has nothing queued or running (scheduler/inline.c), so the
 * command skips the hand-over to the worker and back. 1 when it ran (cmd is then freed; its result is
 * in its future and on its stream), 0 when the caller must push it. */
int ruda__inline_run(ruda__worker *w, ruda__cmd *cmd);

/* ruda__inline_run in two steps, for a command holding issue locks
 * (scheduler/order.h): claim takes w's exec word and its next ticket (1,
 * with guard filled; 0: push the command as usual), in place of the push;
 * the caller then publishes, releases its locks and calls finish, which
 * runs cmd (freeing it) and gives w back. Nothing of ruda's is held
 * while cmd's user code runs. */
int ruda__inline_claim(ruda__worker *w, const ruda__cmd *cmd, ruda__exec_guard *guard);
void ruda__inline_finish(ruda__worker *w, ruda__cmd *cmd, ruda__exec_guard *guard);

/* ---- streams ---- */

/* Cache-line aligned, client fields first (allocate with
 * ruda__stream_alloc): streams are small, and malloc packed two into one
 * line, so a launch on one stream could pull the line another stream's
 * thread was writing (seq). */
enum { RUDA__IN_PLACE_OFF = -1, RUDA__IN_PLACE_AUTO = 0, RUDA__IN_PLACE_ON = 1, RUDA__IN_PLACE_RUN = 16 };

struct ruda__stream {
  /* Client side: read or written by every command issued on the stream. */
  ruda_stream_id id;
  ruda__worker *worker;
  struct ruda__lane *lane; /* its device stream, one of worker's lanes */
  _Atomic uint64_t seq;
  struct ruda__pools *_Atomic pools; /* memory/pool.h; made at first use (ruda__stream_pools) */
  /* The staging block of its last ruda_write (src/api.c): only a key for
   * the next one (the backend's stage_alloc), it may be freed. */
  const void *_Atomic last_staged;
  /* Graph capture (scheduler/graph.c). capturing is read by every launch
   * and copy; the recording itself is made at the first begin. */
  _Atomic int capturing;
  _Atomic int graph_prepared;
  /* Who issues this stream's commands while its worker is idle
   * (scheduler/inline.c): RUDA__IN_PLACE_AUTO (0, the default), _ON or
   * _OFF (ruda_stream_set_in_place). Auto runs a command in place while
   * the stream looks like a request loop: no future of it is outstanding
   * and it was waited on within the last RUDA__IN_PLACE_RUN commands. */
  _Atomic int in_place;
  _Atomic uint32_t unwaited;   /* futures on it not yet waited or freed */
  _Atomic uint32_t since_wait; /* commands issued since its last wait */
  struct ruda__capture *_Atomic cap;
  /* Exec holders' side, on a line of its own: written as commands run
   * (by the worker thread when it runs them), so never on the line of
   * the client's seq.
   * hold_miss: set when a run held for its wait point (inline.c) had to
   * be issued without it; while non-zero, each launch or copy issued in
   * place counts it down instead of being held.
   * mid_request: the stream's last command run was a launch or a copy: a
   * run that starts now is the tail of a request a batch split, which
   * automatic graphs leave alone (auto_graph.h). */
  uint32_t hold_miss __attribute__((aligned(RUDA__CACHELINE)));
  uint32_t mid_request;
  /* Error queue: workers push, drains take. */
  pthread_mutex_t err_lock;
  ruda_error *err_head, *err_tail;
  _Atomic uint32_t nerr;
  _Atomic uint64_t lost; /* errors that could not be recorded (no memory) */
  struct ruda__profile *profiles; /* open profiles, owned by src/profile.c, under err_lock */
  /* A thread's own stream (scheduler/stream.c, retired by
   * scheduler/stream_exit.c): its thread's life,
   * the worker's ticket count seen once the thread had exited (+1; 0: not
   * seen yet), and set once it was retired: drained, its pages given
   * back, no longer listed or found by id. */
  struct ruda__thread_life *life;
  uint64_t exit_ticket;
  _Atomic int retired;
  /* Futures on it not freed yet (scheduler/future.c), counted on threads'
   * own streams only: the record outlives them. */
  _Atomic uint32_t holders;
  /* Once retired and out of the table: the reaper's list of records
   * waiting for a grace period, and the one it waits for (under the
   * table's reap_lock). */
  struct ruda__stream *pending_next;
  uint64_t grace;
  /* Each worker's tickets once the grace period passed (a MARK for this
   * stream may be queued on any worker), NULL before. */
  uint64_t *until;
} __attribute__((aligned(RUDA__CACHELINE)));

/* A zeroed stream, cache-line aligned; free() releases it. */
static inline ruda__stream *ruda__stream_alloc(void) {
  ruda__stream *s = aligned_alloc(RUDA__CACHELINE, sizeof(ruda__stream));
  if (s != NULL) memset(s, 0, sizeof *s);
  return s;
}

/* Hash from id to stream with lock-free lookups. A retired thread's
 * stream leaves its slot (a tombstone, reused by later inserts); a table
 * is rebuilt, larger or smaller, when live streams and tombstones fill
 * half of it. Records and tables a lookup may still hold are freed after
 * a grace period (scheduler/grace.h). */
typedef struct ruda__stream_table {
  struct ruda__stream_slots *_Atomic current;
  struct ruda__stream_slots *retired; /* replaced tables, under lock */
  pthread_mutex_t lock; /* inserts, removals, rebuilds */
  _Atomic uint64_t count; /* live streams in current */
  uint64_t tombs;         /* tombstones in current, under lock */
  _Atomic uint64_t records; /* stream records allocated, pending ones included (for tests) */
  pthread_mutex_t reap_lock;         /* one ruda__streams_reap at a time */
  _Atomic uint32_t thread_creations; /* threads' own streams made, to pace reaping */
  /* Grace periods (advanced under reap_lock), and the retired records
   * waiting for theirs. */
  ruda__grace grace;
  struct ruda__stream *pending;
} ruda__stream_table;

void ruda__streams_init(ruda__stream_table *t);
void ruda__streams_destroy(ruda__stream_table *t);
/* Finds or creates the stream for id (RUDA_STREAM_CURRENT resolved). */
ruda__stream *ruda__stream_get(struct ruda__sched *sch, ruda_stream_id id);
size_t ruda__streams_list(ruda__stream_table *t, ruda_stream_id *ids, size_t cap);

/* A private stream on lane l (and its worker), outside the stream table (ruda_stream_ids
 * does not list it): memory fences, collectives. NULL without memory. */
ruda__stream *ruda__stream_private(ruda_stream_id id, struct ruda__lane *l);
/* Frees one; errors nobody drained are logged as "<what> failed: ...". */
void ruda__stream_private_free(struct ruda__sched *sch, ruda__stream *s, const char *what);


/* The stream a public call names, created at first use: RUDA_EINVAL for a
 * reserved id that names no existing stream, RUDA_ENOMEM (both recorded
 * naming fn) in *rc, NULL then. */
ruda__stream *ruda__stream_for(struct ruda__sched *sch, ruda_stream_id id, const char *fn, int *rc);
/* Threads' own streams. A thread's life record: set exited by its
 * thread-exit hook, held by the thread and by each of its streams.
 * life_get (scheduler/stream.c): the calling thread's record with a
 * reference for a new stream (NULL without memory: the stream is then
 * never retired); life_put drops one (inline, so that the table's
 * record free calls nothing above it). Any thread. */
struct ruda__thread_life {
  _Atomic int exited;
  _Atomic uint32_t refs; /* the thread's own, one per stream */
};
struct ruda__thread_life *ruda__thread_life_get(void);
static inline void ruda__thread_life_put(struct ruda__thread_life *life) {
  if (life != NULL && atomic_fetch_sub_explicit(&life->refs, 1, memory_order_acq_rel) == 1) free(life);
}
/* Retires the streams of threads that exited whose work every worker has
 * run and whose errors were drained: gives their pools' pages back and
 * stops listing them. Skips when another reap is running. Any thread;
 * takes pool locks, never waits for the device. */
void ruda__streams_reap(struct ruda__sched *sch);
/* A call naming a retired thread's id that is waiting for its grace
 * period: when a racing call made the record busy (a capture or profile
 * begun, an error), it goes back into the table now and is returned, so
 * an id that accepted a begin accepts its end; else NULL. The caller is
 * counted in its call slot. Any thread; takes reap_lock, never waits for
 * the device. */
ruda__stream *ruda__streams_reclaim(struct ruda__sched *sch, ruda_stream_id id);

/* Close, after the workers stopped: puts the records still waiting for
 * their grace period back into the table, so that close's walks over the
 * streams (errors a racing call left, profiles, captures) see them. */
void ruda__streams_unpend(struct ruda__sched *sch);
/* Takes st out of the table (it must be there): lookups no longer find
 * it, its slot becomes a tombstone. republish puts it back. Any thread;
 * take the table lock. */
void ruda__streams_unpublish(ruda__stream_table *t, ruda__stream *st);
void ruda__streams_republish(ruda__stream_table *t, ruda__stream *st);
/* Frees a stream record no lookup, command or future can still reach. */
void ruda__stream_free(ruda__stream *st);
/* Frees the replaced tables whose grace period passed; 1 when some are
 * left. Under reap_lock. */
int ruda__streams_free_retired(ruda__stream_table *t);
/* The stream of id in the table, or NULL. Lock-free; any thread. */
ruda__stream *ruda__streams_find(ruda__stream_table *t, ruda_stream_id id);
/* Inserts st (its id set) unless the table has a stream of that id:
 * returns that stream, st once inserted, or NULL without memory (st not
 * inserted). Takes the table lock; any thread. */
ruda__stream *ruda__streams_add(ruda__stream_table *t, ruda__stream *st);

/* The current table's slots (for tests and reports). */
uint64_t ruda__streams_capacity(ruda__stream_table *t);

/* Calls fn for every stream. */
void ruda__streams_each(ruda__stream_table *t, void (*fn)(ruda__stream *, void *), void *arg);

/* Queues an error on a stream (worker side); a NULL err counts a loss. */
void ruda__stream_push_error(ruda__stream *s, ruda_error *err);
/* Takes the stream's errors; returns 0 or RUDA_EUNHEALTHY with *out an
 * owned summary (or discards them when out is NULL). */
int ruda__stream_drain(struct ruda__sched *sch, ruda__stream *s, ruda_error **out);

#endif /* RUDA_SCHEDULER_H */

/* order.h - cross-stream ordering of buffer uses (scheduler/order.c).
 *
 * A command that uses a buffer whose last use went to another lane (a
 * device stream, scheduler.h: another worker's, or another of this
 * worker's) must not start on the device before that use is done. Each
 * worker counts the commands pushed to it (its tickets, worker->tickets)
 * and the commands it ran (worker->done); each buffer slot records the
 * lane and ticket of its last use (memory/handles.h). At enqueue:
 *
 *  - last use on the same lane (the common case): nothing to do; the
 *    queue is FIFO and so is the device stream. One load and compare per
 *    buffer, then, after the push, the slot's record moves to the new
 *    ticket.
 *  - last use on lane a at ticket t, and a has already passed t (its
 *    worker ran it, on a backend whose work is done when it runs; or a
 *    sync or read event of a past t was seen complete): nothing to do.
 *  - otherwise the client pushes a MARK for a on a's worker's queue (or
 *    shares one already there that covers t) and a WAIT on its own worker
 *    before the command. a's worker, on reaching the MARK, records a
 *    backend event on a and publishes it; the waiting worker waits for
 *    the publication (worker to worker, a futex; nothing when it is the
 *    same worker, which ran the MARK first) and then makes its lane wait
 *    for the event (cuStreamWaitEvent: asynchronous). The client never
 *    waits.
 *
 * On a backend whose work is done once its worker ran it (host), the
 * worker's queue orders all its lanes: records name the worker's first
 * lane for any of them (ruda__lane.order_id), and only other workers are
 * ordered after.
 *
 * Tickets are 32-bit and compared serially: a comparison can only err
 * towards ordering when a record is over 2^31 commands old.
 *
 * Simultaneous commands: reading a record, pushing and publishing must be
 * one step, or two clients issuing conflicting uses of a buffer at the
 * same moment could each miss the other. Each record therefore carries an
 * issue lock (handles.h, RUDA__USE_LOCK): shared by clients issuing reads,
 * exclusive for a write, held from ruda__order_lock to ruda__order_publish.
 * Reads of one buffer from many threads still proceed together.
 *
 * Which calls may run concurrently: every function here may run on any
 * number of client threads at once; ruda__order_mark/wait run on workers.
 * A client blocks only on the issue lock of a buffer another client is
 * issuing a conflicting command on, and on the short mark_lock of a
 * source lane, taken only when a MARK is needed.
 */
#ifndef RUDA_ORDER_H
#define RUDA_ORDER_H

#include <stdatomic.h>
#include <stdint.h>

#include "memory/handles.h"
#include "scheduler/scheduler.h"

struct ruda__sched;

/* a >= b for 32-bit counters that wrap. */
static inline int ruda__ticket_ge(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

/* A dependency: one MARK on a source worker, shared by every WAIT that
 * needs it. Refcounted: the MARK, each WAIT, and the source worker's
 * last_mark each hold a reference; the last one releases the event. */
typedef struct ruda__dep {
  _Atomic uint32_t state; /* futex word: RUDA__DEP_PENDING / _SLEEPER / _READY */
  _Atomic uint32_t refs;
  uint32_t lane;  /* the source lane (sch->lanes) */
  uint32_t lower; /* its worker's `done` when the MARK was pushed: tickets up to here are covered */
  int code;        /* the MARK's record failed with this code (err: why) */
  ruda_error *err;
  void *event; /* backend event recorded at the MARK; NULL: reaching it is enough */
} ruda__dep;

enum { RUDA__DEP_PENDING = 0, RUDA__DEP_SLEEPER = 1, RUDA__DEP_READY = 2 };

/* How a command uses a buffer. Reads order after the buffer's last write
 * only, so any number of streams read one buffer at once; writes order
 * after the last write and every read since. */
enum { RUDA__USE_READ = 0, RUDA__USE_WRITE = 1 };

/* What one command needs, gathered on the client's stack while it pins
 * its buffers (ruda__order_note), completed under the buffers' issue locks
 * (ruda__order_lock). */
typedef struct ruda__order {
  uint32_t nuse, nwait;
  uint32_t need;   /* non-zero: a WAIT may be needed (nwait, readers or all) */
  uint32_t locked; /* uses whose issue lock is held (the first `locked`) */
  int all;         /* a record could not be trusted: order after every worker */
  /* Writes: reader bits taken off the buffers' records (handles.h,
   * RUDA__USE_READERS), whose lanes this command orders after; `cleared`
   * goes back onto the records if the command is not pushed. */
  uint64_t readers;
  uint32_t ncleared, npend;
  ruda__slot *pend[RUDA__MAX_PINS]; /* pins to settle once queued (handles.h) */
  struct {
    _Atomic uint64_t *readers;
    uint64_t bits;
  } cleared[RUDA__MAX_PINS];
  struct {
    _Atomic uint64_t *last; /* the slot's record */
    uint64_t hi;            /* this use's record without the ticket */
    uint32_t key;           /* lock order: the slot's index */
    uint32_t write; /* RUDA__USE_WRITE or _READ */
  } use[RUDA__MAX_PINS];
  struct {
    uint32_t lane, ticket;
  } wait[RUDA__MAX_PINS];
} ruda__order;

static inline void ruda__order_init(ruda__order *o) {
  o->nuse = o->nwait = o->need = o->locked = 0;
  o->all = 0;
  o->readers = 0;
  o->ncleared = 0;
  o->npend = 0;
}

/* Notes that the command being built for lane l uses a buffer (pinned,
 * generation gen, slot index key) whose use record is at last, to read or
 * write it. Nothing is read yet: the record is consulted under its issue
 * lock. A buffer named twice is one use, a write if either is. */
static inline void ruda__order_note(ruda__order *o, _Atomic uint64_t *last, uint32_t key, uint32_t gen,
                                    const ruda__lane *l, uint32_t write) {
  for (uint32_t i = 0; i < o->nuse; i++)
    if (o->use[i].last == last) {
      o->use[i].write |= write;
      return;
    }
  uint32_t i = o->nuse++;
  o->use[i].last = last;
  o->use[i].hi = ruda__use_pack(l->order_id, gen, 0);
  o->use[i].key = key;
  o->use[i].write = write;
}

/* Client, once the command is admitted on l's worker and before anything
 * is pushed: takes the issue lock of every noted buffer, in key order (so
 * two commands never wait for each other), and reads what the command
 * must follow: the last write on another lane, and for a write every
 * lane that read since. Blocks only while another client issues a
 * conflicting command on one of these buffers (held from its lock to its
 * publish, which push without blocking). Then ruda__order_needed says
 * whether ruda__order_prepare has work. */
void ruda__order_lock(ruda__order *o, const ruda__lane *l);

/* The command was not pushed: the reader bits its writes took go back,
 * the issue locks are released, its pins are settled. Idempotent; a
 * no-op after ruda__order_publish. */
void ruda__order_abandon(ruda__order *o);

static inline int ruda__order_needed(const ruda__order *o) { return o->need != 0; }

/* Client, after ruda__order_lock and before the command is pushed:
 * pushes the MARKs and the WAIT the command needs (none when the source
 * workers are past the tickets). seq: the command's number, quoted if the
 * WAIT fails. RUDA_ENOMEM (via ruda__fail) when a MARK or WAIT cannot be
 * allocated; nothing the caller must undo then but ruda__order_abandon. */
int ruda__order_prepare(struct ruda__sched *sch, ruda__order *o, ruda__stream *s, uint64_t seq);

/* Client, after the command was pushed for lane l (while it still holds
 * its pins and locks): records its writes as the buffers' last use and
 * its reads as l's bit, then releases the issue locks. The ticket read
 * after the push is at least the command's position in the queue. */
void ruda__order_publish(ruda__order *o, ruda__lane *l);

/* Worker side (worker.c). MARK: record on its lane and publish; WAIT:
 * wait for every dependency, then order lane l (the WAIT's stream's)
 * after its event. Returns 0 or a code with *err. */
void ruda__order_mark(struct ruda__sched *sch, ruda__dep *d);
int ruda__order_wait(ruda__lane *l, ruda__dep **deps, uint32_t n, ruda_error **err);

/* A waiter saw an event covering l's commands up to pos complete. */
void ruda__order_completed(ruda__lane *l, uint64_t pos);

/* Lane lifecycle: reset before its worker starts; drop last marks after
 * it stopped. Worker: its counters reset before start. */
void ruda__order_lane_init(ruda__lane *l);
void ruda__order_lane_fini(struct ruda__sched *sch, ruda__lane *l);
void ruda__order_worker_init(ruda__worker *w);

#endif /* RUDA_ORDER_H */

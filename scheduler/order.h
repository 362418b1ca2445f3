/* order.h - cross-stream ordering of buffer uses (scheduler/order.c).
 *
 * A command that uses a buffer whose last use was queued on another worker
 * must not start on the device before that use is done. Each worker counts
 * the commands pushed to it (its tickets, worker->tickets) and the
 * commands it ran (worker->done); each buffer slot records the worker and
 * ticket of its last use (memory/handles.h). At enqueue:
 *
 *  - last use on the same worker (the common case): nothing to do; the
 *    queue is FIFO. One load and compare per buffer, then, after the push,
 *    the slot's record moves to the new ticket.
 *  - last use on worker a at ticket t, and a has already passed t (ran it,
 *    on a backend whose work is done when it runs; or a sync or read event
 *    past t was seen complete): nothing to do either.
 *  - otherwise the client pushes a MARK on a's queue (or shares one
 *    already there that covers t) and a WAIT on its own worker before the
 *    command. Worker a, on reaching the MARK, records a backend event
 *    (cuda) and publishes it; the waiting worker waits for the publication
 *    (worker to worker, a futex) and then makes its device stream wait for
 *    the event (cuStreamWaitEvent: asynchronous). The client never waits.
 *
 * Tickets are 32-bit and compared serially: a comparison can only err
 * towards ordering when a record is over 2^31 commands old.
 *
 * Which calls may run concurrently: every function here may run on any
 * number of client threads at once; ruda__order_mark/wait_execute run on
 * workers. Nothing here blocks a client thread except the short mark_lock
 * of a source worker, taken only when a MARK is needed.
 */
#ifndef RUDA_ORDER_H
#define RUDA_ORDER_H

#include <stdatomic.h>
#include <stdint.h>

#include "memory/handles.h"
#include "scheduler/scheduler.h"

struct ruda_device;

/* a >= b for 32-bit counters that wrap. */
static inline int ruda__ticket_ge(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

/* A dependency: one MARK on a source worker, shared by every WAIT that
 * needs it. Refcounted: the MARK, each WAIT, and the source worker's
 * last_mark each hold a reference; the last one releases the event. */
typedef struct ruda__dep {
  _Atomic uint32_t state; /* futex word: RUDA__DEP_PENDING / _SLEEPER / _READY */
  _Atomic uint32_t refs;
  uint32_t worker; /* the source worker */
  uint32_t lower;  /* its `done` when the MARK was pushed: tickets up to here are covered */
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
 * its buffers. */
typedef struct ruda__order {
  uint32_t nuse, nwait;
  uint32_t need; /* non-zero: a WAIT may be needed (nwait, readers or all) */
  int all;       /* a record could not be trusted: order after every worker */
  /* Writes: reader bits taken off the buffers' records (handles.h,
   * RUDA__USE_READERS), whose workers this command orders after; `cleared`
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
    uint64_t seen;          /* its value when pinned */
    uint64_t hi;            /* this use's record without the ticket */
    uint32_t write;         /* RUDA__USE_WRITE or _READ */
  } use[RUDA__MAX_PINS];
  struct {
    uint32_t worker, ticket;
  } wait[RUDA__MAX_PINS];
} ruda__order;

static inline void ruda__order_init(ruda__order *o) {
  o->nuse = o->nwait = o->need = 0;
  o->all = 0;
  o->readers = 0;
  o->ncleared = 0;
  o->npend = 0;
}

void ruda__order_note_slow(ruda__order *o, uint64_t seen, uint32_t gen, uint32_t worker);
void ruda__order_take_readers(ruda__order *o, _Atomic uint64_t *readers, uint64_t keep);

/* Notes that the command being built for worker w uses a buffer (pinned,
 * generation gen) whose use record is at last, to read or write it. The
 * common cases cost one or two loads: the last write on the same worker,
 * and for a write no reader on another worker. */
static inline void ruda__order_note(ruda__order *o, _Atomic uint64_t *last, uint32_t gen, const ruda__worker *w,
                                    uint32_t write) {
  /* Acquire: a last use seen here was pushed before; a MARK pushed after
   * this load follows it on its worker's queue. */
  uint64_t seen = atomic_load_explicit(last, memory_order_acquire);
  uint64_t hi = ruda__use_pack(w->index, gen, 0);
  uint32_t i = o->nuse++;
  o->use[i].last = last;
  o->use[i].seen = seen;
  o->use[i].hi = hi;
  o->use[i].write = write;
  if (write) {
    _Atomic uint64_t *rd = last + RUDA__USE_READERS;
    uint64_t r = atomic_load_explicit(rd, memory_order_seq_cst);
    if (__builtin_expect((r & ~w->own_bit) != 0, 0)) ruda__order_take_readers(o, rd, w->own_bit);
  }
  if (__builtin_expect((seen >> 32) == (hi >> 32), 1)) return;
  ruda__order_note_slow(o, seen, gen, w->index);
}

/* The command was not pushed: the reader bits its writes took go back,
 * its pins are settled. Idempotent; a no-op after ruda__order_publish. */
void ruda__order_abandon(ruda__order *o);

static inline int ruda__order_needed(const ruda__order *o) { return o->need != 0; }

/* Client, after the command was admitted on s's worker and before it is
 * pushed: pushes the MARKs and the WAIT the command needs (none when the
 * source workers are past the tickets). seq: the command's number, quoted
 * if the WAIT fails. RUDA_ENOMEM (via ruda__fail) when a MARK or WAIT
 * cannot be allocated; nothing the caller must undo then. */
int ruda__order_prepare(struct ruda_device *dev, ruda__order *o, ruda__stream *s, uint64_t seq);

void ruda__order_publish_slow(_Atomic uint64_t *last, uint64_t cur, uint64_t want);

/* Client, after the command was pushed on w (while it still holds its
 * pins): records its writes as the buffers' last, its reads as w's bit.
 * The ticket read after the push is at least the command's position in
 * w's queue. */
static inline void ruda__order_publish(ruda__order *o, ruda__worker *w) {
  if (o->nuse == 0) return; /* nothing noted, nothing pinned */
  uint32_t t = ruda__queue_ticket(w);
  for (uint32_t i = 0; i < o->nuse; i++) {
    if (!o->use[i].write) {
      /* A read: the worker's bit, set once. Seq_cst pairs with a writer's
       * clear (order.c): a read that finds its bit still set was pushed
       * before the clear, so before the writer's MARK on this worker. */
      _Atomic uint64_t *rd = o->use[i].last + RUDA__USE_READERS;
      uint64_t bit = UINT64_C(1) << (w->index & 63);
      if (!(atomic_load_explicit(rd, memory_order_seq_cst) & bit))
        atomic_fetch_or_explicit(rd, bit, memory_order_seq_cst);
      continue;
    }
    uint64_t want = o->use[i].hi | t;
    uint64_t seen = o->use[i].seen;
    /* Release: whoever sees this record sees our push before it. A CAS,
     * not a store, so that a use on another worker published meanwhile
     * is not overwritten unseen. */
    if (!atomic_compare_exchange_strong_explicit(o->use[i].last, &seen, want, memory_order_release,
                                                 memory_order_relaxed))
      ruda__order_publish_slow(o->use[i].last, seen, want);
  }
  /* Queued: the pins stop being pending, the reader bits stay taken. */
  for (uint32_t i = 0; i < o->npend; i++) ruda__handles_settle(o->pend[i]);
  o->npend = 0;
  o->ncleared = 0;
}

/* Worker side (worker.c). MARK: record and publish; WAIT: wait for every
 * dependency, then order the worker's stream after its event. Returns 0
 * or a code with *err. */
void ruda__order_mark(ruda__worker *w, ruda__dep *d);
int ruda__order_wait(ruda__worker *w, ruda__dep **deps, uint32_t n, ruda_error **err);

/* A waiter saw an event covering w's commands up to pos complete. */
void ruda__order_completed(ruda__worker *w, uint64_t pos);

/* Worker lifecycle: reset before start; drop last marks after stop. */
void ruda__order_worker_init(ruda__worker *w);
void ruda__order_worker_fini(struct ruda_device *dev, ruda__worker *w);

#endif /* RUDA_ORDER_H */

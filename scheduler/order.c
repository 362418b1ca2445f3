/* order.c - cross-stream ordering: the slow paths of order.h, MARK and
 * WAIT on the workers.
 *
 * Why a MARK pushed now follows the use it is for: the use's client pushed
 * its command and published the slot's record before releasing the
 * buffer's issue lock; our client read that record under the lock, so the
 * use's enqueue happens before the MARK's, and the queue is FIFO.
 *
 * Why waits cannot form a cycle: a client pushes its MARKs before its WAIT
 * (a shared MARK was pushed before it was shared). A cycle would need each
 * worker blocked at a WAIT queued before the MARK another blocked worker
 * waits for, which orders every one of those pushes before itself.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "scheduler/order.h"
#include "base/sync.h"

/* ---- client: issue locks ---- */

/* Waits for a lock word to allow us in. The holder is another client
 * between its lock and its publish, which do not block: a short spin
 * covers it unless that client was descheduled, then yield the CPU. */
static void lock_backoff(unsigned *spins) {
  if (++*spins < 64) ruda__cpu_relax();
  else sched_yield();
}

static void lock_read(_Atomic uint64_t *lk) {
  unsigned spins = 0;
  for (;;) {
    /* Acquire: a writer that held the lock before published first. */
    if (!(atomic_fetch_add_explicit(lk, 1, memory_order_acquire) & RUDA__USE_LOCK_WRITER)) return;
    atomic_fetch_sub_explicit(lk, 1, memory_order_relaxed);
    while (atomic_load_explicit(lk, memory_order_relaxed) & RUDA__USE_LOCK_WRITER) lock_backoff(&spins);
  }
}

static void lock_write(_Atomic uint64_t *lk) {
  unsigned spins = 0;
  uint64_t v = atomic_load_explicit(lk, memory_order_relaxed);
  for (;;) {
    if (v & RUDA__USE_LOCK_WRITER) {
      lock_backoff(&spins);
      v = atomic_load_explicit(lk, memory_order_relaxed);
    } else if (atomic_compare_exchange_weak_explicit(lk, &v, v | RUDA__USE_LOCK_WRITER, memory_order_acquire,
                                                     memory_order_relaxed)) {
      break;
    }
  }
  /* Claimed: new readers back off. Wait for those issuing now; acquire
   * pairs with their release, so their reader bits are visible. */
  while (atomic_load_explicit(lk, memory_order_acquire) != RUDA__USE_LOCK_WRITER) lock_backoff(&spins);
}

static void unlock(_Atomic uint64_t *lk, uint32_t write) {
  if (write) atomic_fetch_and_explicit(lk, ~RUDA__USE_LOCK_WRITER, memory_order_release);
  else atomic_fetch_sub_explicit(lk, 1, memory_order_release);
}

static void unlock_all(ruda__order *o) {
  for (uint32_t i = o->locked; i-- > 0;) unlock(o->use[i].last + RUDA__USE_LOCK, o->use[i].write);
  o->locked = 0;
}

/* ---- client: gathering what a command needs ---- */

static void want(ruda__order *o, uint32_t lane, uint32_t ticket) {
  for (uint32_t i = 0; i < o->nwait; i++)
    if (o->wait[i].lane == lane) {
      if (!ruda__ticket_ge(o->wait[i].ticket, ticket)) o->wait[i].ticket = ticket;
      return;
    }
  o->wait[o->nwait].lane = lane;
  o->wait[o->nwait].ticket = ticket;
  o->nwait++;
  o->need = 1;
}

/* Takes the reader bits of a buffer this command writes, except keep (the
 * writer's own lane, which its queue and device stream order already). Under the write
 * lock, so every read whose bit is here was pushed: a MARK pushed on its
 * worker now follows it. */
static void take_readers(ruda__order *o, _Atomic uint64_t *readers, uint64_t keep) {
  uint64_t r = atomic_load_explicit(readers, memory_order_relaxed);
  if ((r & ~keep) == 0) return;
  atomic_store_explicit(readers, r & keep, memory_order_relaxed);
  o->readers |= r & ~keep;
  o->need = 1;
  o->cleared[o->ncleared].readers = readers;
  o->cleared[o->ncleared].bits = r & ~keep;
  o->ncleared++;
}

void ruda__order_lock(ruda__order *o, const ruda__lane *l) {
  /* Key order, an insertion sort: commands use few buffers. */
  for (uint32_t i = 1; i < o->nuse; i++)
    for (uint32_t j = i; j > 0 && o->use[j - 1].key > o->use[j].key; j--) {
      __typeof__(o->use[0]) t = o->use[j];
      o->use[j] = o->use[j - 1];
      o->use[j - 1] = t;
    }
  for (uint32_t i = 0; i < o->nuse; i++) {
    _Atomic uint64_t *last = o->use[i].last;
    if (o->use[i].write) lock_write(last + RUDA__USE_LOCK);
    else lock_read(last + RUDA__USE_LOCK);
    o->locked = i + 1;
    uint64_t seen = atomic_load_explicit(last, memory_order_relaxed);
    if (o->use[i].write) take_readers(o, last + RUDA__USE_READERS, l->own_bit);
    if ((seen >> 32) == (o->use[i].hi >> 32)) continue; /* last written on this lane: FIFO */
    if (seen == 0) continue; /* never used: raw memory, nothing queued on it */
    uint32_t w1 = (uint32_t)(seen >> 48);
    if ((((seen ^ o->use[i].hi) >> 32) & 0xffffu) != 0) { /* another generation */
      /* A stale record (written late for an earlier buffer in this
       * slot): order after every lane. */
      o->all = o->need = 1;
      continue;
    }
    want(o, w1 - 1, (uint32_t)seen);
  }
}

void ruda__order_publish(ruda__order *o, ruda__lane *l) {
  if (o->nuse == 0) return; /* nothing noted, nothing pinned */
  uint32_t t = ruda__queue_ticket(l->worker);
  for (uint32_t i = 0; i < o->nuse; i++) {
    _Atomic uint64_t *last = o->use[i].last;
    if (o->use[i].write) {
      /* Ours alone under the write lock; the unlock releases it. */
      atomic_store_explicit(last, o->use[i].hi | t, memory_order_relaxed);
    } else {
      /* A read: the lane's bit, set once; a writer reads it after our
       * unlock. */
      _Atomic uint64_t *rd = last + RUDA__USE_READERS;
      uint64_t bit = UINT64_C(1) << (l->order_id & 63);
      if (!(atomic_load_explicit(rd, memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(rd, bit, memory_order_relaxed);
    }
  }
  unlock_all(o);
  /* Queued: the pins stop being pending, the reader bits stay taken. */
  for (uint32_t i = 0; i < o->npend; i++) ruda__handles_settle(o->pend[i]);
  o->npend = 0;
  o->ncleared = 0;
  o->nuse = 0;
}

void ruda__order_abandon(ruda__order *o) {
  /* Still under the write locks: nobody saw the bits gone. */
  for (uint32_t i = 0; i < o->ncleared; i++)
    atomic_fetch_or_explicit(o->cleared[i].readers, o->cleared[i].bits, memory_order_relaxed);
  o->ncleared = 0;
  unlock_all(o);
  for (uint32_t i = 0; i < o->npend; i++) ruda__handles_settle(o->pend[i]);
  o->npend = 0;
}

/* ---- client: has lane a passed ticket t? ---- */

/* On a backend without device-side waits (host), work a worker ran is
 * done, so its count of commands run decides; otherwise only events seen
 * complete on the lane do. */
static int passed(struct ruda__sched *sch, uint32_t a, uint32_t t) {
  ruda__lane *l = &sch->lanes[a];
  uint64_t x = sch->backend.ops->stream_wait == NULL ? atomic_load_explicit(&l->worker->done, memory_order_acquire)
                                                     : atomic_load_explicit(&l->completed, memory_order_acquire);
  return ruda__ticket_ge((uint32_t)x, t);
}

/* Does a WAIT already pushed for lane b wait for a MARK of a that covers t? */
static int covered(ruda__lane *b, uint32_t a, uint32_t t) {
  uint64_t v = atomic_load_explicit(&b->covered[a % RUDA__COVER_WAYS], memory_order_acquire);
  return (uint32_t)(v >> 32) == a + 1 && ruda__ticket_ge((uint32_t)v, t);
}

static void cover(ruda__lane *b, const ruda__dep *d) {
  /* A plain store: losing a race only forgets some coverage, which costs
   * a MARK later, never an ordering. */
  atomic_store_explicit(&b->covered[d->lane % RUDA__COVER_WAYS], ((uint64_t)(d->lane + 1) << 32) | d->lower,
                        memory_order_release);
}

static void dep_unref(struct ruda__sched *sch, ruda__dep *d) {
  if (atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1) return;
  if (d->event != NULL && sch->backend.ops->event_release != NULL) sch->backend.ops->event_release(sch->backend.state, d->event);
  ruda_error_free(d->err);
  free(d);
}

/* A MARK for lane a that follows the use at ticket t: the newest one
 * there if it was pushed after a's worker had run t, else a new one. s:
 * the stream asking, the MARK's nominal stream. Returns a reference, or
 * NULL. */
static ruda__dep *mark_for(struct ruda__sched *sch, uint32_t a, uint32_t t, ruda__stream *s) {
  ruda__lane *la = &sch->lanes[a];
  ruda__worker *wa = la->worker;
  pthread_mutex_lock(&la->mark_lock);
  ruda__dep *m = la->last_mark;
  if (m != NULL && ruda__ticket_ge(m->lower, t)) {
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&la->mark_lock);
    atomic_fetch_add_explicit(&sch->order.shared, 1, memory_order_relaxed);
    return m;
  }
  ruda__dep *d = calloc(1, sizeof *d);
  ruda__cmd *cmd = d != NULL ? ruda__cmd_alloc(0) : NULL;
  if (cmd == NULL) {
    pthread_mutex_unlock(&la->mark_lock);
    free(d);
    return NULL;
  }
  d->lane = a;
  /* Read before the push: a had run at most this many commands, all of
   * them ahead of the MARK. */
  d->lower = (uint32_t)atomic_load_explicit(&wa->done, memory_order_acquire);
  atomic_init(&d->state, RUDA__DEP_PENDING);
  atomic_init(&d->refs, 3); /* the MARK, the caller, last_mark */
  cmd->kind = RUDA__CMD_MARK;
  cmd->stream = s;
  cmd->seq = 0;
  cmd->u.mark.dep = d;
  ruda__queue_push_unbounded(wa, cmd);
  la->last_mark = d;
  pthread_mutex_unlock(&la->mark_lock);
  if (m != NULL) dep_unref(sch, m);
  atomic_fetch_add_explicit(&sch->order.marks, 1, memory_order_relaxed);
  return d;
}

int ruda__order_prepare(struct ruda__sched *sch, ruda__order *o, ruda__stream *s, uint64_t seq) {
  ruda__lane *b = &sch->lanes[s->lane->order_id]; /* the WAIT's coverage is kept there */
  ruda__dep *stack[RUDA__MAX_PINS];
  ruda__dep **deps = stack;
  uint32_t n = 0, cap = RUDA__MAX_PINS;
  /* With o->all, every other lane at its worker's current ticket: a MARK
   * pushed now follows everything pushed there before. Reader lanes
   * likewise (their bits say they read the buffer, not at which ticket),
   * after the listed waits. */
  const uint32_t count = o->all ? sch->lanes_total : o->nwait + (o->readers ? sch->lanes_total : 0);
  int rc = 0;
  for (uint32_t i = 0; i < count && rc == 0; i++) {
    uint32_t a, t;
    if (o->all) {
      if ((a = i) == b->index || sch->lanes[a].order_id != a) continue;
      t = ruda__queue_ticket(sch->lanes[a].worker);
    } else if (i < o->nwait) {
      a = o->wait[i].lane;
      t = o->wait[i].ticket;
    } else {
      a = i - o->nwait;
      if (a == b->index || !((o->readers >> (a & 63)) & 1)) continue;
      t = ruda__queue_ticket(sch->lanes[a].worker);
    }
    if (passed(sch, a, t) || covered(b, a, t)) continue;
    if (n == cap) { /* only with o->all and many busy lanes */
      ruda__dep **bigger = malloc(2 * cap * sizeof *bigger);
      if (bigger == NULL) {
        rc = RUDA_ENOMEM;
        break;
      }
      memcpy(bigger, deps, n * sizeof *deps);
      if (deps != stack) free(deps);
      deps = bigger;
      cap *= 2;
    }
    ruda__dep *d = mark_for(sch, a, t, s);
    if (d == NULL) rc = RUDA_ENOMEM;
    else deps[n++] = d;
  }
  ruda__cmd *wait = NULL;
  if (rc == 0 && n > 0 && (wait = ruda__cmd_alloc(n * sizeof *deps)) == NULL) rc = RUDA_ENOMEM;
  if (rc == 0 && n > 0) {
    wait->kind = RUDA__CMD_WAIT;
    wait->stream = s;
    wait->seq = seq;
    wait->u.wait.deps = (ruda__dep **)ruda__cmd_extra(wait);
    wait->u.wait.n = n;
    for (uint32_t i = 0; i < n; i++) {
      atomic_fetch_add_explicit(&deps[i]->refs, 1, memory_order_relaxed); /* the WAIT's */
      wait->u.wait.deps[i] = deps[i];
    }
    ruda__queue_push_unbounded(b->worker, wait);
    atomic_fetch_add_explicit(&sch->order.waits, 1, memory_order_relaxed);
    /* Only now: a client that sees the coverage pushes after the WAIT. */
    for (uint32_t i = 0; i < n; i++) cover(b, deps[i]);
  }
  /* Drop the references taken here; MARKs already pushed publish and
   * drop their own. */
  for (uint32_t i = 0; i < n; i++) dep_unref(sch, deps[i]);
  if (deps != stack) free(deps);
  if (rc != 0)
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory ordering a command after other streams",
                      RUDA__SNAME(s->id));
  return 0;
}

/* ---- workers ---- */

static void dep_ready(ruda__dep *d) {
  if (atomic_exchange_explicit(&d->state, RUDA__DEP_READY, memory_order_release) == RUDA__DEP_SLEEPER)
    ruda__futex_wake_all((const uint32_t *)&d->state);
}

void ruda__order_mark(struct ruda__sched *sch, ruda__dep *d) {
  /* Only a backend that orders streams on the device needs an event: on
   * the others, reaching the MARK means everything before it is done. */
  if (sch->backend.ops->stream_wait != NULL) {
    ruda__completion c = {0};
    ruda_error *err = NULL;
    d->code = sch->backend.ops->record(sch->lanes[d->lane].wstate, &c, &err);
    if (d->code == 0) d->event = c.event;
    else d->err = err;
  }
  dep_ready(d);
  dep_unref(sch, d);
}

static void await_ready(ruda__dep *d) {
  for (int spin = 0; spin < 256; spin++) {
    if (atomic_load_explicit(&d->state, memory_order_acquire) == RUDA__DEP_READY) return;
    ruda__cpu_relax();
  }
  uint32_t st = RUDA__DEP_PENDING;
  atomic_compare_exchange_strong_explicit(&d->state, &st, RUDA__DEP_SLEEPER, memory_order_acquire,
                                          memory_order_acquire);
  while (atomic_load_explicit(&d->state, memory_order_acquire) != RUDA__DEP_READY)
    ruda__futex_wait((const uint32_t *)&d->state, RUDA__DEP_SLEEPER);
}

int ruda__order_wait(ruda__lane *l, ruda__dep **deps, uint32_t n, ruda_error **err) {
  struct ruda__sched *sch = l->worker->sch;
  int rc = 0;
  for (uint32_t i = 0; i < n; i++) {
    ruda__dep *d = deps[i];
    await_ready(d);
    int r = 0;
    ruda_error *e = NULL;
    if (d->code != 0) {
      r = d->code;
      e = ruda__error_new(r, d->err ? d->err->backend_code : 0,
                          "cannot order after device stream %u's earlier use of a buffer: its mark failed: %.300s",
                          d->lane, d->err ? d->err->msg : ruda_err_name(r));
    } else if (d->event != NULL) {
      /* Asynchronous: the device stream waits, the worker goes on. */
      r = sch->backend.ops->stream_wait(l->wstate, d->event, &e);
    }
    if (r != 0 && rc == 0) {
      rc = r;
      *err = e;
    } else {
      ruda_error_free(e);
    }
    dep_unref(sch, d);
  }
  return rc;
}

void ruda__order_completed(ruda__lane *l, uint64_t pos) {
  uint64_t cur = atomic_load_explicit(&l->completed, memory_order_relaxed);
  while ((int64_t)(pos - cur) > 0 &&
         !atomic_compare_exchange_weak_explicit(&l->completed, &cur, pos, memory_order_release,
                                                memory_order_relaxed)) {
  }
}

void ruda__order_worker_init(ruda__worker *w) {
  atomic_init(&w->depth, 0);
  atomic_init(&w->tickets, 0);
  atomic_init(&w->done, 0);
}

void ruda__order_lane_init(ruda__lane *l) {
  atomic_init(&l->completed, 0);
  for (uint32_t i = 0; i < RUDA__COVER_WAYS; i++) atomic_init(&l->covered[i], 0);
  pthread_mutex_init(&l->mark_lock, NULL);
  l->last_mark = NULL;
}

void ruda__order_lane_fini(struct ruda__sched *sch, ruda__lane *l) {
  /* The lane's worker ran its MARKs and every WAIT before it stopped:
   * only this reference is left. */
  if (l->last_mark != NULL) dep_unref(sch, l->last_mark);
  l->last_mark = NULL;
  pthread_mutex_destroy(&l->mark_lock);
}

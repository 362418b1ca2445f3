/* order.c - cross-stream ordering: the slow paths of order.h, MARK and
 * WAIT on the workers.
 *
 * Why a MARK pushed now follows the use it is for: the use's client pushed
 * its command and only then published the slot's record (release); our
 * client read that record (acquire) before pushing the MARK, so the use's
 * enqueue happens before the MARK's, and the queue is FIFO.
 *
 * Why waits cannot form a cycle: a client pushes its MARKs before its WAIT
 * (a shared MARK was pushed before it was shared). A cycle would need each
 * worker blocked at a WAIT queued before the MARK another blocked worker
 * waits for, which orders every one of those pushes before itself.
 */
#include <stdlib.h>
#include <string.h>

#include "scheduler/device.h"
#include "scheduler/order.h"
#include "base/sync.h"

/* ---- client: gathering what a command needs ---- */

static void want(ruda__order *o, uint32_t worker, uint32_t ticket) {
  for (uint32_t i = 0; i < o->nwait; i++)
    if (o->wait[i].worker == worker) {
      if (!ruda__ticket_ge(o->wait[i].ticket, ticket)) o->wait[i].ticket = ticket;
      return;
    }
  o->wait[o->nwait].worker = worker;
  o->wait[o->nwait].ticket = ticket;
  o->nwait++;
  o->need = 1;
}

void ruda__order_note_slow(ruda__order *o, uint64_t seen, uint32_t gen, uint32_t worker) {
  if (seen == 0) return; /* never used: raw memory, nothing queued on it */
  uint32_t w1 = (uint32_t)(seen >> 48);
  uint32_t g = (uint32_t)(seen >> 32) & 0xffffu;
  if (g != (gen & 0xffffu) || w1 == RUDA__USE_MIXED) {
    /* A stale record (written late for an earlier buffer in this slot) or
     * uses that raced on several workers: order after all of them. */
    o->all = o->need = 1;
    return;
  }
  if (w1 - 1 != worker) want(o, w1 - 1, (uint32_t)seen);
}

/* Takes the reader bits of a buffer this command writes, except keep (the
 * writer's own worker, which its queue orders already). Cleared before the
 * MARKs are pushed: a read whose bit was cleared had been pushed before,
 * so a MARK pushed on its worker after the clear follows it; a read that
 * publishes later sets its bit again for the next write. */
void ruda__order_take_readers(ruda__order *o, _Atomic uint64_t *readers, uint64_t keep) {
  uint64_t r = atomic_load_explicit(readers, memory_order_seq_cst);
  while ((r & ~keep) != 0 &&
         !atomic_compare_exchange_weak_explicit(readers, &r, r & keep, memory_order_seq_cst, memory_order_seq_cst)) {
  }
  uint64_t took = r & ~keep;
  if (took == 0) return;
  o->readers |= took;
  o->need = 1;
  o->cleared[o->ncleared].readers = readers;
  o->cleared[o->ncleared].bits = took;
  o->ncleared++;
}

void ruda__order_abandon(ruda__order *o) {
  for (uint32_t i = 0; i < o->ncleared; i++)
    atomic_fetch_or_explicit(o->cleared[i].readers, o->cleared[i].bits, memory_order_seq_cst);
  o->ncleared = 0;
  for (uint32_t i = 0; i < o->npend; i++) ruda__handles_settle(o->pend[i]);
  o->npend = 0;
}

/* ---- client: has worker a passed ticket t? ---- */

/* On a backend without device-side waits (host), work a worker ran is
 * done, so its count of commands run decides; otherwise only events seen
 * complete do. */
static int passed(ruda_device *dev, uint32_t a, uint32_t t) {
  ruda__worker *w = &dev->workers[a];
  uint64_t x = dev->ops->stream_wait == NULL ? atomic_load_explicit(&w->done, memory_order_acquire)
                                             : atomic_load_explicit(&w->completed, memory_order_acquire);
  return ruda__ticket_ge((uint32_t)x, t);
}

/* Does a WAIT already pushed on b wait for a MARK of a that covers t? */
static int covered(ruda__worker *b, uint32_t a, uint32_t t) {
  uint64_t v = atomic_load_explicit(&b->covered[a % RUDA__COVER_WAYS], memory_order_acquire);
  return (uint32_t)(v >> 32) == a + 1 && ruda__ticket_ge((uint32_t)v, t);
}

static void cover(ruda__worker *b, const ruda__dep *d) {
  /* A plain store: losing a race only forgets some coverage, which costs
   * a MARK later, never an ordering. */
  atomic_store_explicit(&b->covered[d->worker % RUDA__COVER_WAYS], ((uint64_t)(d->worker + 1) << 32) | d->lower,
                        memory_order_release);
}

static void dep_unref(ruda_device *dev, ruda__dep *d) {
  if (atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1) return;
  if (d->event != NULL && dev->ops->event_release != NULL) dev->ops->event_release(dev->bstate, d->event);
  ruda_error_free(d->err);
  free(d);
}

/* A MARK on worker a that follows the use at ticket t: the newest one
 * there if it was pushed after a had run t, else a new one. s: the stream
 * asking, the MARK's nominal stream. Returns a reference, or NULL. */
static ruda__dep *mark_for(ruda_device *dev, uint32_t a, uint32_t t, ruda__stream *s) {
  ruda__worker *wa = &dev->workers[a];
  pthread_mutex_lock(&wa->mark_lock);
  ruda__dep *m = wa->last_mark;
  if (m != NULL && ruda__ticket_ge(m->lower, t)) {
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&wa->mark_lock);
    atomic_fetch_add_explicit(&dev->order.shared, 1, memory_order_relaxed);
    return m;
  }
  ruda__dep *d = calloc(1, sizeof *d);
  ruda__cmd *cmd = d != NULL ? ruda__cmd_alloc(0) : NULL;
  if (cmd == NULL) {
    pthread_mutex_unlock(&wa->mark_lock);
    free(d);
    return NULL;
  }
  d->worker = a;
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
  wa->last_mark = d;
  pthread_mutex_unlock(&wa->mark_lock);
  if (m != NULL) dep_unref(dev, m);
  atomic_fetch_add_explicit(&dev->order.marks, 1, memory_order_relaxed);
  return d;
}

int ruda__order_prepare(ruda_device *dev, ruda__order *o, ruda__stream *s, uint64_t seq) {
  ruda__worker *b = s->worker;
  ruda__dep *stack[RUDA__MAX_PINS];
  ruda__dep **deps = stack;
  uint32_t n = 0, cap = RUDA__MAX_PINS;
  /* With o->all, every other worker at its current ticket: a MARK pushed
   * now follows everything pushed there before. Reader workers likewise
   * (their bits say they read the buffer, not at which ticket), after the
   * listed waits. */
  const uint32_t count = o->all ? dev->nworkers : o->nwait + (o->readers ? dev->nworkers : 0);
  int rc = 0;
  for (uint32_t i = 0; i < count && rc == 0; i++) {
    uint32_t a, t;
    if (o->all) {
      if ((a = i) == b->index) continue;
      t = ruda__queue_ticket(&dev->workers[a]);
    } else if (i < o->nwait) {
      a = o->wait[i].worker;
      t = o->wait[i].ticket;
    } else {
      a = i - o->nwait;
      if (a == b->index || !((o->readers >> (a & 63)) & 1)) continue;
      t = ruda__queue_ticket(&dev->workers[a]);
    }
    if (passed(dev, a, t) || covered(b, a, t)) continue;
    if (n == cap) { /* only with o->all and many busy workers */
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
    ruda__dep *d = mark_for(dev, a, t, s);
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
    ruda__queue_push_unbounded(b, wait);
    atomic_fetch_add_explicit(&dev->order.waits, 1, memory_order_relaxed);
    /* Only now: a client that sees the coverage pushes after the WAIT. */
    for (uint32_t i = 0; i < n; i++) cover(b, deps[i]);
  }
  /* Drop the references taken here; MARKs already pushed publish and
   * drop their own. */
  for (uint32_t i = 0; i < n; i++) dep_unref(dev, deps[i]);
  if (deps != stack) free(deps);
  if (rc != 0)
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory ordering a command after other streams",
                      RUDA__SNAME(s->id));
  return 0;
}

void ruda__order_publish_slow(_Atomic uint64_t *last, uint64_t cur, uint64_t want) {
  const uint64_t mine = want >> 48;
  const uint64_t gen = (want >> 32) & 0xffffu;
  for (;;) {
    if (cur == want) return; /* the same slot twice in one command */
    if (((cur >> 32) & 0xffffu) != gen) return; /* stale either way; readers already distrust it */
    uint64_t next;
    if ((cur >> 48) == mine) {
      /* Another command of this worker published: keep the later ticket. */
      if (ruda__ticket_ge((uint32_t)cur, (uint32_t)want)) return;
      next = want;
    } else {
      /* A use on another worker was published after we looked: neither
       * ordered after the other for sure, so the next use orders after
       * every worker. */
      next = ((uint64_t)RUDA__USE_MIXED << 48) | (gen << 32);
      if (cur == next) return;
    }
    if (atomic_compare_exchange_weak_explicit(last, &cur, next, memory_order_release, memory_order_relaxed))
      return;
  }
}

/* ---- workers ---- */

static void dep_ready(ruda__dep *d) {
  if (atomic_exchange_explicit(&d->state, RUDA__DEP_READY, memory_order_release) == RUDA__DEP_SLEEPER)
    ruda__futex_wake_all((const uint32_t *)&d->state);
}

void ruda__order_mark(ruda__worker *w, ruda__dep *d) {
  ruda_device *dev = w->dev;
  /* Only a backend that orders streams on the device needs an event: on
   * the others, reaching the MARK means everything before it is done. */
  if (dev->ops->stream_wait != NULL) {
    ruda__completion c = {0};
    ruda_error *err = NULL;
    d->code = dev->ops->record(w->wstate, &c, &err);
    if (d->code == 0) d->event = c.event;
    else d->err = err;
  }
  dep_ready(d);
  dep_unref(dev, d);
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

int ruda__order_wait(ruda__worker *w, ruda__dep **deps, uint32_t n, ruda_error **err) {
  ruda_device *dev = w->dev;
  int rc = 0;
  for (uint32_t i = 0; i < n; i++) {
    ruda__dep *d = deps[i];
    await_ready(d);
    int r = 0;
    ruda_error *e = NULL;
    if (d->code != 0) {
      r = d->code;
      e = ruda__error_new(r, d->err ? d->err->backend_code : 0,
                          "cannot order after worker %u's earlier use of a buffer: its mark failed: %.300s",
                          d->worker, d->err ? d->err->msg : ruda_err_name(r));
    } else if (d->event != NULL) {
      /* Asynchronous: the device stream waits, the worker goes on. */
      r = dev->ops->stream_wait(w->wstate, d->event, &e);
    }
    if (r != 0 && rc == 0) {
      rc = r;
      *err = e;
    } else {
      ruda_error_free(e);
    }
    dep_unref(dev, d);
  }
  return rc;
}

void ruda__order_completed(ruda__worker *w, uint64_t pos) {
  uint64_t cur = atomic_load_explicit(&w->completed, memory_order_relaxed);
  while ((int64_t)(pos - cur) > 0 &&
         !atomic_compare_exchange_weak_explicit(&w->completed, &cur, pos, memory_order_release,
                                                memory_order_relaxed)) {
  }
}

void ruda__order_worker_init(ruda__worker *w) {
  atomic_init(&w->depth, 0);
  atomic_init(&w->tickets, 0);
  atomic_init(&w->done, 0);
  atomic_init(&w->completed, 0);
  for (uint32_t i = 0; i < RUDA__COVER_WAYS; i++) atomic_init(&w->covered[i], 0);
  pthread_mutex_init(&w->mark_lock, NULL);
  w->last_mark = NULL;
}

void ruda__order_worker_fini(ruda_device *dev, ruda__worker *w) {
  /* The worker ran its MARK and every WAIT before it stopped: only this
   * reference is left. */
  if (w->last_mark != NULL) dep_unref(dev, w->last_mark);
  w->last_mark = NULL;
  pthread_mutex_destroy(&w->mark_lock);
}

/* future.c - one-shot completions for reads and syncs.
 *
 * The worker marks a future submitted (with the backend's completion
 * event, if any) and wakes the waiter with a futex. The waiter then waits
 * for the event itself, on its own thread: workers never block on the
 * device, so one slow sync cannot stall a stream's other commands.
 */
#include <pthread.h>
#include <stdlib.h>

#include "scheduler/sched.h"
#include "scheduler/order.h"
#include "base/sync.h"

/* Futures handed to the application, which may wait, poll and free them
 * on any thread, also after the device closed. Each held future is listed
 * here (striped by address, so threads handing out futures rarely share a
 * lock), and each wait, poll or free of one counts itself in `busy`, then
 * reads `closed`; close sets `closed`, then waits for `busy` to read zero
 * (both sides sequentially consistent, as the call slots: either the
 * operation sees the device closed or close waits for it). The home is
 * referenced by the device and by each held future, and freed by the
 * last. */
#define STRIPES 8u

static const char closed_msg[] = "ruda_future_wait: the device was closed before the future was waited; its "
                                 "result was dropped (a read's destination was not written)";

struct ruda__future_home {
  _Atomic int closed;
  _Atomic uint32_t busy; /* futex word: operations on held futures in progress */
  _Atomic uint32_t refs;
  struct {
    pthread_mutex_t lock;
    struct ruda_future *head;
  } stripe[STRIPES];
};

static unsigned stripe_of(const struct ruda_future *f) { return (unsigned)((uintptr_t)f >> 6) % STRIPES; }

static void home_put(struct ruda__future_home *h) {
  if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) != 1) return;
  for (unsigned i = 0; i < STRIPES; i++) pthread_mutex_destroy(&h->stripe[i].lock);
  free(h);
}

int ruda__futures_open(struct ruda__sched *sch) {
  struct ruda__future_home *h = calloc(1, sizeof *h);
  if (h == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  atomic_init(&h->refs, 1);
  for (unsigned i = 0; i < STRIPES; i++) pthread_mutex_init(&h->stripe[i].lock, NULL);
  sch->futures = h;
  return 0;
}

/* A wait, poll or free of held future f begins: 1 when the device is
 * open (the caller then calls leave), 0 once close began (f is then, or
 * soon, detached: this waits for that). */
static int enter(struct ruda_future *f) {
  struct ruda__future_home *h = f->home;
  atomic_fetch_add_explicit(&h->busy, 1, memory_order_seq_cst);
  if (!atomic_load_explicit(&h->closed, memory_order_seq_cst)) return 1;
  if (atomic_fetch_sub_explicit(&h->busy, 1, memory_order_seq_cst) == 1)
    ruda__futex_wake_all((const uint32_t *)&h->busy);
  while (!atomic_load_explicit(&f->detached, memory_order_acquire))
    ruda__futex_wait((const uint32_t *)&f->detached, 0);
  return 0;
}

static void leave(struct ruda__future_home *h) {
  if (atomic_fetch_sub_explicit(&h->busy, 1, memory_order_seq_cst) == 1 &&
      atomic_load_explicit(&h->closed, memory_order_seq_cst))
    ruda__futex_wake_all((const uint32_t *)&h->busy);
}

struct ruda_future *ruda__future_new(struct ruda__sched *sch, ruda__stream *s, int drains) {
  struct ruda_future *f = calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  atomic_init(&f->state, RUDA__FUT_PENDING);
  atomic_init(&f->refs, 2);
  f->sch = sch;
  f->stream = s;
  /* A thread's own stream is freed once retired: not while this is held. */
  if (s != NULL && s->life != NULL) atomic_fetch_add_explicit(&s->holders, 1, memory_order_relaxed);
  if (s != NULL) atomic_fetch_add_explicit(&s->unwaited, 1, memory_order_relaxed);
  f->drains_errors = drains;
  return f;
}

void ruda__future_submitted(struct ruda_future *f, int code) {
  f->code = code;
  if (atomic_exchange_explicit(&f->state, RUDA__FUT_SUBMITTED, memory_order_acq_rel) == RUDA__FUT_SLEEPING)
    ruda__futex_wake_all((const uint32_t *)&f->state);
}

static int submitted(const void *p) {
  const struct ruda_future *f = p;
  return atomic_load_explicit(&f->state, memory_order_acquire) == RUDA__FUT_SUBMITTED;
}

static void release_event(struct ruda_future *f) {
  if (f->completion.event != NULL && f->sch->backend.ops->event_release)
    f->sch->backend.ops->event_release(f->sch->backend.state, f->completion.event);
  f->completion.event = NULL;
}

/* The future is done with its stream: once waited (the worker's last
 * reference may drop later, but touches no stream) or freed unwaited. */
static void release_stream(struct ruda_future *f) {
  if (f->stream != NULL) atomic_fetch_sub_explicit(&f->stream->unwaited, 1, memory_order_relaxed);
  if (f->stream != NULL && f->stream->life != NULL)
    atomic_fetch_sub_explicit(&f->stream->holders, 1, memory_order_release);
}

void ruda__future_unref(struct ruda_future *f) {
  if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1) return;
  if (!atomic_load_explicit(&f->finished, memory_order_relaxed) && f->completion.discard != NULL) {
    /* Detached before it was waited: the work ran, its result is dropped,
     * but whatever the backend holds for it (staging) must go back once
     * the device work is done. This is often a worker (the client freed
     * the future first), which must not block on the device: the backend
     * retires it when its progress() sees the event complete. */
    const ruda__backend_ops *ops = f->sch->backend.ops;
    if (f->completion.event != NULL && ops->retire != NULL) {
      ops->retire(f->sch->backend.state, f->completion.event, f->completion.discard, f->completion.arg);
      f->completion.event = NULL; /* the backend's now */
      /* The recording worker may sleep without a timeout (nothing was
       * pending at its last poll): wake it to poll this one. */
      if (f->order_lane != NULL) {
        ruda__lane_dirty(f->order_lane);
        ck_ec32_inc(&f->order_lane->worker->wake, &ruda__ec_mp);
      }
    } else {
      if (f->completion.event != NULL) ops->event_wait(f->sch->backend.state, f->completion.event, NULL);
      f->completion.discard(f->sch->backend.state, f->completion.arg);
    }
  }
  release_event(f);
  ruda_error_free(f->err);
  if (!atomic_load_explicit(&f->finished, memory_order_relaxed)) release_stream(f);
  free(f);
}

static int poll_open(struct ruda_future *f);

int ruda_future_poll(ruda_future *f) {
  if (f == NULL) return ruda__fail(RUDA_EINVAL, "ruda_future_poll: future is NULL");
  if (f->home == NULL) return poll_open(f);
  if (atomic_load_explicit(&f->detached, memory_order_acquire) || !enter(f)) return 1;
  int done = poll_open(f);
  leave(f->home);
  return done;
}

static int poll_open(struct ruda_future *f) {
  if (atomic_load_explicit(&f->state, memory_order_acquire) != RUDA__FUT_SUBMITTED) return 0;
  /* A waiter may be finishing meanwhile: it never releases the event
   * (ruda__future_unref does, once the future is freed), so querying it
   * here stays valid. */
  if (atomic_load_explicit(&f->finished, memory_order_acquire) || f->completion.event == NULL) return 1;
  int done = f->sch->backend.ops->event_query(f->sch->backend.state, f->completion.event);
  if (done == 1 && f->order_lane != NULL) ruda__order_completed(f->order_lane, f->order_pos);
  return done;
}

/* The wait itself, on a device that is open. */
static void wait_open(struct ruda_future *f) {
  /* Poll first: a short command's worker usually answers within
   * microseconds, sooner than a sleep and a wake-up. Then sleep, saying
   * so in the state word so the worker wakes us. */
  if (!ruda__spin_bounded(submitted, f, (uint64_t)f->sch->cfg.spin_us * 1000)) {
    for (;;) {
      uint32_t st = atomic_load_explicit(&f->state, memory_order_acquire);
      if (st == RUDA__FUT_SUBMITTED) break;
      if (st == RUDA__FUT_PENDING &&
          !atomic_compare_exchange_weak_explicit(&f->state, &st, RUDA__FUT_SLEEPING, memory_order_acq_rel,
                                                 memory_order_acquire))
        continue;
      ruda__futex_wait((const uint32_t *)&f->state, RUDA__FUT_SLEEPING);
    }
  }
  if (!atomic_load_explicit(&f->finished, memory_order_relaxed)) {
    int rc = f->code;
    ruda_error *e = NULL;
    if (rc == 0 && f->completion.event != NULL) {
      rc = f->sch->backend.ops->event_wait(f->sch->backend.state, f->completion.event, &e);
      if (rc == 0 && f->order_lane != NULL) ruda__order_completed(f->order_lane, f->order_pos);
    }
    if (rc == 0 && f->completion.finish != NULL)
      f->completion.finish(f->sch->backend.state, f->completion.arg);
    if (e != NULL) {
      e->stream = f->stream->id;
      ruda__stream_push_error(f->stream, e);
    }
    /* A failed command already queued its error on the stream; handing
     * the stream's errors back covers both. */
    if (f->drains_errors || rc != 0) {
      int drc = ruda__stream_drain(f->sch, f->stream, &f->err);
      if (rc == 0) rc = drc;
      else if (drc != 0) rc = drc;
    }
    f->code = rc;
    atomic_store_explicit(&f->finished, 1, memory_order_release);
    if (f->stream != NULL) atomic_store_explicit(&f->stream->since_wait, 0, memory_order_relaxed);
    release_stream(f);
  }
}

int ruda_future_wait(ruda_future *f, ruda_error **err) {
  if (err) *err = NULL;
  if (f == NULL) return ruda__fail(RUDA_EINVAL, "ruda_future_wait: future is NULL");
  if (f->home == NULL) {
    wait_open(f);
  } else if (!atomic_load_explicit(&f->detached, memory_order_acquire) && enter(f)) {
    wait_open(f);
    leave(f->home);
  }
  if (err) {
    *err = f->err;
    f->err = NULL;
  }
  /* Completed by close: the thread's last error says so, as a call's. */
  if (f->code == RUDA_ECLOSED) return ruda__fail(RUDA_ECLOSED, "%s", closed_msg);
  return f->code;
}

void ruda__future_hand_out(struct ruda_future *f) {
  if (f == NULL) return;
  struct ruda__future_home *h = f->sch->futures;
  atomic_fetch_add_explicit(&h->refs, 1, memory_order_relaxed);
  f->home = h;
  const unsigned i = stripe_of(f);
  pthread_mutex_lock(&h->stripe[i].lock);
  f->hprev = NULL;
  f->hnext = h->stripe[i].head;
  if (f->hnext != NULL) f->hnext->hprev = f;
  h->stripe[i].head = f;
  pthread_mutex_unlock(&h->stripe[i].lock);
}

void ruda_future_free(ruda_future *f) {
  if (f == NULL) return;
  struct ruda__future_home *h = f->home;
  if (h != NULL && !atomic_load_explicit(&f->detached, memory_order_acquire) && enter(f)) {
    const unsigned i = stripe_of(f);
    pthread_mutex_lock(&h->stripe[i].lock);
    if (f->hprev != NULL) f->hprev->hnext = f->hnext;
    else h->stripe[i].head = f->hnext;
    if (f->hnext != NULL) f->hnext->hprev = f->hprev;
    pthread_mutex_unlock(&h->stripe[i].lock);
    ruda__future_unref(f); /* may still use the device: inside the count */
    leave(h);
  } else {
    ruda__future_unref(f); /* detached: touches no device */
  }
  if (h != NULL) home_put(h);
}

/* Close: f, listed and not in use by anyone (busy read zero), no longer
 * needs the device. Not waited yet: its work ran (the workers stopped),
 * so its event is waited, its result dropped as a free would, and it
 * completes with RUDA_ECLOSED. */
static void detach(struct ruda__sched *sch, struct ruda_future *f) {
  if (!atomic_load_explicit(&f->finished, memory_order_acquire)) {
    const ruda__backend_ops *ops = sch->backend.ops;
    if (f->completion.event != NULL) ops->event_wait(sch->backend.state, f->completion.event, NULL);
    if (f->completion.discard != NULL) f->completion.discard(sch->backend.state, f->completion.arg);
    release_event(f);
    ruda_error_free(f->err);
    f->err = ruda__error_new(RUDA_ECLOSED, 0, "%s", closed_msg);
    f->code = RUDA_ECLOSED;
    release_stream(f);
    atomic_store_explicit(&f->finished, 1, memory_order_release);
  }
  f->stream = NULL;
  atomic_store_explicit(&f->state, RUDA__FUT_SUBMITTED, memory_order_release);
  atomic_store_explicit(&f->detached, 1, memory_order_release);
  ruda__futex_wake_all((const uint32_t *)&f->detached);
}

void ruda__futures_close(struct ruda__sched *sch) {
  struct ruda__future_home *h = sch->futures;
  if (h == NULL) return;
  atomic_store_explicit(&h->closed, 1, memory_order_seq_cst);
  uint32_t b;
  while ((b = atomic_load_explicit(&h->busy, memory_order_seq_cst)) != 0) ruda__futex_wait((const uint32_t *)&h->busy, b);
  for (unsigned i = 0; i < STRIPES; i++) {
    pthread_mutex_lock(&h->stripe[i].lock);
    struct ruda_future *f = h->stripe[i].head;
    h->stripe[i].head = NULL;
    pthread_mutex_unlock(&h->stripe[i].lock);
    while (f != NULL) {
      struct ruda_future *next = f->hnext; /* f may be freed once detached */
      detach(sch, f);
      f = next;
    }
  }
  sch->futures = NULL;
  home_put(h);
}

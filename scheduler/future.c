/* future.c - one-shot completions for reads and syncs.
 *
 * The worker marks a future submitted (with the backend's completion
 * event, if any) and wakes the waiter with a futex. The waiter then waits
 * for the event itself, on its own thread: workers never block on the
 * device, so one slow sync cannot stall a stream's other commands.
 */
#include <stdlib.h>

#include "scheduler/sched.h"
#include "scheduler/order.h"
#include "base/sync.h"

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
      if (f->order_worker != NULL) ck_ec32_inc(&f->order_worker->wake, &ruda__ec_mp);
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

int ruda_future_poll(ruda_future *f) {
  if (f == NULL) return ruda__fail(RUDA_EINVAL, "ruda_future_poll: future is NULL");
  if (atomic_load_explicit(&f->state, memory_order_acquire) != RUDA__FUT_SUBMITTED) return 0;
  /* A waiter may be finishing meanwhile: it never releases the event
   * (ruda__future_unref does, once the future is freed), so querying it
   * here stays valid. */
  if (atomic_load_explicit(&f->finished, memory_order_acquire) || f->completion.event == NULL) return 1;
  int done = f->sch->backend.ops->event_query(f->sch->backend.state, f->completion.event);
  if (done == 1 && f->order_worker != NULL) ruda__order_completed(f->order_worker, f->order_pos);
  return done;
}

int ruda_future_wait(ruda_future *f, ruda_error **err) {
  if (err) *err = NULL;
  if (f == NULL) return ruda__fail(RUDA_EINVAL, "ruda_future_wait: future is NULL");
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
      if (rc == 0 && f->order_worker != NULL) ruda__order_completed(f->order_worker, f->order_pos);
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
  if (err) {
    *err = f->err;
    f->err = NULL;
  }
  return f->code;
}

void ruda__future_hand_out(struct ruda_future *f) {
  if (f == NULL) return;
  f->held = 1;
  atomic_fetch_add_explicit(&f->sch->held_futures, 1, memory_order_relaxed);
}

void ruda_future_free(ruda_future *f) {
  if (f == NULL) return;
  if (f->held) atomic_fetch_sub_explicit(&f->sch->held_futures, 1, memory_order_release);
  ruda__future_unref(f);
}

/* cuda_event.c - the event pool: CUevents reused, never destroyed before
 * close.
 *
 * Free lists per lane (b->ev_lists[index % 1024]): a lane takes from its
 * own, any thread puts an event back on its recorder's, so workers and
 * their clients do not all meet on one lock. Creating an event is off the
 * hot path: on a busy device cuEventCreate blocks its caller for up to
 * tens of milliseconds, and a worker blocked there stalls every stream it
 * serves. So a lane's list is filled when its worker starts
 * (ruda__cu_events_fill), and a take that leaves fewer than EV_LOW asks
 * the refiller thread (one per device, started on first need) to add
 * EV_BATCH more. A take from an empty list still creates one itself.
 *
 * Thread safety: every function may run on any thread, except init and
 * fini (open and close). Only the refiller and a take from an empty list
 * call the driver.
 */
#include <pthread.h>
#include <stdlib.h>

#include "backends/cuda/cuda_internal.h"

enum {
  EV_AHEAD = 32, /* untimed events a lane's list holds when its worker starts */
  EV_LOW = 8,    /* a take leaving fewer asks the refiller */
  EV_BATCH = 32, /* events one refill adds */
};

void ruda__cu_events_init(ruda__cu_backend *b) {
  pthread_mutex_init(&b->ev_lock, NULL);
  for (size_t i = 0; i < RUDA__CU_EV_LISTS; i++) pthread_mutex_init(&b->ev_lists[i].lock, NULL);
  pthread_mutex_init(&b->refill_lock, NULL);
  pthread_cond_init(&b->refill_cond, NULL);
}

/* A new event for list home; NULL with *r set on failure. Any thread with
 * the context current. */
static ruda__cu_event *event_new(ruda__cu_backend *b, uint32_t home, int timed, CUresult *r) {
  ruda__cu_event *e = calloc(1, sizeof *e);
  if (e == NULL) {
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    return NULL;
  }
  /* No timing unless asked: recording and querying such events is cheaper. */
  e->timed = (uint8_t)timed;
  e->home = (uint16_t)home;
  if ((*r = ruda__cu.cuEventCreate(&e->ev, timed ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
    free(e);
    return NULL;
  }
  atomic_init(&e->refs, 1);
  pthread_mutex_lock(&b->ev_lock);
  e->next_all = b->ev_all;
  b->ev_all = e;
  pthread_mutex_unlock(&b->ev_lock);
  return e;
}

/* Adds n new events to list home: CUDA_SUCCESS, or the first failure
 * (those made before it stay). */
static CUresult add_events(ruda__cu_backend *b, uint32_t home, int timed, uint32_t n) {
  struct ruda__cu_event_list *l = &b->ev_lists[home];
  for (uint32_t i = 0; i < n; i++) {
    CUresult r;
    ruda__cu_event *e = event_new(b, home, timed, &r);
    if (e == NULL) return r;
    pthread_mutex_lock(&l->lock);
    e->next_free = l->free[timed];
    l->free[timed] = e;
    l->nfree[timed]++;
    pthread_mutex_unlock(&l->lock);
  }
  return CUDA_SUCCESS;
}

/* The refiller: adds EV_BATCH events to each list that asked, with the
 * device's context current. Blocks in the driver; sleeps otherwise. */
static void *refiller_main(void *arg) {
  ruda__cu_backend *b = arg;
  pthread_setname_np(pthread_self(), "ruda-events");
  const int ctx_ok = ruda__cu.cuCtxSetCurrent(b->ctx) == CUDA_SUCCESS;
  pthread_mutex_lock(&b->refill_lock);
  for (;;) {
    while (!b->refill_stop && b->refill_n == 0) pthread_cond_wait(&b->refill_cond, &b->refill_lock);
    if (b->refill_stop) break;
    const uint32_t want = b->refill_want[--b->refill_n];
    pthread_mutex_unlock(&b->refill_lock);
    const uint32_t home = want >> 1;
    const int timed = (int)(want & 1);
    if (ctx_ok) add_events(b, home, timed, EV_BATCH);
    struct ruda__cu_event_list *l = &b->ev_lists[home];
    pthread_mutex_lock(&l->lock);
    l->asked &= (uint8_t)~(1u << timed); /* a later low take asks again */
    pthread_mutex_unlock(&l->lock);
    pthread_mutex_lock(&b->refill_lock);
  }
  pthread_mutex_unlock(&b->refill_lock);
  return NULL;
}

/* Queues a refill of list home (asked once at a time per list and kind,
 * so the queue never holds more than one entry per pair). */
static void ask_refill(ruda__cu_backend *b, uint32_t home, int timed) {
  pthread_mutex_lock(&b->refill_lock);
  if (!b->refill_stop) {
    if (!b->refiller_started) b->refiller_started = pthread_create(&b->refiller, NULL, refiller_main, b) == 0;
    b->refill_want[b->refill_n++] = home << 1 | (uint32_t)timed;
    pthread_cond_signal(&b->refill_cond);
  }
  pthread_mutex_unlock(&b->refill_lock);
}

/* An event from free list home, else a new one that goes back there. */
static ruda__cu_event *event_take(ruda__cu_backend *b, uint32_t home, int timed, CUresult *r) {
  struct ruda__cu_event_list *l = &b->ev_lists[home];
  pthread_mutex_lock(&l->lock);
  ruda__cu_event *e = l->free[timed];
  int ask = 0;
  if (e != NULL) {
    l->free[timed] = e->next_free;
    ask = --l->nfree[timed] < EV_LOW && !(l->asked & (1u << timed));
  } else {
    ask = !(l->asked & (1u << timed));
  }
  if (ask) l->asked |= (uint8_t)(1u << timed);
  pthread_mutex_unlock(&l->lock);
  if (ask) ask_refill(b, home, timed);
  if (e != NULL) {
    atomic_store_explicit(&e->refs, 1, memory_order_relaxed);
    return e;
  }
  return event_new(b, home, timed, r);
}

CUresult ruda__cu_events_fill(ruda__cu_worker *w) {
  const uint32_t home = w->index % RUDA__CU_EV_LISTS;
  struct ruda__cu_event_list *l = &w->b->ev_lists[home];
  pthread_mutex_lock(&l->lock);
  const uint32_t have = l->nfree[0];
  pthread_mutex_unlock(&l->lock);
  return add_events(w->b, home, 0, have < EV_AHEAD ? EV_AHEAD - have : 0);
}

/* Lane k's list is k's (the builder's index follows the lanes'). */
ruda__cu_event *ruda__cu_event_get(ruda__cu_worker *w, CUresult *r) {
  return event_take(w->b, w->index % RUDA__CU_EV_LISTS, 0, r);
}

ruda__cu_event *ruda__cu_event_get_timed(ruda__cu_worker *w, CUresult *r) {
  return event_take(w->b, w->index % RUDA__CU_EV_LISTS, 1, r);
}

ruda__cu_event *ruda__cu_event_get_shared(ruda__cu_backend *b, CUresult *r) { return event_take(b, 0, 0, r); }

void ruda__cu_event_put(ruda__cu_backend *b, ruda__cu_event *e) {
  if (e == NULL || atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1) return;
  struct ruda__cu_event_list *l = &b->ev_lists[e->home];
  pthread_mutex_lock(&l->lock);
  e->next_free = l->free[e->timed];
  l->free[e->timed] = e;
  l->nfree[e->timed]++;
  pthread_mutex_unlock(&l->lock);
}

ruda__cu_event *ruda__cu_record(ruda__cu_worker *w, CUresult *r) {
  ruda__cu_event *e = ruda__cu_event_get(w, r);
  if (e == NULL) return NULL;
  if ((*r = ruda__cu.cuEventRecord(e->ev, w->stream)) != CUDA_SUCCESS) {
    ruda__cu_event_put(w->b, e);
    return NULL;
  }
  e->kernel = atomic_load_explicit(&w->last_kernel, memory_order_relaxed);
  e->stream = atomic_load_explicit(&w->last_stream, memory_order_relaxed);
  e->seq = atomic_load_explicit(&w->last_seq, memory_order_relaxed);
  e->worker = w;
  e->writes = w->writes; /* worker-only counter: no lock needed to read */
  /* Writes recorded no event of their own (ruda__cu_write): the newest
   * pending one takes a reference to this one, which covers it and every
   * write before it. */
  pthread_mutex_lock(&w->plock);
  if (w->count > 0) {
    ruda__cu_pending *tail = &w->pending[(w->head + w->count - 1) % w->cap];
    if (tail->ev == NULL) {
      atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
      tail->ev = e;
    }
  }
  pthread_mutex_unlock(&w->plock);
  return e;
}

void ruda__cu_events_fini(ruda__cu_backend *b) {
  pthread_mutex_lock(&b->refill_lock);
  b->refill_stop = 1;
  pthread_cond_signal(&b->refill_cond);
  pthread_mutex_unlock(&b->refill_lock);
  if (b->refiller_started) pthread_join(b->refiller, NULL);
  for (ruda__cu_event *e = b->ev_all; e != NULL;) {
    ruda__cu_event *n = e->next_all;
    ruda__cu.cuEventDestroy(e->ev);
    free(e);
    e = n;
  }
  b->ev_all = NULL;
  pthread_cond_destroy(&b->refill_cond);
  pthread_mutex_destroy(&b->refill_lock);
  pthread_mutex_destroy(&b->ev_lock);
  for (size_t i = 0; i < RUDA__CU_EV_LISTS; i++) pthread_mutex_destroy(&b->ev_lists[i].lock);
}

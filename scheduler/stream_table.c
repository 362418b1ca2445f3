/* stream_table.c - the stream table: a device's streams by id, and the
 * stream records themselves.
 *
 * Lookups happen on every call, inserts once per new stream id, so the
 * table is an open-addressing hash whose slots are published with release
 * stores and read with acquire loads: readers take no lock. Inserts and
 * removals take the table mutex. A removed stream (a retired thread's,
 * scheduler/stream_exit.c) leaves a tombstone that probes pass over and
 * inserts reuse. When live streams and tombstones pass half the slots, a
 * table sized for the live ones is built and published; the old one is
 * kept until a grace period passed (scheduler/grace.h), because a reader
 * may still be probing it (ruda__streams_free_retired).
 *
 * Calls nothing of the other stream files (stream.c looks streams up and
 * makes them, stream_exit.c retires them; both call down to here).
 */
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "scheduler/graph.h"
#include "base/log.h"

typedef struct ruda__stream_slots {
  uint64_t mask;
  struct ruda__stream_slots *prev_retired;
  uint64_t grace; /* once replaced: its grace stamp (scheduler/grace.h) */
  ruda__stream *_Atomic slot[];
} ruda__stream_slots;

static ruda__stream_slots *slots_new(uint64_t cap) {
  ruda__stream_slots *t = calloc(1, sizeof *t + cap * sizeof(ruda__stream *));
  if (t != NULL) t->mask = cap - 1;
  return t;
}

/* A removed stream's slot: probes go on past it. Never dereferenced. */
static const char tomb_mark;
#define TOMB ((ruda__stream *)(uintptr_t)&tomb_mark)

static uint64_t mix(uint64_t x) { /* splitmix64 finalizer */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void ruda__streams_init(ruda__stream_table *t) {
  atomic_init(&t->current, slots_new(64));
  t->retired = NULL;
  pthread_mutex_init(&t->lock, NULL);
  atomic_init(&t->count, 0);
  t->tombs = 0;
  atomic_init(&t->records, 0);
  pthread_mutex_init(&t->reap_lock, NULL);
  atomic_init(&t->thread_creations, 0);
  atomic_init(&t->grace.halves, 0); /* calls and phase: the device's, set at open */
  t->pending = NULL;
}

static ruda__stream *find(ruda__stream_slots *s, ruda_stream_id id) {
  for (uint64_t i = mix(id) & s->mask;; i = (i + 1) & s->mask) {
    ruda__stream *st = atomic_load_explicit(&s->slot[i], memory_order_acquire);
    if (st == NULL) return NULL;
    if (st != TOMB && st->id == id) return st;
  }
}

/* Under the lock, st's id absent: the first free slot or tombstone on
 * its probe path. Returns 1 when it took a tombstone. */
static int place(ruda__stream_slots *s, ruda__stream *st) {
  uint64_t i = mix(st->id) & s->mask;
  ruda__stream *o;
  while ((o = atomic_load_explicit(&s->slot[i], memory_order_relaxed)) != NULL && o != TOMB) i = (i + 1) & s->mask;
  atomic_store_explicit(&s->slot[i], st, memory_order_release);
  return o == TOMB;
}

/* Under the lock: inserts st, rebuilding the table first when live
 * streams, tombstones and st would pass half of it. 0 without memory. */
static int insert(ruda__stream_table *t, ruda__stream *st) {
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_relaxed);
  uint64_t n = atomic_load_explicit(&t->count, memory_order_relaxed) + 1;
  if ((n + t->tombs) * 2 > cur->mask + 1) {
    /* Sized for a quarter full, so rebuilds stay amortized O(1) per
     * insert whether the table grows or churns. */
    uint64_t cap = 64;
    while (cap < 4 * n) cap *= 2;
    ruda__stream_slots *fresh = slots_new(cap);
    if (fresh == NULL) return 0;
    for (uint64_t i = 0; i <= cur->mask; i++) {
      ruda__stream *old = atomic_load_explicit(&cur->slot[i], memory_order_relaxed);
      if (old != NULL && old != TOMB) place(fresh, old);
    }
    place(fresh, st);
    atomic_store_explicit(&t->current, fresh, memory_order_seq_cst);
    cur->grace = ruda__grace_stamp(&t->grace, 0); /* under the table lock, not reap_lock */
    cur->prev_retired = t->retired;
    t->retired = cur;
    t->tombs = 0;
  } else if (place(cur, st)) {
    t->tombs--;
  }
  atomic_store_explicit(&t->count, n, memory_order_relaxed);
  return 1;
}

void ruda__streams_unpublish(ruda__stream_table *t, ruda__stream *st) {
  pthread_mutex_lock(&t->lock);
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_relaxed);
  uint64_t i = mix(st->id) & cur->mask;
  while (atomic_load_explicit(&cur->slot[i], memory_order_relaxed) != st) i = (i + 1) & cur->mask;
  /* seq_cst: ordered before the grace period's reads of the call counters
   * (scheduler/grace.c). */
  atomic_store_explicit(&cur->slot[i], TOMB, memory_order_seq_cst);
  t->tombs++;
  atomic_store_explicit(&t->count, atomic_load_explicit(&t->count, memory_order_relaxed) - 1, memory_order_relaxed);
  pthread_mutex_unlock(&t->lock);
}

void ruda__streams_republish(ruda__stream_table *t, ruda__stream *st) {
  pthread_mutex_lock(&t->lock);
  /* Without memory for a bigger table it goes in anyway: a table is never
   * full (rebuilt at half), so one more stream fits. */
  if (!insert(t, st)) {
    ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_relaxed);
    if (place(cur, st)) t->tombs--;
    atomic_store_explicit(&t->count, atomic_load_explicit(&t->count, memory_order_relaxed) + 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&t->lock);
}

int ruda__streams_free_retired(ruda__stream_table *t) {
  pthread_mutex_lock(&t->lock);
  ruda__stream_slots **link = &t->retired;
  while (*link != NULL) {
    ruda__stream_slots *r = *link;
    if (ruda__grace_passed(&t->grace, r->grace)) {
      *link = r->prev_retired;
      free(r);
    } else {
      link = &r->prev_retired;
    }
  }
  const int left = t->retired != NULL;
  pthread_mutex_unlock(&t->lock);
  return left;
}

ruda__stream *ruda__streams_find(ruda__stream_table *t, ruda_stream_id id) {
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_acquire);
  return cur != NULL ? find(cur, id) : NULL;
}

ruda__stream *ruda__streams_add(ruda__stream_table *t, ruda__stream *st) {
  pthread_mutex_lock(&t->lock);
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_relaxed);
  ruda__stream *had = cur ? find(cur, st->id) : NULL;
  if (had == NULL && cur != NULL) {
    if (insert(t, st)) {
      atomic_fetch_add_explicit(&t->records, 1, memory_order_relaxed);
      had = st;
    }
  }
  pthread_mutex_unlock(&t->lock);
  return had;
}

void ruda__streams_each(ruda__stream_table *t, void (*fn)(ruda__stream *, void *), void *arg) {
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_acquire);
  if (cur == NULL) return;
  for (uint64_t i = 0; i <= cur->mask; i++) {
    ruda__stream *st = atomic_load_explicit(&cur->slot[i], memory_order_acquire);
    if (st != NULL && st != TOMB) fn(st, arg);
  }
}

uint64_t ruda__streams_capacity(ruda__stream_table *t) {
  return atomic_load_explicit(&t->current, memory_order_acquire)->mask + 1;
}

typedef struct list_arg {
  ruda_stream_id *ids;
  size_t cap, n;
} list_arg;

static void list_one(ruda__stream *st, void *p) {
  list_arg *a = p;
  if (atomic_load_explicit(&st->retired, memory_order_acquire)) return;
  if (a->n < a->cap) a->ids[a->n] = st->id;
  a->n++;
}

size_t ruda__streams_list(ruda__stream_table *t, ruda_stream_id *ids, size_t cap) {
  list_arg a = {ids, ids ? cap : 0, 0};
  ruda__streams_each(t, list_one, &a);
  return a.n;
}

ruda__stream *ruda__stream_private(ruda_stream_id id, ruda__lane *l) {
  ruda__stream *s = ruda__stream_alloc();
  if (s == NULL) return NULL;
  s->id = id;
  s->worker = l->worker;
  s->lane = l;
  pthread_mutex_init(&s->err_lock, NULL);
  return s;
}

void ruda__stream_private_free(struct ruda__sched *sch, ruda__stream *s, const char *what) {
  if (s == NULL) return;
  for (ruda_error *e = s->err_head; e != NULL; e = e->next)
    ruda__log(sch->cfg.log_level, RUDA_LOG_WARN, "%s failed: %s", what, e->msg);
  ruda_error_free(s->err_head);
  pthread_mutex_destroy(&s->err_lock);
  free(s);
}

void ruda__stream_free(ruda__stream *st) {
  free(st->until);
  ruda__capture_free(atomic_load(&st->cap));
  ruda_error_free(st->err_head);
  ruda__thread_life_put(st->life);
  pthread_mutex_destroy(&st->err_lock);
  free(st);
}

static void free_stream(ruda__stream *st, void *unused) {
  (void)unused;
  ruda__stream_free(st);
}

void ruda__streams_destroy(ruda__stream_table *t) {
  ruda__streams_each(t, free_stream, NULL); /* pending ones too: close unpended them */
  free(atomic_load(&t->current));
  for (ruda__stream_slots *r = t->retired; r != NULL;) {
    ruda__stream_slots *p = r->prev_retired;
    free(r);
    r = p;
  }
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->reap_lock);
  /* Threads' stream caches name this device's serial, which no later
   * device has (scheduler/stream.c): nothing to invalidate. */
}

/* stream.c - the stream table and per-stream error queues.
 *
 * Lookups happen on every call, inserts once per new stream id, so the
 * table is an open-addressing hash whose slots are published with release
 * stores and read with acquire loads: readers take no lock. Inserts and
 * removals take the table mutex. A removed stream (a retired thread's,
 * scheduler/stream_exit.c) leaves a tombstone that probes pass over and
 * inserts reuse. When live streams and tombstones pass half the slots, a
 * table sized for the live ones is built and published; the old one is
 * kept until a grace period passed, because a reader may still be probing
 * it (ruda__streams_free_retired).
 *
 * A thread-local cache remembers the last stream a thread used, so the
 * common case - a thread using its own stream - costs one comparison.
 */
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "scheduler/sched.h"
#include "scheduler/graph.h"
#include "base/log.h"

typedef struct ruda__stream_slots {
  uint64_t mask;
  struct ruda__stream_slots *prev_retired;
  uint64_t grace; /* once replaced: the half-periods completed by then */
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
  atomic_init(&t->halves, 0);
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
    cur->grace = atomic_load_explicit(&t->halves, memory_order_seq_cst);
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
   * (scheduler/stream_exit.c). */
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
  const uint64_t now = atomic_load_explicit(&t->halves, memory_order_relaxed);
  pthread_mutex_lock(&t->lock);
  ruda__stream_slots **link = &t->retired;
  while (*link != NULL) {
    ruda__stream_slots *r = *link;
    /* Stamped under the table lock, not reap_lock: a half-period under
     * way then may have begun before the table was replaced, so the two
     * after it count. */
    if (now >= r->grace + 3) {
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

/* This thread's own stream id and the last stream it looked up, read on
 * every call: initial-exec where the build allows it (base/tls.h). */
static __thread struct {
  uint64_t serial; /* device of the cached stream; 0: none */
  ruda_stream_id id;
  ruda__stream *stream;
  ruda_stream_id current; /* this thread's RUDA_STREAM_CURRENT; 0: not yet numbered */
} cache RUDA__TLS_HOT;

static _Atomic uint64_t next_thread_stream = 1;

static ruda_stream_id number_thread_stream(void) {
  return cache.current = (1ull << 63) | atomic_fetch_add_explicit(&next_thread_stream, 1, memory_order_relaxed);
}

ruda_stream_id ruda_stream_current(void) {
  ruda_stream_id id = cache.current;
  return __builtin_expect(id != 0, 1) ? id : number_thread_stream();
}

static ruda__stream *create(struct ruda__sched *sch, ruda_stream_id id) {
  ruda__stream_table *t = &sch->streams;
  pthread_mutex_lock(&t->lock);
  ruda__stream_slots *cur = atomic_load_explicit(&t->current, memory_order_relaxed);
  ruda__stream *st = cur ? find(cur, id) : NULL;
  if (st != NULL || cur == NULL) goto out;
  st = ruda__stream_alloc();
  if (st == NULL) goto out;
  st->id = id;
  st->worker = &sch->workers[(id & ~(1ull << 63)) % sch->nworkers];
  pthread_mutex_init(&st->err_lock, NULL);
  /* The calling thread's own stream: retired once the thread exits. */
  if (id == cache.current && id > RUDA_STREAM_EXPLICIT_MAX) st->life = ruda__thread_life_get();
  if (!insert(t, st)) {
    ruda__thread_life_put(st->life);
    pthread_mutex_destroy(&st->err_lock);
    free(st);
    st = NULL;
    goto out;
  }
  atomic_fetch_add_explicit(&t->records, 1, memory_order_relaxed);
out:
  pthread_mutex_unlock(&t->lock);
  return st;
}

/* The table behind a cache miss, out of line so that the hit path keeps
 * few registers live. */
static __attribute__((noinline)) ruda__stream *stream_miss(struct ruda__sched *sch, ruda_stream_id id) {
  ruda__stream_slots *cur = atomic_load_explicit(&sch->streams.current, memory_order_acquire);
  ruda__stream *st = find(cur, id);
  if (st == NULL) {
    st = create(sch, id);
    /* Threads that come and go (one per connection) retire the streams
     * of those gone, every sixteenth new thread. */
    if (st != NULL && st->life != NULL &&
        (atomic_fetch_add_explicit(&sch->streams.thread_creations, 1, memory_order_relaxed) & 15) == 15)
      ruda__streams_reap(sch);
  }
  /* Another thread's own stream is never cached: it may be freed once
   * its thread exited and this call returned. */
  if (st != NULL && (st->life == NULL || id == cache.current)) {
    cache.serial = sch->serial;
    cache.id = id;
    cache.stream = st;
  }
  return st;
}

ruda__stream *ruda__stream_get(struct ruda__sched *sch, ruda_stream_id id) {
  if (id == RUDA_STREAM_CURRENT) id = cache.current ? cache.current : number_thread_stream();
  if (__builtin_expect(cache.serial == sch->serial && cache.id == id, 1)) return cache.stream;
  return stream_miss(sch, id);
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

ruda__stream *ruda__stream_for(struct ruda__sched *sch, ruda_stream_id id, const char *fn, int *rc) {
  if (id != RUDA_STREAM_CURRENT && id > RUDA_STREAM_EXPLICIT_MAX) {
    /* A thread's own stream that exists (ruda_stream_ids lists it) may be
     * named by its id, from any thread: how errors left on the stream of a
     * thread that exited are drained. Unknown reserved ids are refused. */
    ruda__stream *st = find(atomic_load_explicit(&sch->streams.current, memory_order_acquire), id);
    if (st != NULL && !atomic_load_explicit(&st->retired, memory_order_acquire)) return st;
    *rc = ruda__fail(RUDA_EINVAL,
                     "%s: stream id %llu is reserved (explicit ids are below 2^63; a thread's own stream "
                     "is named by RUDA_STREAM_CURRENT, or by its id while ruda_stream_ids lists it)",
                     fn, (unsigned long long)id);
    return NULL;
  }
  ruda__stream *s = ruda__stream_get(sch, id);
  if (s == NULL) *rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory creating stream", fn);
  return s;
}

ruda__stream *ruda__stream_private(ruda_stream_id id, ruda__worker *w) {
  ruda__stream *s = ruda__stream_alloc();
  if (s == NULL) return NULL;
  s->id = id;
  s->worker = w;
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

void ruda__stream_forget_thread(void) {
  cache.serial = 0;
  cache.current = 0;
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
  /* Invalidate this thread's cache; other threads compare the serial. */
  cache.serial = 0;
}

void ruda__stream_push_error(ruda__stream *s, ruda_error *err) {
  /* The count changes under the lock with the list: a drain between the
   * two would take an error it does not count (and drop it when it counts
   * none), leaving a count with no error behind. */
  pthread_mutex_lock(&s->err_lock);
  if (err == NULL) {
    atomic_fetch_add_explicit(&s->lost, 1, memory_order_relaxed);
  } else {
    err->next = NULL;
    if (s->err_tail) s->err_tail->next = err;
    else s->err_head = err;
    s->err_tail = err;
  }
  atomic_fetch_add_explicit(&s->nerr, 1, memory_order_release);
  pthread_mutex_unlock(&s->err_lock);
}

/* An error's message as a summary quotes it: whole words, with " ..."
 * where it had to be cut to fit room bytes. */
static const char *excerpt_of(const char *m, char *buf, size_t room) {
  size_t n = strlen(m);
  if (n < room) return m;
  n = room > 5 ? room - 5 : 0;
  while (n > 0 && m[n] != ' ') n--;
  snprintf(buf, room, "%.*s ...", (int)n, m);
  return buf;
}

int ruda__stream_drain(struct ruda__sched *sch, ruda__stream *s, ruda_error **out) {
  if (out) *out = NULL;
  int faulted = atomic_load_explicit(&sch->faulted, memory_order_acquire);
  if (atomic_load_explicit(&s->nerr, memory_order_acquire) == 0 && !faulted) return 0;
  pthread_mutex_lock(&s->err_lock);
  ruda_error *list = s->err_head;
  uint32_t n = atomic_exchange(&s->nerr, 0);
  uint64_t lost = atomic_exchange(&s->lost, 0);
  s->err_head = s->err_tail = NULL;
  pthread_mutex_unlock(&s->err_lock);
  if (n == 0 && !faulted) return 0;

  /* The stream that saw the fault first holds its report among its own
   * errors: the summary then points there instead of repeating it. */
  int fault_below = 0;
  for (const ruda_error *e = list; faulted && sch->fault && e != NULL && !fault_below; e = e->next)
    fault_below = strstr(e->msg, sch->fault->msg) != NULL;
  const char *faulted_is = fault_below ? "; the device is faulted (the first report is among these errors)"
                                       : "; the device is faulted: ";
  /* The thread's last error says it too, as for any failed call. */
  char excerpt[RUDA__MSG_MAX], first[RUDA__MSG_MAX];
  const int quote_fault = faulted && sch->fault != NULL && !fault_below;
  ruda__fail(RUDA_EUNHEALTHY, "%s is unhealthy: %u error%s%s%s (first: %s)", RUDA__SNAME(s->id), n,
             n == 1 ? "" : "s", faulted ? faulted_is : "", quote_fault ? excerpt_of(sch->fault->msg, excerpt, 160) : "",
             list ? excerpt_of(list->msg, first, 200) : "not recorded");
  if (out == NULL) {
    ruda_error_free(list);
    return RUDA_EUNHEALTHY;
  }
  ruda_error *sum = ruda__error_new(
      RUDA_EUNHEALTHY, 0, "%s is unhealthy: %u error%s%s%s", RUDA__SNAME(s->id),
      n, n == 1 ? "" : "s", faulted ? faulted_is : "",
      quote_fault ? excerpt_of(sch->fault->msg, excerpt, RUDA__MSG_MAX - 128) : "");
  ruda_error *l = NULL;
  if (sum != NULL && lost > 0)
    l = ruda__error_new(RUDA_ENOMEM, 0,
                        "%llu further error%s on %s could not be recorded "
                        "(host memory exhausted)",
                        (unsigned long long)lost, lost == 1 ? "" : "s", RUDA__SNAME(s->id));
  if (lost > 0 && l == NULL) {
    /* Nothing to tell the losses with now: they stay counted, for the
     * next drain, rather than vanish with this one. */
    pthread_mutex_lock(&s->err_lock);
    atomic_fetch_add_explicit(&s->lost, lost, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->nerr, (uint32_t)lost, memory_order_release);
    pthread_mutex_unlock(&s->err_lock);
  }
  if (sum == NULL) { /* hand back the list itself rather than nothing */
    *out = list;
    return RUDA_EUNHEALTHY;
  }
  sum->stream = s->id;
  if (l != NULL) {
    l->next = list;
    list = l;
  }
  sum->cause = list;
  *out = sum;
  return RUDA_EUNHEALTHY;
}

void ruda__sched_fault(ruda__sched *sch, ruda_error *err) {
  ruda_error *expected = NULL;
  /* First fault wins; later ones are the same poisoned context. */
  if (err != NULL && __atomic_compare_exchange_n(&sch->fault, &expected, err, 0, __ATOMIC_ACQ_REL,
                                                 __ATOMIC_ACQUIRE)) {
    atomic_store_explicit(&sch->faulted, 1, memory_order_release);
    return;
  }
  atomic_store_explicit(&sch->faulted, 1, memory_order_release);
  ruda_error_free(err);
}

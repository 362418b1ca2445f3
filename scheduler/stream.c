/* stream.c - finding and making a device's streams, threads' own
 * streams, and per-stream error queues.
 *
 * A thread-local cache remembers the last stream a thread used, so the
 * common case - a thread using its own stream - costs one comparison; a
 * miss looks in the table (scheduler/stream_table.c) and makes the stream
 * when it is new. Making a thread's stream now and then retires those of
 * threads gone (scheduler/stream_exit.c).
 */
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "scheduler/sched.h"
#include "base/log.h"

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
  ruda__stream *st = ruda__stream_alloc();
  if (st == NULL) return NULL;
  st->id = id;
  st->lane = ruda__lane_of(sch, id);
  st->worker = st->lane->worker;
  pthread_mutex_init(&st->err_lock, NULL);
  /* The calling thread's own stream: retired once the thread exits. */
  if (id == cache.current && id > RUDA_STREAM_EXPLICIT_MAX) st->life = ruda__thread_life_get();
  ruda__stream *had = ruda__streams_add(&sch->streams, st);
  if (had != st) { /* another thread made it first, or no memory */
    ruda__thread_life_put(st->life);
    pthread_mutex_destroy(&st->err_lock);
    free(st);
    return had;
  }
  /* Threads that come and go (one per connection) retire the streams of
   * those gone where streams are made, every sixteenth new thread's: a
   * lookup never reaps. */
  if (st->life != NULL &&
      (atomic_fetch_add_explicit(&sch->streams.thread_creations, 1, memory_order_relaxed) & 15) == 15)
    ruda__streams_reap(sch);
  return st;
}

/* The table behind a cache miss, out of line so that the hit path keeps
 * few registers live. */
static __attribute__((noinline)) ruda__stream *stream_miss(struct ruda__sched *sch, ruda_stream_id id) {
  ruda__stream *st = ruda__streams_find(&sch->streams, id);
  if (st == NULL) st = create(sch, id);
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

/* A thread's own stream that exists (ruda_stream_ids lists it) may be
 * named by its id, from any thread: how errors left on the stream of a
 * thread that exited are drained. Unknown reserved ids are refused. Out of
 * line: explicit ids and RUDA_STREAM_CURRENT keep the short path. */
static __attribute__((noinline)) ruda__stream *stream_by_thread_id(struct ruda__sched *sch, ruda_stream_id id,
                                                                   const char *fn, int *rc) {
  ruda__stream *st = ruda__streams_find(&sch->streams, id);
  if (st != NULL && !atomic_load_explicit(&st->retired, memory_order_acquire)) return st;
  /* Busy while it waits for its grace period (a begin accepted as it
   * retired): back now. Or the reaper put it back between the find and
   * the reclaim: a second find sees it. */
  if ((st = ruda__streams_reclaim(sch, id)) != NULL) return st;
  st = ruda__streams_find(&sch->streams, id);
  if (st != NULL && !atomic_load_explicit(&st->retired, memory_order_acquire)) return st;
  *rc = ruda__fail(RUDA_EINVAL,
                   "%s: stream id %llu is reserved (explicit ids are below 2^63; a thread's own stream "
                   "is named by RUDA_STREAM_CURRENT, or by its id while ruda_stream_ids lists it)",
                   fn, (unsigned long long)id);
  return NULL;
}

ruda__stream *ruda__stream_for(struct ruda__sched *sch, ruda_stream_id id, const char *fn, int *rc) {
  if (id != RUDA_STREAM_CURRENT && id > RUDA_STREAM_EXPLICIT_MAX) return stream_by_thread_id(sch, id, fn, rc);
  ruda__stream *s = ruda__stream_get(sch, id);
  if (s == NULL) *rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory creating stream", fn);
  return s;
}

/* The calling thread's stream cache forgets its own stream and id (its
 * thread-exit hook): a later call on this thread makes a new stream. */
static void forget_thread(void) {
  cache.serial = 0;
  cache.current = 0;
}

/* Threads' life records: a thread-exit hook (a pthread key destructor)
 * marks the record exited; it touches no device, so it is safe after the
 * device closed. */
static pthread_key_t life_key;
static pthread_once_t life_once = PTHREAD_ONCE_INIT;
static int life_key_made;
static __thread struct ruda__thread_life *own_life;

static void thread_exited(void *p) {
  struct ruda__thread_life *life = p;
  /* A later destructor of this thread that calls ruda gets a new record
   * and a new stream (and this hook runs again for it), never this one
 * once it is freed. */
  own_life = NULL;
  /* Nor does it reach the stream it leaves here: its record is freed once
   * retired. */
  forget_thread();
  atomic_store_explicit(&life->exited, 1, memory_order_release);
  ruda__thread_life_put(life);
}

static void make_key(void) { life_key_made = pthread_key_create(&life_key, thread_exited) == 0; }

struct ruda__thread_life *ruda__thread_life_get(void) {
  if (own_life == NULL) {
    pthread_once(&life_once, make_key);
    if (!life_key_made) return NULL;
    struct ruda__thread_life *life = calloc(1, sizeof *life);
    if (life == NULL) return NULL;
    atomic_init(&life->refs, 1);
    if (pthread_setspecific(life_key, life) != 0) {
      free(life);
      return NULL;
    }
    own_life = life;
  }
  atomic_fetch_add_explicit(&own_life->refs, 1, memory_order_relaxed);
  return own_life;
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

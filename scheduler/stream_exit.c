/* stream_exit.c - the streams of threads that exited.
 *
 * A thread's own stream (RUDA_STREAM_CURRENT) outlives its thread: errors
 * left on it are drained by id, and its commands may still be queued. But
 * a server that runs a thread per connection must not keep each exited
 * thread's pages, nor list its stream for ever. So each such stream holds
 * a reference to its thread's life record, which a thread-exit hook (a
 * pthread key destructor) marks exited; the hook touches no device, so it
 * is safe after the device closed. Reaping then happens on the device's
 * side, when new threads' streams are made and in ruda_stream_ids: a
 * stream whose thread exited, whose worker has run every command pushed
 * before that was seen, with no error waiting, no capture, no open profile
 * and no live buffer, gives its pools' pages back to the arena (where the
 * next thread's stream takes them), hands its empty pools to the next
 * stream that needs some, and is retired. Its record (192 bytes) stays
 * until close: a call naming the id as it retires may still hold it.
 */
#include <stdlib.h>

#include "memory/pool.h"
#include "scheduler/sched.h"

struct ruda__thread_life {
  _Atomic int exited;
  _Atomic uint32_t refs; /* the thread's own, one per stream */
};

static pthread_key_t life_key;
static pthread_once_t life_once = PTHREAD_ONCE_INIT;
static int life_key_made;
static __thread struct ruda__thread_life *own_life;

static void thread_exited(void *p) {
  struct ruda__thread_life *life = p;
  /* A later destructor of this thread that calls ruda gets a new record
   * (and this hook runs again for it), never this one once it is freed. */
  own_life = NULL;
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

void ruda__thread_life_put(struct ruda__thread_life *life) {
  if (life != NULL && atomic_fetch_sub_explicit(&life->refs, 1, memory_order_acq_rel) == 1) free(life);
}

/* Under reap_lock: exit_ticket is written here only. */
static void reap_one(ruda__stream *st, void *arg) {
  struct ruda__sched *sch = arg;
  if (st->life == NULL || atomic_load_explicit(&st->retired, memory_order_relaxed) ||
      !atomic_load_explicit(&st->life->exited, memory_order_acquire))
    return;
  ruda__worker *w = st->worker;
  /* Every push the thread made happened before its exit was seen, so the
   * ticket count read now covers its commands. */
  if (st->exit_ticket == 0) st->exit_ticket = atomic_load_explicit(&w->tickets, memory_order_seq_cst) + 1;
  if (atomic_load_explicit(&w->done, memory_order_acquire) + 1 < st->exit_ticket) return;
  if (atomic_load_explicit(&st->nerr, memory_order_acquire) != 0 ||
      atomic_load_explicit(&st->capturing, memory_order_acquire))
    return;
  pthread_mutex_lock(&st->err_lock);
  const int profiling = st->profiles != NULL;
  pthread_mutex_unlock(&st->err_lock);
  if (profiling) return;
  ruda__pools *p = atomic_load_explicit(&st->pools, memory_order_acquire);
  if (p != NULL && ruda__pools_give_back(p) != 0) return; /* pages in use or behind a fence: later */
  /* The empty pools go to the next stream that needs some. */
  if (p != NULL && atomic_compare_exchange_strong_explicit(&st->pools, &p, NULL, memory_order_acq_rel,
                                                           memory_order_relaxed) &&
      !ruda__pools_recycle(sch->memory, p))
    atomic_store_explicit(&st->pools, p, memory_order_release);
  atomic_store_explicit(&st->retired, 1, memory_order_release);
}

void ruda__streams_reap(struct ruda__sched *sch) {
  if (pthread_mutex_trylock(&sch->streams.reap_lock) != 0) return;
  ruda__streams_each(&sch->streams, reap_one, sch);
  pthread_mutex_unlock(&sch->streams.reap_lock);
}

/* stream_exit.c - the streams of threads that exited.
 *
 * A thread's own stream (RUDA_STREAM_CURRENT) outlives its thread: errors
 * left on it are drained by id, and its commands may still be queued. But
 * a server that runs a thread per connection must not keep each exited
 * thread's pages, nor list its stream for ever. So each such stream holds
 * a reference to its thread's life record, which a thread-exit hook
 * (scheduler/stream.c) marks exited. Reaping then happens on the device's
 * side, where new threads' streams are made and in ruda_stream_ids: a
 * stream whose thread exited, whose worker has run every command pushed
 * before that was seen, with no error waiting, no capture, no open profile
 * and no live buffer, gives its pools' pages back to the arena (where the
 * next thread's stream takes them), hands its empty pools to the next
 * stream that needs some, and is retired: taken out of the stream table.
 *
 * Its record is freed after a grace period (scheduler/grace.h), since a
 * call that named the id as it retired may still hold it. Nobody blocks:
 * the reaper tries again at its next run. What those calls pushed is then
 * waited for through every worker's tickets, and a record that a racing
 * call made busy again (an error, a capture, a future, a page) goes back
 * into the table instead.
 *
 * Calls only the stream table (scheduler/stream_table.c), the grace
 * periods and memory's pools: never stream.c, which calls it.
 */
#include <stdlib.h>

#include "memory/pool.h"
#include "scheduler/sched.h"

/* The stream is idle and holds nothing a client could still want. Under
 * reap_lock, once the worker ran everything up to exit_ticket. */
static int quiet(ruda__stream *st) {
  if (atomic_load_explicit(&st->nerr, memory_order_acquire) != 0 ||
      atomic_load_explicit(&st->capturing, memory_order_acquire) ||
      atomic_load_explicit(&st->holders, memory_order_acquire) != 0)
    return 0;
  pthread_mutex_lock(&st->err_lock);
  const int profiling = st->profiles != NULL;
  pthread_mutex_unlock(&st->err_lock);
  return !profiling;
}

/* Gives the stream's pages back and its empty pools to the next stream
 * that needs some: 0 while it has pages in use or behind a fence. */
static int give_back(struct ruda__sched *sch, ruda__stream *st) {
  ruda__pools *p = atomic_load_explicit(&st->pools, memory_order_acquire);
  if (p != NULL && ruda__pools_give_back(p) != 0) return 0;
  /* Pools recycle refuses stay memory's (freed at close), empty. */
  if (p != NULL && atomic_compare_exchange_strong_explicit(&st->pools, &p, NULL, memory_order_acq_rel,
                                                           memory_order_relaxed))
    ruda__pools_recycle(sch->memory, p);
  return 1;
}

/* The worker ran every command pushed before exit_ticket was taken (taken
 * now when 0). */
static int worker_past(ruda__stream *st) {
  ruda__worker *w = st->worker;
  if (st->exit_ticket == 0) st->exit_ticket = atomic_load_explicit(&w->tickets, memory_order_seq_cst) + 1;
  return atomic_load_explicit(&w->done, memory_order_acquire) + 1 >= st->exit_ticket;
}

/* Under reap_lock: exit_ticket and the pending list are written here only. */
static void reap_one(ruda__stream *st, void *arg) {
  struct ruda__sched *sch = arg;
  if (st->life == NULL || atomic_load_explicit(&st->retired, memory_order_relaxed) ||
      !atomic_load_explicit(&st->life->exited, memory_order_acquire))
    return;
  /* Every push the thread made happened before its exit was seen, so the
   * ticket count read now covers its commands. */
  if (!worker_past(st) || !quiet(st) || !give_back(sch, st)) return;
  atomic_store_explicit(&st->retired, 1, memory_order_release);
  ruda__streams_unpublish(&sch->streams, st);
  st->grace = ruda__grace_stamp(&sch->streams.grace, 1); /* under reap_lock */
  st->pending_next = sch->streams.pending;
  sch->streams.pending = st;
}

/* Every worker ran what was pushed to it once st's grace period passed:
 * the commands of the calls that found st (taken now when not yet). */
static int workers_past(struct ruda__sched *sch, ruda__stream *st) {
  if (st->until == NULL) {
    st->until = malloc(sch->nworkers * sizeof *st->until);
    if (st->until == NULL) return 0; /* next time */
    for (uint32_t i = 0; i < sch->nworkers; i++)
      st->until[i] = atomic_load_explicit(&sch->workers[i].tickets, memory_order_seq_cst);
  }
  for (uint32_t i = 0; i < sch->nworkers; i++)
    if (atomic_load_explicit(&sch->workers[i].done, memory_order_acquire) < st->until[i]) return 0;
  return 1;
}

/* Frees the pending records whose grace period passed and that stayed
 * quiet; puts back those a racing call made busy. */
static void settle(struct ruda__sched *sch) {
  ruda__stream_table *t = &sch->streams;
  for (ruda__stream **link = &t->pending; *link != NULL;) {
    ruda__stream *st = *link;
    if (!ruda__grace_passed(&t->grace, st->grace) || !workers_past(sch, st)) {
      link = &st->pending_next;
      continue;
    }
    *link = st->pending_next;
    if (quiet(st) && give_back(sch, st)) {
      ruda__stream_free(st);
      atomic_fetch_sub_explicit(&t->records, 1, memory_order_relaxed);
    } else {
      free(st->until);
      st->until = NULL;
      st->exit_ticket = 0;
      atomic_store_explicit(&st->retired, 0, memory_order_release);
      ruda__streams_republish(t, st);
    }
  }
}

void ruda__streams_reap(struct ruda__sched *sch) {
  ruda__stream_table *t = &sch->streams;
  if (pthread_mutex_trylock(&t->reap_lock) != 0) return;
  ruda__streams_each(t, reap_one, sch);
  const int tables = ruda__streams_free_retired(t);
  if (t->pending != NULL || tables) ruda__grace_advance(&t->grace);
  settle(sch);
  ruda__streams_free_retired(t);
  pthread_mutex_unlock(&t->reap_lock);
}

void ruda__streams_unpend(struct ruda__sched *sch) {
  ruda__stream_table *t = &sch->streams;
  pthread_mutex_lock(&t->reap_lock);
  while (t->pending != NULL) {
    ruda__stream *st = t->pending;
    t->pending = st->pending_next;
    atomic_store_explicit(&st->retired, 0, memory_order_release);
    ruda__streams_republish(t, st);
  }
  pthread_mutex_unlock(&t->reap_lock);
}

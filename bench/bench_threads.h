/* bench_threads.h - the client threads of a timed run, started together:
 * each warms up, then waits on the run's start barrier; the barrier's
 * release is the start of the timing. Include bench_check.h (for die)
 * before this one. */
#ifndef RUDA_BENCH_THREADS_H
#define RUDA_BENCH_THREADS_H

#include <pthread.h>
#include <stdint.h>

#include "bench/bench_clock.h"

#define BENCH_MAX_THREADS 1024

/* Runs fn on n threads (1..BENCH_MAX_THREADS), thread i given
 * (char *)args + i * arg_size, and joins them. go is made here for n + 1 (the threads wait on it once
 * warmed up, this thread arrives last) and destroyed after the joins.
 * Returns when every thread ended, with the time go released them. */
static inline uint64_t bench_threads_run(pthread_barrier_t *go, int n, void *(*fn)(void *), void *args,
                                         size_t arg_size) {
  pthread_t t[BENCH_MAX_THREADS];
  if (n < 1 || n > BENCH_MAX_THREADS) die("bench_threads_run: thread count", RUDA_EINVAL);
  pthread_barrier_init(go, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++)
    if (pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * arg_size) != 0) die("pthread_create", RUDA_EINVAL);
  pthread_barrier_wait(go);
  const uint64_t t0 = mono_ns();
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(go);
  return t0;
}

#endif /* RUDA_BENCH_THREADS_H */

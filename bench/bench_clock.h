/* bench_clock.h - the benchmarks' clock and the ordering their latency
 * percentiles sort by. */
#ifndef RUDA_BENCH_CLOCK_H
#define RUDA_BENCH_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* qsort comparator for uint64_t, ascending. */
static inline int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

#endif /* RUDA_BENCH_CLOCK_H */

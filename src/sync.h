/* sync.h - futex-based sleeping for workers, futures and backpressure.
 *
 * Concurrency Kit's event count (ck_ec) gives wake-ups that are never lost;
 * it needs the OS wait/wake primitive supplied, which is Linux futex here.
 */
#ifndef RUDA_SYNC_H
#define RUDA_SYNC_H

#include <ck_ec.h>
#include <stdint.h>
#include <time.h>

extern const struct ck_ec_ops ruda__ec_ops;
/* Many threads increment (producers waking a worker). */
extern const struct ck_ec_mode ruda__ec_mp;

/* Sleeps while *addr == expected (spurious returns possible). */
void ruda__futex_wait(const uint32_t *addr, uint32_t expected);
/* Wakes every thread sleeping on addr. */
void ruda__futex_wake_all(const uint32_t *addr);

/* Monotonic nanoseconds. */
static inline uint64_t ruda__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void ruda__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

#endif /* RUDA_SYNC_H */

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

/* What padding keeps two threads' hot words apart. */
#define RUDA__CACHELINE 64

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

/* Polls done(arg) for up to ns nanoseconds; 1 as soon as it holds, 0 at
 * the deadline. For waits that usually end within microseconds, where a
 * futex sleep and wake-up would cost more than the wait. */
static inline void ruda__cpu_relax(void);
static inline int ruda__spin(int (*done)(const void *), const void *arg, uint64_t ns) {
  if (ns == 0) return done(arg);
  uint64_t until = ruda__now_ns() + ns;
  for (;;) {
    for (int i = 0; i < 32; i++) {
      if (done(arg)) return 1;
      ruda__cpu_relax();
    }
    if (ruda__now_ns() >= until) return done(arg);
  }
}

/* ruda__spin, for at most a quarter of the CPUs at once (process-wide,
 * workers and waiting clients together; RUDA_SPIN_SLOTS, read at the
 * first call, sets the count); past that it only checks once.
 * Polling pays while a CPU is free to do it; on a busy machine (many
 * request threads) it would take CPUs from the threads being waited for. */
int ruda__spin_bounded(int (*done)(const void *), const void *arg, uint64_t ns);

/* The same cap as a slot held across a wait of the caller's own (a
 * driver call that spins): 1 if taken, then ruda__spin_slot_give. */
int ruda__spin_slot_take(void);
void ruda__spin_slot_give(void);

/* Waits until done(arg) without holding a CPU: yields for the first 100 us,
 * asking done at most every 2 us, then sleeps in steps growing to 200 us.
 * For waiters that found no spin slot. Any thread. */
void ruda__poll_sleep(int (*done)(const void *), const void *arg);

static inline void ruda__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* liburcu (0.13) and Concurrency Kit implement their atomics in inline
 * assembly, which ThreadSanitizer cannot see. Where they are what orders
 * our plain accesses (a command built by a producer, read by the worker),
 * the happens-before edge is declared to TSan explicitly. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define RUDA__TSAN_RELEASE(p) __tsan_release((void *)(p))
#define RUDA__TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define RUDA__TSAN_RELEASE(p) ((void)(p))
#define RUDA__TSAN_ACQUIRE(p) ((void)(p))
#endif

#endif /* RUDA_SYNC_H */

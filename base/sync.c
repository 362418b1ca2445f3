/* sync.c - futex wait/wake and the ck_ec operations built on them. */

#include "base/sync.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/parse.h"

static long futex(const uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

void ruda__futex_wait(const uint32_t *addr, uint32_t expected) {
  futex(addr, FUTEX_WAIT_PRIVATE, expected, NULL);
}

void ruda__futex_wake_all(const uint32_t *addr) {
  futex(addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
}

static int ec_gettime(const struct ck_ec_ops *ops, struct timespec *out) {
  (void)ops;
  return clock_gettime(CLOCK_MONOTONIC, out);
}

/* ck_ec hands an absolute CLOCK_MONOTONIC deadline; FUTEX_WAIT wants a
 * relative timeout. */
static void ec_wait32(const struct ck_ec_wait_state *state, const uint32_t *addr,
                      uint32_t expected, const struct timespec *deadline) {
  (void)state;
  struct timespec rel, *relp = NULL;
  if (deadline != NULL) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ns = (long long)(deadline->tv_sec - now.tv_sec) * 1000000000ll +
                   (deadline->tv_nsec - now.tv_nsec);
    if (ns <= 0) return;
    rel.tv_sec = (time_t)(ns / 1000000000ll);
    rel.tv_nsec = (long)(ns % 1000000000ll);
    relp = &rel;
  }
  futex(addr, FUTEX_WAIT_PRIVATE, expected, relp);
}

static void ec_wake32(const struct ck_ec_ops *ops, const uint32_t *addr) {
  (void)ops;
  ruda__futex_wake_all(addr);
}

const struct ck_ec_ops ruda__ec_ops = {
    .gettime = ec_gettime,
    .wait32 = ec_wait32,
    .wake32 = ec_wake32,
    /* A short spin catches producers that are about to push again. */
    .busy_loop_iter = 64,
};

const struct ck_ec_mode ruda__ec_mp = {.ops = &ruda__ec_ops, .single_producer = false};

static _Atomic uint32_t spinning;
static _Atomic uint32_t spin_cap;

int ruda__spin_slot_take(void) {
  uint32_t cap = atomic_load_explicit(&spin_cap, memory_order_relaxed);
  if (cap == 0) { /* racing first callers compute the same value */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cap = n >= 8 ? (uint32_t)(n / 4) : 1;
    const char *v = getenv("RUDA_SPIN_SLOTS");
    uint64_t x;
    if (v != NULL && *v != '\0') {
      if (ruda__parse_u64(v, 1u << 16, &x) == 0 && x > 0) cap = (uint32_t)x;
      else fprintf(stderr, "ruda: ignoring malformed RUDA_SPIN_SLOTS (a count from 1)\n");
    }
    atomic_store_explicit(&spin_cap, cap, memory_order_relaxed);
  }
  if (atomic_fetch_add_explicit(&spinning, 1, memory_order_relaxed) < cap) return 1;
  atomic_fetch_sub_explicit(&spinning, 1, memory_order_relaxed);
  return 0;
}

void ruda__spin_slot_give(void) { atomic_fetch_sub_explicit(&spinning, 1, memory_order_relaxed); }

int ruda__spin_bounded(int (*done)(const void *), const void *arg, uint64_t ns) {
  if (ns == 0 || !ruda__spin_slot_take()) return done(arg);
  int r = ruda__spin(done, arg, ns);
  ruda__spin_slot_give();
  return r;
}

void ruda__poll_sleep(int (*done)(const void *), const void *arg) {
  /* Yield first (a thread we wait for may want this CPU), asking at most
   * every 2 us: each ask is a driver query under the lock every issuing
   * thread needs. Then sleep in growing steps up to 200 us: the wait's
   * extra latency stays within about a step of its length. */
  const uint64_t start = ruda__now_ns();
  uint64_t next = start;
  long step = 5000;
  for (;;) {
    const uint64_t now = ruda__now_ns();
    if (now - start < 100000) {
      if (now >= next) {
        if (done(arg)) return;
        next = now + 2000;
      }
      sched_yield();
      continue;
    }
    if (done(arg)) return;
    struct timespec ts = {0, step};
    nanosleep(&ts, NULL);
    if (step < 200000) step *= 2;
  }
}

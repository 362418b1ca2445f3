/* grace.h - grace periods over a device's call slots (scheduler/grace.c),
 * after which nothing a public call could have found is still held.
 *
 * SRCU-style and per device: every public call counts itself in one of
 * two counters of its thread's call slot (src/device.h), picked by the
 * phase. The stream table and the reaper of exited threads' streams use
 * it to free what they took out of reach. A library does not own its
 * callers' threads, so no reader registers; and one device's close must
 * not wait on another's blocked call, so the periods are not process-wide.
 *
 * Three calls: stamp what was just taken out of reach, advance (the
 * reaper, now and then; never blocks), and ask whether the stamp's grace
 * period passed. Thread safety: stamp and passed on any thread; advance
 * under its owner's lock (one advance at a time).
 */
#ifndef RUDA_SCHEDULER_GRACE_H
#define RUDA_SCHEDULER_GRACE_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/sync.h"

/* Public calls in progress on a device, counted by the API layer
 * (src/device.h) in one of RUDA__CALL_SLOTS slots per calling thread (a
 * cache line each, so threads do not share one): ruda_device_close waits
 * until every slot reads zero. Two counters per slot, picked by the
 * phase, so that a grace period can wait for the calls that were in
 * progress without waiting for the ones that start meanwhile. */
#define RUDA__CALL_SLOTS 64
typedef struct ruda__call_slot {
  _Atomic unsigned long n[2];
  char pad[RUDA__CACHELINE - 2 * sizeof(unsigned long)];
} ruda__call_slot;

typedef struct ruda__grace {
  ruda__call_slot *calls;  /* the device's RUDA__CALL_SLOTS */
  _Atomic unsigned *phase; /* the device's: which counter new calls count in */
  _Atomic uint64_t halves; /* half-periods completed */
} ruda__grace;

/* The stamp of something taken out of reach just now, by a seq_cst store
 * (a table slot, a table pointer). advancing: the caller holds the lock
 * advance runs under, so no half-period is under way. Any thread. */
static inline uint64_t ruda__grace_stamp(ruda__grace *g, int advancing) {
  /* A half-period under way may have read some counters before the
   * removal: it does not count for this stamp. */
  return atomic_load_explicit(&g->halves, memory_order_seq_cst) + (advancing ? 0 : 1);
}

/* Completes up to two half-periods, each if every slot's counter of the
 * phase calls left reads zero. Under its owner's lock; never blocks. */
void ruda__grace_advance(ruda__grace *g);

/* Whether the grace period of stamp passed: every call that could have
 * found what was taken out of reach has returned. Any thread. */
int ruda__grace_passed(const ruda__grace *g, uint64_t stamp);

#endif /* RUDA_SCHEDULER_GRACE_H */

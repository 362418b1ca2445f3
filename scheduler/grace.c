/* grace.c - grace periods over a device's call slots (scheduler/grace.h).
 *
 * Why two half-periods after a stamp suffice. A half-period reads every
 * slot's counter of the phase new calls left, and completes when all read
 * zero; it then flips the phase, so that new calls count in the other
 * counter. A call increments its counter (seq_cst) before it looks at
 * anything; the removal is a seq_cst store; the reads are seq_cst. Take a
 * call that could find the removed thing: its increment came before the
 * removal in the single order, so before every read of the half-periods
 * that start after the stamp. If it counted in the phase the first such
 * half-period waits on, that one completes only once it has returned; if
 * in the other, the first half-period flipped to it and the second waits
 * on it. Either way it returned before the second completed. A call
 * counted after a read of its counter finds the thing gone. Nobody
 * blocks: a half-period that reads a nonzero counter waits for the next
 * advance.
 */
#include "scheduler/grace.h"

/* Half-periods in a grace period. */
#define GRACE_HALVES 2

/* One half-period, if every slot's counter of the phase calls left reads
 * zero: flips the phase. The removals before it are ordered before these
 * reads (seq_cst). */
static int half_period(ruda__grace *g) {
  atomic_thread_fence(memory_order_seq_cst);
  const unsigned ph = atomic_load_explicit(g->phase, memory_order_seq_cst) & 1;
  for (unsigned i = 0; i < RUDA__CALL_SLOTS; i++)
    if (atomic_load_explicit(&g->calls[i].n[ph ^ 1], memory_order_seq_cst) != 0) return 0;
  atomic_store_explicit(g->phase, ph ^ 1, memory_order_seq_cst);
  atomic_fetch_add_explicit(&g->halves, 1, memory_order_seq_cst);
  return 1;
}

void ruda__grace_advance(ruda__grace *g) {
  /* Two tries: the advancing call counts in one phase itself, so one
   * advance usually completes one half-period; the next the other. */
  for (int i = 0; i < GRACE_HALVES && half_period(g); i++) {
  }
}

int ruda__grace_passed(const ruda__grace *g, uint64_t stamp) {
  return atomic_load_explicit(&g->halves, memory_order_relaxed) >= stamp + GRACE_HALVES;
}

/* submit.h - the client's way into the scheduler: pin a command's
 * buffers, then push it on its stream's worker in order.
 *
 * Inline: every launch and copy passes here, and a call per buffer
 * argument would show in the caller's cost. Any client thread; nothing
 * here blocks, except a push under RUDA_BACKPRESSURE_BLOCK on a full
 * queue.
 */
#ifndef RUDA_SCHEDULER_SUBMIT_H
#define RUDA_SCHEDULER_SUBMIT_H

#include <pthread.h>
#include <stdio.h>

#include "base/error.h"
#include "base/sync.h"
#include "memory/handles.h"
#include "memory/pool.h"
#include "scheduler/sched.h"
#include "scheduler/order.h"
#include "scheduler/scheduler.h"

/* Drops the n pins of a command (RUDA__PIN_READ flags and all) that was
 * not submitted. Any client thread; non-blocking. */
static inline void ruda__unpin_all(struct ruda__sched *sch, const uint32_t *pins, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) ruda__handles_unpin(sch->handles, ruda__pin_slot(pins[i]), NULL);
}

/* Pins b's buffer and checks the range; on success *addr is the device
 * address of the binding's first byte and *len its size. */
/* what names the binding in error messages; index >= 0 appends a number
 * ("argument 3"). The label is built only on failure: launches pin every
 * buffer argument, and formatting it each time cost half the call. */
static inline const char *ruda__binding_label(char *buf, size_t n, const char *what, int index) {
  if (index < 0) return what;
  snprintf(buf, n, "%s %d", what, index);
  return buf;
}

/* o gathers the ordering the command needs after other streams' uses of
 * the buffer (scheduler/order.h); use says whether the command reads or
 * writes it (RUDA__USE_READ, RUDA__USE_WRITE). */
static inline int ruda__pin_binding(struct ruda__sched *sch, ruda__stream *s, ruda_binding b, const char *fn,
                                    const char *what, int index, uint64_t *addr, uint64_t *len, ruda__order *o,
                                    int hold, uint32_t use) {
  uint64_t base, size;
  ruda__slot *slot;
  _Atomic uint64_t *last;
  char lb[48];
  *addr = *len = 0; /* set on every path: callers read them only on success */
  /* Pinned for s's lane: a lane other than the buffer's home is
   * recorded, so the buffer's memory waits for it after a free. */
  if (ruda__handles_pin_use(sch->handles, b.handle, s->lane->index, hold, &base, &size, &slot, &last) != 0)
    return ruda__fail(RUDA_ENOTFOUND, "%s: %s handle {slot %u, gen %u} names no live buffer", fn,
                      ruda__binding_label(lb, sizeof lb, what, index), b.handle.slot, b.handle.gen);
  if ((base & RUDA__UNBACKED) && ruda__memory_back(sch->memory, atomic_load(&slot->mem), base, fn, &base) != 0) {
    ruda__handles_settle(slot);
    ruda__handles_unpin(sch->handles, b.handle.slot, NULL);
    return ruda_error_code(ruda_last_error());
  }
  uint64_t want = b.size ? b.size : (b.offset <= size ? size - b.offset : 0);
  if (b.offset > size || want > size - b.offset || want == 0) {
    ruda__handles_settle(slot);
    ruda__handles_unpin(sch->handles, b.handle.slot, NULL);
    return ruda__fail(RUDA_ERANGE,
                      "%s: %s binding offset %llu + size %llu is outside buffer {slot %u} of %llu bytes",
                      fn, ruda__binding_label(lb, sizeof lb, what, index), (unsigned long long)b.offset,
                      (unsigned long long)want, b.handle.slot,
                      (unsigned long long)size);
  }
  *addr = base + b.offset;
  *len = want;
  o->pend[o->npend++] = slot;
  ruda__order_note(o, last, b.handle.slot, b.handle.gen, s->lane, use);
  return 0;
}

/* RUDA_LAUNCH_BLOCKING: remembers the caller's stack in cmd (submit.c). */
void ruda__origin_capture(ruda__cmd *cmd);

/* Gives up n orders in reverse of their lock order (abandon unlocks). */
static inline __attribute__((always_inline)) void ruda__orders_abandon(ruda__order *o, uint32_t n) {
  for (uint32_t i = n; i-- > 0;) ruda__order_abandon(&o[i]);
}

/* Whether cmd may run in place by its stream's setting
 * (ruda_stream_set_in_place; RUDA__IN_PLACE_AUTO: when it looks like a
 * request loop). Counts the command towards the loop's window. */
static inline __attribute__((always_inline)) int ruda__stream_in_place(struct ruda__sched *sch, ruda__stream *s,
                                                                       const ruda__cmd *cmd) {
  const int mode = atomic_load_explicit(&s->in_place, memory_order_relaxed);
  int in_place = mode == RUDA__IN_PLACE_ON;
  if (mode == RUDA__IN_PLACE_AUTO && sch->auto_in_place) {
    /* A request loop waits for what it issued: no future left open but
     * this command's own, and a wait within the last few commands. Anything else (a thread issuing
     * back to back, requests in flight) gains from the hand-over. */
    uint32_t n = atomic_load_explicit(&s->since_wait, memory_order_relaxed);
    if (n < RUDA__IN_PLACE_RUN) atomic_store_explicit(&s->since_wait, n + 1, memory_order_relaxed);
    in_place = n < RUDA__IN_PLACE_RUN &&
               atomic_load_explicit(&s->unwaited, memory_order_relaxed) == (cmd->future != NULL);
  }
  return in_place;
}

/* Pushes cmd on s's worker, after whatever other streams' work its orders
 * say it must follow, and records its buffer uses (under their issue
 * locks: order.h). Every command a client builds passes here: it is
 * numbered, stamped for RUDA_TRACE, given its origin under
 * RUDA_LAUNCH_BLOCKING. A command whose uses do not fit one ruda__order
 * (a graph replay: its buffers in groups, then the graph's own record)
 * gives n orders, noted in one key order, locked, prepared and published
 * together. issue: a mutex the caller locked before noting the uses (at
 * least one), unlocked here once the command is published or given up,
 * and before it runs in place (NULL: none). in_place: the command may run
 * on this thread when its worker is idle (scheduler/inline.c); -1: as its
 * stream's setting says (ruda__stream_in_place). On failure the
 * orders are abandoned and cmd is still the caller's. */
static inline __attribute__((always_inline)) int ruda__submit_orders(struct ruda__sched *sch, ruda__stream *s,
                                                                     ruda__cmd *cmd, ruda__order *o, uint32_t n,
                                                                     pthread_mutex_t *issue, int in_place) {
  cmd->stream = s;
  cmd->seq = atomic_fetch_add_explicit(&s->seq, 1, memory_order_relaxed) + 1;
  if (__builtin_expect(sch->cfg.launch_blocking, 0)) ruda__origin_capture(cmd);
  if (__builtin_expect(atomic_load_explicit(&sch->tracing, memory_order_relaxed), 0))
    cmd->enq_ns = ruda__now_ns(); /* tracing: the submit time */
  if (cmd->kind == RUDA__CMD_LAUNCH) { /* the backend names it in fault reports */
    cmd->u.launch.stream = s->id;
    cmd->u.launch.seq = cmd->seq;
  }
  ruda__worker *w = s->worker;
  if (in_place < 0) in_place = ruda__stream_in_place(sch, s, cmd);
  if (n == 1 && o->nuse == 0) { /* no buffers, nothing to order (issue is NULL: see above) */
    if (__builtin_expect(!in_place, 1)) return ruda__queue_push(w, cmd);
    int rc = ruda__queue_admit_as(w, s->id, cmd->nowait);
    if (rc == 0 && !ruda__inline_run(w, cmd)) ruda__queue_push_admitted(w, cmd);
    return rc;
  }
  /* Admitted first: the wait for room (RUDA_BACKPRESSURE_BLOCK) happens
   * before the issue locks are taken, and a refused command leaves no
   * MARK or WAIT. */
  int rc = ruda__queue_admit_as(w, s->id, cmd->nowait);
  if (rc != 0) {
    ruda__orders_abandon(o, n);
    if (issue != NULL) pthread_mutex_unlock(issue);
    return rc;
  }
  for (uint32_t i = 0; i < n; i++) ruda__order_lock(&o[i], s->lane);
  for (uint32_t i = 0; i < n; i++)
    if (__builtin_expect(ruda__order_needed(&o[i]), 0) && (rc = ruda__order_prepare(sch, &o[i], s, cmd->seq)) != 0) {
      ruda__queue_unadmit(w); /* WAITs already pushed only order this stream more */
      ruda__orders_abandon(o, n);
      if (issue != NULL) pthread_mutex_unlock(issue);
      return rc;
    }
  /* In place: the ticket is claimed where the push would be, before the
   * publish; the command runs after the issue locks are released, so a
   * host kernel may issue commands on its own buffers or replay its own
   * graph (inline.c). A WAIT just pushed runs first either way: in place
   * needs the worker to have run everything queued. */
  ruda__exec_guard guard;
  const int claimed = __builtin_expect(in_place, 0) && ruda__inline_claim(w, cmd, &guard);
  if (!claimed) ruda__queue_push_admitted(w, cmd);
  for (uint32_t i = 0; i < n; i++) ruda__order_publish(&o[i], s->lane);
  if (issue != NULL) pthread_mutex_unlock(issue);
  if (claimed) ruda__inline_finish(w, cmd, &guard); /* no lock of ruda's held: cmd is freed */
  return 0;
}

/* ruda__submit_orders for a command whose buffers fit one order, run in
 * place as its stream's setting says (ruda__stream_in_place). */
static inline __attribute__((always_inline)) int ruda__submit(struct ruda__sched *sch, ruda__stream *s, ruda__cmd *cmd,
                                                        ruda__order *o) {
  return ruda__submit_orders(sch, s, cmd, o, 1, NULL, -1);
}

/* Pushes a control command (flush, sync, profile stamp) of kind on s,
 * outside the queue bound, with a new future in *out; drains: waiting on
 * it hands back the stream's errors. */
int ruda__push_control(struct ruda__sched *sch, ruda__stream *s, int kind, int drains, const char *fn,
                       ruda_future **out);

#endif /* RUDA_SCHEDULER_SUBMIT_H */

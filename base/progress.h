/* progress.h - how far each worker's work has got: the scheduler answers,
 * memory asks.
 *
 * Memory must know when a page that worker w's commands used may go to
 * another worker: once w's work pushed before the page was returned has
 * completed on the device. It asks through this narrow table, which the
 * scheduler implements (scheduler/progress.c) with fences: internal sync
 * commands on w's queue whose completion is polled. So memory never builds
 * a command, and the scheduler, which sits above memory, is never called
 * by name from below.
 *
 * Every operation may run on any thread, workers included, and never
 * blocks on the device.
 */
#ifndef RUDA_BASE_PROGRESS_H
#define RUDA_BASE_PROGRESS_H

#include <stdint.h>

typedef struct ruda__progress_ops {
  /* A fence on worker w after everything pushed to w so far; NULL when
   * host memory ran out (the caller tries again later). */
  void *(*fence_issue)(void *ctx, uint32_t w);
  /* 1 once w ran the fence (its later commands may still be queued). */
  int (*fence_reached)(void *ctx, void *fence);
  /* 1 once the fence completed on the device. */
  int (*fence_done)(void *ctx, void *fence);
  void (*fence_free)(void *ctx, void *fence);
  /* 1 when everything pushed to w is known complete without a fence (a
   * backend whose work is done once its worker ran it, w asleep with an
   * empty queue). */
  int (*idle)(void *ctx, uint32_t w);
  /* w's count of commands pushed so far (its tickets, scheduler/order.h). */
  uint32_t (*ticket)(void *ctx, uint32_t w);
  /* 1 once the device closes: workers drain, nothing is reused after. */
  int (*closing)(void *ctx);
} ruda__progress_ops;

typedef struct ruda__progress {
  const ruda__progress_ops *ops;
  void *ctx;
} ruda__progress;

static inline uint32_t ruda__progress_ticket(const ruda__progress *p, uint32_t w) {
  return p->ops->ticket(p->ctx, w);
}

#endif /* RUDA_BASE_PROGRESS_H */

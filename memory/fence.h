/* fence.h - memory's fences (memory/fence.c): per worker, the points
 * memory asked the scheduler to pass through the progress table
 * (base/progress.h) and how far the worker got. The arena and retired
 * buffers ask here whether a page may go to another worker. Every
 * function may run on any thread, workers included, and never waits for
 * the device; fence_lock (in ruda__memory) is taken inside.
 */
#ifndef RUDA_MEMORY_FENCE_H
#define RUDA_MEMORY_FENCE_H

#include <stdatomic.h>
#include <stdint.h>

struct ruda__memory;

/* One fence in flight on a worker (a token of the progress table). */
typedef struct ruda__fence {
  struct ruda__fence *next;
  uint64_t seq;
  void *token;
} ruda__fence;

typedef struct ruda__wfence {
  uint64_t created, wanted;
  _Atomic uint64_t passed; /* written under fence_lock, read without it */
  uint32_t nflight;
  ruda__fence *head, *tail;
} ruda__wfence;

/* Fences (fence_lock taken inside). need: the number of a fence on
 * worker w that follows everything pushed to w so far, or, with executed,
 * everything w has run so far (a fence still queued then does); passed:
 * whether it completed on the device. */
uint64_t ruda__fence_need(struct ruda__memory *mem, uint32_t w, int executed);
int ruda__fence_passed(struct ruda__memory *mem, uint32_t w, uint64_t need);
void ruda__fence_poll_all(struct ruda__memory *mem);
/* Whether w is known past need without polling or taking fence_lock. */
int ruda__fence_seen(struct ruda__memory *mem, uint32_t w, uint64_t need);

/* Device lifecycle (ruda__memory_init / _destroy): one record per worker;
 * destroy frees the fences still in flight. */
int ruda__fence_table_init(struct ruda__memory *mem);
void ruda__fence_table_destroy(struct ruda__memory *mem);

#endif /* RUDA_MEMORY_FENCE_H */

/* memory.h - memory's root object: struct ruda__memory and its
 * lifecycle.
 *
 * The layer's files, each with its own header, call one way:
 *
 *   memory.c   assembles the rest (this header)
 *   pool.c     per-stream pools, buffers, retired buffers (pool.h)
 *   arena.c    pages no stream holds, the backend's pages (arena.h)
 *   fence.c    how far each worker got (fence.h, over base/progress.h)
 *   import.c   foreign memory adopted as buffers (import.h)
 *   handles.c  slot + generation handles, pins, use records (handles.h)
 *
 * Locks, always taken in this order: a stream's pools->lock, one shard
 * lock of the arena, fence_lock; import_lock before fence_lock. docs/memory.md explains the choices.
 */
#ifndef RUDA_MEMORY_MEMORY_H
#define RUDA_MEMORY_MEMORY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/backend.h"
#include "base/progress.h"
#include "memory/arena.h"
#include "memory/fence.h"
#include "memory/handles.h"
#include "ruda/memory.h"

struct ruda__pools;

/* A device's memory: what the pools, the arena and the fences share, and
 * what they are handed from the layers around them (the backend below,
 * the scheduler's progress above). Embedded in struct ruda_device. */
typedef struct ruda__memory {
  const ruda__backend *backend; /* the device's (in the scheduler's root) */
  ruda__handles *handles;
  ruda__progress progress;
  ruda__arena arena;
  pthread_mutex_t layout_lock;
  ruda_pool_config layout[RUDA_MEMORY_MAX_POOLS];
  uint32_t nlayout;
  pthread_mutex_t fence_lock;
  ruda__wfence *fences; /* one per worker */
  uint32_t nworkers;
  pthread_mutex_t all_lock;
  struct ruda__pools *all;
  /* Pools of retired streams, empty, for the next new stream (all_lock). */
  struct ruda__pools *spare;
  /* Gives the pools' unused pages back to the arena before an
   * out-of-memory retry (memory/pool.c; own: the caller's, locked). */
  void (*reclaim)(struct ruda__memory *mem, struct ruda__pools *own);
  /* Freed buffers whose memory stayed with its page for want of host
   * memory to track it (ruda__memory_retire); back at close. */
  _Atomic uint64_t stranded;
  /* Foreign memory adopted (memory/import.h): live and retired imports,
   * and how many there are (read without the lock). */
  pthread_mutex_t import_lock;
  struct ruda__import *imports;
  _Atomic uint32_t nimports;
} ruda__memory;

/* Device lifecycle (memory/memory.c). init with backend, handles and
 * progress set, for nworkers workers: makes the fences, the arena and the
 * pools' shared state, and hands the handle table what it needs of them;
 * destroy after the workers stopped (every page goes back to the
 * backend). Not thread-safe; blocks. */
int ruda__memory_init(ruda__memory *mem, uint32_t nworkers);
void ruda__memory_destroy(ruda__memory *mem);

#endif /* RUDA_MEMORY_MEMORY_H */

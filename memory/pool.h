/* pool.h - per-stream pools (memory/pool.c): buffers are cut from pages
 * here, and a freed buffer's memory goes home from here.
 *
 * Sliced pools keep, per size class, the pages they are cutting into
 * slots; exclusive pools keep a few free pages for reuse. Normally only
 * the stream's own client thread takes a pools->lock. Pages come from and
 * go back to the arena (memory/arena.h); a buffer other workers used is
 * retired and waits for their fences (memory/fence.h).
 */
#ifndef RUDA_MEMORY_POOL_H
#define RUDA_MEMORY_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "memory/arena.h"
#include "memory/memory.h"
#include "ruda/memory.h"
#include "ruda/ruda.h"

struct ruda__pools;

typedef struct ruda__class {
  ruda__page *nonfull; /* pages of this class with a free slot */
  uint64_t size;       /* slot size */
  uint64_t slab;       /* page size it cuts */
} ruda__class;

typedef struct ruda__pool {
  ruda_pool_config cfg; /* kind RUDA_POOL_PERSISTENT for the persistent pool */
  uint64_t min_alloc;   /* exclusive lower bound of the requests routed here */
  struct ruda__pools *owner;
  /* Sliced. */
  uint32_t c_lo, nclasses;
  ruda__class *classes;
  ruda__page *empty; /* cut for nothing; reused by any class */
  uint32_t nempty;
  /* Exclusive and persistent: free pages kept for the home stream. */
  ruda__page *cache;
  uint32_t ncache;
  uint64_t cache_bytes;
  /* Figures (under the owner's lock). */
  uint64_t nallocs, in_use, padding, reserved, unbacked, pages;
  uint64_t peak_nallocs, peak_in_use, peak_reserved;
} ruda__pool;

/* A freed buffer whose memory waits for other workers' fences before it
 * goes back to its home pool. */
typedef struct ruda__retired {
  struct ruda__retired *next;
  ruda__page *page;
  uint64_t addr, size;
  uint32_t nwait;
  struct {
    uint32_t worker;
    uint64_t need;
  } wait[];
} ruda__retired;

#define RUDA__SLOT_CACHE 16
#define RUDA__SLOT_BATCH 8

typedef struct ruda__pools {
  pthread_mutex_t lock;
  struct ruda__memory *mem;
  ruda_stream_id stream_id; /* the stream they serve, for messages */
  uint32_t worker; /* the home worker of every buffer allocated here */
  uint32_t npools;
  ruda__pool pools[RUDA_MEMORY_MAX_POOLS];
  ruda__pool persistent;
  uint8_t modes[RUDA_MEMORY_MODE_DEPTH];
  uint32_t mode_depth;
  uint32_t dry_depth;
  ruda__retired *retired;
  /* Retired buffers pushed by threads that did not take the lock
   * (workers never wait on a pool lock); moved to retired when polled. */
  _Atomic(ruda__retired *) incoming;
  uint32_t slots[RUDA__SLOT_CACHE]; /* free handle slots */
  uint32_t nslots;
  uint64_t peak_in_use, peak_reserved; /* whole-stream high-water marks */
  struct ruda__pools *all_next;
  struct ruda__pools *spare_next; /* on mem->spare (ruda__pools_recycle) */
} ruda__pools;

/* A stream's pools, made at first use and published in *slot: the stream
 * `id` on worker `worker`. NULL without host memory. Any thread. */
struct ruda__pools *ruda__pools_of(ruda__memory *mem, struct ruda__pools *_Atomic *slot, uint32_t worker,
                                   ruda_stream_id id);

/* ruda_buffer_create / ruda_buffer_free, past argument checks: a buffer
 * from pools p, failures named by fn (the public call); a free of h (its
 * memory goes home, whoever frees it). */
int ruda__memory_alloc(struct ruda__pools *p, uint64_t size, const char *fn, ruda_handle *out);
int ruda__memory_free(ruda__memory *mem, ruda_handle h);

/* Called by the handle table when a freed buffer's last reference drops
 * and its memory was not given back at free time: other workers used it,
 * so it waits for their fences. Any thread. */
void ruda__memory_retire(ruda__memory *mem, void *page, uint64_t addr, uint64_t size,
                         uint32_t home, uint64_t users);

/* Backs a dry-run buffer's page if needed; *addr receives the address of
 * the slot's first byte. RUDA_ESTORAGEMAPPING when the backend has no
 * memory for it. fn names the calling API for the message. */
int ruda__memory_back(ruda__memory *mem, void *page, uint64_t tagged, const char *fn,
                      uint64_t *addr);

/* ruda_memory_install_pools: checks a layout; makes it the one new
 * streams get; applies it to p unless p has live buffers
 * (RUDA_EPOOLSINUSE). */
int ruda__pools_check_layout(const ruda_pool_config *pools, uint32_t n);
void ruda__memory_set_layout(ruda__memory *mem, const ruda_pool_config *pools, uint32_t n);
int ruda__pools_install(ruda__pools *p, const ruda_pool_config *pools, uint32_t n, const char *fn);

/* A stream whose thread exited (scheduler/stream_exit.c): gives every page
 * p caches back to the arena, those whose fences passed at once, and
 * returns the bytes p still reserves (pages with live buffers or behind
 * a fence; 0: p holds no memory).
 * Takes p's lock. Any thread. */
uint64_t ruda__pools_give_back(ruda__pools *p);
/* Keeps p, which its retired stream no longer names, for the next stream
 * that needs pools (ruda__pools_of), so exited threads leave no pool
 * bookkeeping behind. Refuses (0) unless p holds nothing: no pages, no
 * buffer waiting on a fence, no mode or dry run open, the current layout.
 * 1 when taken. A caller still holding p (a call racing the retirement)
 * stays memory-safe: p is never freed before close. Any thread. */
int ruda__pools_recycle(ruda__memory *mem, ruda__pools *p);

/* For the memory report, both with pools->lock held: takes back retired
 * buffers whose fences passed; gives unused pages to the arena. */
void ruda__pools_poll_retired(ruda__pools *p);
void ruda__pools_release_unused(ruda__pools *p);

/* mem->reclaim: every stream's unused pages back to the arena; own (may
 * be NULL) is locked by the caller, the others are only tried. */
void ruda__pools_reclaim(ruda__memory *mem, ruda__pools *own);
/* The handle table's retire hook (ctx: the ruda__memory): a freed buffer's
 * last reference dropped (ruda__memory_retire). */
void ruda__pools_retire_hook(void *ctx, void *page, uint64_t addr, uint64_t size, uint32_t home,
                             uint64_t users);
/* Frees every stream's pools (ruda__memory_destroy; pages go with the
 * arena). */
void ruda__pools_destroy_all(ruda__memory *mem);

/* Size classes. */
uint32_t ruda__class_index(uint64_t size);
uint64_t ruda__class_size(uint32_t index);
uint64_t ruda__exclusive_size(uint64_t size);

#endif /* RUDA_MEMORY_POOL_H */

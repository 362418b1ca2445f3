/* pool.h - device memory: the arena, per-stream pools, fences.
 *
 * Three layers, each with its own lock, always taken in this order:
 *
 *   stream pools (ruda__pools, one per stream, pools->lock)
 *     The fast path. Sliced pools keep, per size class, the pages they
 *     are cutting into slots; exclusive pools keep a few free pages for
 *     reuse. Normally only the stream's own client thread takes the lock.
 *   arena (one per device, a shard per worker, shard.lock)
 *     Pages no stream holds, bucketed by size, in the shard of the worker
 *     whose work must pass before another worker may use them. Backend
 *     allocation, the out-of-memory retry and trimming live here. At
 *     most one shard lock is held at a time.
 *   fences (one per device, fence_lock)
 *     Per worker: the fences memory asked for through the progress table
 *     (base/progress.h), whose completion tells that the worker's device
 *     work has passed a point. Polled, never waited on by the allocation
 *     path.
 *
 * docs/memory.md explains the choices.
 */
#ifndef RUDA_POOL_H
#define RUDA_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/backend.h"
#include "base/progress.h"
#include "memory/handles.h"
#include "ruda/memory.h"
#include "ruda/ruda.h"

struct ruda__pools;

/* Every buffer and page is a multiple of this, as cuMemAlloc aligns. */
#define RUDA__MEM_ALIGN 256u
/* Address bit marking a slot whose page has no memory yet (dry run). No
 * host or device virtual address uses bit 63. */
#define RUDA__UNBACKED (UINT64_C(1) << 63)

typedef struct ruda__page {
  struct ruda__page *next, *prev;         /* class / empty / cache / bucket list */
  struct ruda__page *lru_next, *lru_prev; /* arena: oldest first */
  struct ruda__page *all_next, *all_prev; /* every page of the device */
  _Atomic uint64_t base;                  /* device address; 0 until backed */
  uint64_t size;
  struct ruda__pool *pool; /* owner; NULL while in the arena */
  /* Sliced: the class the page is cut for (UINT32_MAX: not cut). */
  uint32_t klass;
  uint32_t nslots, nused, nfree, bump; /* slots: cut, in use, on free_idx, never used */
  uint64_t slot_size;
  uint32_t *free_idx; /* freed slot indices (a stack) */
  uint32_t free_cap;
  /* Arena: the worker that returned it and the fence it needs to pass
   * before other workers may use it. */
  uint32_t worker;
  uint64_t need;
  uint32_t bucket;
  uint8_t in_list; /* 1: class nonfull list / empty / cache / bucket */
  /* 1: a buffer on it was used (memory/handles.h, `used`) since its last
   * fence passed, so it needs a fence before another worker takes it. A
   * page no command touched moves between workers at once. */
  uint8_t dirty;
} ruda__page;

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

/* Arena buckets: sixteen per doubling of page size. */
#define RUDA__NBUCKETS 1024u

/* The free pages one worker's streams returned, under their own lock.
 * Those streams take pages back from here first, with no fence (their
 * later commands follow the returns) and no contention with other
 * workers; other workers look here only when their own shard has nothing
 * that fits. */
typedef struct ruda__shard {
  pthread_mutex_t lock;
  ruda__page *bucket[RUDA__NBUCKETS], *bucket_tail[RUDA__NBUCKETS];
  uint64_t nonempty[RUDA__NBUCKETS / 64];
  uint32_t count[RUDA__NBUCKETS]; /* pages per bucket */
  uint32_t nbuckets;              /* buckets holding a page */
  ruda__page *lru_head, *lru_tail; /* oldest first */
  /* Written under the lock, read without it too (an empty shard is
   * skipped unlocked; a trim picks the fullest). */
  _Atomic uint64_t free_bytes, npages;
} ruda__shard;

typedef struct ruda__arena {
  ruda__shard *shards; /* one per worker */
  uint32_t nshards;
  _Atomic uint64_t free_bytes; /* in all shards */
  pthread_mutex_t lock;        /* `all` only */
  ruda__page *all;             /* every page descriptor, for close */
  /* Every page descriptor in existence: backed bytes, virtual bytes. */
  _Atomic uint64_t backed, virtual_bytes, peak_backed;
  _Atomic uint64_t backend_allocs, backend_frees; /* calls made */
} ruda__arena;

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

/* A device's memory: what the pools, the arena and the fences share, and
 * what they are handed from the layers around them (the backend below,
 * the scheduler's progress above). */
typedef struct ruda__memory {
  const ruda__backend_ops *ops;
  void *bstate;
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
  ruda__pools *all;
  /* Pools of retired streams, empty, for the next new stream (all_lock). */
  ruda__pools *spare;
  /* Freed buffers whose memory stayed with its page for want of host
   * memory to track it (ruda__memory_retire); back at close. */
  _Atomic uint64_t stranded;
} ruda__memory;

/* Device lifecycle. init with ops, bstate, handles and progress set,
 * for nworkers workers; destroy after the workers stopped (every page
 * goes back to the backend). */
int ruda__memory_init(ruda__memory *mem, uint32_t nworkers);
void ruda__memory_destroy(ruda__memory *mem);

/* A stream's pools, made at first use and published in *slot: the stream
 * `id` on worker `worker`. NULL without host memory. Any thread. */
struct ruda__pools *ruda__pools_of(ruda__memory *mem, struct ruda__pools *_Atomic *slot, uint32_t worker,
                                   ruda_stream_id id);

/* ruda_buffer_create / ruda_buffer_free, past argument checks: a buffer
 * from pools p; a free of h (its memory goes home, whoever frees it). */
int ruda__memory_alloc(struct ruda__pools *p, uint64_t size, ruda_handle *out);
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

/* ---- shared between pool.c, arena.c and the memory report ---- */
/* Both with pools->lock held. */
void ruda__pools_poll_retired(ruda__pools *p);
void ruda__pools_release_unused(ruda__pools *p);

/* Size classes. */
uint32_t ruda__class_index(uint64_t size);
uint64_t ruda__class_size(uint32_t index);
uint64_t ruda__exclusive_size(uint64_t size);

/* Arena (shard locks taken inside). take: a page of size..max_size bytes
 * that p's worker may use, from the arena or else the backend (unbacked
 * when virtual_ok), or NULL with *rc set. */
ruda__page *ruda__arena_take(ruda__memory *mem, ruda__pools *p, uint64_t size, uint64_t max_size,
                             int virtual_ok, const char *fn, uint64_t request, int *rc);
/* Only from the arena: NULL when nothing there fits. */
ruda__page *ruda__arena_find(ruda__memory *mem, ruda__pools *p, uint64_t size, uint64_t max_size);
/* Gives a page no pool holds any more back to the arena, as returned by
 * worker (its fence requested). */
void ruda__arena_put(ruda__memory *mem, ruda__page *pg, uint32_t worker);
/* Frees arena pages whose fences passed; waits up to wait_ns for workers
 * to reach their fences. Returns bytes released. */
uint64_t ruda__arena_trim(ruda__memory *mem, uint64_t keep, uint64_t wait_ns);
/* Backs a page that has none (dry run), with the out-of-memory retry. */
int ruda__arena_back(ruda__memory *mem, ruda__pools *p, ruda__page *pg);
void ruda__page_discard(ruda__memory *mem, ruda__page *pg);

/* Fences (fence_lock taken inside). need: the number of a fence on
 * worker w that follows everything pushed to w so far, or, with executed,
 * everything w has run so far (a fence still queued then does); passed:
 * whether it completed on the device. */
uint64_t ruda__fence_need(ruda__memory *mem, uint32_t w, int executed);
int ruda__fence_passed(ruda__memory *mem, uint32_t w, uint64_t need);
void ruda__fence_poll_all(ruda__memory *mem);

#endif /* RUDA_POOL_H */

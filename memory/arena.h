/* arena.h - the device arena (memory/arena.c): pages no stream's pools
 * hold, one shard per worker, and the backend allocations behind them.
 *
 * A page returned on worker W goes to W's shard; W's streams may take it
 * back at once, others once a fence on W passed (memory/fence.h).
 * Backend allocation, the out-of-memory retry and trimming live here. At
 * most one shard lock is held at a time.
 */
#ifndef RUDA_MEMORY_ARENA_H
#define RUDA_MEMORY_ARENA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct ruda__memory;
struct ruda__pool;
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

/* Shard locks are taken inside. take: a page of size..max_size bytes
 * that worker w may use, from the arena or else the backend (unbacked
 * when virtual_ok), or NULL with *rc set. `own` is the calling stream's
 * pools, whose lock the caller holds: an out-of-memory retry hands it to
 * mem->reclaim. */
ruda__page *ruda__arena_take(struct ruda__memory *mem, uint32_t w, struct ruda__pools *own, uint64_t size,
                             uint64_t max_size, int virtual_ok, const char *fn, uint64_t request, int *rc);
/* Only from the arena: NULL when nothing there fits. */
ruda__page *ruda__arena_find(struct ruda__memory *mem, uint32_t w, uint64_t size, uint64_t max_size);
/* Gives a page no pool holds any more back to the arena, as returned by
 * worker (its fence requested). */
void ruda__arena_put(struct ruda__memory *mem, ruda__page *pg, uint32_t worker);
/* Frees arena pages whose fences passed; waits up to wait_ns for workers
 * to reach their fences. Returns bytes released. */
uint64_t ruda__arena_trim(struct ruda__memory *mem, uint64_t keep, uint64_t wait_ns);
/* Backs a page that has none (dry run), with the out-of-memory retry,
 * failures named by fn; the caller updates its pool's figures. */
int ruda__arena_back(struct ruda__memory *mem, struct ruda__pools *own, ruda__page *pg, const char *fn);
void ruda__page_discard(struct ruda__memory *mem, ruda__page *pg);

/* Device lifecycle (ruda__memory_init / _destroy): destroy gives every
 * page back to the backend, in a pool or not. */
int ruda__arena_init(struct ruda__memory *mem);
void ruda__arena_destroy(struct ruda__memory *mem);

#endif /* RUDA_MEMORY_ARENA_H */

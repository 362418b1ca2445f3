/* cache.h - recently freed staging blocks, kept for the next allocation of
 * the same size (staging/cache.c).
 *
 * Without it every block is a trip into the staging arena's jemalloc, which
 * runs without thread caches (a manual arena: MALLOCX_TCACHE_NONE) and so
 * takes the arena's locks for each allocation and free; a request loop
 * makes two (the write's block, the read's bounce block) and its threads
 * all meet there. The cache is striped: each thread keeps to one stripe
 * (assigned round robin at its first use), whose lock it then rarely
 * shares. A stripe holds a few blocks, small ones only, so little
 * page-locked memory idles in it.
 *
 * Thread safety: every function may run on any thread at once, except
 * init and the caller's teardown. No function blocks beyond a stripe's
 * short lock.
 */
#ifndef RUDA_STAGING_CACHE_H
#define RUDA_STAGING_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define RUDA__CACHE_STRIPES 32u
#define RUDA__CACHE_SLOTS 8u                    /* blocks per stripe */
#define RUDA__CACHE_MAX_BLOCK ((size_t)256 << 10) /* larger blocks are not kept */
#define RUDA__CACHE_MAX_BYTES ((size_t)512 << 10) /* per stripe: 16 MiB in all */

typedef struct ruda__block_cache {
  void (*release)(void *ctx, void *p); /* frees a block the cache lets go */
  void *ctx;
  struct ruda__cache_stripe {
    _Alignas(64) pthread_mutex_t lock; /* a cache line of its own: threads of two stripes do not meet */
    unsigned n;
    size_t bytes;
    struct {
      void *p;
      size_t size; /* the block's usable size */
    } slot[RUDA__CACHE_SLOTS];
  } stripe[RUDA__CACHE_STRIPES];
} ruda__block_cache;

/* release(ctx, p) frees a block the cache lets go (outside its locks). */
void ruda__block_cache_init(ruda__block_cache *c, void (*release)(void *ctx, void *p), void *ctx);
/* Releases every block it holds. */
void ruda__block_cache_destroy(ruda__block_cache *c);

/* Which stripe a take or put uses: key % RUDA__CACHE_STRIPES, or with
 * RUDA__CACHE_THREAD the calling thread's. Keyed by a block's address
 * (ruda__block_cache_key), a block that one thread takes and another
 * returns (a write's, taken by a client and retired by a worker) is found
 * again by a take keyed by that address: the same user's next block. */
#define RUDA__CACHE_THREAD UINT32_MAX

/* The key of block p: its address hashed (Fibonacci), so blocks spread
 * over the stripes. */
static inline uint32_t ruda__block_cache_key(const void *p) {
  return (uint32_t)(((uintptr_t)p >> 6) * UINT64_C(0x9e3779b97f4a7c15) >> 40);
}

/* A kept block of exactly size usable bytes from key's stripe, or NULL:
 * block `want` if it is kept there, else the newest. */
void *ruda__block_cache_take(ruda__block_cache *c, size_t size, uint32_t key, const void *want);

/* Keeps block p (size usable bytes) in key's stripe, releasing the
 * stripe's oldest blocks to make room; a block over
 * RUDA__CACHE_MAX_BLOCK is released at once. */
void ruda__block_cache_put(ruda__block_cache *c, void *p, size_t size, uint32_t key);

#endif /* RUDA_STAGING_CACHE_H */

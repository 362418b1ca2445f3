/* arena.c - the page-locked staging arena (see staging/staging.h). */
#include "staging/staging.h"

#include "staging/jemalloc_private.h"
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "staging/cache.h"

#define MAX_CHUNKS 4096u
#define DEFAULT_CHUNK ((size_t)64 << 20)
#define PAGE_ROUND ((size_t)2 << 20) /* chunks are whole huge pages */

typedef struct chunk {
  uintptr_t base; /* written once, before nchunks publishes it */
  size_t size;
  size_t used; /* bump offset, under lock */
} chunk;

struct ruda__staging {
  extent_hooks_t hooks; /* first: jemalloc hands this pointer to every hook */
  ruda__pinned_ops ops;
  unsigned arena;
  int flags;
  size_t chunk;
  uint64_t limit;
  pthread_mutex_t lock; /* chunk growth and carving */
  /* The next chunk, made ahead by the grower thread so that no allocation
   * waits for the driver to page-lock a chunk (milliseconds, under a lock
   * every other driver call of the process waits on). Under lock. */
  pthread_cond_t grow_cond;
  pthread_t grower;
  int grower_started, stop, want_spare;
  void *spare;
  size_t spare_size;
  _Atomic uint32_t nchunks;
  _Atomic uint64_t pinned, in_use, peak, fb_bytes, fb_count;
  ruda__block_cache cache; /* freed blocks kept for the next of their size */
  chunk chunks[MAX_CHUNKS];
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static const chunk *chunk_of(const ruda__staging *s, uintptr_t a) {
  uint32_t n = atomic_load_explicit(&s->nchunks, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++)
    if (a >= s->chunks[i].base && a - s->chunks[i].base < s->chunks[i].size) return &s->chunks[i];
  return NULL;
}

int ruda__staging_pinned(const ruda__staging *s, const void *p) {
  return s != NULL && p != NULL && chunk_of(s, (uintptr_t)p) != NULL;
}

/* Space from an existing chunk, newest first (it is the one with room). */
static void *carve(ruda__staging *s, size_t size, size_t align) {
  uint32_t n = atomic_load_explicit(&s->nchunks, memory_order_relaxed);
  for (uint32_t i = n; i-- > 0;) {
    chunk *c = &s->chunks[i];
    uintptr_t a = round_up(c->base + c->used, align);
    if (a + size <= c->base + c->size) {
      c->used = a + size - c->base;
      return (void *)a;
    }
  }
  return NULL;
}

/* The grower: makes a spare chunk whenever grow() took the last one, off
 * the allocating threads. Blocks in the driver; sleeps otherwise. */
static void *grower_main(void *p) {
  ruda__staging *s = p;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->stop && (!s->want_spare || s->spare != NULL)) pthread_cond_wait(&s->grow_cond, &s->lock);
    if (s->stop) break;
    s->want_spare = 0;
    uint64_t have = atomic_load_explicit(&s->pinned, memory_order_relaxed);
    if (s->limit && have + s->chunk > s->limit) continue; /* grow() falls back to exact sizes */
    pthread_mutex_unlock(&s->lock);
    void *mem = s->ops.alloc(s->ops.ctx, s->chunk);
    pthread_mutex_lock(&s->lock);
    if (mem != NULL) {
      s->spare = mem;
      s->spare_size = s->chunk;
      atomic_fetch_add_explicit(&s->pinned, s->chunk, memory_order_relaxed); /* held, if not used yet */
    }
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Under lock: asks the grower (started on first use) for a spare. */
static void want_spare(ruda__staging *s) {
  if (s->spare != NULL || s->want_spare) return;
  if (!s->grower_started) s->grower_started = pthread_create(&s->grower, NULL, grower_main, s) == 0;
  s->want_spare = 1;
  pthread_cond_signal(&s->grow_cond);
}

static int grow(ruda__staging *s, size_t size, size_t align) {
  uint32_t n = atomic_load_explicit(&s->nchunks, memory_order_relaxed);
  if (n == MAX_CHUNKS) return -1;
  size_t need = round_up(size + align, PAGE_ROUND);
  size_t want = need > s->chunk ? need : s->chunk;
  void *mem = NULL;
  int spare = s->spare != NULL && s->spare_size >= need;
  if (spare) { /* made ahead: no driver call here */
    mem = s->spare;
    want = s->spare_size;
    s->spare = NULL;
  } else {
    uint64_t have = atomic_load_explicit(&s->pinned, memory_order_relaxed);
    if (s->limit && have + want > s->limit) {
      if (have + need > s->limit) return -1; /* over the cap: caller falls back */
      want = need;
    }
    mem = s->ops.alloc(s->ops.ctx, want);
  }
  if (mem == NULL) return -1;
  s->chunks[n] = (chunk){(uintptr_t)mem, want, 0};
  atomic_store_explicit(&s->nchunks, n + 1, memory_order_release);
  if (!spare) atomic_fetch_add_explicit(&s->pinned, want, memory_order_relaxed);
  return 0;
}

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t align, bool *zero,
                        bool *commit, unsigned arena_ind) {
  (void)arena_ind;
  ruda__staging *s = (ruda__staging *)h;
  /* Chunk space cannot be placed at an address of jemalloc's choosing. */
  if (new_addr != NULL || size == 0) return NULL;
  if (align < 64) align = 64;
  pthread_mutex_lock(&s->lock);
  void *p = carve(s, size, align);
  if (p == NULL && grow(s, size, align) == 0) p = carve(s, size, align);
  /* The newest chunk three quarters carved: the next one is made ahead. */
  uint32_t n = atomic_load_explicit(&s->nchunks, memory_order_relaxed);
  if (p != NULL && n > 0 && s->chunks[n - 1].used > s->chunks[n - 1].size / 4 * 3) want_spare(s);
  pthread_mutex_unlock(&s->lock);
  if (p == NULL) return NULL;
  if (*zero) memset(p, 0, size);
  *commit = true; /* page-locked memory is always committed */
  return p;
}

/* Returning true opts out: jemalloc keeps the extent (retained) and reuses
 * it, so pinned memory is never handed back piecemeal. */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind) {
  (void)h, (void)addr, (void)size, (void)committed, (void)ind;
  return true;
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind) {
  (void)h, (void)addr, (void)size, (void)committed, (void)ind; /* chunks go back in destroy */
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
                        unsigned ind) {
  (void)h, (void)addr, (void)size, (void)off, (void)len, (void)ind;
  return false; /* already committed: success */
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
                          unsigned ind) {
  (void)h, (void)addr, (void)size, (void)off, (void)len, (void)ind;
  return true; /* refuse: pinned pages stay */
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t a, size_t b, bool committed,
                       unsigned ind) {
  (void)h, (void)addr, (void)size, (void)a, (void)b, (void)committed, (void)ind;
  return false; /* any split of chunk space is still chunk space */
}

/* Merging is allowed within one chunk only: a block spanning two driver
 * allocations would not be one page-locked region to the DMA engine. */
static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned ind) {
  (void)committed, (void)ind;
  const ruda__staging *s = (const ruda__staging *)h;
  const chunk *c = chunk_of(s, (uintptr_t)addr_a);
  if (c == NULL) return true;
  uintptr_t end = (uintptr_t)addr_b + size_b;
  (void)size_a;
  return !((uintptr_t)addr_b >= c->base && end <= c->base + c->size);
}

static void cache_release(void *ctx, void *p) { dallocx(p, ((ruda__staging *)ctx)->flags); }

static int arena_set_ssize(unsigned arena, const char *what, ssize_t v) {
  char name[64];
  snprintf(name, sizeof name, "arena.%u.%s", arena, what);
  return mallctl(name, NULL, NULL, &v, sizeof v);
}

int ruda__staging_create(const ruda__pinned_ops *ops, size_t chunk_bytes, uint64_t limit,
                         ruda__staging **out) {
  *out = NULL;
  /* Aligned as its block cache's stripes are (a cache line each). */
  ruda__staging *s = aligned_alloc(_Alignof(ruda__staging), round_up(sizeof *s, _Alignof(ruda__staging)));
  if (s == NULL) return ruda__fail(RUDA_ENOMEM, "staging arena: out of host memory");
  memset(s, 0, sizeof *s);
  s->hooks = (extent_hooks_t){.alloc = hook_alloc,
                              .dalloc = hook_dalloc,
                              .destroy = hook_destroy,
                              .commit = hook_commit,
                              .decommit = hook_decommit,
                              .purge_lazy = NULL,
                              .purge_forced = NULL,
                              .split = hook_split,
                              .merge = hook_merge};
  s->ops = *ops;
  s->chunk = chunk_bytes ? round_up(chunk_bytes, PAGE_ROUND) : DEFAULT_CHUNK;
  s->limit = limit;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->grow_cond, NULL);
  extent_hooks_t *hp = &s->hooks;
  size_t sz = sizeof s->arena;
  int rc = mallctl("arenas.create", &s->arena, &sz, &hp, sizeof hp);
  if (rc != 0) {
    pthread_cond_destroy(&s->grow_cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return ruda__fail(RUDA_ENOMEM, "staging arena: jemalloc arenas.create failed (error %d)", rc);
  }
  /* Never purge (the hooks could not anyway) and never grow the retained
   * region by more than half a chunk beyond what a request needs, so
   * pinned memory tracks demand, and each growth (its size, plus the
   * alignment carve() adds) fits in the spare chunk the grower made
   * ahead: a whole chunk would not, and every growth would page-lock a
   * chunk on the allocating thread. */
  arena_set_ssize(s->arena, "dirty_decay_ms", -1);
  arena_set_ssize(s->arena, "muzzy_decay_ms", -1);
  char name[64];
  snprintf(name, sizeof name, "arena.%u.retain_grow_limit", s->arena);
  size_t grow_limit = s->chunk / 2;
  mallctl(name, NULL, NULL, &grow_limit, sizeof grow_limit);
  s->flags = MALLOCX_ARENA(s->arena) | MALLOCX_TCACHE_NONE;
  ruda__block_cache_init(&s->cache, cache_release, s);
  *out = s;
  return 0;
}

void ruda__staging_destroy(ruda__staging *s) {
  if (s == NULL) return;
  pthread_mutex_lock(&s->lock);
  s->stop = 1;
  pthread_cond_signal(&s->grow_cond);
  pthread_mutex_unlock(&s->lock);
  if (s->grower_started) pthread_join(s->grower, NULL);
  if (s->spare != NULL) s->ops.free(s->ops.ctx, s->spare);
  ruda__block_cache_destroy(&s->cache);
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", s->arena);
  mallctl(name, NULL, NULL, NULL, 0);
  uint32_t n = atomic_load(&s->nchunks);
  for (uint32_t i = 0; i < n; i++) s->ops.free(s->ops.ctx, (void *)s->chunks[i].base);
  pthread_cond_destroy(&s->grow_cond);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static void *alloc_keyed(ruda__staging *s, size_t size, uint32_t key, const void *want);
static void free_keyed(ruda__staging *s, void *p, int by_addr);

void *ruda__staging_alloc(ruda__staging *s, size_t size) { return alloc_keyed(s, size, RUDA__CACHE_THREAD, NULL); }

void ruda__staging_free(ruda__staging *s, void *p) { free_keyed(s, p, 0); }

void *ruda__staging_alloc_after(ruda__staging *s, size_t size, const void *prev) {
  return alloc_keyed(s, size, prev != NULL ? ruda__block_cache_key(prev) : RUDA__CACHE_THREAD, prev);
}

void ruda__staging_free_addr(ruda__staging *s, void *p) { free_keyed(s, p, 1); }

static void *alloc_keyed(ruda__staging *s, size_t size, uint32_t key, const void *want) {
  if (size == 0) size = 1;
  uint64_t u = size <= RUDA__CACHE_MAX_BLOCK ? nallocx(size, s->flags) : 0;
  void *p = u != 0 ? ruda__block_cache_take(&s->cache, u, key, want) : NULL; /* u: its size */
  if (p == NULL && u != 0 && key != RUDA__CACHE_THREAD) p = ruda__block_cache_take(&s->cache, u, RUDA__CACHE_THREAD, NULL);
  if (p == NULL && (p = mallocx(size, s->flags)) != NULL) u = sallocx(p, s->flags);
  if (p != NULL && ruda__staging_pinned(s, p)) {
    uint64_t now = atomic_fetch_add_explicit(&s->in_use, u, memory_order_relaxed) + u;
    uint64_t peak = atomic_load_explicit(&s->peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&s->peak, &peak, now, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    return p;
  }
  if (p != NULL) dallocx(p, s->flags); /* cannot happen: every extent is chunk space */
  /* Over the limit, or the driver refused: pageable memory still works,
   * only the DMA is slower. */
  p = malloc(size);
  if (p != NULL) {
    atomic_fetch_add_explicit(&s->fb_bytes, malloc_usable_size(p), memory_order_relaxed);
    atomic_fetch_add_explicit(&s->fb_count, 1, memory_order_relaxed);
  }
  return p;
}

static void free_keyed(ruda__staging *s, void *p, int by_addr) {
  if (p == NULL) return;
  if (ruda__staging_pinned(s, p)) {
    const size_t u = sallocx(p, s->flags);
    atomic_fetch_sub_explicit(&s->in_use, u, memory_order_relaxed);
    ruda__block_cache_put(&s->cache, p, u, by_addr ? ruda__block_cache_key(p) : RUDA__CACHE_THREAD);
  } else {
    atomic_fetch_sub_explicit(&s->fb_bytes, malloc_usable_size(p), memory_order_relaxed);
    free(p);
  }
}

size_t ruda__staging_size(const ruda__staging *s, const void *p) {
  return ruda__staging_pinned(s, p) ? sallocx((void *)(uintptr_t)p, s->flags) : malloc_usable_size((void *)(uintptr_t)p);
}

void ruda__staging_usage(const ruda__staging *s, ruda_staging_stats *out) {
  out->pinned_bytes = atomic_load_explicit(&s->pinned, memory_order_relaxed);
  out->in_use_bytes = atomic_load_explicit(&s->in_use, memory_order_relaxed);
  out->peak_bytes = atomic_load_explicit(&s->peak, memory_order_relaxed);
  out->limit_bytes = s->limit;
  out->chunk_bytes = s->chunk;
  out->fallback_bytes = atomic_load_explicit(&s->fb_bytes, memory_order_relaxed);
  out->fallback_count = atomic_load_explicit(&s->fb_count, memory_order_relaxed);
}

static int env_bytes(const char *name, uint64_t *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (*end != '\0' || end == v || x > (UINT64_MAX >> shift)) {
    fprintf(stderr, "ruda: ignoring malformed %s=%s (bytes, optional K/M/G)\n", name, v);
    return 0;
  }
  *out = (uint64_t)x << shift;
  return 1;
}

void ruda__staging_env(uint64_t *limit, size_t *chunk) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  *limit = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 4 : (uint64_t)4 << 30;
  *chunk = DEFAULT_CHUNK;
  uint64_t v;
  if (env_bytes("RUDA_STAGING_LIMIT", &v)) *limit = v;
  if (env_bytes("RUDA_STAGING_CHUNK", &v) && v > 0) *chunk = (size_t)v;
}

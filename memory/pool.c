/* pool.c - a stream's pools: routing, size classes, slots, the fast path.
 *
 * Allocation and free of a buffer homed on the calling stream take only
 * that stream's pool lock (uncontended unless several threads share an
 * explicit stream id) and touch only the stream's own pages: no global
 * lock, no command, no wait. Pages come from and go back to the shared
 * arena (arena.c) only when a class runs out or a page falls empty.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "memory/arena.h"
#include "memory/fence.h"
#include "memory/handles.h"
#include "memory/memory.h"
#include "memory/pool.h"

/* Empty sliced pages a pool keeps beside the one each class keeps. */
#define KEEP_EMPTY 1
/* Free exclusive pages a pool keeps for its home stream: at most this
 * many, and beyond the first no more bytes than a sixteenth of what the
 * pool has in use (kept pages are memory no other stream can use). */
#define KEEP_CACHED 4
#define CACHE_SHARE 16
/* Smallest slab: cuMemAlloc is slow, so small classes share 64 KiB. */
#define SLAB_MIN (UINT64_C(64) << 10)
/* A slab holds at least this many slots (fewer only when page_size says). */
#define SLAB_SLOTS 8

/* ---- size classes ---- */

/* Four classes per doubling, all multiples of 256: 256, 512, 768, 1024,
 * 1280, 1536, 1792, 2048, 2560, ... A request wastes under 25% of its
 * slot, about 10% on average. */
uint32_t ruda__class_index(uint64_t size) {
  if (size <= 1024) return size == 0 ? 0 : (uint32_t)((size + 255) / 256 - 1);
  uint32_t e = 63u - (uint32_t)__builtin_clzll(size - 1); /* 2^e < size <= 2^(e+1) */
  uint32_t k = (uint32_t)((size - 1) >> (e - 2));         /* 4..7 */
  return 4 + (e - 10) * 4 + (k - 4);
}

uint64_t ruda__class_size(uint32_t index) {
  if (index < 4) return (uint64_t)(index + 1) * 256;
  uint32_t e = 10 + (index - 4) / 4, k = 4 + (index - 4) % 4;
  return (uint64_t)(k + 1) << (e - 2);
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Exclusive pages: sixteen sizes per doubling (under 6.25% waste). */
uint64_t ruda__exclusive_size(uint64_t size) {
  if (size <= 4096) return round_up(size, RUDA__MEM_ALIGN);
  uint32_t e = 63u - (uint32_t)__builtin_clzll(size - 1);
  uint64_t step = UINT64_C(1) << (e - 4);
  if (step < RUDA__MEM_ALIGN) step = RUDA__MEM_ALIGN;
  return round_up(size, step);
}

static uint64_t pow2_ceil(uint64_t x) {
  return x <= 1 ? 1 : UINT64_C(1) << (64 - __builtin_clzll(x - 1));
}

/* ---- building pools ---- */

static const char *kind_name(ruda_pool_kind k) {
  return k == RUDA_POOL_SLICED ? "sliced" : k == RUDA_POOL_EXCLUSIVE ? "exclusive" : "persistent";
}

static int pool_build(ruda__pools *p, ruda__pool *pool, const ruda_pool_config *cfg, uint64_t min_alloc) {
  memset(pool, 0, sizeof *pool);
  pool->cfg = *cfg;
  pool->min_alloc = min_alloc;
  pool->owner = p;
  if (cfg->kind != RUDA_POOL_SLICED) return 0;
  pool->c_lo = ruda__class_index(min_alloc + 1);
  uint32_t c_hi = ruda__class_index(cfg->max_alloc);
  pool->nclasses = c_hi - pool->c_lo + 1;
  pool->classes = calloc(pool->nclasses, sizeof *pool->classes);
  if (pool->classes == NULL) return RUDA_ENOMEM;
  for (uint32_t i = 0; i < pool->nclasses; i++) {
    ruda__class *c = &pool->classes[i];
    c->size = ruda__class_size(pool->c_lo + i);
    uint64_t slab = pow2_ceil(c->size) * SLAB_SLOTS;
    if (slab < SLAB_MIN) slab = SLAB_MIN;
    if (slab > cfg->page_size) slab = round_up(cfg->page_size, RUDA__MEM_ALIGN);
    if (slab < c->size) slab = c->size;
    c->slab = slab;
  }
  return 0;
}

/* Builds every pool of the layout, or none: RUDA_ENOMEM with p left
 * without pools (a stream that could never allocate would be worse). */
static int build_layout(ruda__pools *p, const ruda_pool_config *layout, uint32_t n) {
  uint64_t lo = 0;
  p->npools = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (pool_build(p, &p->pools[i], &layout[i], lo) != 0) {
      for (uint32_t j = 0; j < p->npools; j++) free(p->pools[j].classes);
      p->npools = 0;
      return RUDA_ENOMEM;
    }
    p->npools++;
    lo = layout[i].max_alloc;
  }
  p->peak_in_use = p->peak_reserved = 0;
  return 0;
}

uint32_t ruda_memory_default_pools(ruda_pool_config *pools, uint32_t cap) {
  /* Buffers up to 64 KiB share slabs of at least 8 slots (64 KiB to
   * 512 KiB); anything larger gets a page of its own, sized to one of 16
   * classes per doubling. Larger slabs would make every stream hold a
   * half-used slab per class, which costs more than page-sized buffers. */
  static const ruda_pool_config def[] = {
      {.kind = RUDA_POOL_SLICED, .max_alloc = UINT64_C(8) << 10, .page_size = UINT64_C(1) << 20},
      {.kind = RUDA_POOL_SLICED, .max_alloc = UINT64_C(64) << 10, .page_size = UINT64_C(2) << 20},
      {.kind = RUDA_POOL_EXCLUSIVE, .max_alloc = UINT64_MAX},
  };
  uint32_t n = sizeof def / sizeof def[0];
  for (uint32_t i = 0; i < n && i < cap && pools != NULL; i++) pools[i] = def[i];
  return n;
}

/* A spare pools (ruda__pools_recycle) made over to stream id on worker,
 * its high-water marks reset; NULL when there is none. */
static ruda__pools *take_spare(ruda__memory *mem, uint32_t worker, ruda_stream_id id) {
  pthread_mutex_lock(&mem->all_lock);
  ruda__pools *p = mem->spare;
  if (p != NULL) mem->spare = p->spare_next;
  pthread_mutex_unlock(&mem->all_lock);
  if (p == NULL) return NULL;
  pthread_mutex_lock(&p->lock);
  p->spare_next = NULL;
  p->stream_id = id;
  p->worker = worker;
  p->peak_in_use = p->peak_reserved = 0;
  for (uint32_t i = 0; i <= p->npools; i++) {
    ruda__pool *pool = i < p->npools ? &p->pools[i] : &p->persistent;
    pool->peak_nallocs = pool->peak_in_use = pool->peak_reserved = 0;
  }
  pthread_mutex_unlock(&p->lock);
  return p;
}

int ruda__pools_recycle(ruda__memory *mem, ruda__pools *p) {
  pthread_mutex_lock(&mem->layout_lock);
  pthread_mutex_lock(&p->lock);
  int empty = p->mode_depth == 0 && p->dry_depth == 0 && p->retired == NULL &&
              atomic_load_explicit(&p->incoming, memory_order_acquire) == NULL && p->npools == mem->nlayout;
  for (uint32_t i = 0; empty && i <= p->npools; i++) {
    const ruda__pool *pool = i < p->npools ? &p->pools[i] : &p->persistent;
    empty = pool->reserved == 0 && pool->nallocs == 0 &&
            (i == p->npools || memcmp(&pool->cfg, &mem->layout[i], sizeof pool->cfg) == 0);
  }
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_unlock(&mem->layout_lock);
  if (!empty) return 0;
  pthread_mutex_lock(&mem->all_lock);
  p->spare_next = mem->spare;
  mem->spare = p;
  pthread_mutex_unlock(&mem->all_lock);
  return 1;
}

ruda__pools *ruda__pools_of(ruda__memory *mem, ruda__pools *_Atomic *slot, uint32_t worker,
                           ruda_stream_id id) {
  ruda__pools *p = atomic_load_explicit(slot, memory_order_acquire);
  if (p != NULL) return p;
  if ((p = take_spare(mem, worker, id)) != NULL) {
    ruda__pools *expected = NULL;
    if (atomic_compare_exchange_strong_explicit(slot, &expected, p, memory_order_acq_rel, memory_order_acquire))
      return p;
    ruda__pools_recycle(mem, p); /* another thread made the stream's pools first */
    return expected;
  }
  p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  pthread_mutex_init(&p->lock, NULL);
  p->mem = mem;
  p->stream_id = id;
  p->worker = worker;
  ruda_pool_config layout[RUDA_MEMORY_MAX_POOLS];
  pthread_mutex_lock(&mem->layout_lock);
  uint32_t n = mem->nlayout;
  memcpy(layout, mem->layout, n * sizeof layout[0]);
  pthread_mutex_unlock(&mem->layout_lock);
  ruda_pool_config pers = {.kind = RUDA_POOL_PERSISTENT, .max_alloc = UINT64_MAX};
  if (build_layout(p, layout, n) != 0) {
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
  }
  pool_build(p, &p->persistent, &pers, 0);
  ruda__pools *expected = NULL;
  if (!atomic_compare_exchange_strong_explicit(slot, &expected, p, memory_order_acq_rel,
                                               memory_order_acquire)) {
    for (uint32_t i = 0; i < p->npools; i++) free(p->pools[i].classes);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return expected;
  }
  pthread_mutex_lock(&mem->all_lock);
  p->all_next = mem->all;
  mem->all = p;
  pthread_mutex_unlock(&mem->all_lock);
  return p;
}

/* ---- figures ---- */

static void note_reserved(ruda__pool *pool, int64_t delta, int unbacked) {
  ruda__pools *p = pool->owner;
  pool->reserved += (uint64_t)delta;
  if (unbacked) pool->unbacked += (uint64_t)delta;
  pool->pages += delta > 0 ? 1 : (uint64_t)-1;
  if (pool->reserved > pool->peak_reserved) pool->peak_reserved = pool->reserved;
  if (delta > 0) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < p->npools; i++) total += p->pools[i].reserved;
    total += p->persistent.reserved;
    if (total > p->peak_reserved) p->peak_reserved = total;
  }
}

static void note_alloc(ruda__pool *pool, uint64_t size, uint64_t slot) {
  ruda__pools *p = pool->owner;
  pool->nallocs++;
  pool->in_use += size;
  pool->padding += slot - size;
  if (pool->nallocs > pool->peak_nallocs) pool->peak_nallocs = pool->nallocs;
  if (pool->in_use > pool->peak_in_use) pool->peak_in_use = pool->in_use;
  uint64_t total = p->persistent.in_use;
  for (uint32_t i = 0; i < p->npools; i++) total += p->pools[i].in_use;
  if (total > p->peak_in_use) p->peak_in_use = total;
}

/* ---- pages in a pool ---- */

static void list_push(ruda__page **head, ruda__page *pg) {
  pg->prev = NULL;
  pg->next = *head;
  if (*head) (*head)->prev = pg;
  *head = pg;
  pg->in_list = 1;
}

static void list_unlink(ruda__page **head, ruda__page *pg) {
  if (pg->prev) pg->prev->next = pg->next;
  else *head = pg->next;
  if (pg->next) pg->next->prev = pg->prev;
  pg->next = pg->prev = NULL;
  pg->in_list = 0;
}

/* The pool's empty slabs (counted in nempty) and kept exclusive pages
 * (ncache, cache_bytes): a page goes on or off either list with its
 * counts. */
static void empty_push(ruda__pool *pool, ruda__page *pg) {
  list_push(&pool->empty, pg);
  pool->nempty++;
}

static void empty_unlink(ruda__pool *pool, ruda__page *pg) {
  list_unlink(&pool->empty, pg);
  pool->nempty--;
}

static void cache_push(ruda__pool *pool, ruda__page *pg) {
  list_push(&pool->cache, pg);
  pool->ncache++;
  pool->cache_bytes += pg->size;
}

static void cache_unlink(ruda__pool *pool, ruda__page *pg) {
  list_unlink(&pool->cache, pg);
  pool->ncache--;
  pool->cache_bytes -= pg->size;
}

/* A page leaves its pool for the arena. */
static void page_out(ruda__pool *pool, ruda__page *pg) {
  ruda__memory *mem = pool->owner->mem;
  note_reserved(pool, -(int64_t)pg->size, atomic_load_explicit(&pg->base, memory_order_relaxed) == 0);
  pg->pool = NULL;
  ruda__arena_put(mem, pg, pool->owner->worker);
}

/* Gives every page the pools hold without a live buffer back to the
 * arena: empty slabs, kept exclusive pages. */
static void pool_release_unused(ruda__pool *pool) {
  while (pool->empty) {
    ruda__page *pg = pool->empty;
    empty_unlink(pool, pg);
    page_out(pool, pg);
  }
  while (pool->cache) {
    ruda__page *pg = pool->cache;
    cache_unlink(pool, pg);
    page_out(pool, pg);
  }
  for (uint32_t i = 0; i < pool->nclasses; i++) {
    ruda__class *c = &pool->classes[i];
    for (ruda__page *pg = c->nonfull, *next; pg != NULL; pg = next) {
      next = pg->next;
      if (pg->nused == 0) {
        list_unlink(&c->nonfull, pg);
        page_out(pool, pg);
      }
    }
  }
}

void ruda__pools_release_unused(ruda__pools *p) {
  for (uint32_t i = 0; i < p->npools; i++) pool_release_unused(&p->pools[i]);
  pool_release_unused(&p->persistent);
}

uint64_t ruda__pools_give_back(ruda__pools *p) {
  pthread_mutex_lock(&p->lock);
  ruda__pools_poll_retired(p);
  ruda__pools_release_unused(p);
  uint64_t kept = p->persistent.reserved;
  for (uint32_t i = 0; i < p->npools; i++) kept += p->pools[i].reserved;
  pthread_mutex_unlock(&p->lock);
  return kept;
}

/* Room for need more bytes of pages under the pool's cap? Unused pages
 * go first. */
static int cap_check(ruda__pool *pool, uint64_t need, uint64_t request, const char *fn) {
  uint64_t cap = pool->cfg.capacity;
  if (cap == 0 || pool->reserved + need <= cap) return 0;
  pool_release_unused(pool);
  if (pool->reserved + need <= cap) return 0;
  ruda__pools *p = pool->owner;
  return ruda__fail(RUDA_EPOOLCAPACITY,
                    "%s: %s pool (up to %llu bytes) of %s is capped at %llu bytes: a %llu-byte "
                    "buffer needs a %llu-byte page; %llu bytes in use, %llu reserved",
                    fn, kind_name(pool->cfg.kind), (unsigned long long)pool->cfg.max_alloc,
                    RUDA__SNAME(p->stream_id), (unsigned long long)cap,
                    (unsigned long long)request, (unsigned long long)need,
                    (unsigned long long)pool->in_use, (unsigned long long)pool->reserved);
}

/* A page of at least size bytes for pool: from the arena (up to an
 * eighth bigger, and within the cap), else the backend. */
static ruda__page *page_in(ruda__pool *pool, uint64_t size, uint64_t request, const char *fn, int *rc) {
  ruda__pools *p = pool->owner;
  if ((*rc = cap_check(pool, size, request, fn)) != 0) return NULL;
  if (p->retired || atomic_load_explicit(&p->incoming, memory_order_relaxed)) ruda__pools_poll_retired(p);
  uint64_t max = size + size / 8;
  if (pool->cfg.capacity && max > pool->cfg.capacity - pool->reserved) max = pool->cfg.capacity - pool->reserved;
  ruda__page *pg = ruda__arena_find(p->mem, p->worker, size, max);
  /* Rather than new backend memory (a slow call, and with cuMemFree a
   * device synchronization when something is trimmed for it), take a free
   * page up to twice the size: it is reserved already either way. */
  uint64_t loose = size * 2;
  if (pool->cfg.capacity && loose > pool->cfg.capacity - pool->reserved) loose = pool->cfg.capacity - pool->reserved;
  if (pg == NULL && loose > max) pg = ruda__arena_find(p->mem, p->worker, max + 1, loose);
  if (pg == NULL) {
    /* New memory is about to be taken: pages this stream keeps that did
     * not fit go where they can be reused by others or freed first. */
    for (uint32_t i = 0; i < p->npools; i++)
      if (p->pools[i].cache != NULL) pool_release_unused(&p->pools[i]);
    if (p->persistent.cache != NULL) pool_release_unused(&p->persistent);
    pg = ruda__arena_take(p->mem, p->worker, p, size, max, p->dry_depth > 0, fn, request, rc);
    if (pg == NULL) return NULL;
  }
  pg->pool = pool;
  note_reserved(pool, (int64_t)pg->size, atomic_load_explicit(&pg->base, memory_order_relaxed) == 0);
  return pg;
}

/* Cuts pg into slots of class c. */
static int slice(ruda__page *pg, ruda__class *c, uint32_t klass) {
  uint32_t n = (uint32_t)(pg->size / c->size);
  if (n > pg->free_cap) {
    uint32_t *f = realloc(pg->free_idx, n * sizeof *f);
    if (f == NULL) return RUDA_ENOMEM;
    pg->free_idx = f;
    pg->free_cap = n;
  }
  pg->klass = klass;
  pg->slot_size = c->size;
  pg->nslots = n;
  pg->nused = pg->nfree = pg->bump = 0;
  return 0;
}

/* Non-dry allocations must not land on a page a dry run left unbacked. */
static int ensure_backed(ruda__pools *p, ruda__page *pg, const char *fn) {
  if (p->dry_depth > 0 || atomic_load_explicit(&pg->base, memory_order_acquire) != 0) return 0;
  int rc = ruda__arena_back(p->mem, p, pg, fn);
  if (rc == 0 && pg->pool) pg->pool->unbacked -= pg->size;
  return rc;
}

static int alloc_sliced(ruda__pool *pool, uint64_t size, const char *fn, ruda__page **out, uint64_t *addr) {
  ruda__pools *p = pool->owner;
  uint32_t k = ruda__class_index(size) - pool->c_lo;
  ruda__class *c = &pool->classes[k];
  ruda__page *pg = c->nonfull;
  int rc;
  if (pg == NULL) {
    /* An empty page of the pool that is big enough and not much bigger. */
    for (ruda__page *e = pool->empty; e != NULL; e = e->next)
      if (e->size >= c->slab && e->size <= 2 * c->slab) {
        pg = e;
        empty_unlink(pool, e);
        break;
      }
    if (pg == NULL && (pg = page_in(pool, c->slab, size, fn, &rc)) == NULL) return rc;
    if (slice(pg, c, k) != 0) {
      empty_push(pool, pg);
      return ruda__fail(RUDA_ENOMEM, "%s: out of host memory for page metadata", fn);
    }
    list_push(&c->nonfull, pg);
  }
  /* Counted as used while backing it: the out-of-memory path releases
   * unused pages of this very pool. */
  pg->nused++;
  rc = ensure_backed(p, pg, fn);
  pg->nused--;
  if (rc != 0) return rc;
  uint32_t idx = pg->nfree ? pg->free_idx[--pg->nfree] : pg->bump++;
  if (++pg->nused == pg->nslots) list_unlink(&c->nonfull, pg);
  uint64_t off = (uint64_t)idx * pg->slot_size;
  uint64_t base = atomic_load_explicit(&pg->base, memory_order_relaxed);
  *addr = base ? base + off : (RUDA__UNBACKED | off);
  *out = pg;
  note_alloc(pool, size, pg->slot_size);
  return 0;
}

static int alloc_exclusive(ruda__pool *pool, uint64_t size, const char *fn, ruda__page **out, uint64_t *addr) {
  ruda__pools *p = pool->owner;
  uint64_t want = pool->cfg.kind == RUDA_POOL_PERSISTENT ? round_up(size, RUDA__MEM_ALIGN)
                                                         : ruda__exclusive_size(size);
  ruda__page *pg = NULL;
  int rc;
  for (ruda__page *e = pool->cache; e != NULL; e = e->next)
    if (e->size >= want && e->size - want <= want / 8) {
      pg = e;
      cache_unlink(pool, e);
      break;
    }
  if (pg == NULL && (pg = page_in(pool, want, size, fn, &rc)) == NULL) return rc;
  if ((rc = ensure_backed(p, pg, fn)) != 0) {
    cache_push(pool, pg);
    return rc;
  }
  pg->klass = UINT32_MAX;
  pg->nslots = pg->nused = 1;
  pg->slot_size = pg->size;
  uint64_t base = atomic_load_explicit(&pg->base, memory_order_relaxed);
  *addr = base ? base : RUDA__UNBACKED;
  *out = pg;
  note_alloc(pool, size, pg->size);
  return 0;
}

/* Returns a buffer's memory to its pool (owner's lock held). */
static void release(ruda__page *pg, uint64_t addr, uint64_t size, int used) {
  ruda__pool *pool = pg->pool;
  pg->dirty |= (uint8_t)(used != 0);
  pool->nallocs--;
  pool->in_use -= size;
  pool->padding -= pg->slot_size - size;
  const int unbacked = atomic_load_explicit(&pg->base, memory_order_relaxed) == 0;
  if (pg->klass == UINT32_MAX) { /* exclusive page */
    pg->nused = 0;
    if (unbacked) { /* a dry run's page: nothing to keep */
      page_out(pool, pg);
      return;
    }
    cache_push(pool, pg);
    while (pool->ncache > 1 &&
           (pool->ncache > KEEP_CACHED || pool->cache_bytes > pool->in_use / CACHE_SHARE)) {
      ruda__page *old = pool->cache;
      while (old->next) old = old->next;
      cache_unlink(pool, old);
      page_out(pool, old);
    }
    return;
  }
  uint64_t off = (addr & RUDA__UNBACKED) ? (addr & ~RUDA__UNBACKED)
                                         : addr - atomic_load_explicit(&pg->base, memory_order_relaxed);
  ruda__class *c = &pool->classes[pg->klass];
  pg->free_idx[pg->nfree++] = (uint32_t)(off / pg->slot_size);
  if (pg->nused-- == pg->nslots) list_push(&c->nonfull, pg);
  if (pg->nused > 0) return;
  /* Empty: the class keeps one page to cut from; others go to the pool's
   * empty list, and past that to the arena. Pages a dry run left without
   * memory are dropped at once. */
  if (c->nonfull == pg && pg->next == NULL && !unbacked) return;
  list_unlink(&c->nonfull, pg);
  pg->klass = UINT32_MAX;
  if (pool->nempty < KEEP_EMPTY && !unbacked) {
    empty_push(pool, pg);
  } else {
    page_out(pool, pg);
  }
}

static ruda__pool *route(ruda__pools *p, uint64_t size) {
  if (p->mode_depth > 0 && p->modes[p->mode_depth - 1] == RUDA_ALLOC_PERSISTENT) return &p->persistent;
  for (uint32_t i = 0; i < p->npools; i++)
    if (size <= p->pools[i].cfg.max_alloc) return &p->pools[i];
  return NULL;
}

/* ---- buffers ---- */

int ruda__memory_alloc(ruda__pools *p, uint64_t size, const char *fn, ruda_handle *out) {
  ruda__memory *mem = p->mem;
  pthread_mutex_lock(&p->lock);
  if (atomic_load_explicit(&p->incoming, memory_order_relaxed) != NULL) ruda__pools_poll_retired(p);
  ruda__pool *pool = route(p, size);
  int rc;
  if (pool == NULL) {
    uint64_t max = p->npools ? p->pools[p->npools - 1].cfg.max_alloc : 0;
    pthread_mutex_unlock(&p->lock);
    return ruda__fail(RUDA_EBUFFERTOOBIG,
                      "%s: %llu bytes can never fit: the largest pool of %s "
                      "takes %llu bytes",
                      fn, (unsigned long long)size, RUDA__SNAME(p->stream_id), (unsigned long long)max);
  }
  if (p->nslots == 0) {
    p->nslots = ruda__handles_take(mem->handles, p->slots, RUDA__SLOT_BATCH);
    if (p->nslots == 0) {
      pthread_mutex_unlock(&p->lock);
      return ruda__fail(RUDA_ENOMEM, "%s: no handle slot left (host memory or the limit of live buffers)", fn);
    }
  }
  ruda__page *pg = NULL;
  uint64_t addr = 0;
  rc = pool->cfg.kind == RUDA_POOL_SLICED ? alloc_sliced(pool, size, fn, &pg, &addr)
                                          : alloc_exclusive(pool, size, fn, &pg, &addr);
  if (rc != 0) {
    pthread_mutex_unlock(&p->lock);
    return rc;
  }
  uint32_t slot = p->slots[--p->nslots];
  pthread_mutex_unlock(&p->lock);
  ruda__handles_publish(mem->handles, slot, addr, size, p->worker, pg, out);
  return 0;
}

int ruda__memory_free(ruda__memory *mem, ruda_handle h) {
  uint32_t refs = 0;
  int rc = ruda__handles_kill(mem->handles, h, &refs);
  if (rc != 0) return rc;
  ruda__slot *slot = ruda__handles_slot(mem->handles, h.slot);
  ruda__page *pg = atomic_load_explicit(&slot->mem, memory_order_relaxed);
  /* The kill's acquire-release pairs with every successful pin, so any
   * other worker that pinned the buffer has its bit in users by now. */
  uint64_t users = atomic_load_explicit(&slot->users, memory_order_acquire);
  const int used = atomic_load_explicit(&slot->used, memory_order_relaxed);
  if (pg == NULL || users != 0 || (refs != 1 && atomic_load_explicit(&slot->pending, memory_order_acquire) != 0) ||
      atomic_load_explicit(&slot->held, memory_order_relaxed)) {
    /* Raw memory, used on other workers, kept by a graph, or pinned by a
     * call that has not queued its command yet (which would then run
     * after a reuse queued meanwhile): the last reference decides
     * (ruda__memory_retire waits for other workers' fences). */
    ruda__handles_unpin(mem->handles, h.slot, NULL);
    return 0;
  }
  /* Only the home worker ever used it and every command that holds it is
   * queued there: every later command of the home stream runs after
   * them, so the memory is reusable at once. */
  ruda__pools *p = pg->pool->owner;
  uint64_t addr = slot->addr, size = slot->size;
  pthread_mutex_lock(&p->lock);
  release(pg, addr, size, used);
  atomic_store_explicit(&slot->mem, NULL, memory_order_relaxed);
  if (ruda__handles_drop(mem->handles, h.slot)) {
    if (p->nslots == RUDA__SLOT_CACHE) {
      ruda__handles_put(mem->handles, p->slots, RUDA__SLOT_BATCH);
      p->nslots -= RUDA__SLOT_BATCH;
      memmove(p->slots, p->slots + RUDA__SLOT_BATCH, p->nslots * sizeof p->slots[0]);
    }
    p->slots[p->nslots++] = h.slot;
  }
  pthread_mutex_unlock(&p->lock);
  return 0;
}

void ruda__memory_retire(ruda__memory *mem, void *page, uint64_t addr, uint64_t size, uint32_t home,
                         uint64_t users) {
  ruda__page *pg = page;
  ruda__pools *p = pg->pool->owner;
  uint32_t n = 0, nw = mem->nworkers;
  for (uint32_t w = 0; w < nw; w++)
    if (w != home && (users >> (w & 63)) & 1) n++;
  /* A buffer retired here was pinned by some command: used. */
  if (n == 0 && pthread_mutex_trylock(&p->lock) == 0) {
    release(pg, addr, size, 1);
    pthread_mutex_unlock(&p->lock);
    return;
  }
  ruda__retired *r = NULL;
  for (int tries = 0; tries < 64 && (r = malloc(sizeof *r + n * sizeof r->wait[0])) == NULL; tries++) sched_yield();
  if (r == NULL) {
    /* No memory to note what the reuse must wait for: the bytes stay with
     * their page, still counted in use, until the device closes and frees
     * every page. Never a hang, never an early reuse. */
    atomic_fetch_add_explicit(&mem->stranded, 1, memory_order_relaxed);
    return;
  }
  r->page = pg;
  r->addr = addr;
  r->size = size;
  r->nwait = 0;
  for (uint32_t w = 0; w < nw; w++)
    if (w != home && (users >> (w & 63)) & 1) {
      r->wait[r->nwait].worker = w;
      r->wait[r->nwait].need = ruda__fence_need(mem, w, 1);
      r->nwait++;
    }
  /* A worker may be the caller: push without the lock, never wait on it. */
  r->next = atomic_load_explicit(&p->incoming, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&p->incoming, &r->next, r, memory_order_release,
                                                memory_order_relaxed)) {
  }
}

void ruda__pools_poll_retired(ruda__pools *p) {
  ruda__retired *in = atomic_exchange_explicit(&p->incoming, NULL, memory_order_acquire);
  while (in != NULL) {
    ruda__retired *next = in->next;
    in->next = p->retired;
    p->retired = in;
    in = next;
  }
  ruda__retired **link = &p->retired;
  while (*link != NULL) {
    ruda__retired *r = *link;
    uint32_t i = 0;
    while (i < r->nwait && ruda__fence_passed(p->mem, r->wait[i].worker, r->wait[i].need)) i++;
    if (i < r->nwait) {
      link = &r->next;
      continue;
    }
    *link = r->next;
    release(r->page, r->addr, r->size, 1);
    free(r);
  }
}

int ruda__memory_back(ruda__memory *mem, void *page, uint64_t tagged, const char *fn, uint64_t *addr) {
  ruda__page *pg = page;
  uint64_t base = pg ? atomic_load_explicit(&pg->base, memory_order_acquire) : 0;
  if (pg != NULL && base == 0) {
    ruda__pools *p = pg->pool->owner;
    pthread_mutex_lock(&p->lock);
    int rc = 0;
    if (atomic_load_explicit(&pg->base, memory_order_relaxed) == 0 && (rc = ruda__arena_back(mem, p, pg, fn)) == 0 &&
        pg->pool)
      pg->pool->unbacked -= pg->size;
    pthread_mutex_unlock(&p->lock);
    if (rc != 0) {
      char cause[RUDA__MSG_MAX];
      snprintf(cause, sizeof cause, "%s", ruda_error_message(ruda_last_error()));
      long raw = ruda_error_backend_code(ruda_last_error());
      return ruda__fail_backend(RUDA_ESTORAGEMAPPING, raw,
                        "%s: could not back a deferred (dry-run) allocation: its %llu-byte page has "
                        "no device memory; the plan was measured against more memory than there is; "
                        "caused by %s: %.300s",
                        fn, (unsigned long long)pg->size, ruda_err_name(rc), cause);
    }
    base = atomic_load_explicit(&pg->base, memory_order_acquire);
  }
  if (pg == NULL)
    return ruda__fail(RUDA_ENOTFOUND, "%s: the buffer was freed while the call used it", fn);
  *addr = base + (tagged & ~RUDA__UNBACKED);
  return 0;
}

/* ---- layouts ---- */

int ruda__pools_check_layout(const ruda_pool_config *pools, uint32_t n) {
  static const char fn[] = "ruda_memory_install_pools";
  if (pools == NULL) return ruda__fail(RUDA_EINVAL, "%s: pools is NULL", fn);
  if (n == 0 || n > RUDA_MEMORY_MAX_POOLS)
    return ruda__fail(RUDA_EINVAL, "%s: %u pools, expected 1..%d", fn, n, RUDA_MEMORY_MAX_POOLS);
  uint64_t lo = 0;
  for (uint32_t i = 0; i < n; i++) {
    const ruda_pool_config *c = &pools[i];
    if (c->kind != RUDA_POOL_SLICED && c->kind != RUDA_POOL_EXCLUSIVE)
      return ruda__fail(RUDA_EINVAL, "%s: pool %u has kind %d, not sliced or exclusive", fn, i, (int)c->kind);
    if (c->reserved[0] != 0 || c->reserved[1] != 0)
      return ruda__fail(RUDA_EINVAL, "%s: pool %u: reserved words must be zero", fn, i);
    if (c->max_alloc <= lo)
      return ruda__fail(RUDA_EINVAL, "%s: pool %u takes up to %llu bytes, not more than pool %u's %llu",
                        fn, i, (unsigned long long)c->max_alloc, i ? i - 1 : 0, (unsigned long long)lo);
    if (c->kind == RUDA_POOL_SLICED) {
      if (c->max_alloc > (UINT64_C(1) << 40) || c->page_size > (UINT64_C(1) << 40))
        return ruda__fail(RUDA_EINVAL, "%s: sliced pool %u: max_alloc and page_size must be at most 1 TiB",
                          fn, i);
      if (c->page_size < c->max_alloc)
        return ruda__fail(RUDA_EINVAL, "%s: sliced pool %u: page_size %llu is below its max_alloc %llu", fn,
                          i, (unsigned long long)c->page_size, (unsigned long long)c->max_alloc);
    }
    lo = c->max_alloc;
  }
  return 0;
}

void ruda__memory_set_layout(ruda__memory *mem, const ruda_pool_config *pools, uint32_t n) {
  pthread_mutex_lock(&mem->layout_lock);
  memcpy(mem->layout, pools, n * sizeof *pools);
  mem->nlayout = n;
  pthread_mutex_unlock(&mem->layout_lock);
}

int ruda__pools_install(ruda__pools *p, const ruda_pool_config *pools, uint32_t n, const char *fn) {
  pthread_mutex_lock(&p->lock);
  ruda__pools_poll_retired(p);
  uint64_t live = 0, bytes = 0;
  for (uint32_t i = 0; i < p->npools; i++) {
    live += p->pools[i].nallocs;
    bytes += p->pools[i].in_use;
  }
  if (live > 0) {
    pthread_mutex_unlock(&p->lock);
    return ruda__fail(RUDA_EPOOLSINUSE,
                      "%s: %s kept its old layout: %llu buffers (%llu bytes) are live in its "
                      "pools; the new layout applies to streams created from now on",
                      fn, RUDA__SNAME(p->stream_id), (unsigned long long)live, (unsigned long long)bytes);
  }
  /* Same layout already? Keep the pages. */
  int same = p->npools == n;
  for (uint32_t i = 0; same && i < n; i++)
    same = memcmp(&p->pools[i].cfg, &pools[i], sizeof *pools) == 0;
  if (!same) {
    for (uint32_t i = 0; i < p->npools; i++) {
      pool_release_unused(&p->pools[i]);
      free(p->pools[i].classes);
    }
    if (build_layout(p, pools, n) != 0) {
      pthread_mutex_unlock(&p->lock);
      return ruda__fail(RUDA_ENOMEM, "%s: out of host memory; the stream has no pools until a layout is installed",
                        fn);
    }
  }
  pthread_mutex_unlock(&p->lock);
  return 0;
}

/* Others' locks are only tried, so two threads reclaiming at once cannot
 * deadlock. */
void ruda__pools_reclaim(ruda__memory *mem, ruda__pools *own) {
  if (own) ruda__pools_release_unused(own);
  pthread_mutex_lock(&mem->all_lock);
  ruda__pools *q = mem->all; /* the list only grows at its head */
  pthread_mutex_unlock(&mem->all_lock);
  for (; q != NULL; q = q->all_next) {
    if (q == own || pthread_mutex_trylock(&q->lock) != 0) continue;
    ruda__pools_release_unused(q);
    pthread_mutex_unlock(&q->lock);
  }
}

void ruda__pools_retire_hook(void *ctx, void *page, uint64_t addr, uint64_t size, uint32_t home,
                             uint64_t users) {
  ruda__memory_retire(ctx, page, addr, size, home, users);
}

void ruda__pools_destroy_all(ruda__memory *mem) {
  for (ruda__pools *p = mem->all, *next; p != NULL; p = next) {
    next = p->all_next;
    ruda__retired *r = atomic_exchange(&p->incoming, NULL);
    while (r) {
      ruda__retired *rn = r->next;
      free(r);
      r = rn;
    }
    for (r = p->retired; r != NULL;) {
      ruda__retired *rn = r->next;
      free(r);
      r = rn;
    }
    for (uint32_t i = 0; i < p->npools; i++) free(p->pools[i].classes);
    pthread_mutex_destroy(&p->lock);
    free(p);
  }
  mem->all = NULL;
}

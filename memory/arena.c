/* arena.c - the device arena and its backend pages (memory/arena.h).
 *
 * The arena holds pages no stream's pools hold, in one shard per worker. A
 * page returned by a pool on worker W goes to W's shard; it may be taken
 * again at once by a stream of W (its commands follow W's earlier ones),
 * and by any other stream once a fence issued on W after the return has
 * completed on the device (or at once if no command touched it). Streams
 * look in their own worker's shard first, so threads on different workers
 * do not meet on one lock; only a shard with nothing that fits sends them
 * to the others. Fences are internal sync commands, a few in flight per
 * worker, polled, so neither the allocation path nor a worker ever waits
 * for the device.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/sync.h"
#include "memory/arena.h"
#include "memory/fence.h"
#include "memory/memory.h"

/* Free pages the arena keeps: an eighth of the pages in use, at least
 * this much. Past it, the oldest pages whose fences passed are freed; the
 * arena is also brought down to it before any new backend allocation, so
 * what is reserved follows what is live instead of its history. The floor
 * is large enough that a few hundred MiB of mixed live buffers do not
 * trade pages with the backend on every burst (docs/memory.md has the
 * measurement behind it). */
#define RETAIN_MIN (UINT64_C(128) << 20)
#define RETAIN_SHARE 8
/* Before a backend allocation that would set a new high-water mark of
 * reserved memory, the arena keeps only this fraction of its budget. */
#define PEAK_SHARE 4
/* How long an out-of-memory retry waits for workers to pass fences. */
#define OOM_WAIT_NS (50ull * 1000 * 1000)
/* Arena pages examined per bucket before giving up on it. */
#define SCAN_MAX 32

static ruda__page *collect(ruda__memory *mem, ruda__shard *a, uint64_t keep);
static void discard_list(ruda__memory *mem, ruda__page *list);

static uint32_t bucket_of(uint64_t size) {
  if (size < 4096) return (uint32_t)(size / 256);
  uint32_t e = 63u - (uint32_t)__builtin_clzll(size);
  uint32_t sub = (uint32_t)(size >> (e - 4)) & 15u;
  return 16 + (e - 12) * 16 + sub;
}

static void bucket_link(ruda__arena *arena, ruda__shard *a, ruda__page *pg) {
  uint32_t b = bucket_of(pg->size);
  pg->bucket = b;
  /* Append: older pages, likelier past their fences, are met first. */
  pg->next = NULL;
  pg->prev = a->bucket_tail[b];
  if (pg->prev) pg->prev->next = pg;
  else a->bucket[b] = pg;
  a->bucket_tail[b] = pg;
  a->nonempty[b / 64] |= UINT64_C(1) << (b % 64);
  if (a->count[b]++ == 0) a->nbuckets++;
  pg->lru_next = NULL;
  pg->lru_prev = a->lru_tail;
  if (a->lru_tail) a->lru_tail->lru_next = pg;
  else a->lru_head = pg;
  a->lru_tail = pg;
  atomic_fetch_add_explicit(&a->free_bytes, pg->size, memory_order_relaxed);
  atomic_fetch_add_explicit(&a->npages, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&arena->free_bytes, pg->size, memory_order_relaxed);
}

static void bucket_unlink(ruda__arena *arena, ruda__shard *a, ruda__page *pg) {
  uint32_t b = pg->bucket;
  if (pg->prev) pg->prev->next = pg->next;
  else a->bucket[b] = pg->next;
  if (pg->next) pg->next->prev = pg->prev;
  else a->bucket_tail[b] = pg->prev;
  if (a->bucket[b] == NULL) a->nonempty[b / 64] &= ~(UINT64_C(1) << (b % 64));
  if (--a->count[b] == 0) a->nbuckets--;
  if (pg->lru_prev) pg->lru_prev->lru_next = pg->lru_next;
  else a->lru_head = pg->lru_next;
  if (pg->lru_next) pg->lru_next->lru_prev = pg->lru_prev;
  else a->lru_tail = pg->lru_prev;
  pg->next = pg->prev = pg->lru_next = pg->lru_prev = NULL;
  atomic_fetch_sub_explicit(&a->free_bytes, pg->size, memory_order_relaxed);
  atomic_fetch_sub_explicit(&a->npages, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&arena->free_bytes, pg->size, memory_order_relaxed);
}

/* ---- pages ---- */

static ruda__page *page_new(ruda__memory *mem, uint64_t size, uint64_t base) {
  ruda__page *pg = calloc(1, sizeof *pg);
  if (pg == NULL) return NULL;
  pg->size = size;
  atomic_init(&pg->base, base);
  pg->klass = UINT32_MAX;
  ruda__arena *a = &mem->arena;
  pthread_mutex_lock(&a->lock);
  pg->all_next = a->all;
  if (a->all) a->all->all_prev = pg;
  a->all = pg;
  pthread_mutex_unlock(&a->lock);
  if (base) {
    uint64_t now = atomic_fetch_add(&a->backed, size) + size;
    uint64_t peak = atomic_load(&a->peak_backed);
    while (now > peak && !atomic_compare_exchange_weak(&a->peak_backed, &peak, now)) {
    }
  } else {
    atomic_fetch_add(&a->virtual_bytes, size);
  }
  return pg;
}

/* Forgets a page (its memory, if any, already went back). */
static void page_forget(ruda__memory *mem, ruda__page *pg) {
  ruda__arena *a = &mem->arena;
  pthread_mutex_lock(&a->lock);
  if (pg->all_prev) pg->all_prev->all_next = pg->all_next;
  else a->all = pg->all_next;
  if (pg->all_next) pg->all_next->all_prev = pg->all_prev;
  pthread_mutex_unlock(&a->lock);
  free(pg->free_idx);
  free(pg);
}

void ruda__page_discard(ruda__memory *mem, ruda__page *pg) {
  uint64_t base = atomic_load_explicit(&pg->base, memory_order_relaxed);
  ruda__arena *a = &mem->arena;
  if (base) {
    mem->backend->ops->mem_free(mem->backend->state, base, NULL);
    atomic_fetch_sub(&a->backed, pg->size);
    atomic_fetch_add(&a->backend_frees, 1);
  } else {
    atomic_fetch_sub(&a->virtual_bytes, pg->size);
  }
  page_forget(mem, pg);
}

/* The backend call, retried once after releasing cached pages. */
static int backend_alloc(ruda__memory *mem, struct ruda__pools *own, uint64_t size, uint64_t request,
                         const char *fn, uint64_t *addr) {
  ruda__arena *a = &mem->arena;
  atomic_fetch_add(&a->backend_allocs, 1);
  int rc = mem->backend->ops->mem_alloc(mem->backend->state, size, addr);
  if (rc != RUDA_EOUTOFMEMORY) return rc;
  mem->reclaim(mem, own);
  uint64_t released = ruda__arena_trim(mem, 0, OOM_WAIT_NS);
  atomic_fetch_add(&a->backend_allocs, 1);
  rc = mem->backend->ops->mem_alloc(mem->backend->state, size, addr);
  if (rc != RUDA_EOUTOFMEMORY) return rc;
  /* Keep the backend's own words and result (CUresult) reachable. */
  char cause[RUDA__MSG_MAX];
  snprintf(cause, sizeof cause, "%s", ruda_error_message(ruda_last_error()));
  long raw = ruda_error_backend_code(ruda_last_error());
  return ruda__fail_backend(RUDA_EOUTOFMEMORY, raw,
                    "%s: out of device memory for a %llu-byte page (a %llu-byte buffer), also after "
                    "releasing %llu cached bytes; %llu bytes are reserved: %.200s",
                    fn, (unsigned long long)size, (unsigned long long)request,
                    (unsigned long long)released, (unsigned long long)atomic_load(&a->backed), cause);
}

/* The free bytes the arena may keep. */
static uint64_t retain(ruda__arena *a) {
  /* Two counters read apart: a page moving meanwhile may show in one only. */
  uint64_t backed = atomic_load(&a->backed), free_bytes = atomic_load(&a->free_bytes);
  uint64_t used = backed > free_bytes ? backed - free_bytes : 0;
  return used / RETAIN_SHARE > RETAIN_MIN ? used / RETAIN_SHARE : RETAIN_MIN;
}

/* A page of size..max_size from shard a (of worker `owner`) that worker w
 * may use; NULL if none. */
static ruda__page *shard_find(ruda__memory *mem, ruda__shard *a, uint32_t owner, uint32_t w, uint64_t size,
                              uint64_t max_size) {
  if (atomic_load_explicit(&a->npages, memory_order_relaxed) == 0) return NULL;
  ruda__page *found = NULL;
  pthread_mutex_lock(&a->lock);
  uint32_t b_hi = bucket_of(max_size);
  for (uint32_t b = bucket_of(size); b <= b_hi && found == NULL; b++) {
    if (!(a->nonempty[b / 64] & (UINT64_C(1) << (b % 64)))) continue;
    int scanned = 0;
    for (ruda__page *pg = a->bucket[b]; pg != NULL && scanned < SCAN_MAX; pg = pg->next, scanned++) {
      if (pg->size < size || pg->size > max_size) continue;
      if (owner == w) {
        /* The worker's own returns need no fence; a page it takes back
         * before the fence passed stays dirty, so that its next return
         * fences again. */
        pg->dirty = (uint8_t)!ruda__fence_seen(mem, owner, pg->need);
      } else {
        if (!ruda__fence_passed(mem, owner, pg->need)) continue;
        pg->dirty = 0;
      }
      found = pg;
      break;
    }
  }
  if (found) bucket_unlink(&mem->arena, a, found);
  pthread_mutex_unlock(&a->lock);
  return found;
}

ruda__page *ruda__arena_find(ruda__memory *mem, uint32_t w, uint64_t size, uint64_t max_size) {
  ruda__arena *a = &mem->arena;
  const uint32_t n = a->nshards;
  ruda__page *pg = shard_find(mem, &a->shards[w], w, w, size, max_size);
  for (uint32_t i = 1; pg == NULL && i < n; i++) {
    uint32_t o = (w + i) % n;
    pg = shard_find(mem, &a->shards[o], o, w, size, max_size);
  }
  return pg;
}

/* Brings the arena's free bytes down to keep, from shard `first` on, as
 * far as fences allow. */
static void trim_to(ruda__memory *mem, uint32_t first, uint64_t keep) {
  ruda__arena *a = &mem->arena;
  for (uint32_t i = 0; i < a->nshards && atomic_load(&a->free_bytes) > keep; i++) {
    ruda__shard *sh = &a->shards[(first + i) % a->nshards];
    if (atomic_load_explicit(&sh->npages, memory_order_relaxed) == 0) continue;
    pthread_mutex_lock(&sh->lock);
    ruda__page *drop = collect(mem, sh, keep);
    pthread_mutex_unlock(&sh->lock);
    discard_list(mem, drop);
  }
}

ruda__page *ruda__arena_take(ruda__memory *mem, uint32_t w, struct ruda__pools *own, uint64_t size, uint64_t max_size,
                             int virtual_ok, const char *fn, uint64_t request, int *rc) {
  ruda__page *found = ruda__arena_find(mem, w, size, max_size);
  if (found) return found;
  ruda__arena *a = &mem->arena;
  if (!virtual_ok) {
    /* About to raise the high-water mark of reserved memory: free pages
     * are pure excess at such a moment, so far fewer are kept. */
    uint64_t keep = retain(a);
    if (atomic_load(&a->backed) + size > atomic_load(&a->peak_backed)) keep /= PEAK_SHARE;
    if (atomic_load(&a->free_bytes) > keep) trim_to(mem, w, keep);
  }
  uint64_t addr = 0;
  if (!virtual_ok && (*rc = backend_alloc(mem, own, size, request, fn, &addr)) != 0) return NULL;
  ruda__page *pg = page_new(mem, size, addr);
  if (pg == NULL) {
    if (addr) mem->backend->ops->mem_free(mem->backend->state, addr, NULL);
    *rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory for a page descriptor", fn);
  }
  return pg;
}

int ruda__arena_back(ruda__memory *mem, struct ruda__pools *own, ruda__page *pg, const char *fn) {
  uint64_t addr;
  int rc = backend_alloc(mem, own, pg->size, pg->size, fn, &addr);
  if (rc != 0) return rc;
  ruda__arena *a = &mem->arena;
  atomic_fetch_sub(&a->virtual_bytes, pg->size);
  uint64_t now = atomic_fetch_add(&a->backed, pg->size) + pg->size;
  uint64_t peak = atomic_load(&a->peak_backed);
  while (now > peak && !atomic_compare_exchange_weak(&a->peak_backed, &peak, now)) {
  }
  atomic_store_explicit(&pg->base, addr, memory_order_release);
  return 0;
}

/* Collects pages of shard a past their fences, oldest first, until the
 * arena's free bytes would be at most keep. Under a->lock.
 *
 * The first pass only takes pages of sizes the shard holds more of than
 * the average size: with a few sizes in steady use (fixed shapes), oldest
 * first trims whichever size happens to be old, a size's count then walks
 * to zero and the next request for it goes to the backend while pages of
 * other sizes sit idle. Evening the counts out keeps every size in stock.
 * With sizes that are all different every bucket holds one page and the
 * second pass is plain oldest first. */
static ruda__page *collect(ruda__memory *mem, ruda__shard *a, uint64_t keep) {
  ruda__arena *arena = &mem->arena;
  ruda__page *out = NULL;
  for (int pass = 0; pass < 2 && atomic_load(&arena->free_bytes) > keep; pass++) {
    int skipped = 0;
    for (ruda__page *pg = a->lru_head, *next; pg != NULL && atomic_load(&arena->free_bytes) > keep; pg = next) {
      next = pg->lru_next;
      /* At or below the average count (count * buckets <= pages): keep. */
      const uint64_t npages = atomic_load_explicit(&a->npages, memory_order_relaxed);
      if (pass == 0 && (uint64_t)a->count[pg->bucket] * a->nbuckets <= npages) {
        if (++skipped > 4 * SCAN_MAX) break;
        continue;
      }
      if (!ruda__fence_passed(mem, pg->worker, pg->need)) {
        if (++skipped > SCAN_MAX) break;
        continue;
      }
      bucket_unlink(arena, a, pg);
      pg->next = out;
      out = pg;
    }
  }
  return out;
}

static void discard_list(ruda__memory *mem, ruda__page *list) {
  while (list) {
    ruda__page *next = list->next;
    ruda__page_discard(mem, list);
    list = next;
  }
}

void ruda__arena_put(ruda__memory *mem, ruda__page *pg, uint32_t worker) {
  if (atomic_load_explicit(&pg->base, memory_order_relaxed) == 0) { /* a dry run's: nothing behind it */
    ruda__page_discard(mem, pg);
    return;
  }
  pg->worker = worker;
  /* Memory no command touched since its last fence needs none. */
  pg->need = pg->dirty ? ruda__fence_need(mem, worker, 0) : 0;
  pg->klass = UINT32_MAX;
  ruda__arena *a = &mem->arena;
  ruda__shard *sh = &a->shards[worker];
  pthread_mutex_lock(&sh->lock);
  bucket_link(a, sh, pg);
  pthread_mutex_unlock(&sh->lock);
  if (atomic_load(&a->free_bytes) <= retain(a)) return;
  /* Past the budget: the shard holding the most gives back its oldest
   * (a shard drained by another's returns would send its own streams to
   * the backend). What fences hold waits for the trim before the next
   * backend allocation. */
  uint32_t fat = worker;
  uint64_t most = atomic_load_explicit(&sh->free_bytes, memory_order_relaxed);
  for (uint32_t i = 0; i < a->nshards; i++) {
    uint64_t b = atomic_load_explicit(&a->shards[i].free_bytes, memory_order_relaxed);
    if (b > most) most = b, fat = i;
  }
  sh = &a->shards[fat];
  pthread_mutex_lock(&sh->lock);
  ruda__page *drop = collect(mem, sh, retain(a));
  pthread_mutex_unlock(&sh->lock);
  discard_list(mem, drop);
}

uint64_t ruda__arena_trim(ruda__memory *mem, uint64_t keep, uint64_t wait_ns) {
  ruda__arena *a = &mem->arena;
  uint64_t released = 0, deadline = ruda__now_ns() + wait_ns;
  for (;;) {
    ruda__fence_poll_all(mem);
    for (uint32_t i = 0; i < a->nshards; i++) {
      ruda__shard *sh = &a->shards[i];
      pthread_mutex_lock(&sh->lock);
      ruda__page *drop = collect(mem, sh, keep);
      pthread_mutex_unlock(&sh->lock);
      for (ruda__page *pg = drop; pg != NULL; pg = pg->next) released += pg->size;
      discard_list(mem, drop);
    }
    if (atomic_load(&a->free_bytes) <= keep || ruda__now_ns() >= deadline) break;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return released;
}

/* ---- lifecycle ---- */

int ruda__arena_init(ruda__memory *mem) {
  ruda__arena *a = &mem->arena;
  pthread_mutex_init(&a->lock, NULL);
  a->nshards = mem->nworkers;
  a->shards = calloc(mem->nworkers, sizeof *a->shards);
  if (a->shards == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  for (uint32_t w = 0; w < mem->nworkers; w++) pthread_mutex_init(&a->shards[w].lock, NULL);
  return 0;
}

void ruda__arena_destroy(ruda__memory *mem) {
  ruda__arena *a = &mem->arena;
  /* Every page, in a pool or in the arena, live buffer or not. */
  for (ruda__page *pg = a->all, *next; pg != NULL; pg = next) {
    next = pg->all_next;
    uint64_t base = atomic_load(&pg->base);
    if (base) mem->backend->ops->mem_free(mem->backend->state, base, NULL);
    free(pg->free_idx);
    free(pg);
  }
  for (uint32_t w = 0; a->shards != NULL && w < a->nshards; w++) pthread_mutex_destroy(&a->shards[w].lock);
  free(a->shards);
  pthread_mutex_destroy(&a->lock);
}

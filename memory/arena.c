/* arena.c - the device arena, backend pages, fences, lifecycle.
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
#include "memory/pool.h"
#include "base/sync.h"

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
/* Fences a worker may have in flight for returned pages. */
#define FENCES_IN_FLIGHT 4
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

/* ---- fences ---- */

/* Whether everything pushed to w is known complete without a fence. */
static int worker_idle(ruda__memory *mem, uint32_t w) {
  return mem->progress.ops->idle(mem->progress.ctx, w);
}

static void fence_issue(ruda__memory *mem, ruda__wfence *f, uint32_t w) {
  const ruda__progress *pr = &mem->progress;
  if (pr->ops->closing(pr->ctx)) {
    /* Closing: workers drain everything queued before they stop, and
     * nothing is reused after; count the fence as passed. */
    atomic_store_explicit(&f->passed, ++f->created, memory_order_release);
    return;
  }
  ruda__fence *node = malloc(sizeof *node);
  void *token = node ? pr->ops->fence_issue(pr->ctx, w) : NULL;
  if (token == NULL) { /* no host memory: a later poll tries again */
    free(node);
    return;
  }
  node->seq = ++f->created;
  f->nflight++;
  node->token = token;
  node->next = NULL;
  if (f->tail) f->tail->next = node;
  else f->head = node;
  f->tail = node;
}

static void fence_poll(ruda__memory *mem, ruda__wfence *f, uint32_t w) {
  const ruda__progress *pr = &mem->progress;
  while (f->head != NULL && pr->ops->fence_done(pr->ctx, f->head->token)) {
    ruda__fence *node = f->head;
    /* A fence that failed to record was still passed by its worker, which
     * is what reuse needs on the host; a CUDA context that cannot record
     * events is faulted. */
    atomic_store_explicit(&f->passed, node->seq, memory_order_release);
    f->head = node->next;
    f->nflight--;
    if (f->head == NULL) f->tail = NULL;
    pr->ops->fence_free(pr->ctx, node->token);
    free(node);
  }
  if (f->nflight < FENCES_IN_FLIGHT && f->wanted > f->created) fence_issue(mem, f, w);
}

uint64_t ruda__fence_need(ruda__memory *mem, uint32_t w, int executed) {
  ruda__memory *m = mem;
  /* Number 0 has always passed. */
  if (mem->ops->event_query == NULL && (executed || worker_idle(mem, w))) return 0;
  pthread_mutex_lock(&m->fence_lock);
  ruda__wfence *f = &m->fences[w];
  /* When every use already ran on w, a fence w has not run yet comes
   * after them: join it. */
  if (executed && f->tail != NULL && !mem->progress.ops->fence_reached(mem->progress.ctx, f->tail->token)) {
    uint64_t seq = f->tail->seq;
    pthread_mutex_unlock(&m->fence_lock);
    return seq;
  }
  uint64_t need = f->created + 1;
  if (f->wanted < need) f->wanted = need;
  /* Returned pages share a few fences in flight per worker, which bounds
   * the sync commands a burst of returns costs while a page still waits
   * one round trip, not two, when streams trade pages quickly; retired
   * buffers get theirs at once, so usage figures settle as soon as the
   * workers pass them. */
  if (executed || f->nflight < FENCES_IN_FLIGHT) fence_issue(mem, f, w);
  else fence_poll(mem, f, w);
  pthread_mutex_unlock(&m->fence_lock);
  return need;
}

int ruda__fence_passed(ruda__memory *mem, uint32_t w, uint64_t need) {
  ruda__memory *m = mem;
  if (need == 0) return 1;
  ruda__wfence *f = &m->fences[w];
  if (atomic_load_explicit(&f->passed, memory_order_acquire) >= need || worker_idle(mem, w)) return 1;
  pthread_mutex_lock(&m->fence_lock);
  if (f->passed < need) fence_poll(mem, f, w);
  int r = f->passed >= need;
  pthread_mutex_unlock(&m->fence_lock);
  return r;
}

void ruda__fence_poll_all(ruda__memory *mem) {
  ruda__memory *m = mem;
  pthread_mutex_lock(&m->fence_lock);
  for (uint32_t w = 0; w < m->nworkers; w++) fence_poll(mem, &m->fences[w], w);
  pthread_mutex_unlock(&m->fence_lock);
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
    mem->ops->mem_free(mem->bstate, base, NULL);
    atomic_fetch_sub(&a->backed, pg->size);
    atomic_fetch_add(&a->backend_frees, 1);
  } else {
    atomic_fetch_sub(&a->virtual_bytes, pg->size);
  }
  page_forget(mem, pg);
}

/* Asks every stream's pools to give their unused pages back; the caller
 * holds own's lock (others' are only tried, so two threads reclaiming at
 * once cannot deadlock). */
static void reclaim_pools(ruda__memory *mem, ruda__pools *own) {
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

/* The backend call, retried once after releasing cached pages. */
static int backend_alloc(ruda__memory *mem, ruda__pools *p, uint64_t size, uint64_t request,
                         const char *fn, uint64_t *addr) {
  ruda__arena *a = &mem->arena;
  atomic_fetch_add(&a->backend_allocs, 1);
  int rc = mem->ops->mem_alloc(mem->bstate, size, addr);
  if (rc != RUDA_EOUTOFMEMORY) return rc;
  reclaim_pools(mem, p);
  uint64_t released = ruda__arena_trim(mem, 0, OOM_WAIT_NS);
  atomic_fetch_add(&a->backend_allocs, 1);
  rc = mem->ops->mem_alloc(mem->bstate, size, addr);
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

/* Whether worker w is known to have passed fence need, without polling or
 * taking fence_lock. */
static int fence_seen(ruda__memory *mem, uint32_t w, uint64_t need) {
  return need == 0 || atomic_load_explicit(&mem->fences[w].passed, memory_order_acquire) >= need ||
         worker_idle(mem, w);
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
        pg->dirty = (uint8_t)!fence_seen(mem, owner, pg->need);
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

ruda__page *ruda__arena_find(ruda__memory *mem, ruda__pools *p, uint64_t size, uint64_t max_size) {
  ruda__arena *a = &mem->arena;
  const uint32_t n = a->nshards, w = p->worker;
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

ruda__page *ruda__arena_take(ruda__memory *mem, ruda__pools *p, uint64_t size, uint64_t max_size,
                             int virtual_ok, const char *fn, uint64_t request, int *rc) {
  ruda__page *found = ruda__arena_find(mem, p, size, max_size);
  if (found) return found;
  ruda__arena *a = &mem->arena;
  if (!virtual_ok) {
    /* About to raise the high-water mark of reserved memory: free pages
     * are pure excess at such a moment, so far fewer are kept. */
    uint64_t keep = retain(a);
    if (atomic_load(&a->backed) + size > atomic_load(&a->peak_backed)) keep /= PEAK_SHARE;
    if (atomic_load(&a->free_bytes) > keep) trim_to(mem, p->worker, keep);
  }
  uint64_t addr = 0;
  if (!virtual_ok && (*rc = backend_alloc(mem, p, size, request, fn, &addr)) != 0) return NULL;
  ruda__page *pg = page_new(mem, size, addr);
  if (pg == NULL) {
    if (addr) mem->ops->mem_free(mem->bstate, addr, NULL);
    *rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory for a page descriptor", fn);
  }
  return pg;
}

int ruda__arena_back(ruda__memory *mem, ruda__pools *p, ruda__page *pg) {
  uint64_t addr;
  int rc = backend_alloc(mem, p, pg->size, pg->size, "ruda_buffer_create", &addr);
  if (rc != 0) return rc;
  ruda__arena *a = &mem->arena;
  atomic_fetch_sub(&a->virtual_bytes, pg->size);
  uint64_t now = atomic_fetch_add(&a->backed, pg->size) + pg->size;
  uint64_t peak = atomic_load(&a->peak_backed);
  while (now > peak && !atomic_compare_exchange_weak(&a->peak_backed, &peak, now)) {
  }
  if (pg->pool) pg->pool->unbacked -= pg->size;
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

int ruda__memory_init(ruda__memory *mem, uint32_t nworkers) {
  ruda__memory *m = mem;
  ruda__memory given = *m; /* what the device handed down */
  memset(m, 0, sizeof *m);
  m->ops = given.ops;
  m->bstate = given.bstate;
  m->handles = given.handles;
  m->progress = given.progress;
  m->nworkers = nworkers;
  pthread_mutex_init(&m->arena.lock, NULL);
  m->arena.nshards = mem->nworkers;
  m->arena.shards = calloc(mem->nworkers, sizeof *m->arena.shards);
  if (m->arena.shards == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  for (uint32_t w = 0; w < mem->nworkers; w++) pthread_mutex_init(&m->arena.shards[w].lock, NULL);
  pthread_mutex_init(&m->layout_lock, NULL);
  pthread_mutex_init(&m->fence_lock, NULL);
  pthread_mutex_init(&m->all_lock, NULL);
  m->nlayout = ruda_memory_default_pools(m->layout, RUDA_MEMORY_MAX_POOLS);
  m->fences = calloc(m->nworkers, sizeof *m->fences);
  if (m->fences == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  return 0;
}

void ruda__memory_destroy(ruda__memory *mem) {
  ruda__memory *m = mem;
  for (uint32_t w = 0; m->fences != NULL && w < m->nworkers; w++) {
    ruda__wfence *f = &m->fences[w];
    while (f->head) {
      ruda__fence *n = f->head;
      f->head = n->next;
      mem->progress.ops->fence_free(mem->progress.ctx, n->token);
      free(n);
    }
  }
  free(m->fences);
  for (ruda__pools *p = m->all, *next; p != NULL; p = next) {
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
  /* Every page, in a pool or in the arena, live buffer or not. */
  for (ruda__page *pg = m->arena.all, *next; pg != NULL; pg = next) {
    next = pg->all_next;
    uint64_t base = atomic_load(&pg->base);
    if (base) mem->ops->mem_free(mem->bstate, base, NULL);
    free(pg->free_idx);
    free(pg);
  }
  for (uint32_t w = 0; m->arena.shards != NULL && w < m->arena.nshards; w++)
    pthread_mutex_destroy(&m->arena.shards[w].lock);
  free(m->arena.shards);
  pthread_mutex_destroy(&m->arena.lock);
  pthread_mutex_destroy(&m->layout_lock);
  pthread_mutex_destroy(&m->fence_lock);
  pthread_mutex_destroy(&m->all_lock);
}

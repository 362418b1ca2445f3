/* memory_report.c - memory usage, per-pool reports, cleanup.
 *
 * Reports read a stream's figures under its pool lock after polling its
 * retired buffers, so a buffer whose fences passed is counted as freed.
 * They report whatever the streams' health: errors stay queued for the
 * stream's next flush or sync, and a program that watches its memory
 * while something failed needs the figures most.
 */
#include <string.h>

#include "memory/pool.h"
#include "scheduler/device.h"
#include "src/api.h"

static int stream_pools(ruda_device *dev, ruda_stream_id id, const char *fn, ruda__stream **sp,
                        ruda__pools **pp) {
  int rc = 0;
  ruda__stream *s = ruda__stream_for(dev, id, fn, &rc);
  if (s == NULL) return rc;
  ruda__pools *p = ruda__stream_pools(dev, s);
  if (p == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  *sp = s;
  *pp = p;
  return 0;
}

static void add_pool(ruda_memory_stats *u, const ruda__pool *pool) {
  u->nallocs += pool->nallocs;
  u->bytes_in_use += pool->in_use;
  u->bytes_padding += pool->padding;
  u->bytes_reserved += pool->reserved;
  u->bytes_unbacked += pool->unbacked;
}

/* With p->lock held. */
static void usage_of(ruda__pools *p, ruda_memory_stats *u) {
  ruda__pools_poll_retired(p);
  for (uint32_t i = 0; i < p->npools; i++) add_pool(u, &p->pools[i]);
  add_pool(u, &p->persistent);
  u->peak_in_use += p->peak_in_use;
  u->peak_reserved += p->peak_reserved;
}

int ruda_memory_usage(ruda_device *dev, ruda_stream_id stream, ruda_memory_stats *out) {
  static const char fn[] = "ruda_memory_usage";
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  ruda__stream *s = NULL;
  ruda__pools *p = NULL;
  int rc = stream_pools(dev, stream, fn, &s, &p);
  if (rc != 0) return rc;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&p->lock);
  usage_of(p, out);
  pthread_mutex_unlock(&p->lock);
  return 0;
}

int ruda_memory_device_usage(ruda_device *dev, ruda_memory_stats *out) {
  static const char fn[] = "ruda_memory_device_usage";
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&dev->memory.all_lock);
  ruda__pools *q = dev->memory.all; /* grows at its head only; never shrinks before close */
  pthread_mutex_unlock(&dev->memory.all_lock);
  for (; q != NULL; q = q->all_next) {
    pthread_mutex_lock(&q->lock);
    usage_of(q, out);
    pthread_mutex_unlock(&q->lock);
  }
  ruda__arena *a = &dev->memory.arena;
  out->bytes_reserved += atomic_load(&a->free_bytes);
  /* Per-stream peaks happened at different times; the device's own
   * high-water mark of backed pages is the honest figure for reserved.
   * peak_in_use stays the sum of the streams' peaks (an upper bound). */
  uint64_t peak = atomic_load(&a->peak_backed);
  out->peak_reserved = peak > out->bytes_reserved ? peak : out->bytes_reserved;
  return 0;
}

static void report_pool(const ruda__pool *pool, ruda_pool_report *r) {
  memset(r, 0, sizeof *r);
  r->kind = pool->cfg.kind;
  r->min_alloc = pool->min_alloc;
  r->max_alloc = pool->cfg.max_alloc;
  r->page_size = pool->cfg.kind == RUDA_POOL_SLICED ? pool->cfg.page_size : 0;
  r->capacity = pool->cfg.capacity;
  r->nclasses = pool->nclasses;
  r->pages = pool->pages;
  r->nallocs = pool->nallocs;
  r->bytes_in_use = pool->in_use;
  r->bytes_padding = pool->padding;
  r->bytes_reserved = pool->reserved;
  r->peak_nallocs = pool->peak_nallocs;
  r->peak_in_use = pool->peak_in_use;
  r->peak_reserved = pool->peak_reserved;
}

int ruda_memory_report(ruda_device *dev, ruda_stream_id stream, ruda_pool_report *pools, uint32_t cap,
                       uint32_t *npools) {
  static const char fn[] = "ruda_memory_report";
  RUDA__CHECK_DEV(dev, fn);
  if (npools == NULL) return ruda__fail(RUDA_EINVAL, "%s: npools is NULL", fn);
  if (pools == NULL && cap > 0) return ruda__fail(RUDA_EINVAL, "%s: pools is NULL with cap %u", fn, cap);
  ruda__stream *s = NULL;
  ruda__pools *p = NULL;
  int rc = stream_pools(dev, stream, fn, &s, &p);
  if (rc != 0) return rc;
  pthread_mutex_lock(&p->lock);
  ruda__pools_poll_retired(p);
  uint32_t n = p->npools + 1;
  for (uint32_t i = 0; i < n && i < cap; i++)
    report_pool(i < p->npools ? &p->pools[i] : &p->persistent, &pools[i]);
  pthread_mutex_unlock(&p->lock);
  *npools = n;
  return 0;
}

/* Cleanup waits this long at most for workers to reach their fences. */
#define CLEANUP_WAIT_NS (1000ull * 1000)

int ruda_memory_cleanup(ruda_device *dev, ruda_stream_id stream) {
  static const char fn[] = "ruda_memory_cleanup";
  RUDA__CHECK_DEV(dev, fn);
  ruda__stream *s = NULL;
  ruda__pools *p = NULL;
  int rc = stream_pools(dev, stream, fn, &s, &p);
  if (rc != 0) return rc;
  pthread_mutex_lock(&p->lock);
  ruda__pools_poll_retired(p);
  ruda__pools_release_unused(p);
  pthread_mutex_unlock(&p->lock);
  ruda__arena_trim(&dev->memory, 0, CLEANUP_WAIT_NS);
  return 0;
}

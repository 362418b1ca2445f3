/* memory_report.c - memory usage, per-pool reports, cleanup.
 *
 * Reports read a stream's figures under its pool lock after polling its
 * retired buffers, so a buffer whose fences passed is counted as freed.
 * They report whatever the streams' health: errors stay queued for the
 * stream's next flush or sync, and a program that watches its memory
 * while something failed needs the figures most.
 */
#include <stdio.h>
#include <string.h>

#include "memory/pool.h"
#include "src/device.h"

static int stream_pools(ruda_device *dev, ruda_stream_id id, const char *fn, ruda__stream **sp,
                        ruda__pools **pp) {
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, id, fn, &rc);
  if (s == NULL) return rc;
  ruda__pools *p = ruda__stream_pools(&dev->sched, s);
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

/* ---- a printed summary ---- */

/* Bytes as a person reads them: "512 B", "64.0 KiB", "3.2 GiB". */
static const char *human(uint64_t b, char *buf, size_t len) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)b);
  else snprintf(buf, len, "%.1f %s", v, unit[u]);
  return buf;
}

/* The largest request the pool could serve now without a new page: a free
 * slot's size (sliced), the largest cached page (exclusive). Lock held. */
static uint64_t largest_free(const ruda__pool *pool) {
  uint64_t best = 0;
  if (pool->cfg.kind == RUDA_POOL_SLICED) {
    for (uint32_t c = 0; c < pool->nclasses; c++)
      if (pool->classes[c].nonfull != NULL && pool->classes[c].size > best) best = pool->classes[c].size;
    for (const ruda__page *e = pool->empty; e != NULL; e = e->next)
      if (e->size > best) best = e->size;
  } else {
    for (const ruda__page *e = pool->cache; e != NULL; e = e->next)
      if (e->size > best) best = e->size;
  }
  return best;
}

static const char *pool_name(const ruda__pool *pool, char *buf, size_t len) {
  char h[32];
  if (pool->cfg.kind == RUDA_POOL_PERSISTENT) snprintf(buf, len, "persistent");
  else if (pool->cfg.max_alloc == UINT64_MAX) snprintf(buf, len, "%s", pool->cfg.kind == RUDA_POOL_SLICED ? "sliced, any" : "exclusive, any");
  else snprintf(buf, len, "%s <= %s", pool->cfg.kind == RUDA_POOL_SLICED ? "sliced" : "exclusive",
                human(pool->cfg.max_alloc, h, sizeof h));
  return buf;
}

int ruda_memory_summary(ruda_device *dev, FILE *out) {
  static const char fn[] = "ruda_memory_summary";
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  ruda_memory_stats d;
  int rc = ruda_memory_device_usage(dev, &d);
  if (rc != 0) return rc;
  const ruda__arena *a = &dev->memory.arena;
  char h1[32], h2[32], h3[32], h4[32], h5[32];
  fprintf(out, "ruda memory summary: %s (%s backend), %u workers\n", dev->limits.name, dev->sched.backend.ops->name,
          dev->sched.nworkers);
  fprintf(out, "  device: %llu buffers, %s in use, %s reserved (%.1f%% of it in use), peaks %s in use, %s reserved\n",
          (unsigned long long)d.nallocs, human(d.bytes_in_use, h1, sizeof h1), human(d.bytes_reserved, h2, sizeof h2),
          d.bytes_reserved ? 100.0 * (double)d.bytes_in_use / (double)d.bytes_reserved : 100.0,
          human(d.peak_in_use, h3, sizeof h3), human(d.peak_reserved, h4, sizeof h4));
  fprintf(out, "  arena: %s of free pages cached; from the backend: %s backed (peak %s), %llu allocations, %llu frees\n",
          human(atomic_load(&a->free_bytes), h1, sizeof h1), human(atomic_load(&a->backed), h2, sizeof h2),
          human(atomic_load(&a->peak_backed), h3, sizeof h3), (unsigned long long)atomic_load(&a->backend_allocs),
          (unsigned long long)atomic_load(&a->backend_frees));
  fprintf(out, "  %-22s %-20s %8s %11s %11s %11s %7s %11s %11s\n", "stream", "pool", "buffers", "in use", "padding",
          "reserved", "frag", "peak use", "largest free");
  pthread_mutex_lock(&dev->memory.all_lock);
  ruda__pools *q = dev->memory.all; /* grows at its head only; never shrinks before close */
  pthread_mutex_unlock(&dev->memory.all_lock);
  for (; q != NULL; q = q->all_next) {
    pthread_mutex_lock(&q->lock);
    ruda__pools_poll_retired(q);
    char sname[RUDA__STREAM_NAME_MAX], pname[48];
    ruda__stream_name(q->stream_id, sname);
    for (uint32_t i = 0; i <= q->npools; i++) {
      const ruda__pool *pool = i < q->npools ? &q->pools[i] : &q->persistent;
      if (pool->reserved == 0 && pool->nallocs == 0 && pool->peak_in_use == 0) continue;
      double frag = pool->reserved ? 100.0 * (1.0 - (double)pool->in_use / (double)pool->reserved) : 0.0;
      fprintf(out, "  %-22s %-20s %8llu %11s %11s %11s %6.1f%% %11s %11s\n", sname, pool_name(pool, pname, sizeof pname),
              (unsigned long long)pool->nallocs, human(pool->in_use, h1, sizeof h1), human(pool->padding, h2, sizeof h2),
              human(pool->reserved, h3, sizeof h3), frag, human(pool->peak_in_use, h4, sizeof h4),
              human(largest_free(pool), h5, sizeof h5));
    }
    pthread_mutex_unlock(&q->lock);
  }
  return ferror(out) ? ruda__fail(RUDA_EIO, "%s: writing the summary failed", fn) : 0;
}

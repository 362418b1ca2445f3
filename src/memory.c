/* memory.c - the public calls of ruda/memory.h that set a stream's pools:
 * allocation modes, dry runs, pool layouts. The pools themselves are in
 * memory/pool.c; the report is in memory_report.c. */
#include <pthread.h>

#include "memory/pool.h"
#include "src/device.h"

static int pools_for(ruda_device *dev, ruda_stream_id id, const char *fn, ruda__pools **pp) {
  if (id != RUDA_STREAM_CURRENT && id > RUDA_STREAM_EXPLICIT_MAX)
    return ruda__fail(RUDA_EINVAL, "%s: stream id %llu is reserved (explicit ids are below 2^63)", fn,
                      (unsigned long long)id);
  ruda__stream *s = ruda__stream_get(&dev->sched, id);
  ruda__pools *p = s ? ruda__stream_pools(&dev->sched, s) : NULL;
  if (p == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  *pp = p;
  return 0;
}

/* The stream's pools with their lock held, for the small per-stream
 * settings below; the caller unlocks. */
static int lock_pools(ruda_device *dev, ruda_stream_id stream, const char *fn, ruda__pools **p) {
  RUDA__CHECK_DEV(dev, fn);
  int rc = pools_for(dev, stream, fn, p);
  if (rc == 0) pthread_mutex_lock(&(*p)->lock);
  return rc;
}

int ruda_memory_mode_push(ruda_device *dev, ruda_stream_id stream, ruda_alloc_mode mode) {
  static const char fn[] = "ruda_memory_mode_push";
  RUDA__CHECK_DEV(dev, fn);
  if ((int)mode < 0 || mode > RUDA_ALLOC_PERSISTENT)
    return ruda__fail(RUDA_EINVAL, "%s: unknown mode %d", fn, (int)mode);
  ruda__pools *p = NULL;
  int rc = lock_pools(dev, stream, fn, &p);
  if (rc != 0) return rc;
  if (p->mode_depth == RUDA_MEMORY_MODE_DEPTH)
    rc = ruda__fail(RUDA_EINVAL, "%s: modes nest %d deep at most", fn, RUDA_MEMORY_MODE_DEPTH);
  else p->modes[p->mode_depth++] = (uint8_t)mode;
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int ruda_memory_mode_pop(ruda_device *dev, ruda_stream_id stream) {
  ruda__pools *p = NULL;
  int rc = lock_pools(dev, stream, "ruda_memory_mode_pop", &p);
  if (rc != 0) return rc;
  if (p->mode_depth == 0) rc = ruda__fail(RUDA_EINVAL, "ruda_memory_mode_pop: no mode was pushed");
  else p->mode_depth--;
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int ruda_memory_dry_run_begin(ruda_device *dev, ruda_stream_id stream) {
  ruda__pools *p = NULL;
  int rc = lock_pools(dev, stream, "ruda_memory_dry_run_begin", &p);
  if (rc != 0) return rc;
  p->dry_depth++;
  pthread_mutex_unlock(&p->lock);
  return 0;
}

int ruda_memory_dry_run_end(ruda_device *dev, ruda_stream_id stream) {
  ruda__pools *p = NULL;
  int rc = lock_pools(dev, stream, "ruda_memory_dry_run_end", &p);
  if (rc != 0) return rc;
  if (p->dry_depth == 0) rc = ruda__fail(RUDA_EINVAL, "ruda_memory_dry_run_end: no dry run is open");
  else p->dry_depth--;
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int ruda_memory_install_pools(ruda_device *dev, ruda_stream_id stream, const ruda_pool_config *pools,
                              uint32_t n) {
  static const char fn[] = "ruda_memory_install_pools";
  RUDA__CHECK_DEV(dev, fn);
  int rc = ruda__pools_check_layout(pools, n);
  if (rc != 0) return rc;
  ruda__memory_set_layout(&dev->memory, pools, n);
  ruda__pools *p = NULL;
  if ((rc = pools_for(dev, stream, fn, &p)) != 0) return rc;
  return ruda__pools_install(p, pools, n, fn);
}

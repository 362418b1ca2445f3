/* cuda_backend.c - the cuda backend: the device's primary context, one
 * non-blocking CUstream per worker, device memory, pooled events, the
 * page-locked staging arena, and the operations table.
 *
 * Workers never wait for the device. A write's staging block is kept with
 * an event and returned when progress() (called by the worker between
 * batches and, while anything is pending, on a short idle timeout) finds
 * the event complete; reads and syncs hand their event to the future,
 * whose waiter synchronizes on it from its own thread. A read whose future
 * is dropped unwaited comes back to the same poll (cu_retire_detached).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/sync.h"

/* ---- context guard ---- */

int ruda__cu_enter(ruda__cu_backend *b, ruda__cu_guard *g) {
  CUcontext cur = NULL;
  g->changed = 0;
  g->prev = NULL;
  if (ruda__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == b->ctx) return 0;
  CUresult r = ruda__cu.cuCtxSetCurrent(b->ctx);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "cuCtxSetCurrent");
  g->prev = cur;
  g->changed = 1;
  return 0;
}

void ruda__cu_leave(ruda__cu_guard *g) {
  if (g->changed) ruda__cu.cuCtxSetCurrent(g->prev);
}

/* A fault poisons the whole context: every stream must report it, so the
 * device is marked faulted with a copy of the first report. */
static void fault_device(ruda__cu_backend *b, const ruda_error *e) {
  if (b->env.faulted(b->env.ctx)) return;
  ruda_error *copy = ruda__error_new(e->code, e->backend_code, "%s", e->msg);
  if (copy != NULL) copy->stream = e->stream;
  b->env.fault(b->env.ctx, copy);
}

/* A sticky fault poisons the whole context: any launch in flight on any
 * worker's stream may have caused it. Lists each worker's last launch
 * without blaming one; RUDA_LAUNCH_BLOCKING narrows it to the culprit.
 * Only the device's first report carries the list (later ones point to
 * it), and only whole entries: those that do not fit are counted. */
static void describe_in_flight(ruda__cu_backend *b, char *out, size_t len) {
  if (b->env.faulted(b->env.ctx)) {
    snprintf(out, len, "the device's first fault report lists the launches then in flight");
    return;
  }
  static const char tail[] = "; the faulting one is among these or launched before them "
                             "(RUDA_LAUNCH_BLOCKING=1 names it)";
  size_t at = (size_t)snprintf(out, len, "the latest launch of each device stream then:");
  unsigned listed = 0, left_out = 0;
  for (uint32_t i = 0; i < 1024; i++) {
    ruda__cu_worker *w = atomic_load_explicit(&b->workers[i], memory_order_acquire);
    if (w == NULL) continue;
    const char *k = atomic_load_explicit(&w->last_kernel, memory_order_relaxed);
    if (k == NULL) continue;
    const int call = k == ruda__cu_call_mark; /* a library call's work, not a kernel ruda launched */
    char entry[160];
    int n = snprintf(entry, sizeof entry, "%s %s%.64s%s (%s, command #%llu)", listed ? "," : "",
                     call ? "" : "kernel \"", k, call ? "" : "\"",
                     RUDA__SNAME(atomic_load_explicit(&w->last_stream, memory_order_relaxed)),
                     (unsigned long long)atomic_load_explicit(&w->last_seq, memory_order_relaxed));
    /* Room kept for the tail and a count of those left out. */
    if (n > 0 && at + (size_t)n + sizeof tail + 24 <= len) {
      memcpy(out + at, entry, (size_t)n + 1);
      at += (size_t)n;
      listed++;
    } else {
      left_out++;
    }
  }
  if (listed == 0 && left_out == 0) {
    snprintf(out, len, "no launch was submitted before it");
    return;
  }
  if (left_out > 0) at += (size_t)snprintf(out + at, len - at, " and %u more", left_out);
  snprintf(out + at, len - at, "%s", tail);
}

int ruda__cu_worker_fail(ruda__cu_worker *w, CUresult r, ruda_error **err, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  ruda_error *e;
  if (ruda__cu_sticky(r)) {
    char last[320];
    describe_in_flight(w->b, last, sizeof last);
    e = ruda__cu_error(r, "%s: the CUDA context is faulted (%s)", what, last);
    if (e != NULL) fault_device(w->b, e);
  } else {
    e = ruda__cu_error(r, "%s", what);
  }
  *err = e;
  return ruda__cu_code(r);
}

/* ---- staging ---- */

static void *pinned_alloc(void *ctx, size_t size) {
  ruda__cu_backend *b = ctx;
  ruda__cu_guard g;
  if (ruda__cu_enter(b, &g) != 0) return NULL;
  void *p = NULL;
  /* Portable: usable from any context, should the application create its
   * own on this device. */
  CUresult r = ruda__cu.cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE);
  ruda__cu_leave(&g);
  if (r != CUDA_SUCCESS) {
    char d[160];
    ruda__log(b->log_level, RUDA_LOG_WARN, "cuMemHostAlloc(%zu) failed: %s; staging falls back to pageable memory",
              size, ruda__cu_describe(r, d, sizeof d));
    return NULL;
  }
  return p;
}

static void pinned_free(void *ctx, void *p) {
  ruda__cu_backend *b = ctx;
  ruda__cu_guard g;
  if (ruda__cu_enter(b, &g) != 0) return;
  ruda__cu.cuMemFreeHost(p);
  ruda__cu_leave(&g);
}

static void *cu_stage_alloc(void *state, size_t size, const void *prev) {
  return ruda__staging_alloc_after(((ruda__cu_backend *)state)->staging, size, prev);
}

static void cu_stage_free(void *state, void *p) {
  ruda__staging_free(((ruda__cu_backend *)state)->staging, p);
}

static size_t cu_stage_size(void *state, const void *p) {
  return ruda__staging_size(((ruda__cu_backend *)state)->staging, p);
}

static int cu_stage_usage(void *state, ruda_staging_stats *out) {
  ruda__staging_usage(((ruda__cu_backend *)state)->staging, out);
  return 0;
}

void ruda__cu_retire(ruda__cu_worker *w, ruda__cu_event *ev, void *staged, size_t bytes) {
  pthread_mutex_lock(&w->plock);
  if (w->count == w->cap) {
    uint32_t cap = w->cap ? w->cap * 2 : 64;
    ruda__cu_pending *p = malloc(cap * sizeof *p);
    if (p == NULL) {
      pthread_mutex_unlock(&w->plock);
      /* No room to remember it: wait here rather than leak or free early. */
      if (ev != NULL) ruda__cu.cuEventSynchronize(ev->ev);
      else ruda__cu.cuStreamSynchronize(w->stream);
      ruda__cu_event_put(w->b, ev);
      ruda__staging_free_addr(w->b->staging, staged);
      return;
    }
    for (uint32_t i = 0; i < w->count; i++) p[i] = w->pending[(w->head + i) % w->cap];
    free(w->pending);
    w->pending = p;
    w->head = 0;
    w->cap = cap;
  }
  w->pending[(w->head + w->count) % w->cap] = (ruda__cu_pending){ev, staged, bytes, ++w->writes};
  w->count++;
  w->pending_bytes += bytes;
  pthread_mutex_unlock(&w->plock);
}

/* Pops the oldest pending write (under plock) into *out. */
static int pop_oldest(ruda__cu_worker *w, ruda__cu_pending *out) {
  if (w->count == 0) return 0;
  *out = w->pending[w->head];
  w->head = (w->head + 1) % w->cap;
  w->count--;
  w->pending_bytes -= out->bytes;
  return 1;
}

/* The block is kept by its address, whoever retires it (the worker, or
 * a client whose wait saw a later event): its stream's next write, which
 * asks for a block after it, takes it again. */
static void release_pending(ruda__cu_worker *w, ruda__cu_pending *p) {
  ruda__cu_event_put(w->b, p->ev);
  ruda__staging_free_addr(w->b->staging, p->staged);
}

/* Returns the staging of every write whose copy completed; non-zero while
 * some are still in flight. Worker only. A write records no event of its
 * own: the first event recorded after it (a read's, a sync's, a MARK's)
 * covers it, as the stream runs in order; only writes no event follows
 * get one here, one for all of them. So only the oldest covering event is
 * queried. */
static int progress_writes(ruda__cu_worker *w) {
  for (;;) {
    pthread_mutex_lock(&w->plock);
    if (w->count == 0) {
      pthread_mutex_unlock(&w->plock);
      return 0;
    }
    uint32_t k = 0;
    while (k < w->count && w->pending[(w->head + k) % w->cap].ev == NULL) k++;
    if (k == w->count) {
      pthread_mutex_unlock(&w->plock);
      CUresult r;
      ruda__cu_event *e = ruda__cu_record(w, &r); /* covers them */
      if (e == NULL) {
        ruda__cu.cuStreamSynchronize(w->stream); /* cannot tell otherwise */
        for (ruda__cu_pending p;;) {
          pthread_mutex_lock(&w->plock);
          int got = pop_oldest(w, &p);
          pthread_mutex_unlock(&w->plock);
          if (!got) return 0;
          release_pending(w, &p);
        }
      }
      ruda__cu_event_put(w->b, e); /* the pending write holds its own */
      continue;
    }
    CUresult r = ruda__cu.cuEventQuery(w->pending[(w->head + k) % w->cap].ev->ev);
    /* Done, or the context died (no copy will touch the blocks again). */
    if (r == CUDA_ERROR_NOT_READY) {
      pthread_mutex_unlock(&w->plock);
      return 1;
    }
    ruda__cu_pending done[16];
    uint32_t n = 0;
    while (n <= k && n < 16 && pop_oldest(w, &done[n])) n++;
    pthread_mutex_unlock(&w->plock);
    for (uint32_t i = 0; i < n; i++) release_pending(w, &done[i]);
  }
}

/* Runs what waited on every dropped future's event that completed (or
 * failed: the context died and no copy touches the staging again); with
 * wait, waits for the others first. Non-zero while some remain. Each is
 * queried: they were dropped in any order. */
static int progress_detached(ruda__cu_worker *w, int wait) {
  ruda__cu_detached *done = NULL, **pp;
  pthread_mutex_lock(&w->plock);
  for (pp = &w->detached; *pp != NULL;) {
    ruda__cu_detached *d = *pp;
    if (!wait && ruda__cu.cuEventQuery(d->ev->ev) == CUDA_ERROR_NOT_READY) {
      pp = &d->next;
      continue;
    }
    *pp = d->next;
    d->next = done;
    done = d;
  }
  int left = w->detached != NULL;
  pthread_mutex_unlock(&w->plock);
  while (done != NULL) {
    ruda__cu_detached *d = done;
    done = d->next;
    if (wait) ruda__cu.cuEventSynchronize(d->ev->ev);
    d->fn(w->b, d->arg);
    ruda__cu_event_put(w->b, d->ev);
    free(d);
  }
  return left;
}

/* Between batches (idle 0) the worker makes no driver call while little
 * is held: each query or covering record takes the driver's lock that
 * every issuing thread needs, and a client's wait returns the writes its
 * event covers anyway (ruda__cu_retire_upto). It retires when the writes
 * hold more than LAZY_BYTES or LAZY_WRITES, every LAZY_CALLS calls (a
 * worker that never idles still returns what dropped futures held), and
 * always before it sleeps (idle 1). */
#define LAZY_WRITES 32u
#define LAZY_BYTES ((size_t)16 << 20)
#define LAZY_CALLS 64u

static int cu_progress(void *ws, int idle) {
  ruda__cu_worker *w = ws;
  if (!idle && ++w->between < LAZY_CALLS) {
    pthread_mutex_lock(&w->plock);
    const int held = w->count > 0 || w->detached != NULL;
    const int cheap = w->count <= LAZY_WRITES && w->pending_bytes <= LAZY_BYTES;
    pthread_mutex_unlock(&w->plock);
    if (cheap) return held;
  }
  w->between = 0;
  int writes = progress_writes(w);
  return progress_detached(w, 0) | writes;
}

static int cu_event_wait(void *state, void *event, ruda_error **err);

/* A future dropped before it was waited (often by a worker, which must not
 * block on the device): its event goes to the worker that recorded it,
 * whose progress() runs fn once the event completed. */
static void cu_retire_detached(void *state, void *event, void (*fn)(void *state, void *arg), void *arg) {
  ruda__cu_backend *b = state;
  ruda__cu_event *e = event;
  ruda__cu_worker *w = e->worker;
  ruda__cu_detached *d = w != NULL ? malloc(sizeof *d) : NULL;
  if (d == NULL) {
    /* No room to remember it: wait here rather than leak or free early. */
    cu_event_wait(b, e, NULL);
    fn(b, arg);
    ruda__cu_event_put(b, e);
    return;
  }
  d->ev = e;
  d->fn = fn;
  d->arg = arg;
  pthread_mutex_lock(&w->plock);
  d->next = w->detached;
  w->detached = d;
  pthread_mutex_unlock(&w->plock);
}

void ruda__cu_retire_upto(ruda__cu_event *e) {
  ruda__cu_worker *w = e->worker;
  if (w == NULL) return;
  for (;;) {
    ruda__cu_pending p;
    pthread_mutex_lock(&w->plock);
    int got = w->count > 0 && w->pending[w->head].n <= e->writes && pop_oldest(w, &p);
    pthread_mutex_unlock(&w->plock);
    if (!got) return;
    release_pending(w, &p);
  }
}

/* ---- open / close ---- */

static int attr(ruda__cu_backend *b, CUdevice_attribute a, int *out, const char *what) {
  CUresult r = ruda__cu.cuDeviceGetAttribute(out, a, b->cudev);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "ruda_device_open: cuDeviceGetAttribute(%s)", what);
  return 0;
}

static void cu_close(void *state);

static int cu_open(const ruda__backend_env *env, void **state, ruda__limits *lim) {
  const ruda_config *cfg = env->cfg;
  *state = NULL;
  int rc = ruda__cu_load();
  if (rc != 0) return rc;
  int count = 0;
  CUresult r = ruda__cu.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "ruda_device_open: cuDeviceGetCount");
  int ord = cfg->device_ordinal;
  if (ord < 0 || ord >= count)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_device_open: device ordinal %d, but %d CUDA device%s present",
                      ord, count, count == 1 ? " is" : "s are");
  ruda__cu_backend *b = calloc(1, sizeof *b);
  if (b == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  b->env = *env;
  b->env.cfg = NULL;
  b->log_level = cfg->log_level;
  b->ordinal = ord;
  b->bounds_checked = cfg->bounds_checked;
  ruda__cu_events_init(b);
  pthread_mutex_init(&b->mod_lock, NULL);
  pthread_cond_init(&b->mod_cond, NULL);
  if ((r = ruda__cu.cuDeviceGet(&b->cudev, ord)) != CUDA_SUCCESS) {
    rc = ruda__cu_fail(r, "ruda_device_open: cuDeviceGet(%d)", ord);
    goto fail;
  }
  /* The primary context is the one the runtime API and most libraries
   * use, so handles from ruda_cuda_stream() work with them directly. */
  if ((r = ruda__cu.cuDevicePrimaryCtxRetain(&b->ctx, b->cudev)) != CUDA_SUCCESS) {
    b->ctx = NULL;
    rc = ruda__cu_fail(r, "ruda_device_open: cuDevicePrimaryCtxRetain(device %d)", ord);
    goto fail;
  }

  memset(lim, 0, sizeof *lim);
  if ((r = ruda__cu.cuDeviceGetName(lim->name, (int)sizeof lim->name, b->cudev)) != CUDA_SUCCESS) {
    rc = ruda__cu_fail(r, "ruda_device_open: cuDeviceGetName");
    goto fail;
  }
  int v[16];
  if ((rc = attr(b, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &v[0], "cc major")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &v[1], "cc minor")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &v[2], "SM count")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_WARP_SIZE, &v[3], "warp size")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &v[4], "max threads per block")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &v[5], "max block x")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &v[6], "max block y")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &v[7], "max block z")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, &v[8], "max grid x")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, &v[9], "max grid y")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, &v[10], "max grid z")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, &v[11], "shared per block")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &v[12], "shared opt-in")) ||
      (rc = attr(b, CU_DEVICE_ATTRIBUTE_MAX_PITCH, &v[13], "max pitch")))
    goto fail;
  lim->cc_major = v[0];
  lim->cc_minor = v[1];
  lim->sm_count = (uint32_t)v[2];
  lim->warp_size = (uint32_t)v[3];
  lim->max_threads_per_block = (uint32_t)v[4];
  for (int i = 0; i < 3; i++) {
    lim->max_block[i] = (uint32_t)v[5 + i];
    lim->max_grid[i] = (uint32_t)v[8 + i];
  }
  lim->max_shared = (uint32_t)v[11];
  /* Devices without opt-in report 0: their default is the maximum. */
  lim->max_shared_optin = v[12] > v[11] ? (uint32_t)v[12] : (uint32_t)v[11];
  b->max_shared_optin = lim->max_shared_optin;
  b->max_pitch = (uint64_t)v[13];
  size_t total = 0;
  if ((r = ruda__cu.cuDeviceTotalMem(&total, b->cudev)) != CUDA_SUCCESS) {
    rc = ruda__cu_fail(r, "ruda_device_open: cuDeviceTotalMem");
    goto fail;
  }
  lim->total_mem = total;
  snprintf(b->arch, sizeof b->arch, "sm_%d%d", v[0], v[1]);

  uint64_t limit;
  size_t chunk;
  ruda__staging_env(&limit, &chunk);
  ruda__pinned_ops pops = {pinned_alloc, pinned_free, b};
  if ((rc = ruda__staging_create(&pops, chunk, limit, &b->staging)) != 0) goto fail;
  b->cache_dir = ruda__cu_cache_dir(cfg);
  b->limits = *lim;
  *state = b;
  return 0;
fail:
  cu_close(b);
  return rc;
}

static void cu_close(void *state) {
  ruda__cu_backend *b = state;
  if (b == NULL) return;
  ruda__cu_guard g;
  int entered = b->ctx != NULL && ruda__cu_enter(b, &g) == 0;
  ruda__cu_modules_destroy(b);
  ruda__cu_events_fini(b);
  ruda__staging_destroy(b->staging);
  if (entered) ruda__cu_leave(&g);
  if (b->ctx != NULL) ruda__cu.cuDevicePrimaryCtxRelease(b->cudev);
  free(b->cache_dir);
  pthread_cond_destroy(&b->mod_cond);
  pthread_mutex_destroy(&b->mod_lock);
  free(b);
}

/* ---- workers ---- */

static int cu_worker_start(void *state, uint32_t index, void **wstate) {
  ruda__cu_backend *b = state;
  *wstate = NULL;
  /* A worker only ever uses this context: set it once, never restore. */
  CUresult r = ruda__cu.cuCtxSetCurrent(b->ctx);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "ruda_device_open: worker %u: cuCtxSetCurrent", index);
  ruda__cu_worker *w = calloc(1, sizeof *w);
  if (w == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: worker %u: out of host memory", index);
  w->b = b;
  w->index = index;
  pthread_mutex_init(&w->plock, NULL);
  /* Non-blocking: no implicit ordering with the legacy default stream,
   * which other code in the process may use. */
  int rc;
  if ((r = ruda__cu.cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    rc = ruda__cu_fail(r, "ruda_device_open: worker %u: cuStreamCreate", index);
    goto no_stream;
  }
  if ((w->indirect = ruda__staging_alloc(b->staging, 16)) == NULL) {
    rc = ruda__fail(RUDA_ENOMEM, "ruda_device_open: worker %u: out of host memory", index);
    goto no_indirect;
  }
  /* Events made here, not on the hot path (cuda_event.c). */
  if ((r = ruda__cu_events_fill(w)) != CUDA_SUCCESS) {
    rc = ruda__cu_fail(r, "ruda_device_open: worker %u: cuEventCreate", index);
    goto no_events;
  }
  if (index < 1024) atomic_store_explicit(&b->workers[index], w, memory_order_release);
  *wstate = w;
  return 0;
no_events: /* the events made stay in the pool until close */
  ruda__staging_free(b->staging, w->indirect);
no_indirect:
  ruda__cu.cuStreamDestroy(w->stream);
no_stream:
  pthread_mutex_destroy(&w->plock);
  free(w);
  return rc;
}

static void cu_worker_stop(void *state, void *ws) {
  ruda__cu_backend *b = state;
  ruda__cu_worker *w = ws;
  if (w == NULL) return;
  if (w->index < 1024) atomic_store_explicit(&b->workers[w->index], NULL, memory_order_release);
  /* Everything this worker submitted must finish before its staging
   * blocks are returned and the stream goes away. */
  ruda__cu.cuStreamSynchronize(w->stream);
  cu_progress(w, 1);
  progress_detached(w, 1); /* none left after the synchronize; be sure */
  free(w->pending);
  ruda__staging_free(w->b->staging, w->indirect);
  ruda__cu.cuStreamDestroy(w->stream);
  pthread_mutex_destroy(&w->plock);
  free(w);
}

static void *cu_native_stream(void *ws) { return ws ? (void *)((ruda__cu_worker *)ws)->stream : NULL; }
static void *cu_native_context(void *state) { return (void *)((ruda__cu_backend *)state)->ctx; }

/* Ordering with streams ruda does not own (ruda_cuda_wait_buffer,
 * ruda_buffer_wait_cuda): pooled events like the workers'. */
static int cu_native_record(void *state, void *stream, void **event, const char *fn) {
  ruda__cu_backend *b = state;
  ruda__cu_guard g = {NULL, 0};
  if (ruda__cu_enter(b, &g) != 0) return ruda_error_code(ruda_last_error());
  CUresult r;
  ruda__cu_event *e = ruda__cu_event_get_shared(b, &r);
  if (e != NULL && (r = ruda__cu.cuEventRecord(e->ev, (CUstream)stream)) != CUDA_SUCCESS) {
    ruda__cu_event_put(b, e);
    e = NULL;
  }
  ruda__cu_leave(&g);
  if (e == NULL) {
    char d[160];
    return ruda__fail_backend(RUDA_ECUDA, (long)r, "%s: cuEventRecord on stream %p: %s", fn, stream,
                              ruda__cu_describe(r, d, sizeof d));
  }
  *event = e;
  return 0;
}

static int cu_native_wait(void *state, void *stream, void *event, const char *fn) {
  ruda__cu_backend *b = state;
  ruda__cu_guard g = {NULL, 0};
  if (ruda__cu_enter(b, &g) != 0) return ruda_error_code(ruda_last_error());
  CUresult r = ruda__cu.cuStreamWaitEvent((CUstream)stream, ((ruda__cu_event *)event)->ev, 0);
  ruda__cu_leave(&g);
  if (r != CUDA_SUCCESS) {
    char d[160];
    return ruda__fail_backend(RUDA_ECUDA, (long)r, "%s: cuStreamWaitEvent on stream %p: %s", fn, stream,
                              ruda__cu_describe(r, d, sizeof d));
  }
  return 0;
}

/* ---- device memory ---- */

static int cu_mem_alloc(void *state, uint64_t size, uint64_t *addr) {
  ruda__cu_backend *b = state;
  ruda__cu_guard g;
  int rc = ruda__cu_enter(b, &g);
  if (rc != 0) return rc;
  CUdeviceptr p = 0;
  CUresult r = ruda__cu.cuMemAlloc(&p, size);
  if (r != CUDA_SUCCESS) {
    size_t fr = 0, total = 0;
    ruda__cu.cuMemGetInfo(&fr, &total);
    ruda__cu_leave(&g);
    return ruda__cu_fail(r, "ruda_buffer_create: cuMemAlloc(%llu bytes) with %zu of %zu bytes free",
                         (unsigned long long)size, fr, total);
  }
  ruda__cu_leave(&g);
  *addr = (uint64_t)p;
  return 0;
}

/* An import must be device memory of this context, whole within the
 * allocation it starts in: the driver's pointer attributes say. */
static int cu_mem_check(void *state, uint64_t addr, uint64_t size, const char *fn) {
  ruda__cu_backend *b = state;
  if (ruda__cu.cuPointerGetAttribute == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: the driver has no cuPointerGetAttribute to check the pointer", fn);
  ruda__cu_guard g = {NULL, 0};
  if (ruda__cu_enter(b, &g) != 0) return ruda_error_code(ruda_last_error());
  CUcontext ctx = NULL;
  unsigned int type = 0;
  CUdeviceptr start = 0;
  size_t range = 0;
  CUdeviceptr p = (CUdeviceptr)addr;
  CUresult r = ruda__cu.cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
  ruda__cu_leave(&g);
  if (r != CUDA_SUCCESS) {
    char d[160];
    return ruda__fail_backend(RUDA_EINVAL, (long)r,
                              "%s: 0x%llx is no device memory the driver knows (a host pointer, or freed): "
                              "cuPointerGetAttribute says %s",
                              fn, (unsigned long long)addr, ruda__cu_describe(r, d, sizeof d));
  }
  if (type != CU_MEMORYTYPE_DEVICE)
    return ruda__fail(RUDA_EINVAL, "%s: 0x%llx is %s memory, not device memory", fn, (unsigned long long)addr,
                      type == CU_MEMORYTYPE_HOST ? "page-locked host" : "non-device");
  if (ctx != b->ctx)
    return ruda__fail(RUDA_EINVAL, "%s: 0x%llx belongs to another context or device than this device's", fn,
                      (unsigned long long)addr);
  if (addr - (uint64_t)start + size > (uint64_t)range)
    return ruda__fail(RUDA_EINVAL, "%s: [0x%llx, +%llu) runs past its allocation [0x%llx, +%zu)", fn,
                      (unsigned long long)addr, (unsigned long long)size, (unsigned long long)start, range);
  return 0;
}

/* cuMemFree waits for work in flight on the memory, which keeps this
 * simple scheme correct whichever stream used the buffer last; the pools
 * of the memory layer replace it with stream-ordered reuse. */
static void cu_mem_free(void *state, uint64_t addr, void *ws) {
  ruda__cu_backend *b = state;
  ruda__cu_guard g = {NULL, 0};
  if (ws == NULL && ruda__cu_enter(b, &g) != 0) return;
  CUresult r = ruda__cu.cuMemFree((CUdeviceptr)addr);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
    char d[160];
    ruda__log(b->log_level, RUDA_LOG_DEBUG, "cuMemFree(0x%llx): %s", (unsigned long long)addr,
              ruda__cu_describe(r, d, sizeof d));
  }
  ruda__cu_leave(&g);
}

/* ---- completion ---- */

static int cu_record(void *ws, ruda__completion *c, ruda_error **err) {
  ruda__cu_worker *w = ws;
  CUresult r;
  ruda__cu_event *e = ruda__cu_record(w, &r);
  if (e == NULL) return ruda__cu_worker_fail(w, r, err, "cuEventRecord");
  c->event = e;
  return 0;
}

static int event_done(const void *p) {
  return ruda__cu.cuEventQuery(((const ruda__cu_event *)p)->ev) != CUDA_ERROR_NOT_READY;
}

/* A client's wait for the device. cuEventSynchronize spins a CPU for the
 * whole wait (the primary context's default where CPUs outnumber
 * contexts): the quickest wake-up, so a few waiters at a time do that
 * (the process-wide spin cap, base/sync.h). The rest poll and sleep, so
 * that many waiting clients cannot take the CPUs from the workers whose
 * work they wait for. */
static CUresult wait_event(ruda__cu_event *e) {
  if (ruda__spin_slot_take()) {
    CUresult r = ruda__cu.cuEventSynchronize(e->ev);
    ruda__spin_slot_give();
    return r;
  }
  ruda__poll_sleep(event_done, e);
  return ruda__cu.cuEventSynchronize(e->ev); /* complete: its status */
}

static int cu_event_wait(void *state, void *event, ruda_error **err) {
  ruda__cu_backend *b = state;
  ruda__cu_event *e = event;
  ruda__cu_guard g;
  if (ruda__cu_enter(b, &g) != 0) {
    if (err) *err = ruda__error_new(ruda_last_error()->code, ruda_last_error()->backend_code, "%s",
                                    ruda_last_error()->msg);
    return ruda_last_error()->code;
  }
  CUresult r = wait_event(e);
  ruda__cu_leave(&g);
  if (r == CUDA_SUCCESS) {
    /* The uploads before this point are done: their staging can serve the
     * caller's next write now rather than at the worker's next poll. */
    ruda__cu_retire_upto(e);
    return 0;
  }
  ruda_error *x;
  if (ruda__cu_sticky(r)) {
    char last[320];
    int first = !b->env.faulted(b->env.ctx);
    describe_in_flight(b, last, sizeof last);
    /* The first stream to see the fault lists what was in flight; later
     * ones say the device was already faulted. */
    x = ruda__cu_error(r, "device fault (every stream of the device fails from now on) seen while waiting for %s%s; %s",
                       RUDA__SNAME(e->stream), first ? "" : " (the device was already faulted)", last);
    if (x != NULL) {
      x->stream = e->stream;
      fault_device(b, x);
    }
  } else {
    x = ruda__cu_error(r, "cuEventSynchronize");
  }
  int code = ruda__cu_code(r);
  if (err) *err = x;
  else ruda_error_free(x);
  return code;
}

static int cu_event_query(void *state, void *event) {
  ruda__cu_backend *b = state;
  ruda__cu_guard g;
  if (ruda__cu_enter(b, &g) != 0) return 1; /* the wait will report it */
  CUresult r = ruda__cu.cuEventQuery(((ruda__cu_event *)event)->ev);
  ruda__cu_leave(&g);
  if (r == CUDA_SUCCESS) ruda__cu_retire_upto(event);
  return r != CUDA_ERROR_NOT_READY;
}

/* Any thread: a client running a worker's command in place. A thread
 * with no current context keeps the device's (primary) context after, as
 * the CUDA runtime would bind it there too: a request loop then sets it
 * once, not twice per command. Another context is put back. */
static int cu_exec_enter(void *state, ruda__exec_guard *g) {
  ruda__cu_guard cg;
  if (ruda__cu_enter(state, &cg) != 0) return ruda_error_code(ruda_last_error());
  g->prev = cg.prev;
  g->changed = cg.changed && cg.prev != NULL;
  return 0;
}

static void cu_exec_leave(void *state, ruda__exec_guard *g) {
  (void)state;
  ruda__cu_guard cg = {g->prev, g->changed};
  ruda__cu_leave(&cg);
}

static void cu_event_release(void *state, void *event) {
  ruda__cu_event_put(state, event);
}

/* Cross-stream ordering: later work on this worker's stream waits on the
 * device for another worker's event; the call itself returns at once. The
 * driver takes the event's most recent record at this call, so the event
 * may go back to the pool (and be recorded again) right after. */
static int cu_stream_wait(void *ws, void *event, ruda_error **err) {
  ruda__cu_worker *w = ws;
  CUresult r = ruda__cu.cuStreamWaitEvent(w->stream, ((ruda__cu_event *)event)->ev, 0);
  if (r != CUDA_SUCCESS) return ruda__cu_worker_fail(w, r, err, "cuStreamWaitEvent");
  return 0;
}

/* ---- profiling ---- */

/* A timing event on the worker's stream: the waiter and ruda_profile_end
 * treat it like any completion event. */
static int cu_stamp(void *ws, ruda__completion *c, ruda_error **err) {
  ruda__cu_worker *w = ws;
  CUresult r;
  ruda__cu_event *e = ruda__cu_event_get_timed(w, &r);
  if (e == NULL) return ruda__cu_worker_fail(w, r, err, "cuEventCreate (timing)");
  if ((r = ruda__cu.cuEventRecord(e->ev, w->stream)) != CUDA_SUCCESS) {
    ruda__cu_event_put(w->b, e);
    return ruda__cu_worker_fail(w, r, err, "cuEventRecord (timing)");
  }
  e->kernel = atomic_load_explicit(&w->last_kernel, memory_order_relaxed);
  e->stream = atomic_load_explicit(&w->last_stream, memory_order_relaxed);
  e->seq = atomic_load_explicit(&w->last_seq, memory_order_relaxed);
  e->worker = w;
  e->writes = w->writes;
  c->event = e;
  return 0;
}

static int cu_elapsed(void *state, void *from, void *to, double *ms) {
  ruda__cu_guard g;
  if (ruda__cu_enter(state, &g) != 0) return ruda_error_code(ruda_last_error());
  float f = 0;
  CUresult r = ruda__cu.cuEventElapsedTime(&f, ((ruda__cu_event *)from)->ev, ((ruda__cu_event *)to)->ev);
  ruda__cu_leave(&g);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "cuEventElapsedTime");
  *ms = f;
  return 0;
}

static const ruda__backend_ops cuda_ops = {
    .name = "cuda",
    .auto_graphs_pay = 1,
    .in_place_pays = 1,
    .hold_with_peers = 1,
    .open = cu_open,
    .close = cu_close,
    .worker_start = cu_worker_start,
    .worker_stop = cu_worker_stop,
    .mem_alloc = cu_mem_alloc,
    .mem_free = cu_mem_free,
    .mem_check = cu_mem_check,
    .stage_alloc = cu_stage_alloc,
    .stage_free = cu_stage_free,
    .stage_size = cu_stage_size,
    .write = ruda__cu_write,
    .read = ruda__cu_read,
    .copy = ruda__cu_copy,
    .upload = ruda__cu_upload,
    .download = ruda__cu_download,
    .stage_retire = ruda__cu_stage_retire,
    .stage_owns = ruda__cu_stage_owns,
    .launch = ruda__cu_launch,
    .call_begin = ruda__cu_call_begin,
    .record = cu_record,
    .event_wait = cu_event_wait,
    .exec_enter = cu_exec_enter,
    .exec_leave = cu_exec_leave,
    .event_query = cu_event_query,
    .event_release = cu_event_release,
    .stream_wait = cu_stream_wait,
    .kernel_prepare = ruda__cu_kernel_prepare,
    .kernel_release = ruda__cu_kernel_release,
    .progress = cu_progress,
    .retire = cu_retire_detached,
    .layout_check = ruda__cu_layout_check,
    .launch_check = ruda__cu_launch_check,
    .native_stream = cu_native_stream,
    .native_context = cu_native_context,
    .native_record = cu_native_record,
    .native_wait = cu_native_wait,
    .stage_usage = cu_stage_usage,
    .graph_replay = ruda__cu_graph_replay,
    .graph_release = ruda__cu_graph_release,
    .graph_build = ruda__cu_graph_build,
    .stamp = cu_stamp,
    .elapsed = cu_elapsed,
    .comm_init = ruda__cu_comm_init,
    .comm_destroy = ruda__cu_comm_destroy,
    .comm_init_rank = ruda__cu_comm_init_rank,
    .comm_id = ruda__cu_comm_id,
    .collective = ruda__cu_collective,
    .tensor_map = ruda__cu_tensor_map,
};

const ruda__backend_ops *const ruda__cuda_backend = &cuda_ops;

#define _GNU_SOURCE
/* bench_memory.c - device memory: what an allocation costs, and how much
 * memory the pools hold beyond what is live.
 *
 * 1. alloc+free latency and throughput. T threads (1, 4, 16 by default),
 *    each on its own explicit stream, time ruda_buffer_create +
 *    ruda_buffer_free pairs for a few sizes, for a fixed time. Beside it,
 *    in the same run, the same threads call the backend's own allocator
 *    (ops->mem_alloc + ops->mem_free: cuMemAlloc/cuMemFree on a GPU,
 *    aligned malloc/free on the host), and on the cuda backend also
 *    cuMemAllocAsync + cuMemFreeAsync on a non-blocking stream of the
 *    thread's own (the driver's default memory pool). A "window" mode keeps 32 buffers of
 *    mixed sizes live per thread and replaces the oldest each time, so
 *    pages and classes are shared by buffers of different lifetimes.
 *    The window runs twice: buffers never used (the allocator alone), then
 *    each new buffer used by one launch of an empty kernel (untimed, on
 *    the thread's stream: for ruda a ruda_launch, for the driver's
 *    allocators a cuLaunchKernel on the thread's own stream), so that
 *    memory moving between streams has device work to wait for.
 *    Every pair is timed with CLOCK_MONOTONIC; the cost of one clock pair
 *    is printed and included, not subtracted.
 *
 * 2. amplification on a replayed trace. A synthetic training-like trace
 *    from several streams (per stream: weights kept for the whole run;
 *    per iteration, activations allocated layer by layer and freed in
 *    reverse while gradients come and go, temporaries in between; the
 *    batch size, and with it every activation size, changes between
 *    iterations) is replayed, interleaving the streams, one thread per
 *    stream. Reported: the peak of live bytes (exact, from the trace), the
 *    peak of memory taken from the backend, and their ratio.
 *
 * usage: bench_memory [-s seconds per case] [-t 1,4,16] [-b auto|host|cuda]
 *                     [-x] (skip the raw baseline) [-a] (amplification only)
 *                     [-w] (the window case only, no amplification)
 *                     [-m factor] (scale every size of the trace)
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"
#ifdef RUDA_BENCH_CUDA
#include "backends/cuda/cu_loader.h"
#include "backends/cuda/cuda_internal.h"
#endif

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- part 1: latency and throughput ---- */

enum mode { RUDA_PAIR, RAW_PAIR, RUDA_WINDOW, RAW_WINDOW, ASYNC_PAIR, ASYNC_WINDOW };

/* The stream-ordered driver allocator: only on the cuda backend, when the
 * driver has it. Each thread allocates and frees on a stream of its own. */
static int have_async(ruda_device *dev) {
#ifdef RUDA_BENCH_CUDA
  return strcmp(dev->sched.backend.ops->name, "cuda") == 0 && ruda__cu.cuMemAllocAsync != NULL &&
         ruda__cu.cuMemFreeAsync != NULL;
#else
  (void)dev;
  return 0;
#endif
}

#ifdef RUDA_BENCH_CUDA
static int async_rc(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  char d[160];
  fprintf(stderr, "%s: %s\n", what, ruda__cu_describe(r, d, sizeof d));
  return RUDA_ECUDA;
}
#endif

typedef struct job {
  ruda_device *dev;
  enum mode mode;
  uint32_t id;
  uint64_t size; /* pair modes */
  double seconds;
  pthread_barrier_t *start;
  uint32_t *lat; /* ns per pair, capped at UINT32_MAX */
  size_t nlat, cap;
  uint64_t pairs, t0, t1;
  int rc;
} job;

/* The "used" window: one launch of kernel "touch" per new buffer. */
static int use_buffers;
#ifdef RUDA_BENCH_CUDA
static CUfunction touch_fn;
#endif

static int touch_host(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static int register_touch(ruda_device *dev) {
#ifdef RUDA_BENCH_CUDA
  if (strcmp(dev->sched.backend.ops->name, "cuda") == 0) {
    int rc = ruda_kernel_source(dev, "touch", "extern \"C\" __global__ void touch(float *x) { (void)x; }\n", NULL);
    if (rc == 0) touch_fn = ((ruda__cu_kernel *)ruda__kernel_find(dev, "touch")->impl)->fn;
    return rc;
  }
#endif
  return ruda_host_kernel_register(dev, "touch", touch_host);
}

static int use_ruda(ruda_device *dev, ruda_stream_id s, ruda_handle h) {
  if (!use_buffers) return 0;
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  ruda_launch_desc l = {.kernel = "touch", .grid = {1, 1, 1}, .block = {32, 1, 1}, .args = &a, .nargs = 1};
  return ruda_launch(dev, s, &l);
}

#ifdef RUDA_BENCH_CUDA
static int use_raw(CUstream cs, uint64_t addr) {
  if (!use_buffers || cs == NULL) return 0;
  void *params[1] = {&addr};
  return async_rc(ruda__cu.cuLaunchKernel(touch_fn, 1, 1, 1, 32, 1, 1, 0, cs, params, NULL), "cuLaunchKernel");
}
#else
static int use_raw(void *cs, uint64_t addr) {
  (void)cs;
  (void)addr;
  return 0;
}
#endif

static const uint64_t window_sizes[] = {256, 1000, 4096, 24 << 10, 100 << 10, 256 << 10, 1 << 20, 3 << 20};
#define WINDOW 32

static void record(job *j, uint64_t ns) {
  if (j->nlat < j->cap) j->lat[j->nlat++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

static void *run_job(void *p) {
  job *j = p;
  ruda_device *dev = j->dev;
  const ruda__backend_ops *ops = dev->sched.backend.ops;
  ruda_stream_id s = j->id;
  unsigned seed = 12345u + j->id;
  ruda_handle h[WINDOW];
  uint64_t addr[WINDOW];
  uint32_t head = 0;
#ifdef RUDA_BENCH_CUDA
  CUstream cs = NULL;
  const int raw_stream = use_buffers && j->mode == RAW_WINDOW && strcmp(ops->name, "cuda") == 0;
  if (j->mode == ASYNC_PAIR || j->mode == ASYNC_WINDOW || raw_stream) {
    j->rc = async_rc(ruda__cu.cuCtxSetCurrent((CUcontext)ops->native_context(dev->sched.backend.state)), "cuCtxSetCurrent");
    if (j->rc == 0) j->rc = async_rc(ruda__cu.cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (j->rc == 0 && j->mode == ASYNC_PAIR) {
      CUdeviceptr d;
      j->rc = async_rc(ruda__cu.cuMemAllocAsync(&d, j->size, cs), "cuMemAllocAsync");
      if (j->rc == 0) j->rc = async_rc(ruda__cu.cuMemFreeAsync(d, cs), "cuMemFreeAsync");
    }
    for (int i = 0; i < WINDOW && j->rc == 0 && j->mode == ASYNC_WINDOW; i++) {
      CUdeviceptr d;
      j->rc = async_rc(ruda__cu.cuMemAllocAsync(&d, window_sizes[rand_r(&seed) % 8], cs), "cuMemAllocAsync");
      addr[i] = (uint64_t)d;
      if (j->rc == 0) j->rc = use_raw(cs, addr[i]);
    }
  }
#else
  void *cs = NULL;
#endif
  /* Warm up: the stream, its pools, the window. */
  if (j->mode == RUDA_PAIR) {
    if ((j->rc = ruda_buffer_create(dev, s, j->size, &h[0])) == 0) j->rc = ruda_buffer_free(dev, s, h[0]);
  } else if (j->mode == RUDA_WINDOW) {
    for (int i = 0; i < WINDOW && j->rc == 0; i++) {
      j->rc = ruda_buffer_create(dev, s, window_sizes[rand_r(&seed) % 8], &h[i]);
      if (j->rc == 0) j->rc = use_ruda(dev, s, h[i]);
    }
  } else if (j->mode == RAW_WINDOW) {
    for (int i = 0; i < WINDOW && j->rc == 0; i++) {
      j->rc = ops->mem_alloc(dev->sched.backend.state, window_sizes[rand_r(&seed) % 8], &addr[i]);
      if (j->rc == 0) j->rc = use_raw(cs, addr[i]);
    }
  }
  pthread_barrier_wait(j->start);
  if (j->rc != 0) return NULL;
  const uint64_t budget = (uint64_t)(j->seconds * 1e9);
  j->t0 = now_ns();
  uint64_t t = j->t0;
  while (t - j->t0 < budget) {
    uint64_t a = t, b;
    int rc = 0;
    uint32_t used = UINT32_MAX; /* the window entry to use, after the timing */
    switch (j->mode) {
      case RUDA_PAIR:
        rc = ruda_buffer_create(dev, s, j->size, &h[0]);
        if (rc == 0) rc = ruda_buffer_free(dev, s, h[0]);
        break;
      case RAW_PAIR:
        rc = ops->mem_alloc(dev->sched.backend.state, j->size, &addr[0]);
        if (rc == 0) ops->mem_free(dev->sched.backend.state, addr[0], NULL);
        break;
      case RUDA_WINDOW:
        rc = ruda_buffer_free(dev, s, h[head]);
        if (rc == 0) rc = ruda_buffer_create(dev, s, window_sizes[rand_r(&seed) % 8], &h[head]);
        used = head;
        head = (head + 1) % WINDOW;
        break;
      case RAW_WINDOW:
        ops->mem_free(dev->sched.backend.state, addr[head], NULL);
        rc = ops->mem_alloc(dev->sched.backend.state, window_sizes[rand_r(&seed) % 8], &addr[head]);
        used = head;
        head = (head + 1) % WINDOW;
        break;
#ifdef RUDA_BENCH_CUDA
      case ASYNC_PAIR: {
        CUdeviceptr d;
        rc = async_rc(ruda__cu.cuMemAllocAsync(&d, j->size, cs), "cuMemAllocAsync");
        if (rc == 0) rc = async_rc(ruda__cu.cuMemFreeAsync(d, cs), "cuMemFreeAsync");
        break;
      }
      case ASYNC_WINDOW: {
        CUdeviceptr d;
        rc = async_rc(ruda__cu.cuMemFreeAsync((CUdeviceptr)addr[head], cs), "cuMemFreeAsync");
        if (rc == 0) rc = async_rc(ruda__cu.cuMemAllocAsync(&d, window_sizes[rand_r(&seed) % 8], cs), "cuMemAllocAsync");
        addr[head] = rc == 0 ? (uint64_t)d : 0;
        used = head;
        head = (head + 1) % WINDOW;
        break;
      }
#endif
      default:
        rc = RUDA_EINVAL;
    }
    b = now_ns();
    if (rc != 0) {
      j->rc = rc;
      if (j->mode != ASYNC_PAIR && j->mode != ASYNC_WINDOW)
        fprintf(stderr, "thread %u: %s\n", j->id, ruda_error_message(ruda_last_error()));
      break;
    }
    record(j, b - a);
    j->pairs++;
    if (use_buffers && used != UINT32_MAX) {
      rc = j->mode == RUDA_WINDOW ? use_ruda(dev, s, h[used]) : use_raw(cs, addr[used]);
      if (rc != 0) {
        j->rc = rc;
        break;
      }
      b = now_ns(); /* the launch is not part of the pair */
    }
    t = b;
  }
  j->t1 = now_ns();
  if (j->mode == RUDA_WINDOW) {
    for (int i = 0; i < WINDOW; i++) ruda_buffer_free(dev, s, h[i]);
    if (use_buffers) ruda_sync(dev, s, NULL);
  }
  if (j->mode == RAW_WINDOW)
    for (int i = 0; i < WINDOW; i++) ops->mem_free(dev->sched.backend.state, addr[i], NULL);
#ifdef RUDA_BENCH_CUDA
  if (cs != NULL) {
    if (j->mode == ASYNC_WINDOW)
      for (int i = 0; i < WINDOW; i++)
        if (addr[i]) ruda__cu.cuMemFreeAsync((CUdeviceptr)addr[i], cs);
    ruda__cu.cuStreamSynchronize(cs);
    ruda__cu.cuStreamDestroy(cs);
  }
#endif
  return NULL;
}

typedef struct result {
  double p50, p99, mops;
  uint64_t pairs;
  double backend_per_k; /* backend allocations + frees per 1000 pairs (ruda side) */
} result;

static result run_case(ruda_device *dev, enum mode mode, uint32_t threads, uint64_t size, double seconds) {
  ruda__arena *arena = &dev->memory.arena;
  uint64_t calls0 = atomic_load(&arena->backend_allocs) + atomic_load(&arena->backend_frees);
  job *jobs = calloc(threads, sizeof *jobs);
  pthread_t *th = calloc(threads, sizeof *th);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, threads);
  size_t cap = (size_t)(seconds * 2e7) + 1024; /* room for 20M pairs/s per thread */
  if (cap > (64u << 20)) cap = 64u << 20;
  for (uint32_t i = 0; i < threads; i++) {
    jobs[i] = (job){.dev = dev, .mode = mode, .id = i, .size = size, .seconds = seconds, .start = &start};
    jobs[i].cap = cap / threads + 1024;
    jobs[i].lat = malloc(jobs[i].cap * sizeof(uint32_t));
    pthread_create(&th[i], NULL, run_job, &jobs[i]);
  }
  for (uint32_t i = 0; i < threads; i++) pthread_join(th[i], NULL);
  size_t n = 0;
  uint64_t pairs = 0, t0 = UINT64_MAX, t1 = 0;
  for (uint32_t i = 0; i < threads; i++) {
    n += jobs[i].nlat;
    pairs += jobs[i].pairs;
    if (jobs[i].t0 && jobs[i].t0 < t0) t0 = jobs[i].t0;
    if (jobs[i].t1 > t1) t1 = jobs[i].t1;
  }
  uint32_t *all = malloc((n + 1) * sizeof *all);
  size_t k = 0;
  for (uint32_t i = 0; i < threads; i++) {
    memcpy(all + k, jobs[i].lat, jobs[i].nlat * sizeof *all);
    k += jobs[i].nlat;
    free(jobs[i].lat);
  }
  qsort(all, n, sizeof *all, cmp_u32);
  uint64_t calls = atomic_load(&arena->backend_allocs) + atomic_load(&arena->backend_frees) - calls0;
  result r = {0, 0, 0, pairs, pairs ? 1000.0 * (double)calls / (double)pairs : 0};
  if (n > 0) {
    r.p50 = all[n / 2];
    r.p99 = all[(size_t)((double)n * 0.99)];
  }
  if (t1 > t0) r.mops = (double)pairs / ((double)(t1 - t0) / 1e3);
  free(all);
  free(jobs);
  free(th);
  pthread_barrier_destroy(&start);
  return r;
}

static void print_size(char *out, size_t n, uint64_t size) {
  if (size >= (1u << 20)) snprintf(out, n, "%llu MiB", (unsigned long long)(size >> 20));
  else if (size >= 1024) snprintf(out, n, "%llu KiB", (unsigned long long)(size >> 10));
  else snprintf(out, n, "%llu B", (unsigned long long)size);
}

/* ---- part 2: amplification on a replayed trace ---- */

typedef struct ev {
  uint32_t buf;  /* index in the stream's buffer table */
  uint64_t size; /* 0: free */
} ev;

typedef struct trace {
  ev *ev;
  size_t n, cap;
  uint32_t nbufs;
} trace;

static void push_ev(trace *t, uint32_t buf, uint64_t size) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 4096;
    t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
  }
  t->ev[t->n++] = (ev){buf, size};
}

static uint32_t alloc_ev(trace *t, uint64_t size) {
  uint32_t b = t->nbufs++;
  push_ev(t, b, size);
  return b;
}

static double urand(unsigned *seed) { return (double)rand_r(seed) / ((double)RAND_MAX + 1.0); }

/* Log-uniform in [lo, hi], to 4-byte elements. */
static uint64_t logu(unsigned *seed, double lo, double hi) {
  double x = exp(log(lo) + urand(seed) * (log(hi) - log(lo)));
  return ((uint64_t)x + 3) & ~(uint64_t)3;
}

#define LAYERS 24
#define ITERS 40
static double trace_scale = 1.0; /* -m: multiplies every size of the trace */

static void make_trace(trace *t, unsigned seed) {
  uint64_t base[LAYERS];
  /* Weights: live for the whole run. */
  const double m = trace_scale;
  for (int l = 0; l < LAYERS; l++) alloc_ev(t, logu(&seed, 4096 * m, (24 << 20) * m));
  for (int l = 0; l < LAYERS; l++) base[l] = logu(&seed, 512 * m, (48 << 20) * m);
  static const double batch[] = {1.0, 0.75, 0.5, 0.875, 0.625, 1.0, 0.9375};
  for (int it = 0; it < ITERS; it++) {
    double b = batch[rand_r(&seed) % 7];
    uint32_t act[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
      act[l] = alloc_ev(t, ((uint64_t)((double)base[l] * b) + 3) & ~(uint64_t)3);
      uint32_t tmp = alloc_ev(t, logu(&seed, 256, (double)base[l] * b + 512));
      push_ev(t, tmp, 0);
    }
    uint32_t g_prev = UINT32_MAX;
    for (int l = LAYERS - 1; l >= 0; l--) {
      uint32_t g = alloc_ev(t, ((uint64_t)((double)base[l] * b) + 3) & ~(uint64_t)3);
      uint32_t tmp = alloc_ev(t, logu(&seed, 256, (1 << 20) * m));
      push_ev(t, act[l], 0);
      push_ev(t, tmp, 0);
      if (g_prev != UINT32_MAX) push_ev(t, g_prev, 0);
      g_prev = g;
    }
    push_ev(t, g_prev, 0);
  }
}

typedef struct replayer {
  ruda_device *dev;
  ruda_stream_id s;
  trace *t;
  size_t step;      /* events done */
  ruda_handle *h;
  uint64_t *size;
  int rc;
} replayer;

/* Live bytes over all streams, and their peak: exact, from the trace. */
static _Atomic uint64_t live_now, live_peak;
static pthread_barrier_t lockstep;
#define STEP 64 /* events per stream between lock steps */

static size_t rounds; /* lock steps of the longest trace */

static void *replay(void *p) {
  replayer *r = p;
  for (size_t round = 0; round < rounds; round++) {
    size_t end = r->step + STEP < r->t->n ? r->step + STEP : r->t->n;
    for (; r->step < end && r->rc == 0; r->step++) {
      ev e = r->t->ev[r->step];
      if (e.size) {
        r->rc = ruda_buffer_create(r->dev, r->s, e.size, &r->h[e.buf]);
        r->size[e.buf] = e.size;
        uint64_t now = atomic_fetch_add(&live_now, e.size) + e.size;
        uint64_t pk = atomic_load(&live_peak);
        while (now > pk && !atomic_compare_exchange_weak(&live_peak, &pk, now)) {
        }
      } else {
        atomic_fetch_sub(&live_now, r->size[e.buf]);
        r->rc = ruda_buffer_free(r->dev, r->s, r->h[e.buf]);
      }
      if (r->rc != 0) fprintf(stderr, "replay: %s\n", ruda_error_message(ruda_last_error()));
    }
    /* Streams advance together, as replicas of one model would. */
    pthread_barrier_wait(&lockstep);
  }
  return NULL;
}

static void amplification(ruda_device *dev, uint32_t streams) {
  trace *t = calloc(streams, sizeof *t);
  size_t most = 0;
  for (uint32_t i = 0; i < streams; i++) {
    make_trace(&t[i], 777u + i * 31u);
    if (t[i].n > most) most = t[i].n;
  }
  replayer *r = calloc(streams, sizeof *r);
  pthread_t *th = calloc(streams, sizeof *th);
  pthread_barrier_init(&lockstep, NULL, streams);
  rounds = (most + STEP - 1) / STEP;
  atomic_store(&live_now, 0);
  atomic_store(&live_peak, 0);
  /* Start from nothing reserved: pages the earlier cases left would serve
   * the trace without showing in the backend peak. */
  ruda_stream_id ids[256];
  size_t nids = ruda_stream_ids(dev, ids, 256);
  for (size_t i = 0; i < nids && i < 256; i++) ruda_memory_cleanup(dev, ids[i]);
  uint64_t backed0 = atomic_load(&dev->memory.arena.backed);
  atomic_store(&dev->memory.arena.peak_backed, backed0);
  if (backed0 != 0) printf("\n(%.1f MiB still reserved before the trace)\n", (double)backed0 / 1048576.0);
  uint64_t calls0 = atomic_load(&dev->memory.arena.backend_allocs);
  uint64_t frees0 = atomic_load(&dev->memory.arena.backend_frees);
  size_t events = 0;
  for (uint32_t i = 0; i < streams; i++) {
    events += t[i].n;
    r[i] = (replayer){.dev = dev, .s = 100 + i, .t = &t[i]};
    r[i].h = calloc(t[i].nbufs, sizeof *r[i].h);
    r[i].size = calloc(t[i].nbufs, sizeof *r[i].size);
  }
  uint64_t t0 = now_ns();
  for (uint32_t i = 0; i < streams; i++) pthread_create(&th[i], NULL, replay, &r[i]);
  for (uint32_t i = 0; i < streams; i++) pthread_join(th[i], NULL);
  uint64_t t1 = now_ns();
  int rc = 0;
  for (uint32_t i = 0; i < streams; i++) rc |= r[i].rc;
  uint64_t peak = atomic_load(&dev->memory.arena.peak_backed) - backed0;
  uint64_t live = atomic_load(&live_peak);
  uint64_t calls = atomic_load(&dev->memory.arena.backend_allocs) - calls0;
  uint64_t frees = atomic_load(&dev->memory.arena.backend_frees) - frees0;
  printf("\n## Amplification on a replayed trace (%u streams, %d layers, %d iterations, sizes x%g)\n\n",
         streams, LAYERS, ITERS, trace_scale);
  printf("| events | live peak (MiB) | backend peak (MiB) | reserved / live peak | backend allocs | backend "
         "frees | replay time (ms) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  printf("| %zu | %.1f | %.1f | **%.3f** | %llu | %llu | %.1f |%s\n", events, (double)live / 1048576.0,
         (double)peak / 1048576.0, live ? (double)peak / (double)live : 0.0, (unsigned long long)calls,
         (unsigned long long)frees, (double)(t1 - t0) / 1e6, rc ? " (errors)" : "");
  for (uint32_t i = 0; i < streams; i++) {
    free(r[i].h);
    free(r[i].size);
    free(t[i].ev);
  }
  free(r);
  free(th);
  free(t);
  pthread_barrier_destroy(&lockstep);
}

int main(int argc, char **argv) {
  double seconds = 0.5;
  uint32_t thread_counts[8] = {1, 4, 16};
  int nthreads = 3, raw = 1, only_amp = 0, only_window = 0;
  ruda_backend_kind backend = RUDA_BACKEND_AUTO;
  int opt;
  while ((opt = getopt(argc, argv, "hs:t:b:xawm:")) != -1) {
    switch (opt) {
      case 'm': trace_scale = atof(optarg) > 0 ? atof(optarg) : 1.0; break;
      case 's': seconds = atof(optarg); break;
      case 't': {
        nthreads = 0;
        for (char *tok = strtok(optarg, ","); tok && nthreads < 8; tok = strtok(NULL, ","))
          thread_counts[nthreads++] = (uint32_t)atoi(tok);
        break;
      }
      case 'b':
        backend = !strcmp(optarg, "host") ? RUDA_BACKEND_HOST
                  : !strcmp(optarg, "cuda") ? RUDA_BACKEND_CUDA
                                            : RUDA_BACKEND_AUTO;
        break;
      case 'x': raw = 0; break;
      case 'a': only_amp = 1; break;
      case 'w': only_window = 1; break;
      default:
        fprintf(opt == 'h' ? stdout : stderr,
                "usage: %s [-s seconds] [-t 1,4,16] [-b auto|host|cuda] [-x] [-a] [-w] [-m factor]\n"
                "  -s  seconds per case (default 0.5)\n"
                "  -t  thread counts, comma-separated (default 1,4,16)\n"
                "  -b  backend (default auto: cuda when usable, else host)\n"
                "  -x  skip the backend's own allocators (the baseline)\n"
                "  -a  the replayed-trace amplification case only\n"
                "  -w  the window case only (no amplification)\n"
                "  -m  scale every size of the replayed trace by this factor\n"
                "  -h  this help\n",
                argv[0]);
        return opt == 'h' ? 0 : 2;
    }
  }
  uint32_t most = 1;
  for (int i = 0; i < nthreads; i++)
    if (thread_counts[i] > most) most = thread_counts[i];
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = backend;
  cfg.num_streams = most > 4 ? most : 4;
  cfg.log_level = RUDA_LOG_ERROR;
  ruda_device *dev;
  if (ruda_device_open(&cfg, &dev) != 0) {
    fprintf(stderr, "open: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  uint64_t c0 = now_ns(), c1 = c0;
  for (int i = 0; i < 1000; i++) c1 = now_ns();
  printf("# bench_memory: backend %s (%s), %u workers; clock pair %.0f ns (included)\n",
         ruda_device_backend(dev), dev->limits.name, dev->sched.nworkers, (double)(c1 - c0) / 1000.0);

  if (!only_amp) {
    printf("\n## alloc+free pairs, %.2f s per case (ns per pair; Mpairs/s over all threads)\n\n", seconds);
    const int async = raw && have_async(dev);
    printf("| size | threads | ruda p50 | ruda p99 | ruda Mpairs/s | backend calls / 1k | raw p50 | raw p99 | raw "
           "Mpairs/s | async p50 | async p99 | async Mpairs/s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    static const uint64_t sizes[] = {256, 64 << 10, 1 << 20, 16 << 20};
    if (register_touch(dev) != 0) {
      fprintf(stderr, "kernel touch: %s\n", ruda_error_message(ruda_last_error()));
      return 1;
    }
    for (int si = only_window ? 4 : 0; si < 6; si++) {
      use_buffers = si == 5;
      for (int ti = 0; ti < nthreads; ti++) {
        uint32_t T = thread_counts[ti];
        enum mode rm = si < 4 ? RUDA_PAIR : RUDA_WINDOW, bm = si < 4 ? RAW_PAIR : RAW_WINDOW;
        /* Without a stream of its own the host's raw allocator cannot use its buffers. */
        const int do_raw = raw && !(use_buffers && strcmp(dev->sched.backend.ops->name, "cuda") != 0);
        uint64_t size = si < 4 ? sizes[si] : 0;
        result a = run_case(dev, rm, T, size, seconds);
        result b = {0, 0, 0, 0, 0};
        if (do_raw) b = run_case(dev, bm, T, size, seconds);
        result c = {0, 0, 0, 0, 0};
        if (async) c = run_case(dev, si < 4 ? ASYNC_PAIR : ASYNC_WINDOW, T, size, seconds);
        char sz[32];
        if (si < 4) print_size(sz, sizeof sz, size);
        else snprintf(sz, sizeof sz, use_buffers ? "window, each used once" : "window of 32 mixed");
        printf("| %s | %u | %.0f | %.0f | %.2f | %.2f | ", sz, T, a.p50, a.p99, a.mops, a.backend_per_k);
        if (do_raw) printf("%.0f | %.0f | %.3f | ", b.p50, b.p99, b.mops);
        else printf("- | - | - | ");
        if (async) printf("%.0f | %.0f | %.3f |\n", c.p50, c.p99, c.mops);
        else printf("- | - | - |\n");
        fflush(stdout);
      }
    }
  }
  if (!only_window) amplification(dev, 4);
  ruda_memory_stats d;
  if (ruda_memory_device_usage(dev, &d) == 0)
    printf("\nafter the runs: %.1f MiB reserved, %.1f MiB peak backed\n", (double)d.bytes_reserved / 1048576.0,
           (double)d.peak_reserved / 1048576.0);
  ruda_device_close(dev, NULL);
  return 0;
}

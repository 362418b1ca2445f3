#define _GNU_SOURCE
/* bench_gpu.c - the cuda backend beside the raw driver, in one process.
 *
 *   bench_gpu [-q] [-s sections] [-W window] [-w workers[,workers...]] [out.csv]
 *
 * 1. Caller-side launch latency: one thread calls ruda_launch (an empty
 *    kernel, grid 1, block 32) n times; the same thread then calls
 *    cuLaunchKernel n times on a stream of its own. Each call is timed
 *    with a calibrated TSC; the cost of a clock pair is printed and not
 *    subtracted. Twice:
 *    - burst: the n launches back to back. The worker submits ~20x slower
 *      than the client enqueues, so nearly all n commands are in flight at
 *      the end and the command pool grows (fresh memory, page faults)
 *      instead of recycling; the raw driver's own queue fills likewise.
 *    - steady: the same launches with the work in flight bounded: every
 *      `window` launches (-W, default 256) the loop waits, untimed, until
 *      the worker has caught up (ruda_flush: everything before it handed
 *      to the driver) or, for the raw driver, until the stream is idle
 *      (cuStreamSynchronize). This is what a server that keeps up with
 *      its GPU sees. The first launch after each wait finds the worker
 *      asleep and pays its wake-up (one launch in `window`).
 * 2. Sustained launches/s for 1, 2, 4, 8, 16 and 64 client threads: each
 *    thread issues its share of the launches on its own stream and then
 *    waits for it (ruda_sync / cuStreamSynchronize); the rate is launches
 *    over the wall time from the start barrier to the last thread done.
 *    ruda runs once per worker count given (default 4 and 8): client
 *    threads beyond that share workers, so the number of threads calling
 *    the driver stays at its sweet spot. Each thread count is measured in
 *    rounds (-R, default 3), raw then every ruda configuration back to
 *    back in each; printed are medians and the per-round ratios' spread.
 * 3. Upload of 512 MiB: ruda_write from pageable memory (staged, chunked),
 *    ruda_write_staged from a staging buffer, and the raw driver's
 *    cuMemcpyHtoD from pageable and from page-locked memory. Best and
 *    median of 5 runs, each until the copy completed.
 * 4. Kernel load: 20 distinct kernels registered on a device with an empty
 *    disk cache (NVRTC), then on a fresh device over the same cache (disk),
 *    then again on that device (memory).
 * 6. Graph replay: 100 empty kernels captured once, the graph replayed
 *    1000 times then waited for: ruda_graph_replay on a ruda stream beside
 *    the raw driver's stream capture + cuGraphInstantiate + cuGraphLaunch
 *    on a stream of its own, and beside the same 100,000 kernels launched
 *    one by one (cuLaunchKernel). Time per kernel, and the caller's cost
 *    per ruda_graph_replay call.
 * 5. Sections 1 and 2 again with one buffer argument per launch (a kernel
 *    taking a float *): ruda pins the buffer's handle and records the
 *    launch for cross-stream ordering; the raw driver passes the pointer.
 *    Each thread uses a buffer of its own, so no launch waits on another
 *    stream: this is the price of the bookkeeping alone.
 *
 * The raw driver is reached through ruda's own loader (dlopen of
 * libcuda.so.1 + cuGetProcAddress), on the same primary context.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "ruda/ruda.h"
#include "backends/cuda/cuda_internal.h"
#define BENCH_NAME "bench_gpu"
#include "bench/bench_check.h"
#include "src/api.h"

/* ---- clocks ---- */

static double ns_per_tick;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tick0(void) {
  _mm_lfence();
  uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}

static inline uint64_t tick1(void) {
  unsigned aux;
  uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
}

static void calibrate(void) {
  uint64_t n0 = mono_ns(), t0 = __rdtsc();
  while (mono_ns() - n0 < 100000000ull) {
  }
  uint64_t n1 = mono_ns(), t1 = __rdtsc();
  ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct(uint64_t *sorted, size_t n, double p) { return sorted[(size_t)(p * (double)(n - 1))] * ns_per_tick; }

/* ---- output ---- */

static FILE *csv;

static void row(const char *section, const char *variant, int threads, const char *metric, double value,
                const char *unit) {
  if (csv) fprintf(csv, "%s,%s,%d,%s,%.6g,%s\n", section, variant, threads, metric, value, unit);
}



static ruda_device *open_dev(uint32_t workers, const char *cache_dir) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_CUDA;
  cfg.num_streams = workers;
  cfg.queue_bound = 1u << 22;
  cfg.log_level = RUDA_LOG_WARN;
  cfg.cache_dir = cache_dir;
  ruda_device *dev = NULL;
  int rc = ruda_device_open(&cfg, &dev);
  if (rc != 0) die("ruda_device_open(cuda)", rc);
  return dev;
}

static const char SRC_EMPTY[] = "extern \"C\" __global__ void empty() {}\n";
static const char SRC_TOUCH[] = "extern \"C\" __global__ void touch(float *x) { (void)x; }\n";

/* Section 5: launches carry one buffer argument (kernel "touch"). */
static int with_buf;
static const char *kname(void) { return with_buf ? "touch" : "empty"; }

static CUfunction raw_function(ruda_device *dev, const char *name) {
  ruda__kernel *k = ruda__kernel_find(dev, name);
  return ((ruda__cu_kernel *)k->impl)->fn;
}

static CUcontext ctx_of(ruda_device *dev) {
  void *c = NULL;
  CHECK(ruda_cuda_context(dev, &c));
  return (CUcontext)c;
}

/* ---- 1. latency ---- */

typedef struct lat {
  double p50, p99, p999;
} lat;

static lat summarize(uint64_t *t, size_t n) {
  qsort(t, n, sizeof *t, cmp_u64);
  return (lat){pct(t, n, 0.5), pct(t, n, 0.99), pct(t, n, 0.999)};
}

/* n timed ruda_launch calls; window 0: back to back, else a ruda_flush
 * (untimed) after every window launches. *drain_ms: the closing sync. */
static lat time_ruda(ruda_device *dev, const ruda_launch_desc *l, uint64_t *t, size_t n, size_t window,
                     double *drain_ms) {
  for (int warm = 0; warm < 1000; warm++) CHECK(ruda_launch(dev, 0, l));
  CHECK(ruda_sync(dev, 0, NULL));
  for (size_t i = 0; i < n; i++) {
    if (window && i % window == 0 && i > 0) CHECK(ruda_flush(dev, 0, NULL));
    uint64_t a = tick0();
    int rc = ruda_launch(dev, 0, l);
    t[i] = tick1() - a;
    if (rc != 0) die("ruda_launch", rc);
  }
  uint64_t s0 = mono_ns();
  CHECK(ruda_sync(dev, 0, NULL));
  *drain_ms = (mono_ns() - s0) / 1e6;
  return summarize(t, n);
}

/* The same with cuLaunchKernel on a stream of the caller's own; the wait
 * is cuStreamSynchronize. */
static lat time_raw(CUfunction fn, CUstream st, void **params, uint64_t *t, size_t n, size_t window) {
  for (int warm = 0; warm < 1000; warm++) CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, st, params, NULL));
  CU(ruda__cu.cuStreamSynchronize(st));
  for (size_t i = 0; i < n; i++) {
    if (window && i % window == 0 && i > 0) CU(ruda__cu.cuStreamSynchronize(st));
    uint64_t a = tick0();
    CUresult r = ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, st, params, NULL);
    t[i] = tick1() - a;
    if (r != CUDA_SUCCESS) die("cuLaunchKernel", RUDA_ECUDA);
  }
  CU(ruda__cu.cuStreamSynchronize(st));
  return summarize(t, n);
}

static void lat_rows(const char *variant, lat x) {
  char v[48];
  snprintf(v, sizeof v, "%s%s", variant, with_buf ? "_1buf" : "");
  row("latency", v, 1, "p50", x.p50, "ns");
  row("latency", v, 1, "p99", x.p99, "ns");
  row("latency", v, 1, "p999", x.p999, "ns");
}

static void latency(ruda_device *dev, size_t n, size_t window) {
  uint64_t *t = malloc(n * sizeof *t);
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = kname();
  l.grid = (ruda_dim3){1, 1, 1};
  l.block = (ruda_dim3){32, 1, 1};
  ruda_handle h = {0, 0};
  ruda_arg arg;
  uint64_t dptr = 0;
  void *params[1] = {&dptr};
  if (with_buf) {
    CHECK(ruda_buffer_create(dev, 0, 4096, &h));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(h), &dptr));
    arg = ruda_arg_buffer(ruda_bind(h));
    l.args = &arg;
    l.nargs = 1;
  }
  /* clock pair cost */
  for (size_t i = 0; i < n; i++) {
    uint64_t a = tick0();
    t[i] = tick1() - a;
  }
  qsort(t, n, sizeof *t, cmp_u64);
  double clk = pct(t, n, 0.5);
  printf("clock pair: p50 %.1f ns (included in every latency below)\n", clk);
  row("latency", "clock_pair", 1, "p50", clk, "ns");

  double burst_drain_ms, steady_drain_ms;
  lat rb = time_ruda(dev, &l, t, n, 0, &burst_drain_ms);
  CUfunction fn = raw_function(dev, kname());
  CU(ruda__cu.cuCtxSetCurrent(ctx_of(dev)));
  CUstream st;
  CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  void **pp = with_buf ? params : NULL;
  lat db = time_raw(fn, st, pp, t, n, 0);
  lat rs = time_ruda(dev, &l, t, n, window, &steady_drain_ms);
  lat ds = time_raw(fn, st, pp, t, n, window);
  CU(ruda__cu.cuStreamDestroy(st));
  if (with_buf) {
    CHECK(ruda_buffer_free(dev, 0, h));
    CHECK(ruda_sync(dev, 0, NULL));
  }

  printf("\n%s. caller-side launch latency, %zu launches%s, one thread (ns)\n", with_buf ? "5a" : "1", n,
         with_buf ? " with one buffer argument" : "");
  printf("   %-40s %10s %10s %10s\n", "", "p50", "p99", "p99.9");
  printf("   %-40s %10.1f %10.1f %10.1f   (worker drained the rest in %.1f ms)\n", "burst: ruda_launch", rb.p50,
         rb.p99, rb.p999, burst_drain_ms);
  printf("   %-40s %10.1f %10.1f %10.1f\n", "burst: cuLaunchKernel", db.p50, db.p99, db.p999);
  char what[64];
  snprintf(what, sizeof what, "steady (wait every %zu): ruda_launch", window);
  printf("   %-40s %10.1f %10.1f %10.1f\n", what, rs.p50, rs.p99, rs.p999);
  snprintf(what, sizeof what, "steady (wait every %zu): cuLaunchKernel", window);
  printf("   %-40s %10.1f %10.1f %10.1f\n", what, ds.p50, ds.p99, ds.p999);
  lat_rows("ruda", rb);
  lat_rows("raw", db);
  lat_rows("ruda_steady", rs);
  lat_rows("raw_steady", ds);
  row("latency", "steady_window", 1, "launches", (double)window, "1");
  free(t);
}

/* ---- 2. throughput ---- */

typedef struct tput_arg {
  ruda_device *dev;
  int raw;
  int index;
  size_t launches;
  CUcontext ctx;
  CUfunction fn;
  pthread_barrier_t *go;
  uint64_t done_ns;
} tput_arg;

/* Section 5: a 4 KiB buffer of the thread's own, for ruda and for raw. */
static void tput_buffer(tput_arg *a, ruda_stream_id s, ruda_handle *h, uint64_t *dptr) {
  ruda_device *dev = a->dev;
  CHECK(ruda_buffer_create(dev, s, 4096, h));
  CHECK(ruda_binding_device_ptr(dev, ruda_bind(*h), dptr));
}

static void *tput_main(void *p) {
  tput_arg *a = p;
  ruda_stream_id s = (ruda_stream_id)a->index;
  ruda_handle h = {0, 0};
  uint64_t dptr = 0;
  void *params[1] = {&dptr};
  if (with_buf) tput_buffer(a, s, &h, &dptr); /* raw uses ruda's memory too: same pointer kind */
  if (a->raw) {
    CU(ruda__cu.cuCtxSetCurrent(a->ctx));
    CUstream st;
    CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    pthread_barrier_wait(a->go);
    for (size_t i = 0; i < a->launches; i++)
      CU(ruda__cu.cuLaunchKernel(a->fn, 1, 1, 1, 32, 1, 1, 0, st, with_buf ? params : NULL, NULL));
    CU(ruda__cu.cuStreamSynchronize(st));
    a->done_ns = mono_ns();
    CU(ruda__cu.cuStreamDestroy(st));
  } else {
    ruda_launch_desc l;
    memset(&l, 0, sizeof l);
    ruda_arg arg = ruda_arg_buffer(ruda_bind(h));
    l.kernel = kname();
    l.grid = (ruda_dim3){1, 1, 1};
    l.block = (ruda_dim3){32, 1, 1};
    if (with_buf) l.args = &arg, l.nargs = 1;
    CHECK(ruda_sync(a->dev, s, NULL)); /* create the stream outside the timing */
    pthread_barrier_wait(a->go);
    for (size_t i = 0; i < a->launches; i++) CHECK(ruda_launch(a->dev, s, &l));
    CHECK(ruda_sync(a->dev, s, NULL));
    a->done_ns = mono_ns();
  }
  if (with_buf) {
    CHECK(ruda_buffer_free(a->dev, s, h));
    CHECK(ruda_sync(a->dev, s, NULL));
  }
  return NULL;
}

static double run_tput(ruda_device *dev, int raw, int threads, size_t total) {
  pthread_t t[64];
  tput_arg a[64];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
  CUfunction fn = raw_function(dev, kname());
  for (int i = 0; i < threads; i++) {
    a[i] = (tput_arg){dev, raw, i, total / (size_t)threads, ctx_of(dev), fn, &go, 0};
    pthread_create(&t[i], NULL, tput_main, &a[i]);
  }
  pthread_barrier_wait(&go);
  uint64_t start = mono_ns(), end = start;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    if (a[i].done_ns > end) end = a[i].done_ns;
  }
  pthread_barrier_destroy(&go);
  return (double)(total / (size_t)threads * (size_t)threads) / ((end - start) / 1e9);
}

static int cmp_d(const void *a, const void *b);

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ruda with each worker count of the list beside the raw driver; each
 * ruda configuration gets a device of its own, all open at once, so
 * that each round measures raw and every ruda configuration back to back
 * at one thread count: a machine whose speed drifts during the run moves
 * both sides of a round's ratio alike. Printed: the medians over the
 * rounds of each rate and of the per-round ratios, and the ratios'
 * spread (min-max). */
static void throughput(ruda_device *raw_dev, size_t total, const uint32_t *workers, int nw, int rounds) {
  static const int T[] = {1, 2, 4, 8, 16, 64};
  enum { NT = sizeof T / sizeof *T, MAXR = 16 };
  ruda_device *devs[8];
  for (int w = 0; w < nw; w++) {
    devs[w] = open_dev(workers[w], "");
    CHECK(ruda_kernel_source(devs[w], "empty", SRC_EMPTY, NULL));
    CHECK(ruda_kernel_source(devs[w], "touch", SRC_TOUCH, NULL));
  }
  printf("\n%s. sustained launches/s (%zu %s launches per point, medians of %d rounds)\n", with_buf ? "5b" : "2",
         total, with_buf ? "one-buffer" : "empty", rounds);
  printf("   %8s %14s", "threads", "raw driver");
  for (int w = 0; w < nw; w++) printf("   ruda %2u wkrs  ratio (min-max)", workers[w]);
  printf("\n");
  double best_raw = 0;
  for (int i = 0; i < NT; i++) {
    double raw[MAXR], r[8][MAXR], ratio[8][MAXR];
    for (int k = 0; k < rounds; k++) {
      raw[k] = run_tput(raw_dev, 1, T[i], total);
      for (int w = 0; w < nw; w++) {
        r[w][k] = run_tput(devs[w], 0, T[i], total);
        ratio[w][k] = r[w][k] / raw[k];
      }
    }
    const double raw_m = median(raw, rounds);
    if (raw_m > best_raw) best_raw = raw_m;
    printf("   %8d %14.0f", T[i], raw_m);
    row("throughput", with_buf ? "raw_1buf" : "raw", T[i], "launches_per_s", raw_m, "1/s");
    for (int w = 0; w < nw; w++) {
      const double rm = median(r[w], rounds), qm = median(ratio[w], rounds); /* sorts: min first */
      printf(" %14.0f %6.3f (%.2f-%.2f)", rm, qm, ratio[w][0], ratio[w][rounds - 1]);
      char v[32];
      snprintf(v, sizeof v, "ruda_w%u%s", workers[w], with_buf ? "_1buf" : "");
      row("throughput", v, T[i], "launches_per_s", rm, "1/s");
      snprintf(v, sizeof v, "ratio_w%u%s", workers[w], with_buf ? "_1buf" : "");
      row("throughput", v, T[i], "median_ratio", qm, "x");
    }
    printf("\n");
  }
  for (int w = 0; w < nw; w++) ruda_device_close(devs[w], NULL);
  printf("   raw driver best: %.0f/s\n", best_raw);
  row("throughput", with_buf ? "raw_best_1buf" : "raw_best", 0, "launches_per_s", best_raw, "1/s");
}

/* ---- 3. uploads ---- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report_gbs(const char *variant, double *gbs, int n) {
  qsort(gbs, (size_t)n, sizeof *gbs, cmp_d);
  printf("   %-40s best %6.2f  median %6.2f GB/s\n", variant, gbs[n - 1], gbs[n / 2]);
  row("upload_512MiB", variant, 1, "best", gbs[n - 1], "GB/s");
  row("upload_512MiB", variant, 1, "median", gbs[n / 2], "GB/s");
}

static void uploads(ruda_device *dev, int runs) {
  const size_t n = 512u << 20;
  unsigned char *pageable = malloc(n);
  for (size_t i = 0; i < n; i++) pageable[i] = (unsigned char)(i * 7); /* resident */
  ruda_handle h;
  CHECK(ruda_buffer_create(dev, 0, n, &h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  uint64_t dptr;
  CHECK(ruda_binding_device_ptr(dev, ruda_bind(h), &dptr));
  double gbs[16];
  printf("\n3. upload of 512 MiB (staging: %u helper copy threads + the caller)\n", ruda__staging_helpers());

  CHECK(ruda_write(dev, 0, &d, pageable, n)); /* warm-up: the arena reserves its chunks */
  CHECK(ruda_sync(dev, 0, NULL));
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = mono_ns();
    CHECK(ruda_write(dev, 0, &d, pageable, n));
    CHECK(ruda_sync(dev, 0, NULL));
    gbs[r] = n / ((mono_ns() - t0) / 1e9) / 1e9;
  }
  report_gbs("ruda_write (pageable via staging)", gbs, runs);

  for (int r = 0; r < runs; r++) {
    void *p;
    CHECK(ruda_staging_alloc(dev, n, &p));
    memset(p, r, n);
    uint64_t t0 = mono_ns();
    CHECK(ruda_write_staged(dev, 0, &d, p, n));
    CHECK(ruda_sync(dev, 0, NULL));
    gbs[r] = n / ((mono_ns() - t0) / 1e9) / 1e9;
  }
  report_gbs("ruda_write_staged (direct staging)", gbs, runs);

  CU(ruda__cu.cuCtxSetCurrent(ctx_of(dev)));
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = mono_ns();
    CU(ruda__cu.cuMemcpyHtoD((CUdeviceptr)dptr, pageable, n));
    gbs[r] = n / ((mono_ns() - t0) / 1e9) / 1e9;
  }
  report_gbs("cuMemcpyHtoD from pageable", gbs, runs);

  void *pinned;
  CU(ruda__cu.cuMemHostAlloc(&pinned, n, 0));
  memcpy(pinned, pageable, n);
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = mono_ns();
    CU(ruda__cu.cuMemcpyHtoD((CUdeviceptr)dptr, pinned, n));
    gbs[r] = n / ((mono_ns() - t0) / 1e9) / 1e9;
  }
  report_gbs("cuMemcpyHtoD from page-locked", gbs, runs);
  CU(ruda__cu.cuMemFreeHost(pinned));

  ruda_staging_stats st;
  CHECK(ruda_staging_usage(dev, &st));
  printf("   staging arena: %llu MiB page-locked, peak in use %llu MiB, %llu pageable fallbacks\n",
         (unsigned long long)(st.pinned_bytes >> 20), (unsigned long long)(st.peak_bytes >> 20),
         (unsigned long long)st.fallback_count);
  CHECK(ruda_buffer_free(dev, 0, h));
  CHECK(ruda_sync(dev, 0, NULL));
  free(pageable);
}

/* ---- 6. graph replay ---- */

static void graphs(ruda_device *dev, int replays) {
  enum { K = 100 };
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "empty";
  l.grid = (ruda_dim3){1, 1, 1};
  l.block = (ruda_dim3){32, 1, 1};
  ruda_graph *g;
  CHECK(ruda_graph_begin_capture(dev, 0));
  for (int i = 0; i < K; i++) CHECK(ruda_launch(dev, 0, &l));
  CHECK(ruda_graph_end_capture(dev, 0, &g));
  for (int w = 0; w < 10; w++) CHECK(ruda_graph_replay(dev, 0, g)); /* the first one instantiates */
  CHECK(ruda_sync(dev, 0, NULL));
  uint64_t *t = malloc((size_t)replays * sizeof *t);
  uint64_t t0 = mono_ns();
  for (int r = 0; r < replays; r++) {
    uint64_t a = tick0();
    CHECK(ruda_graph_replay(dev, 0, g));
    t[r] = tick1() - a;
  }
  CHECK(ruda_sync(dev, 0, NULL));
  double ruda_us = (mono_ns() - t0) / 1e3 / ((double)replays * K);
  lat call = summarize(t, (size_t)replays);
  CHECK(ruda_graph_destroy(dev, g));

  CUfunction fn = raw_function(dev, "empty");
  CU(ruda__cu.cuCtxSetCurrent(ctx_of(dev)));
  CUstream st;
  CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUgraph cg;
  CUgraphExec ge;
  CU(ruda__cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  for (int i = 0; i < K; i++) CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, st, NULL, NULL));
  CU(ruda__cu.cuStreamEndCapture(st, &cg));
  CU(ruda__cu.cuGraphInstantiateWithFlags(&ge, cg, 0));
  for (int w = 0; w < 10; w++) CU(ruda__cu.cuGraphLaunch(ge, st));
  CU(ruda__cu.cuStreamSynchronize(st));
  t0 = mono_ns();
  for (int r = 0; r < replays; r++) {
    uint64_t a = tick0();
    CU(ruda__cu.cuGraphLaunch(ge, st));
    t[r] = tick1() - a;
  }
  CU(ruda__cu.cuStreamSynchronize(st));
  double raw_us = (mono_ns() - t0) / 1e3 / ((double)replays * K);
  lat rawcall = summarize(t, (size_t)replays);
  t0 = mono_ns();
  for (int r = 0; r < replays * K; r++) CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, st, NULL, NULL));
  CU(ruda__cu.cuStreamSynchronize(st));
  double single_us = (mono_ns() - t0) / 1e3 / ((double)replays * K);
  CU(ruda__cu.cuGraphExecDestroy(ge));
  CU(ruda__cu.cuGraphDestroy(cg));
  CU(ruda__cu.cuStreamDestroy(st));
  free(t);

  printf("\n6. graph replay: %d empty kernels per graph, %d replays (us per kernel; call p50/p99 in ns)\n", K,
         replays);
  printf("   %-44s %8.3f us/kernel   call p50 %7.1f  p99 %7.1f\n", "ruda_graph_replay", ruda_us, call.p50,
         call.p99);
  printf("   %-44s %8.3f us/kernel   call p50 %7.1f  p99 %7.1f\n", "cuGraphLaunch (raw capture + instantiate)",
         raw_us, rawcall.p50, rawcall.p99);
  printf("   %-44s %8.3f us/kernel\n", "cuLaunchKernel, one by one", single_us);
  printf("   ruda / raw graph: %.3f\n", ruda_us / raw_us);
  row("graph", "ruda", 1, "us_per_kernel", ruda_us, "us");
  row("graph", "raw_graph", 1, "us_per_kernel", raw_us, "us");
  row("graph", "raw_launch", 1, "us_per_kernel", single_us, "us");
  row("graph", "ruda", 1, "call_p50", call.p50, "ns");
  row("graph", "raw_graph", 1, "call_p50", rawcall.p50, "ns");
}

/* ---- 4. kernel load ---- */

static void load_all(ruda_device *dev, int k, double *ms) {
  char src[256], name[32];
  for (int i = 0; i < k; i++) {
    snprintf(name, sizeof name, "k%d", i);
    snprintf(src, sizeof src,
             "extern \"C\" __global__ void k%d(float *x, unsigned n) {\n"
             "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) x[i] = x[i] * %d.0f + 1.0f;\n"
             "}\n",
             i, i + 2);
    uint64_t t0 = mono_ns();
    CHECK(ruda_kernel_source(dev, name, src, NULL));
    ms[i] = (mono_ns() - t0) / 1e6;
  }
}

static void kernel_load(int k) {
  char dir[] = "/tmp/ruda-bench-cache-XXXXXX";
  if (mkdtemp(dir) == NULL) die("mkdtemp", RUDA_EIO);
  double cold[64], warm[64], mem[64];
  ruda_device *a = open_dev(1, dir);
  load_all(a, k, cold);
  ruda_device_close(a, NULL);
  ruda_device *b = open_dev(1, dir);
  load_all(b, k, warm);
  load_all(b, k, mem);
  ruda_device_close(b, NULL);
  qsort(cold, (size_t)k, sizeof *cold, cmp_d);
  qsort(warm, (size_t)k, sizeof *warm, cmp_d);
  qsort(mem, (size_t)k, sizeof *mem, cmp_d);
  printf("\n4. kernel load, %d distinct small kernels (ms per kernel)\n", k);
  printf("   %-30s median %8.3f  max %8.3f\n", "NVRTC compile + load", cold[k / 2], cold[k - 1]);
  printf("   %-30s median %8.3f  max %8.3f\n", "disk cache (new device)", warm[k / 2], warm[k - 1]);
  printf("   %-30s median %8.3f  max %8.3f\n", "in-memory cache", mem[k / 2], mem[k - 1]);
  row("kernel_load", "nvrtc", 1, "median", cold[k / 2], "ms");
  row("kernel_load", "disk_cache", 1, "median", warm[k / 2], "ms");
  row("kernel_load", "disk_cache", 1, "max", warm[k - 1], "ms");
  row("kernel_load", "memory_cache", 1, "median", mem[k / 2], "ms");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "bench_gpu: could not remove %s\n", dir);
}

int main(int argc, char **argv) {
  int quick = 0, opt, nw = 0, rounds = 0;
  uint32_t workers[8];
  int run[7] = {0, 1, 1, 1, 1, 1, 1}; /* sections 1-6 */
  size_t window = 256;
  while ((opt = getopt(argc, argv, "hqs:R:W:w:")) != -1) {
    if (opt == 'q') {
      quick = 1;
    } else if (opt == 'R' && atoi(optarg) >= 1 && atoi(optarg) <= 16) {
      rounds = atoi(optarg);
    } else if (opt == 's') {
      memset(run, 0, sizeof run);
      for (char *t = strtok(optarg, ","); t; t = strtok(NULL, ","))
        if (atoi(t) >= 1 && atoi(t) <= 6) run[atoi(t)] = 1;
    } else if (opt == 'W' && atol(optarg) > 0) {
      window = (size_t)atol(optarg);
    } else if (opt == 'w') {
      for (char *t = strtok(optarg, ","); t && nw < 8; t = strtok(NULL, ",")) workers[nw++] = (uint32_t)atoi(t);
    } else {
      fprintf(opt == 'h' ? stdout : stderr,
              "usage: bench_gpu [-q] [-s sections] [-R rounds] [-W window] [-w workers[,workers...]] [out.csv]\n"
              "  -q  quick: fewer launches and runs\n"
              "  -s  sections to run, comma-separated: 1 latency, 2 throughput, 3 uploads,\n"
              "      4 kernel load, 5 sections 1-2 with one buffer argument, 6 graph replay\n"
              "      (default all)\n"
              "  -R  throughput rounds, raw and ruda back to back in each (1..16; default 3, quick 1)\n"
              "  -W  steady-state latency: launches between untimed waits (default 256)\n"
              "  -w  worker counts for the throughput section (default 4,8)\n"
              "  -h  this help\n"
              "  out.csv  also write every figure as CSV (section,variant,threads,metric,value,unit)\n");
      return opt == 'h' ? 0 : 2;
    }
  }
  if (nw == 0) workers[nw++] = 4, workers[nw++] = 8;
  if (rounds == 0) rounds = quick ? 1 : 3;
  if (optind < argc && (csv = fopen(argv[optind], "w")) == NULL) {
    perror(argv[optind]);
    return 1;
  }
  if (csv) fprintf(csv, "section,variant,threads,metric,value,unit\n");
  calibrate();
  ruda_device *dev = open_dev(workers[0], "");
  ruda_device_props p;
  CHECK(ruda_device_get_props(dev, &p));
  printf("device: %s (sm_%d%d, %u SMs, %.1f GiB), driver %d%s\n", p.name, p.cc_major, p.cc_minor, p.sm_count,
         p.total_mem / 1073741824.0, ruda__cu.driver_version, quick ? ", quick run" : "");
  CHECK(ruda_kernel_source(dev, "empty", SRC_EMPTY, NULL));
  CHECK(ruda_kernel_source(dev, "touch", SRC_TOUCH, NULL));
  if (run[1]) latency(dev, quick ? 20000 : 200000, window);
  if (run[2]) throughput(dev, quick ? 64000 : 640000, workers, nw, rounds);
  if (run[3]) uploads(dev, quick ? 3 : 5);
  if (run[5]) {
    with_buf = 1;
    latency(dev, quick ? 20000 : 200000, window);
    throughput(dev, quick ? 64000 : 640000, workers, nw, rounds);
    with_buf = 0;
  }
  if (run[6]) graphs(dev, quick ? 100 : 1000);
  ruda_device_close(dev, NULL);
  if (run[4]) kernel_load(quick ? 5 : 20);
  if (csv) fclose(csv);
  return 0;
}

/* ruda_bench.c - ruda-bench, the installed stream-concurrency benchmark:
 * measures what a person choosing a GPU runtime asks, beside the raw
 * driver in the same run (cuda backend), with a table on stdout, progress
 * on stderr, and --json / --csv for tools/plot.py.
 *
 *   ruda-bench [--json FILE] [--csv FILE] [--plot DIR] [-q] SUBCOMMAND [options]
 *     launch   launches/s by client threads, each on its own stream
 *     overlap  kernels of a chosen duration on 1..S streams at once:
 *              achieved concurrency (S x one stream's wall / the wall
 *              of S streams) vs ideal
 *     upload   host-to-device bandwidth by size (ruda_write vs cuMemcpyHtoD)
 *     latency  what one launch costs its caller (p50, p99), one thread
 *     alloc    buffer create+free pairs per second by size
 *     graph    a graph of N empty kernels replayed: us per kernel, beside
 *              the same kernels launched one by one
 *     serve    request round trips by threads: upload 64 KiB, one kernel,
 *              download 512 B, wait (bench_serve is the full study);
 *              --graph: the request recorded once and replayed with
 *              ruda_graph_run, beside a raw CUDA graph (bench_serve -g)
 *     profile  one short kernel timed with profile tokens against raw
 *              timing events around the same kernel
 *     all      every one of them
 *
 * On the host backend (no GPU) kernels are host functions (the spin kernel
 * busy-waits its duration), there is no raw column, and the run says so.
 * bench_serve is the full serving study (docs/benchmarks.md). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ruda/ruda.h"

#ifdef RUDA_BENCH_CUDA
#include "backends/cuda/cuda_internal.h"
#include "src/api.h"
#endif
#define BENCH_NAME "ruda-bench"
#include "bench/bench_args.h"
#include "bench/bench_check.h"

#define MAXT 64

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- results: the table, and rows for --json / --csv ---- */

typedef struct row {
  char bench[16], variant[16], unit[16];
  double x, value;
} row;

static row rows[1024];
static int nrows, quick;
static ruda_device *dev;
static int on_cuda;

static void add(const char *bench, const char *variant, double x, double value, const char *unit) {
  if (nrows == (int)(sizeof rows / sizeof *rows)) return;
  row *r = &rows[nrows++];
  snprintf(r->bench, sizeof r->bench, "%s", bench);
  snprintf(r->variant, sizeof r->variant, "%s", variant);
  snprintf(r->unit, sizeof r->unit, "%s", unit);
  r->x = x;
  r->value = value;
}

/* Where it goes: rewritten in place on a terminal, a line each in a log. */
static void progress(const char *what, double x) {
  if (isatty(STDERR_FILENO)) fprintf(stderr, "\rruda-bench: %s %g ...          ", what, x);
  else fprintf(stderr, "ruda-bench: %s %g ...\n", what, x);
  fflush(stderr);
}

/* Clears the progress line before a result row (terminals only). */
static void progress_done(void) {
  if (isatty(STDERR_FILENO)) fprintf(stderr, "\r");
}

/* ---- kernels ---- */

static const char SRC[] =
    "extern \"C\" __global__ void rb_empty() {}\n"
    "extern \"C\" __global__ void rb_twice(const float *x, float *y) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < 128) y[i] = 2.0f * x[i];\n"
    "}\n"
    "extern \"C\" __global__ void rb_spin(unsigned long long ns) {\n"
    "  unsigned long long t0, t;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t0));\n"
    "  do { asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); } while (t - t0 < ns);\n"
    "}\n";

static int host_empty(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  (void)a;
  return 0;
}

static int host_spin(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  const uint64_t ns = *(const uint64_t *)a[0], t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
  return 0;
}

static int host_twice(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  const float *x = a[0];
  float *y = a[1];
  for (int i = 0; i < 128; i++) y[i] = 2.0f * x[i];
  return 0;
}

static void launch_on(ruda_stream_id s, const char *k, const uint64_t *spin_ns) {
  ruda_arg a = ruda_arg_scalar(spin_ns, sizeof *spin_ns);
  ruda_launch_desc l = {.kernel = k, .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = spin_ns ? 1 : 0};
  CHECK(ruda_launch(dev, s, &l));
}

#ifdef RUDA_BENCH_CUDA
static CUfunction raw_fn(const char *name) { return ((ruda__cu_kernel *)ruda__kernel_find(dev, name)->impl)->fn; }

static CUcontext raw_ctx(void) {
  void *c = NULL;
  CHECK(ruda_cuda_context(dev, &c));
  return (CUcontext)c;
}
#endif

/* ---- launch: launches/s by threads ---- */

typedef struct job {
  int index, raw;
  size_t n;
  uint64_t spin_ns; /* overlap: each kernel's duration; 0: empty kernels */
  pthread_barrier_t *go;
} job;

static void *run_job(void *p) {
  job *j = p;
  ruda_stream_id s = (ruda_stream_id)j->index;
  const uint64_t *spin = j->spin_ns ? &j->spin_ns : NULL;
  const char *k = spin ? "rb_spin" : "rb_empty";
#ifdef RUDA_BENCH_CUDA
  CUstream st = NULL;
  CUfunction fn = NULL;
  void *params[1] = {&j->spin_ns};
  if (j->raw) {
    CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
    CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    fn = raw_fn(k);
  }
#endif
  if (!j->raw) CHECK(ruda_sync(dev, s, NULL)); /* the stream exists before the clock */
  pthread_barrier_wait(j->go);
  for (size_t i = 0; i < j->n; i++) {
#ifdef RUDA_BENCH_CUDA
    if (j->raw) {
      CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, spin ? params : NULL, NULL));
      continue;
    }
#endif
    launch_on(s, k, spin);
  }
#ifdef RUDA_BENCH_CUDA
  if (j->raw) {
    CU(ruda__cu.cuStreamSynchronize(st));
    CU(ruda__cu.cuStreamDestroy(st));
    return NULL;
  }
#endif
  CHECK(ruda_sync(dev, s, NULL));
  return NULL;
}

/* Seconds for `threads` threads to each issue n kernels and see them done. */
static double timed(int threads, int raw, size_t n, uint64_t spin_ns) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
  job j[MAXT];
  pthread_t t[MAXT];
  for (int i = 0; i < threads; i++) {
    j[i] = (job){i, raw, n, spin_ns, &go};
    if (pthread_create(&t[i], NULL, run_job, &j[i]) != 0) die("pthread_create", RUDA_EINVAL);
  }
  pthread_barrier_wait(&go);
  uint64_t t0 = now_ns();
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double s = (double)(now_ns() - t0) / 1e9;
  pthread_barrier_destroy(&go);
  return s;
}

static void bench_launch(const int *ts, int nt, size_t n) {
  printf("\nlaunch: empty kernels, each thread on its own stream, until all are done (launches/s)\n");
  printf("  %7s %14s %14s %8s\n", "threads", "ruda", on_cuda ? "raw driver" : "-", on_cuda ? "ratio" : "");
  for (int i = 0; i < nt; i++) {
    progress("launch, threads", ts[i]);
    double r = (double)n * ts[i] / timed(ts[i], 0, n, 0);
    add("launch", "ruda", ts[i], r, "launches/s");
    double b = 0;
    if (on_cuda) {
      b = (double)n * ts[i] / timed(ts[i], 1, n, 0);
      add("launch", "raw", ts[i], b, "launches/s");
    }
    progress_done();
    if (on_cuda) printf("  %7d %14.0f %14.0f %8.3f\n", ts[i], r, b, r / b);
    else printf("  %7d %14.0f\n", ts[i], r);
  }
}

/* ---- overlap: achieved concurrency of kernels on S streams ---- */

/* The kernels' time is measured, not taken from their nominal duration,
 * which a spin kernel need not keep exactly: concurrency is the work of S
 * streams run one after another (S times one stream's wall, measured
 * first) over the wall of S at once, so one stream is 1 by construction. */
static void bench_overlap(const int *ss, int ns, size_t k, double us) {
  const uint64_t spin = (uint64_t)(us * 1000.0);
  printf("\noverlap: %zu kernels of %.0f us per stream, streams at once; concurrency = S x one stream's wall"
         " / wall of S streams (ideal: the stream count)\n",
         k, us);
  printf("  %7s %14s %14s\n", "streams", "ruda", on_cuda ? "raw driver" : "-");
  progress("overlap, one stream alone", 1);
  const double one = timed(1, 0, k, spin), one_raw = on_cuda ? timed(1, 1, k, spin) : 0;
  for (int i = 0; i < ns; i++) {
    progress("overlap, streams", ss[i]);
    double r = (double)ss[i] * one / timed(ss[i], 0, k, spin);
    add("overlap", "ruda", ss[i], r, "concurrency");
    add("overlap", "ideal", ss[i], ss[i], "concurrency");
    double b = 0;
    if (on_cuda) {
      b = (double)ss[i] * one_raw / timed(ss[i], 1, k, spin);
      add("overlap", "raw", ss[i], b, "concurrency");
    }
    progress_done();
    if (on_cuda) printf("  %7d %14.2f %14.2f\n", ss[i], r, b);
    else printf("  %7d %14.2f\n", ss[i], r);
  }
}

/* ---- upload: host-to-device bandwidth ---- */

static void bench_upload(const int *mib, int nm) {
  printf("\nupload: one pageable host buffer to a device buffer, best of 3 (GB/s)\n");
  printf("  %7s %14s %14s\n", "MiB", "ruda_write", on_cuda ? "cuMemcpyHtoD" : "-");
  for (int i = 0; i < nm; i++) {
    progress("upload, MiB", mib[i]);
    size_t bytes = (size_t)mib[i] << 20;
    unsigned char *src = malloc(bytes);
    if (src == NULL) die("malloc", RUDA_ENOMEM);
    memset(src, 1, bytes);
    ruda_handle h;
    CHECK(ruda_buffer_create(dev, 0, bytes, &h));
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
    double best = 0, raw = 0;
    for (int r = 0; r < 3; r++) {
      CHECK(ruda_sync(dev, 0, NULL));
      uint64_t t0 = now_ns();
      CHECK(ruda_write(dev, 0, &d, src, bytes));
      CHECK(ruda_sync(dev, 0, NULL));
      double gbs = (double)bytes / (double)(now_ns() - t0);
      if (gbs > best) best = gbs;
    }
    add("upload", "ruda", mib[i], best, "GB/s");
#ifdef RUDA_BENCH_CUDA
    if (on_cuda) {
      CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
      CUdeviceptr p;
      CU(ruda__cu.cuMemAlloc(&p, bytes));
      for (int r = 0; r < 3; r++) {
        uint64_t t0 = now_ns();
        CU(ruda__cu.cuMemcpyHtoD(p, src, bytes));
        double gbs = (double)bytes / (double)(now_ns() - t0);
        if (gbs > raw) raw = gbs;
      }
      CU(ruda__cu.cuMemFree(p));
      add("upload", "raw", mib[i], raw, "GB/s");
    }
#endif
    CHECK(ruda_buffer_free(dev, 0, h));
    free(src);
    progress_done();
    if (on_cuda) printf("  %7d %14.2f %14.2f\n", mib[i], best, raw);
    else printf("  %7d %14.2f\n", mib[i], best);
  }
}

/* ---- latency: the caller's cost of one launch ---- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void bench_latency(size_t n) {
  uint64_t *t = malloc(n * sizeof *t);
  if (t == NULL) die("malloc", RUDA_ENOMEM);
  printf("\nlatency: one thread, %zu empty launches, waiting every 256 (ns in the call)\n", n);
  printf("  %10s %10s %10s\n", "", "p50", "p99");
  for (int raw = 0; raw <= on_cuda; raw++) {
    progress(raw ? "latency, raw" : "latency, ruda", (double)n);
#ifdef RUDA_BENCH_CUDA
    CUstream st = NULL;
    CUfunction fn = NULL;
    if (raw) {
      CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
      CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
      fn = raw_fn("rb_empty");
    }
#endif
    for (size_t i = 0; i < n; i++) {
      uint64_t t0 = now_ns();
#ifdef RUDA_BENCH_CUDA
      if (raw) CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
      else
#endif
        launch_on(0, "rb_empty", NULL);
      t[i] = now_ns() - t0;
      if (i % 256 == 255) {
#ifdef RUDA_BENCH_CUDA
        if (raw) CU(ruda__cu.cuStreamSynchronize(st));
        else
#endif
          CHECK(ruda_sync(dev, 0, NULL));
      }
    }
#ifdef RUDA_BENCH_CUDA
    if (raw) {
      CU(ruda__cu.cuStreamSynchronize(st));
      CU(ruda__cu.cuStreamDestroy(st));
    }
#endif
    if (!raw) CHECK(ruda_sync(dev, 0, NULL));
    qsort(t, n, sizeof *t, cmp_u64);
    const double p50 = (double)t[n / 2], p99 = (double)t[(size_t)(0.99 * (double)(n - 1))];
    add("latency", raw ? "raw" : "ruda", 50, p50, "ns");
    add("latency", raw ? "raw" : "ruda", 99, p99, "ns");
    progress_done();
    printf("  %10s %10.0f %10.0f\n", raw ? "raw driver" : "ruda", p50, p99);
  }
  free(t);
}

/* ---- alloc: buffer create + free ---- */

static void bench_alloc(const int *kib, int nk, size_t n) {
  printf("\nalloc: buffer create + free pairs per second on one stream (ruda: its pools; raw: cuMemAllocAsync/"
         "cuMemFreeAsync, the driver's pool)\n");
  printf("  %7s %14s %14s\n", "KiB", "ruda", on_cuda ? "raw driver" : "-");
  ruda_handle *h = malloc(64 * sizeof *h);
  if (h == NULL) die("malloc", RUDA_ENOMEM);
  for (int i = 0; i < nk; i++) {
    progress("alloc, KiB", kib[i]);
    const uint64_t bytes = (uint64_t)kib[i] << 10;
    uint64_t t0 = now_ns();
    for (size_t r = 0; r < n; r += 64) {
      for (int j = 0; j < 64; j++) CHECK(ruda_buffer_create(dev, 0, bytes, &h[j]));
      for (int j = 0; j < 64; j++) CHECK(ruda_buffer_free(dev, 0, h[j]));
    }
    const size_t done = (n + 63) / 64 * 64;
    double r = (double)done / ((double)(now_ns() - t0) / 1e9);
    add("alloc", "ruda", kib[i], r, "pairs/s");
    double b = 0;
#ifdef RUDA_BENCH_CUDA
    if (on_cuda && ruda__cu.cuMemAllocAsync != NULL && ruda__cu.cuMemFreeAsync != NULL) {
      /* The driver's own pool, stream-ordered: cuMemAllocAsync and
       * cuMemFreeAsync on one stream, synchronized at the end. */
      CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
      CUstream st;
      CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
      CUdeviceptr p[64];
      t0 = now_ns();
      for (size_t q = 0; q < n; q += 64) {
        for (int j = 0; j < 64; j++) CU(ruda__cu.cuMemAllocAsync(&p[j], bytes, st));
        for (int j = 0; j < 64; j++) CU(ruda__cu.cuMemFreeAsync(p[j], st));
      }
      CU(ruda__cu.cuStreamSynchronize(st));
      b = (double)done / ((double)(now_ns() - t0) / 1e9);
      CU(ruda__cu.cuStreamDestroy(st));
      add("alloc", "raw", kib[i], b, "pairs/s");
    }
#endif
    progress_done();
    if (on_cuda) printf("  %7d %14.0f %14.0f\n", kib[i], r, b);
    else printf("  %7d %14.0f\n", kib[i], r);
  }
  CHECK(ruda_sync(dev, 0, NULL));
  free(h);
}

/* ---- graph: replay against one-by-one launches ---- */

static void bench_graph(const int *ks, int nk, int replays) {
  printf("\ngraph: N empty kernels recorded once and replayed %d times, against the same kernels launched one by one"
         " (us per kernel, until done)\n",
         replays);
  printf("  %7s %14s %14s\n", "kernels", "replayed", "one by one");
  for (int i = 0; i < nk; i++) {
    progress("graph, kernels", ks[i]);
    ruda_graph *g;
    CHECK(ruda_graph_begin_capture(dev, 0));
    for (int k = 0; k < ks[i]; k++) launch_on(0, "rb_empty", NULL);
    CHECK(ruda_graph_end_capture(dev, 0, &g));
    CHECK(ruda_graph_replay(dev, 0, g)); /* the first replay captures on the worker */
    CHECK(ruda_sync(dev, 0, NULL));
    uint64_t t0 = now_ns();
    for (int r = 0; r < replays; r++) CHECK(ruda_graph_replay(dev, 0, g));
    CHECK(ruda_sync(dev, 0, NULL));
    double per = (double)(now_ns() - t0) / 1e3 / ((double)replays * ks[i]);
    CHECK(ruda_graph_destroy(dev, g));
    t0 = now_ns();
    for (int r = 0; r < replays; r++)
      for (int k = 0; k < ks[i]; k++) launch_on(0, "rb_empty", NULL);
    CHECK(ruda_sync(dev, 0, NULL));
    double one = (double)(now_ns() - t0) / 1e3 / ((double)replays * ks[i]);
    add("graph", "replayed", ks[i], per, "us/kernel");
    add("graph", "one by one", ks[i], one, "us/kernel");
    progress_done();
    printf("  %7d %14.3f %14.3f\n", ks[i], per, one);
  }
}

/* ---- serve: request round trips ---- */

enum { REQ_IN = 16384, REQ_OUT = 128 }; /* floats: 64 KiB in, 512 B out */

typedef struct serve_job {
  int index, raw, graph;
  size_t n;
  uint64_t *lat;
  pthread_barrier_t *go;
  _Atomic int *wrong;
} serve_job;

static void *run_serve(void *p) {
  serve_job *j = p;
  ruda_stream_id s = (ruda_stream_id)j->index;
  float *in = malloc(REQ_IN * sizeof *in), out[REQ_OUT];
  if (in == NULL) die("malloc", RUDA_ENOMEM);
  for (int i = 0; i < REQ_IN; i++) in[i] = (float)(i % 97) + (float)j->index;
#ifdef RUDA_BENCH_CUDA
  CUstream st = NULL;
  CUdeviceptr dx = 0, dy = 0;
  float *hin = NULL, *hout = NULL;
  CUfunction fn = NULL;
  void *params[2] = {&dx, &dy};
  if (j->raw) { /* page-locked buffers, as a tuned raw loop has */
    CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
    CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CU(ruda__cu.cuMemAlloc(&dx, REQ_IN * sizeof(float)));
    CU(ruda__cu.cuMemAlloc(&dy, REQ_OUT * sizeof(float)));
    CU(ruda__cu.cuMemHostAlloc((void **)&hin, REQ_IN * sizeof(float), 0));
    CU(ruda__cu.cuMemHostAlloc((void **)&hout, REQ_OUT * sizeof(float), 0));
    memcpy(hin, in, REQ_IN * sizeof(float));
    fn = raw_fn("rb_twice");
  }
  CUgraphExec ge = NULL;
  if (j->raw && j->graph) { /* the request recorded once as a CUDA graph */
    CUgraph graph = NULL;
    CU(ruda__cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CU(ruda__cu.cuMemcpyHtoDAsync(dx, hin, REQ_IN * sizeof(float), st));
    CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, st, params, NULL));
    CU(ruda__cu.cuMemcpyDtoHAsync(hout, dy, REQ_OUT * sizeof(float), st));
    CU(ruda__cu.cuStreamEndCapture(st, &graph));
    CU(ruda__cu.cuGraphInstantiateWithFlags(&ge, graph, 0));
    CU(ruda__cu.cuGraphDestroy(graph));
  }
#endif
  ruda_handle x = {0, 0}, y = {0, 0};
  if (!j->raw) {
    CHECK(ruda_buffer_create(dev, s, REQ_IN * sizeof(float), &x));
    CHECK(ruda_buffer_create(dev, s, REQ_OUT * sizeof(float), &y));
    CHECK(ruda_sync(dev, s, NULL));
  }
  ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x)), yd = ruda_copy_contiguous(ruda_bind(y));
  ruda_arg a[2] = {ruda_arg_in(ruda_bind(x)), ruda_arg_out(ruda_bind(y))};
  ruda_launch_desc l = {.kernel = "rb_twice", .grid = {1, 1, 1}, .block = {on_cuda ? 128 : 1, 1, 1}, .args = a,
                        .nargs = 2};
  /* --graph: the request (upload from a staging block, the kernel, the
   * download into another) recorded once, then one ruda_graph_run each:
   * what bench_serve -g measures. */
  ruda_graph *g = NULL;
  void *sin = NULL, *sout = NULL;
  if (!j->raw && j->graph) {
    CHECK(ruda_staging_alloc(dev, REQ_IN * sizeof(float), &sin));
    CHECK(ruda_staging_alloc(dev, REQ_OUT * sizeof(float), &sout));
    memcpy(sin, in, REQ_IN * sizeof(float));
    ruda_future *none = NULL;
    CHECK(ruda_graph_begin_capture(dev, s));
    CHECK(ruda_write_staged(dev, s, &xd, sin, REQ_IN * sizeof(float)));
    CHECK(ruda_launch(dev, s, &l));
    CHECK(ruda_read(dev, s, &yd, sout, REQ_OUT * sizeof(float), &none)); /* recorded: none stays NULL */
    CHECK(ruda_graph_end_capture(dev, s, &g));
  }
  pthread_barrier_wait(j->go);
  for (size_t r = 0; r < j->n; r++) {
    uint64_t t0 = now_ns();
    const float *got = out;
#ifdef RUDA_BENCH_CUDA
    if (j->raw && j->graph) {
      CU(ruda__cu.cuGraphLaunch(ge, st));
      CU(ruda__cu.cuStreamSynchronize(st));
      got = hout;
    } else if (j->raw) {
      CU(ruda__cu.cuMemcpyHtoDAsync(dx, hin, REQ_IN * sizeof(float), st));
      CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, st, params, NULL));
      CU(ruda__cu.cuMemcpyDtoHAsync(hout, dy, REQ_OUT * sizeof(float), st));
      CU(ruda__cu.cuStreamSynchronize(st));
      got = hout;
    } else
#endif
    if (g != NULL) {
      CHECK(ruda_graph_run(dev, s, g, NULL));
      got = sout;
    } else {
      ruda_future *f = NULL;
      CHECK(ruda_write(dev, s, &xd, in, REQ_IN * sizeof(float)));
      CHECK(ruda_launch(dev, s, &l));
      CHECK(ruda_read(dev, s, &yd, out, sizeof out, &f));
      CHECK(ruda_future_wait(f, NULL));
      ruda_future_free(f);
    }
    j->lat[r] = now_ns() - t0;
    if (got[REQ_OUT - 1] != 2.0f * in[REQ_OUT - 1]) atomic_store(j->wrong, 1);
  }
#ifdef RUDA_BENCH_CUDA
  if (ge != NULL) CU(ruda__cu.cuGraphExecDestroy(ge));
  if (j->raw) {
    CU(ruda__cu.cuMemFreeHost(hin));
    CU(ruda__cu.cuMemFreeHost(hout));
    CU(ruda__cu.cuMemFree(dx));
    CU(ruda__cu.cuMemFree(dy));
    CU(ruda__cu.cuStreamDestroy(st));
  }
#endif
  if (g != NULL) {
    CHECK(ruda_graph_destroy(dev, g));
    CHECK(ruda_staging_free(dev, sin));
    CHECK(ruda_staging_free(dev, sout));
  }
  if (!j->raw) {
    CHECK(ruda_buffer_free(dev, s, x));
    CHECK(ruda_buffer_free(dev, s, y));
  }
  free(in);
  return NULL;
}

/* Requests/s and p50 latency (us) of `threads` threads doing n round trips. */
static void serve_run(int threads, int raw, int graph, size_t n, double *rps, double *p50) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
  serve_job j[MAXT];
  pthread_t t[MAXT];
  uint64_t *lat = malloc((size_t)threads * n * sizeof *lat);
  _Atomic int wrong = 0;
  if (lat == NULL) die("malloc", RUDA_ENOMEM);
  for (int i = 0; i < threads; i++) {
    j[i] = (serve_job){i, raw, graph, n, lat + (size_t)i * n, &go, &wrong};
    if (pthread_create(&t[i], NULL, run_serve, &j[i]) != 0) die("pthread_create", RUDA_EINVAL);
  }
  pthread_barrier_wait(&go);
  uint64_t t0 = now_ns();
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  *rps = (double)threads * (double)n / ((double)(now_ns() - t0) / 1e9);
  qsort(lat, (size_t)threads * n, sizeof *lat, cmp_u64);
  *p50 = (double)lat[(size_t)threads * n / 2] / 1e3;
  free(lat);
  pthread_barrier_destroy(&go);
  if (atomic_load(&wrong)) {
    fprintf(stderr, "ruda-bench: serve: a %s%s result was wrong\n", raw ? "raw" : "ruda", graph ? " graph" : "");
    exit(1);
  }
}

static void bench_serve(const int *ts, int nt, size_t n, int graph) {
  printf("\nserve%s: each thread on its own stream: upload 64 KiB, one kernel, download 512 B, wait%s; results "
         "checked (requests/s, p50 us)\n",
         graph ? " --graph" : "", graph ? ", recorded once as a graph and replayed by ruda_graph_run" : "");
  printf("  %7s %14s %8s %14s %8s %8s\n", "threads", graph ? "ruda graph" : "ruda", "p50",
         on_cuda ? (graph ? "raw graph" : "raw driver") : "-", on_cuda ? "p50" : "", on_cuda ? "ratio" : "");
  for (int i = 0; i < nt; i++) {
    progress(graph ? "serve --graph, threads" : "serve, threads", ts[i]);
    double r, rp, b = 0, bp = 0;
    serve_run(ts[i], 0, graph, n, &r, &rp);
    add("serve", graph ? "ruda graph" : "ruda", ts[i], r, "requests/s");
    if (on_cuda) {
      serve_run(ts[i], 1, graph, n, &b, &bp);
      add("serve", graph ? "raw graph" : "raw", ts[i], b, "requests/s");
    }
    progress_done();
    if (on_cuda) printf("  %7d %14.0f %8.1f %14.0f %8.1f %8.3f\n", ts[i], r, rp, b, bp, r / b);
    else printf("  %7d %14.0f %8.1f\n", ts[i], r, rp);
  }
}

/* ---- profile: profile tokens against raw timing events ---- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void bench_profile(const int *kus, int nk, int n) {
  printf("\nprofile: one single-block kernel timed %d times, median us: ruda_profile_begin/end against "
         "cuEventRecord around cuLaunchKernel\n",
         n);
  printf("  %9s %12s %12s %10s\n", "kernel us", "ruda token", on_cuda ? "raw events" : "-", on_cuda ? "ruda - raw" : "");
  double *t = malloc((size_t)n * sizeof *t);
  if (t == NULL) die("malloc", RUDA_ENOMEM);
  for (int i = 0; i < nk; i++) {
    progress("profile, kernel us", kus[i]);
    uint64_t ns = (uint64_t)kus[i] * 1000;
    for (int r = 0; r < n; r++) {
      ruda_profile_token tok;
      uint64_t got = 0;
      CHECK(ruda_profile_begin(dev, 0, &tok));
      launch_on(0, "rb_spin", &ns);
      CHECK(ruda_profile_end(dev, 0, tok, &got, NULL));
      t[r] = (double)got / 1e3;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    const double ruda = t[n / 2];
    add("profile", "ruda", kus[i], ruda, "us");
    double raw = 0;
#ifdef RUDA_BENCH_CUDA
    if (on_cuda) {
      CU(ruda__cu.cuCtxSetCurrent(raw_ctx()));
      CUstream st;
      CUevent e0, e1;
      CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
      CU(ruda__cu.cuEventCreate(&e0, CU_EVENT_DEFAULT));
      CU(ruda__cu.cuEventCreate(&e1, CU_EVENT_DEFAULT));
      CUfunction fn = raw_fn("rb_spin");
      void *params[1] = {&ns};
      for (int r = 0; r < n; r++) {
        float ms = 0;
        CU(ruda__cu.cuEventRecord(e0, st));
        CU(ruda__cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        CU(ruda__cu.cuEventRecord(e1, st));
        CU(ruda__cu.cuEventSynchronize(e1));
        CU(ruda__cu.cuEventElapsedTime(&ms, e0, e1));
        t[r] = (double)ms * 1e3;
      }
      qsort(t, (size_t)n, sizeof *t, cmp_d);
      raw = t[n / 2];
      add("profile", "raw", kus[i], raw, "us");
      CU(ruda__cu.cuEventDestroy(e0));
      CU(ruda__cu.cuEventDestroy(e1));
      CU(ruda__cu.cuStreamDestroy(st));
    }
#endif
    progress_done();
    if (on_cuda) printf("  %9d %12.2f %12.2f %10.2f\n", kus[i], ruda, raw, ruda - raw);
    else printf("  %9d %12.2f\n", kus[i], ruda);
  }
  free(t);
}

/* ---- output files ---- */

static void write_files(const char *json, const char *csv, const char *machine, const char *date, int argc,
                        char **argv) {
  if (csv != NULL) {
    FILE *f = fopen(csv, "w");
    if (f == NULL) die("opening the --csv file", RUDA_EINVAL);
    fprintf(f, "bench,variant,x,value,unit\n");
    for (int i = 0; i < nrows; i++)
      fprintf(f, "%s,%s,%g,%.6g,%s\n", rows[i].bench, rows[i].variant, rows[i].x, rows[i].value, rows[i].unit);
    fclose(f);
  }
  if (json != NULL) {
    FILE *f = fopen(json, "w");
    if (f == NULL) die("opening the --json file", RUDA_EINVAL);
    fprintf(f, "{\"tool\":\"ruda-bench\",\"version\":\"%s\",\"machine\":\"%s\",\"backend\":\"%s\",\"date\":\"%s\",",
            ruda_version(), machine, ruda_device_backend(dev), date);
    fprintf(f, "\"command\":\"");
    for (int i = 0; i < argc; i++) fprintf(f, "%s%s", i ? " " : "", argv[i]); /* arguments hold no quotes */
    fprintf(f, "\",\"rows\":[\n");
    for (int i = 0; i < nrows; i++)
      fprintf(f, "{\"bench\":\"%s\",\"variant\":\"%s\",\"x\":%g,\"value\":%.6g,\"unit\":\"%s\"}%s\n", rows[i].bench,
              rows[i].variant, rows[i].x, rows[i].value, rows[i].unit, i + 1 < nrows ? "," : "");
    fprintf(f, "]}\n");
    fclose(f);
  }
}

/* --plot: runs ruda-bench-plot (tools/plot.py, installed beside this
 * program; in the build tree the source's copy) on the JSON. */
static int draw(const char *json, const char *dir) {
  char self[4096], script[4200];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n > 0 ? n : 0] = '\0';
  char *slash = strrchr(self, '/');
  if (slash != NULL) *slash = '\0';
  snprintf(script, sizeof script, "%s/ruda-bench-plot", self);
  if (access(script, X_OK) != 0) snprintf(script, sizeof script, "%s/tools/plot.py", RUDA_SOURCE_DIR);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(2, 1); /* its list of files goes with the progress, not the table */
    execlp("python3", "python3", script, json, dir, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "ruda-bench: drawing the plots failed (%s %s %s); the figures are in %s\n", script, json, dir,
            json);
    return 1;
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ruda-bench [--json FILE] [--csv FILE] [--plot DIR] [-q] SUBCOMMAND [options]\n"
          "  launch   launches/s by client threads, each on its own stream   [-t 1,2,4,8,16] [-n launches]\n"
          "  overlap  kernels of -u us on 1..S streams: achieved concurrency [-s 1,2,4,8,16] [-k kernels] [-u us]\n"
          "  upload   host-to-device GB/s by size                             [-m 1,16,256 (MiB)]\n"
          "  latency  the caller's ns per launch, p50 and p99, one thread       [-n launches]\n"
          "  alloc    buffer create+free pairs/s by size                      [-a 1,1024 (KiB)] [-n pairs]\n"
          "  graph    replay of N empty kernels vs one-by-one launches          [-g 10,100 (kernels)]\n"
          "  serve    request round trips/s by threads (64 KiB up, a kernel, 512 B down) [-t] [-n]\n"
          "           [--graph: the request recorded as a graph, beside a raw CUDA graph]\n"
          "  profile  a short kernel timed by profile tokens vs raw events   [-p 1,2,20 (kernel us)]\n"
          "  all      every one of them with their defaults\n"
          "The raw driver runs beside ruda on the cuda backend. --json/--csv write every figure;\n"
          "--plot DIR also draws them into DIR (ruda-bench-plot, i.e. tools/plot.py; needs matplotlib).\n"
          "-w N: ruda workers (default 64, one per stream the subcommands use; streams share\n"
          "workers when fewer). -q: a short run. The backend is ruda's default (RUDA_BACKEND).\n");
}

int main(int argc, char **argv) {
  const char *json = NULL, *csv = NULL, *plot = NULL, *sub = NULL;
  char json_in_plot[4096];
  int ts[16] = {1, 2, 4, 8, 16}, nt = 5, ss[16] = {1, 2, 4, 8, 16}, nss = 5, mib[16] = {1, 16, 256}, nm = 3;
  int kib[16] = {1, 1024}, na = 2, gk[16] = {10, 100}, ng = 2, pk[16] = {1, 2, 20}, np = 3;
  long n = 0, k = 0, workers = 0;
  int serve_graph = 0;
  double us = 200;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json") && v) json = argv[++i];
    else if (!strcmp(a, "--csv") && v) csv = argv[++i];
    else if (!strcmp(a, "--plot") && v) plot = argv[++i];
    else if (!strcmp(a, "-q")) quick = 1;
    else if (!strcmp(a, "--graph")) serve_graph = 1;
    else if (!strcmp(a, "-t") && v) nt = bench_int_list(argv[++i], 1, INT_MAX, ts, 16);
    else if (!strcmp(a, "-s") && v) nss = bench_int_list(argv[++i], 1, INT_MAX, ss, 16);
    else if (!strcmp(a, "-m") && v) nm = bench_int_list(argv[++i], 1, INT_MAX, mib, 16);
    else if (!strcmp(a, "-a") && v) na = bench_int_list(argv[++i], 1, INT_MAX, kib, 16);
    else if (!strcmp(a, "-g") && v) ng = bench_int_list(argv[++i], 1, INT_MAX, gk, 16);
    else if (!strcmp(a, "-p") && v) np = bench_int_list(argv[++i], 1, INT_MAX, pk, 16);
    else if (!strcmp(a, "-n") && v) n = atol(argv[++i]);
    else if (!strcmp(a, "-w") && v) workers = atol(argv[++i]);
    else if (!strcmp(a, "-k") && v) k = atol(argv[++i]);
    else if (!strcmp(a, "-u") && v) us = atof(argv[++i]);
    else if (sub == NULL && a[0] != '-') sub = a;
    else {
      fprintf(stderr, "ruda-bench: unknown or incomplete option \"%s\"\n", a);
      usage(stderr);
      return 2;
    }
  }
  int bad = nt < 1 || nss < 1 || nm < 1 || na < 1 || ng < 1 || np < 1 || us <= 0 || workers < 0 || workers > 4096;
  for (int i = 0; i < nt; i++) bad |= ts[i] > MAXT;
  for (int i = 0; i < nss; i++) bad |= ss[i] > MAXT;
  if (sub == NULL || bad ||
      (strcmp(sub, "launch") && strcmp(sub, "overlap") && strcmp(sub, "upload") && strcmp(sub, "latency") &&
       strcmp(sub, "alloc") && strcmp(sub, "graph") && strcmp(sub, "serve") && strcmp(sub, "profile") && strcmp(sub, "all"))) {
    if (bad) fprintf(stderr, "ruda-bench: lists take 1..%d, -u a positive duration\n", MAXT);
    usage(stderr);
    return 2;
  }

  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.num_streams = workers > 0 ? (uint32_t)workers : MAXT; /* default: a worker per stream used */
  cfg.queue_bound = 1u << 20;
  if (cfg.log_level > RUDA_LOG_WARN) cfg.log_level = RUDA_LOG_WARN;
  CHECK(ruda_device_open(&cfg, &dev));
  on_cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
#ifndef RUDA_BENCH_CUDA
  on_cuda = 0; /* built without CUDA: no raw column */
#endif
  if (on_cuda) {
    CHECK(ruda_kernel_source(dev, "rb_empty", SRC, NULL));
    CHECK(ruda_kernel_source(dev, "rb_spin", SRC, NULL));
    CHECK(ruda_kernel_source(dev, "rb_twice", SRC, NULL));
  } else {
    CHECK(ruda_host_kernel_register(dev, "rb_empty", host_empty));
    CHECK(ruda_host_kernel_register(dev, "rb_spin", host_spin));
    CHECK(ruda_host_kernel_register(dev, "rb_twice", host_twice));
  }
  ruda_device_props props;
  CHECK(ruda_device_get_props(dev, &props));
  char date[64];
  time_t t = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
  printf("ruda-bench %s: %s, backend %s, %u workers, %s%s\n", ruda_version(), props.name, ruda_device_backend(dev),
         ruda_device_num_streams(dev), date, quick ? ", quick run" : "");
  if (!on_cuda) {
    const char *why = ruda_device_fallback_reason(dev);
    printf("host backend: kernels are host functions and there is no raw driver to compare with%s%s%s\n",
           why ? " (" : "", why ? why : "", why ? ")" : "");
  }

  const int all = !strcmp(sub, "all");
  if (all || !strcmp(sub, "launch")) bench_launch(ts, nt, n > 0 ? (size_t)n : quick || !on_cuda ? 2000 : 50000);
  if (all || !strcmp(sub, "overlap"))
    bench_overlap(ss, nss, k > 0 ? (size_t)k : quick || !on_cuda ? 5 : 50, on_cuda ? us : (us < 2000 ? 2000 : us));
  if (all || !strcmp(sub, "upload")) {
    if (quick || !on_cuda) nm = 2, mib[0] = 1, mib[1] = 16;
    bench_upload(mib, nm);
  }
  if (all || !strcmp(sub, "latency")) bench_latency(n > 0 ? (size_t)n : quick || !on_cuda ? 20000 : 200000);
  if (all || !strcmp(sub, "alloc")) bench_alloc(kib, na, n > 0 ? (size_t)n : quick || !on_cuda ? 6400 : 64000);
  if (all || !strcmp(sub, "graph")) bench_graph(gk, ng, quick || !on_cuda ? 20 : 200);
  if (all || !strcmp(sub, "profile")) bench_profile(pk, np, quick || !on_cuda ? 50 : 500);
  const size_t serve_n = n > 0 && !all ? (size_t)n : quick || !on_cuda ? 200 : 4000;
  if ((all || !strcmp(sub, "serve")) && !serve_graph) bench_serve(ts, nt, serve_n, 0);
  if (all || (!strcmp(sub, "serve") && serve_graph)) bench_serve(ts, nt, serve_n, 1);
  if (plot != NULL && json == NULL) {
    snprintf(json_in_plot, sizeof json_in_plot, "%s/ruda_bench.json", plot);
    if (mkdir(plot, 0777) != 0 && errno != EEXIST) die("creating the --plot folder", RUDA_EIO);
    json = json_in_plot;
  }
  write_files(json, csv, props.name, date, argc, argv);
  int plot_rc = plot != NULL ? draw(json, plot) : 0;
  ruda_error *errs = NULL;
  int rc = ruda_device_close(dev, &errs);
  if (rc != 0) die("ruda_device_close", rc);
  return plot_rc;
}

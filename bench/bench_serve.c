#define _GNU_SOURCE
/* bench_serve.c - an inference-server loop through ruda, beside the raw
 * driver in the same process (issue 9, item 4).
 *
 *   bench_serve [-q] [-t threads[,threads...]] [-n requests] [-w workers] [-v variants]
 *
 * T client threads (default 1,4,16,64), each on its own ruda stream
 * (explicit id = thread index). One request:
 *   ruda_write of a 64 KiB input (128 rows x 128 floats),
 *   layer:     y = x W            (128 rows, W 128x128 floats, 64 KiB)
 *   bias_relu: y = max(y + b, 0)  (b: 128 floats)
 *   softmax:   each row of y
 *   ruda_read of 512 B (the first 128 floats of y) and ruda_future_wait.
 * Variants (-v, comma-separated, default all):
 *   1  weights (W and b) shared by all streams, 1 request in flight per thread
 *   2  weights copied per thread,              1 in flight
 *   3  weights shared,                         4 in flight (issue 4, then wait the oldest)
 *   4  weights copied per thread,              4 in flight
 * Launch arguments carry access modes: x, W and b are declared read-only
 * (ruda_arg_in), so streams sharing W need not wait for one another.
 * Results are checked against a CPU reference (double precision) for the
 * first request of each thread and every 64th, tolerance 1e-3 relative;
 * mismatches are counted and printed, and any makes the exit status 1.
 *
 * Latency of a request: from the start of its ruda_write to the return of
 * its future wait (with 4 in flight: to the return of the wait on it as
 * the oldest). Requests/s: all requests over the wall time from the start
 * barrier to the last thread done. Each thread first runs a few untimed
 * warm-up requests.
 *
 * The raw driver baseline (cuda backend only): one CUstream per thread,
 * each request's input first copied into the slot's page-locked block
 * (the receive every loop here pays: ruda's -s and the graphs copy too;
 * -P skips it; timed inside the latency as ruda_write's copy is, outside
 * with -s as ruda's is there), outputs page-locked (cuMemHostAlloc), cuMemcpyHtoDAsync, the
 * same 3 kernels (the CUfunctions of the module ruda compiled from the same
 * CUDA source) by cuLaunchKernel, cuMemcpyDtoHAsync, cuStreamSynchronize;
 * with 4 in flight one event per request and cuEventSynchronize on the
 * oldest. Device memory from cuMemAlloc. The raw driver is reached through
 * ruda's own loader (the ruda__cu table), on ruda's primary context.
 *
 * On the host backend (no GPU) the kernels are C functions computing the
 * same thing; only the ruda rows are printed, with -q a small case.
 * Workers: the ruda default (RUDA_STREAMS, else 8) unless -w.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ruda/ruda.h"
/* -b reads the scheduler's own counters (struct ruda_device): bench_serve
 * links the internal library on every backend. */
#include "src/device.h"

#ifdef RUDA_BENCH_CUDA
#include "backends/cuda/cu_loader.h"
#include "backends/cuda/cuda_internal.h"
#include "src/api.h"
#endif
#define BENCH_NAME "bench_serve"
#include "bench/bench_args.h"
#include "bench/bench_check.h"
#include "bench/bench_clock.h"
#include "bench/bench_threads.h"

enum {
  ROWS = 128,
  COLS = 128,
  IN_FLOATS = ROWS * COLS,
  IN_BYTES = IN_FLOATS * 4, /* 64 KiB */
  OUT_FLOATS = COLS,
  OUT_BYTES = OUT_FLOATS * 4, /* 512 B */
  NIN = 16,                   /* distinct inputs, rotated through */
  MAXDEPTH = 4,
  MAXT = 64,
  WARMUP = 8,
  CHECK_EVERY = 64
};

/* ---- the model: inputs, weights, CPU reference ---- */

static float *inputs;              /* NIN x IN_FLOATS */
static float weights[IN_FLOATS];   /* W[k][c] */
static float bias[COLS];
static double refs[NIN][OUT_FLOATS]; /* softmax(relu(x[0] W + b)) of each input's row 0 */

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0); /* [-1, 1) */
}

static void make_model(void) {
  uint64_t s = 42;
  inputs = malloc((size_t)NIN * IN_BYTES);
  for (size_t i = 0; i < (size_t)NIN * IN_FLOATS; i++) inputs[i] = frand(&s);
  for (int i = 0; i < IN_FLOATS; i++) weights[i] = frand(&s) * 0.25f;
  for (int i = 0; i < COLS; i++) bias[i] = frand(&s) * 0.5f;
  for (int n = 0; n < NIN; n++) {
    const float *x = inputs + (size_t)n * IN_FLOATS; /* row 0 */
    double y[COLS], mx = -INFINITY, sum = 0;
    for (int c = 0; c < COLS; c++) {
      double acc = 0;
      for (int k = 0; k < COLS; k++) acc += (double)x[k] * weights[k * COLS + c];
      acc += bias[c];
      y[c] = acc > 0 ? acc : 0;
      if (y[c] > mx) mx = y[c];
    }
    for (int c = 0; c < COLS; c++) sum += (y[c] = exp(y[c] - mx));
    for (int c = 0; c < COLS; c++) refs[n][c] = y[c] / sum;
  }
}

static int input_of(int thread, size_t req) { return (int)(((size_t)thread * 7 + req) % NIN); }

static atomic_ulong mismatches, checks;

/* Compares one output with its reference; prints the first few mismatches. */
static void check_output(const char *who, int thread, size_t req, const float *out) {
  const double *ref = refs[input_of(thread, req)];
  atomic_fetch_add(&checks, 1);
  for (int c = 0; c < OUT_FLOATS; c++) {
    double d = fabs((double)out[c] - ref[c]);
    if (!(d <= 1e-3 * fabs(ref[c]) + 1e-12)) {
      unsigned long m = atomic_fetch_add(&mismatches, 1);
      if (m < 10)
        fprintf(stderr, "bench_serve: MISMATCH %s thread %d request %zu col %d: got %.9g, expected %.9g\n", who,
                thread, req, c, (double)out[c], ref[c]);
      return;
    }
  }
}

static int must_check(size_t req) { return req == 0 || req % CHECK_EVERY == 0; }

/* ---- kernels ---- */

static const char SRC_LAYER[] =
    "extern \"C\" __global__ void serve_layer(const float *x, const float *w, float *y) {\n"
    "  unsigned r = blockIdx.x, c = threadIdx.x;\n"
    "  const float *xr = x + r * 128u;\n"
    "  float acc = 0.0f;\n"
    "  for (unsigned k = 0; k < 128u; k++) acc += xr[k] * w[k * 128u + c];\n"
    "  y[r * 128u + c] = acc;\n"
    "}\n";
static const char SRC_BIAS_RELU[] =
    "extern \"C\" __global__ void serve_bias_relu(float *y, const float *b) {\n"
    "  unsigned i = blockIdx.x * 128u + threadIdx.x;\n"
    "  float v = y[i] + b[threadIdx.x];\n"
    "  y[i] = v > 0.0f ? v : 0.0f;\n"
    "}\n";
static const char SRC_SOFTMAX[] =
    "extern \"C\" __global__ void serve_softmax(float *y) {\n"
    "  __shared__ float s[128];\n"
    "  unsigned c = threadIdx.x;\n"
    "  float *row = y + blockIdx.x * 128u;\n"
    "  float v = row[c];\n"
    "  s[c] = v;\n"
    "  __syncthreads();\n"
    "  for (unsigned h = 64; h > 0; h >>= 1) {\n"
    "    if (c < h) s[c] = fmaxf(s[c], s[c + h]);\n"
    "    __syncthreads();\n"
    "  }\n"
    "  float mx = s[0];\n"
    "  __syncthreads();\n"
    "  float e = expf(v - mx);\n"
    "  s[c] = e;\n"
    "  __syncthreads();\n"
    "  for (unsigned h = 64; h > 0; h >>= 1) {\n"
    "    if (c < h) s[c] += s[c + h];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  row[c] = e / s[0];\n"
    "}\n";

/* Host backend: launched with block (1,1,1), one call per row. */
static int host_layer(const ruda_host_ctx *ctx, void *const *args) {
  const float *x = args[0], *w = args[1];
  float *y = args[2];
  unsigned r = ctx->block_idx.x;
  for (int c = 0; c < COLS; c++) {
    float acc = 0.0f;
    for (int k = 0; k < COLS; k++) acc += x[r * COLS + k] * w[k * COLS + c];
    y[r * COLS + c] = acc;
  }
  return 0;
}

static int host_bias_relu(const ruda_host_ctx *ctx, void *const *args) {
  float *y = args[0];
  const float *b = args[1];
  unsigned r = ctx->block_idx.x;
  for (int c = 0; c < COLS; c++) {
    float v = y[r * COLS + c] + b[c];
    y[r * COLS + c] = v > 0.0f ? v : 0.0f;
  }
  return 0;
}

static int host_softmax(const ruda_host_ctx *ctx, void *const *args) {
  float *row = (float *)args[0] + ctx->block_idx.x * COLS;
  float mx = row[0], sum = 0.0f;
  for (int c = 1; c < COLS; c++) mx = row[c] > mx ? row[c] : mx;
  for (int c = 0; c < COLS; c++) sum += (row[c] = expf(row[c] - mx));
  for (int c = 0; c < COLS; c++) row[c] /= sum;
  return 0;
}

static int on_cuda;

static void register_kernels(ruda_device *dev) {
  if (on_cuda) {
    CHECK(ruda_kernel_source(dev, "serve_layer", SRC_LAYER, NULL));
    CHECK(ruda_kernel_source(dev, "serve_bias_relu", SRC_BIAS_RELU, NULL));
    CHECK(ruda_kernel_source(dev, "serve_softmax", SRC_SOFTMAX, NULL));
  } else {
    CHECK(ruda_host_kernel_register(dev, "serve_layer", host_layer));
    CHECK(ruda_host_kernel_register(dev, "serve_bias_relu", host_bias_relu));
    CHECK(ruda_host_kernel_register(dev, "serve_softmax", host_softmax));
  }
}

/* ---- one run: T threads, one variant, ruda or raw ---- */

typedef struct variant {
  const char *name;
  int shared; /* weights shared by all streams */
  int depth;  /* requests in flight per thread */
} variant;

static const variant VARIANTS[4] = {
    {"weights shared by all streams, 1 request in flight per thread", 1, 1},
    {"weights copied per thread, 1 request in flight per thread", 0, 1},
    {"weights shared by all streams, 4 requests in flight per thread", 1, 4},
    {"weights copied per thread, 4 requests in flight per thread", 0, 4},
};

typedef struct run_ctx {
  ruda_device *dev;
  const variant *v;
  int threads;
  size_t n; /* timed requests per thread */
  pthread_barrier_t go;
  /* ruda: shared weights (when v->shared) */
  ruda_handle w, b;
#ifdef RUDA_BENCH_CUDA
  CUcontext cuctx;
  CUfunction f_layer, f_bias, f_softmax;
  const void *pinned_inputs; /* NIN x IN_BYTES, page-locked */
  CUdeviceptr dw, db;        /* raw shared weights */
#endif
} run_ctx;

typedef struct thread_arg {
  run_ctx *rc;
  int index;
  uint64_t *lat; /* n latencies, ns */
  uint64_t *at;  /* n start times (mono_ns), for -b's slow-request report */
  uint64_t done_ns;
  uint64_t phase_ns[4]; /* -b, ruda: in ruda_write, the launches, ruda_read, ruda_future_wait */
} thread_arg;

static int breakdown; /* -b */

static void upload(ruda_device *dev, ruda_stream_id s, ruda_handle h, const void *src, size_t len) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  CHECK(ruda_write(dev, s, &d, src, len));
}

static void make_weights(ruda_device *dev, ruda_stream_id s, ruda_handle *w, ruda_handle *b) {
  CHECK(ruda_buffer_create(dev, s, IN_BYTES, w));
  CHECK(ruda_buffer_create(dev, s, OUT_BYTES, b));
  upload(dev, s, *w, weights, IN_BYTES);
  upload(dev, s, *b, bias, OUT_BYTES);
}

static int staged_io; /* -s */
static int raw_preloaded; /* -P */
static int in_place;  /* -i: ruda_stream_set_in_place(1) on each client's stream; -I: (0) */
static int use_graphs; /* -g: each request one graph replay (ruda and raw) */
static int patch_graphs; /* -p: as -g, but ruda keeps one graph per thread and moves it onto each slot's
                            blocks with patches (ruda_graph_run_with / _replay_with) */
static int raw_graphs;   /* the raw loop replays a CUDA graph per request (-g, -p, the raw-graph column) */

static void *ruda_thread(void *p) {
  thread_arg *a = p;
  pthread_setname_np(pthread_self(), "ruda-client"); /* tools/cu_count.c tells threads apart by name */
  run_ctx *rc = a->rc;
  ruda_device *dev = rc->dev;
  ruda_stream_id s = (ruda_stream_id)a->index;
  const int depth = rc->v->depth;
  ruda_handle w = rc->w, b = rc->b, x, y;
  if (in_place) CHECK(ruda_stream_set_in_place(dev, s, in_place > 0));
  if (!rc->v->shared) make_weights(dev, s, &w, &b);
  CHECK(ruda_buffer_create(dev, s, IN_BYTES, &x));
  CHECK(ruda_buffer_create(dev, s, IN_BYTES, &y));
  ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x));
  ruda_copy_desc yd = ruda_copy_contiguous(ruda_bind_range(y, 0, OUT_BYTES));
  /* Access modes: x, W and b are only read, so streams sharing W need
   * not order against each other; y is written, then read-modify-written. */
  ruda_arg a_layer[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_out(ruda_bind(y))};
  ruda_arg a_bias[2] = {ruda_arg_buffer(ruda_bind(y)), ruda_arg_in(ruda_bind(b))};
  ruda_arg a_soft[1] = {ruda_arg_buffer(ruda_bind(y))};
  ruda_dim3 grid = {ROWS, 1, 1}, block = {on_cuda ? COLS : 1, 1, 1};
  ruda_launch_desc l_layer = {.kernel = "serve_layer", .grid = grid, .block = block, .args = a_layer, .nargs = 3};
  ruda_launch_desc l_bias = {.kernel = "serve_bias_relu", .grid = grid, .block = block, .args = a_bias, .nargs = 2};
  ruda_launch_desc l_soft = {.kernel = "serve_softmax", .grid = grid, .block = block, .args = a_soft, .nargs = 1};
  /* With -s the request's buffers are page-locked, as the raw driver's
   * are: the input is received into a staging block handed over with
   * ruda_write_staged, the output read into staging memory. */
  float outbuf[MAXDEPTH][OUT_FLOATS], *out[MAXDEPTH];
  for (int i = 0; i < MAXDEPTH; i++) {
    out[i] = outbuf[i];
    if (staged_io || use_graphs) CHECK(ruda_staging_alloc(dev, OUT_BYTES, (void **)&out[i]));
  }
  /* With -g each slot's request is a graph: upload from the slot's input
   * block, the three launches, download into its output block. */
  ruda_graph *g[MAXDEPTH] = {0};
  void *gin[MAXDEPTH] = {0};
  for (int i = 0; use_graphs && i < depth; i++) {
    ruda_future *none = NULL;
    CHECK(ruda_staging_alloc(dev, IN_BYTES, &gin[i]));
    if (patch_graphs && i > 0) continue; /* slot 0's graph serves every slot */
    CHECK(ruda_graph_begin_capture(dev, s));
    CHECK(ruda_write_staged(dev, s, &xd, gin[i], IN_BYTES));
    CHECK(ruda_launch(dev, s, &l_layer));
    CHECK(ruda_launch(dev, s, &l_bias));
    CHECK(ruda_launch(dev, s, &l_soft));
    CHECK(ruda_read(dev, s, &yd, out[i], OUT_BYTES, &none));
    CHECK(ruda_graph_end_capture(dev, s, &g[i]));
  }
  /* -p: slot i's request is slot 0's graph with its own blocks. */
  ruda_graph_patch gp[MAXDEPTH][2];
  for (int i = 0; i < MAXDEPTH; i++) {
    gp[i][0] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, gin[i]);
    gp[i][1] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 4, out[i]);
  }
  ruda_future *fut[MAXDEPTH] = {0};
  uint64_t start[MAXDEPTH] = {0}, ran[MAXDEPTH] = {0};
  CHECK(ruda_sync(dev, s, NULL)); /* stream and buffers ready outside the timing */

  /* WARMUP untimed requests, all waited for; then the start barrier and n
   * timed ones. Request r (counted from 0 over both) uses slot r % depth. */
  for (int phase = 0; phase < 2; phase++) {
    const size_t first = phase ? WARMUP : 0, count = phase ? rc->n : WARMUP;
    if (phase) pthread_barrier_wait(&rc->go);
    for (size_t i = 0; i < count + (size_t)depth; i++) {
      if (i >= (size_t)depth) { /* wait the oldest */
        size_t o = first + i - (size_t)depth;
        int slot = (int)(o % (size_t)depth);
        ruda_error *err = NULL;
        uint64_t tw = mono_ns(), t = ran[slot];
        int wrc = 0;
        if (fut[slot] != NULL) { /* else ruda_graph_run ran it */
          wrc = ruda_future_wait(fut[slot], &err);
          t = mono_ns();
          if (phase) a->phase_ns[3] += t - tw;
        }
        if (wrc != 0) {
          fprintf(stderr, "bench_serve: ruda thread %d request %zu: %s: %s\n", a->index, o, ruda_err_name(wrc),
                  ruda_error_message(err));
          exit(1);
        }
        ruda_future_free(fut[slot]);
        fut[slot] = NULL;
        if (phase) a->lat[o - WARMUP] = t - start[slot], a->at[o - WARMUP] = start[slot];
        if (o == 0 || (phase && must_check(o - WARMUP))) check_output("ruda", a->index, o, out[slot]);
      }
      if (i < count) {
        size_t r = first + i;
        int slot = (int)(r % (size_t)depth);
        const float *in = inputs + (size_t)input_of(a->index, r) * IN_FLOATS;
        if (use_graphs) { /* the request arrives in the slot's block */
          memcpy(gin[slot], in, IN_BYTES);
          start[slot] = mono_ns();
          if (depth == 1) { /* served synchronously: replay and wait in one call */
            if (patch_graphs) CHECK(ruda_graph_run_with(dev, s, g[0], gp[slot], 2, NULL));
            else CHECK(ruda_graph_run(dev, s, g[slot], NULL));
            ran[slot] = mono_ns();
            if (phase) a->phase_ns[3] += ran[slot] - start[slot];
            continue;
          }
          if (patch_graphs) CHECK(ruda_graph_replay_with(dev, s, g[0], gp[slot], 2, &fut[slot]));
          else CHECK(ruda_graph_replay_async(dev, s, g[slot], &fut[slot]));
          if (phase) a->phase_ns[0] += mono_ns() - start[slot];
          continue;
        }
        if (staged_io) {
          void *blk = NULL; /* the request arrives in page-locked memory */
          CHECK(ruda_staging_alloc(dev, IN_BYTES, &blk));
          memcpy(blk, in, IN_BYTES);
          start[slot] = mono_ns();
          CHECK(ruda_write_staged(dev, s, &xd, blk, IN_BYTES));
        } else {
          start[slot] = mono_ns();
          CHECK(ruda_write(dev, s, &xd, in, IN_BYTES));
        }
        uint64_t t1 = mono_ns();
        CHECK(ruda_launch(dev, s, &l_layer));
        CHECK(ruda_launch(dev, s, &l_bias));
        CHECK(ruda_launch(dev, s, &l_soft));
        uint64_t t2 = mono_ns();
        CHECK(ruda_read(dev, s, &yd, out[slot], OUT_BYTES, &fut[slot]));
        if (phase) {
          a->phase_ns[0] += t1 - start[slot];
          a->phase_ns[1] += t2 - t1;
          a->phase_ns[2] += mono_ns() - t2;
        }
      }
    }
  }
  a->done_ns = mono_ns();
  for (int i = 0; use_graphs && i < depth; i++)
    if (g[i] != NULL) CHECK(ruda_graph_destroy(dev, g[i]));
  CHECK(ruda_sync(dev, s, NULL)); /* the last replays ran: their blocks are free */
  for (int i = 0; use_graphs && i < depth; i++) CHECK(ruda_staging_free(dev, gin[i]));
  if (staged_io || use_graphs)
    for (int i = 0; i < MAXDEPTH; i++) CHECK(ruda_staging_free(dev, out[i]));
  CHECK(ruda_buffer_free(dev, s, x));
  CHECK(ruda_buffer_free(dev, s, y));
  if (!rc->v->shared) {
    CHECK(ruda_buffer_free(dev, s, w));
    CHECK(ruda_buffer_free(dev, s, b));
  }
  CHECK(ruda_sync(dev, s, NULL));
  return NULL;
}

#ifdef RUDA_BENCH_CUDA
static void *raw_thread(void *p) {
  thread_arg *a = p;
  pthread_setname_np(pthread_self(), "raw-client");
  run_ctx *rc = a->rc;
  const int depth = rc->v->depth;
  CU(ruda__cu.cuCtxSetCurrent(rc->cuctx));
  CUstream st;
  CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUdeviceptr w = rc->dw, b = rc->db, x, y;
  if (!rc->v->shared) {
    CU(ruda__cu.cuMemAlloc(&w, IN_BYTES));
    CU(ruda__cu.cuMemAlloc(&b, OUT_BYTES));
    CU(ruda__cu.cuMemcpyHtoD(w, weights, IN_BYTES));
    CU(ruda__cu.cuMemcpyHtoD(b, bias, OUT_BYTES));
  }
  CU(ruda__cu.cuMemAlloc(&x, IN_BYTES));
  CU(ruda__cu.cuMemAlloc(&y, IN_BYTES));
  float *out;
  CU(ruda__cu.cuMemHostAlloc((void **)&out, (size_t)MAXDEPTH * OUT_BYTES, 0));
  CUevent ev[MAXDEPTH];
  for (int i = 0; i < depth; i++) CU(ruda__cu.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
  void *p_layer[3] = {&x, &w, &y}, *p_bias[2] = {&y, &b}, *p_soft[1] = {&y};
  uint64_t start[MAXDEPTH] = {0};
  const char *in = rc->pinned_inputs;
  /* -g: the same request captured once per slot as a CUDA graph. */
  CUgraphExec ge[MAXDEPTH] = {0};
  void *gin = NULL;
  char *rin = NULL;
  if (raw_graphs) CU(ruda__cu.cuMemHostAlloc(&gin, (size_t)MAXDEPTH * IN_BYTES, 0));
  else if (!raw_preloaded) CU(ruda__cu.cuMemHostAlloc((void **)&rin, (size_t)MAXDEPTH * IN_BYTES, 0));
  for (int i = 0; raw_graphs && i < depth; i++) {
    CUgraph graph;
    CU(ruda__cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CU(ruda__cu.cuMemcpyHtoDAsync(x, (char *)gin + (size_t)i * IN_BYTES, IN_BYTES, st));
    CU(ruda__cu.cuLaunchKernel(rc->f_layer, ROWS, 1, 1, COLS, 1, 1, 0, st, p_layer, NULL));
    CU(ruda__cu.cuLaunchKernel(rc->f_bias, ROWS, 1, 1, COLS, 1, 1, 0, st, p_bias, NULL));
    CU(ruda__cu.cuLaunchKernel(rc->f_softmax, ROWS, 1, 1, COLS, 1, 1, 0, st, p_soft, NULL));
    CU(ruda__cu.cuMemcpyDtoHAsync(out + (size_t)i * OUT_FLOATS, y, OUT_BYTES, st));
    CU(ruda__cu.cuStreamEndCapture(st, &graph));
    CU(ruda__cu.cuGraphInstantiateWithFlags(&ge[i], graph, 0));
    CU(ruda__cu.cuGraphDestroy(graph));
  }

  for (int phase = 0; phase < 2; phase++) { /* as in ruda_thread */
    const size_t first = phase ? WARMUP : 0, count = phase ? rc->n : WARMUP;
    if (phase) pthread_barrier_wait(&rc->go);
    for (size_t i = 0; i < count + (size_t)depth; i++) {
      if (i >= (size_t)depth) {
        size_t o = first + i - (size_t)depth;
        int slot = (int)(o % (size_t)depth);
        uint64_t tw = mono_ns();
        if (depth == 1)
          CU(ruda__cu.cuStreamSynchronize(st));
        else
          CU(ruda__cu.cuEventSynchronize(ev[slot]));
        uint64_t t = mono_ns();
        if (phase) a->phase_ns[3] += t - tw;
        if (phase) a->lat[o - WARMUP] = t - start[slot], a->at[o - WARMUP] = start[slot];
        if (o == 0 || (phase && must_check(o - WARMUP)))
          check_output("raw", a->index, o, out + (size_t)slot * OUT_FLOATS);
      }
      if (i < count) {
        size_t r = first + i;
        int slot = (int)(r % (size_t)depth);
        if (raw_graphs) {
          memcpy((char *)gin + (size_t)slot * IN_BYTES, in + (size_t)input_of(a->index, r) * IN_BYTES, IN_BYTES);
          start[slot] = mono_ns();
          CU(ruda__cu.cuGraphLaunch(ge[slot], st));
        } else {
          /* The request arrives in the slot's page-locked block, as ruda's
           * (-s) and the raw graph's do; -P: already there. The copy is
           * timed as ruda's is: inside the latency where ruda's loop copies
           * in ruda_write (pageable, the default), outside with -s. */
          const size_t k = (size_t)input_of(a->index, r);
          if (!staged_io) start[slot] = mono_ns();
          const void *src = raw_preloaded ? in + k * IN_BYTES
                                          : memcpy(rin + (size_t)slot * IN_BYTES, inputs + k * IN_FLOATS, IN_BYTES);
          if (staged_io) start[slot] = mono_ns();
          CU(ruda__cu.cuMemcpyHtoDAsync(x, src, IN_BYTES, st));
          CU(ruda__cu.cuLaunchKernel(rc->f_layer, ROWS, 1, 1, COLS, 1, 1, 0, st, p_layer, NULL));
          CU(ruda__cu.cuLaunchKernel(rc->f_bias, ROWS, 1, 1, COLS, 1, 1, 0, st, p_bias, NULL));
          CU(ruda__cu.cuLaunchKernel(rc->f_softmax, ROWS, 1, 1, COLS, 1, 1, 0, st, p_soft, NULL));
          CU(ruda__cu.cuMemcpyDtoHAsync(out + (size_t)slot * OUT_FLOATS, y, OUT_BYTES, st));
        }
        if (depth > 1) CU(ruda__cu.cuEventRecord(ev[slot], st));
        if (phase) a->phase_ns[0] += mono_ns() - start[slot];
      }
    }
  }
  a->done_ns = mono_ns();
  CU(ruda__cu.cuStreamSynchronize(st));
  for (int i = 0; raw_graphs && i < depth; i++) CU(ruda__cu.cuGraphExecDestroy(ge[i]));
  if (gin != NULL) CU(ruda__cu.cuMemFreeHost(gin));
  if (rin != NULL) CU(ruda__cu.cuMemFreeHost(rin));
  for (int i = 0; i < depth; i++) CU(ruda__cu.cuEventDestroy(ev[i]));
  CU(ruda__cu.cuMemFreeHost(out));
  CU(ruda__cu.cuMemFree(x));
  CU(ruda__cu.cuMemFree(y));
  if (!rc->v->shared) {
    CU(ruda__cu.cuMemFree(w));
    CU(ruda__cu.cuMemFree(b));
  }
  CU(ruda__cu.cuStreamDestroy(st));
  return NULL;
}

static CUfunction raw_function(ruda_device *dev, const char *name) {
  ruda__kernel *k = ruda__kernel_find(dev, name);
  return ((ruda__cu_kernel *)k->impl)->fn;
}
#endif

typedef struct result {
  double rps, p50, p99, p999; /* requests/s, latencies in us */
} result;

static uint64_t *lat_all, *at_all;

/* -b: ruda's own counters, read before and after a run. */
typedef struct counters {
  uint64_t marks, waits, in_place, auto_cmds, auto_templates, auto_replaced;
} counters;

static counters counters_of(ruda_device *dev) {
  counters c = {atomic_load(&dev->sched.order.marks), atomic_load(&dev->sched.order.waits), 0, 0, 0, 0};
  for (uint32_t i = 0; i < dev->sched.nworkers; i++) {
    const ruda__worker *w = &dev->sched.workers[i];
    c.in_place += w->in_place_runs;
    c.auto_cmds += atomic_load(&w->auto_cmds);
    c.auto_templates += atomic_load(&w->auto_templates);
    c.auto_replaced += atomic_load(&w->auto_replaced);
  }
  return c;
}

/* -b: when the slow requests ran. A request is slow above 1 ms; the report
 * counts them per tenth of the run (start-up or periodic) and names the
 * five slowest with their start and thread. Reads lat_all/at_all before
 * they are sorted. */
static void slow_report(int threads, size_t n, int raw, uint64_t t0, uint64_t end) {
  enum { SLOW_NS = 1000000, WORST = 5 };
  size_t tenth[10] = {0}, nslow = 0, worst[WORST];
  int nworst = 0;
  const double span = (double)(end - t0);
  for (size_t i = 0; i < n * (size_t)threads; i++) {
    if (lat_all[i] <= SLOW_NS) continue;
    nslow++;
    double f = ((double)at_all[i] - (double)t0) / span;
    int k = f < 0 ? 0 : f >= 1 ? 9 : (int)(f * 10);
    tenth[k]++;
    if (nworst == WORST && lat_all[worst[WORST - 1]] >= lat_all[i]) continue;
    int j = nworst < WORST ? nworst++ : WORST - 1;
    for (; j > 0 && lat_all[worst[j - 1]] < lat_all[i]; j--) worst[j] = worst[j - 1];
    worst[j] = i;
  }
  printf("       T=%d %s: %zu requests over 1 ms; per tenth of the run:", threads, raw ? "raw" : "ruda", nslow);
  for (int k = 0; k < 10; k++) printf(" %zu", tenth[k]);
  printf("\n");
  for (int j = 0; j < nworst; j++)
    printf("       T=%d %s: slow %.2f ms, thread %zu, started at %.1f ms of %.1f\n", threads, raw ? "raw" : "ruda",
           (double)lat_all[worst[j]] / 1e6, worst[j] / n, ((double)at_all[worst[j]] - (double)t0) / 1e6, span / 1e6);
}

static result run(ruda_device *dev, const variant *v, int threads, size_t n, int raw) {
  const counters before = counters_of(dev);
  run_ctx rc;
  memset(&rc, 0, sizeof rc);
  rc.dev = dev;
  rc.v = v;
  rc.threads = threads;
  rc.n = n;
  thread_arg a[MAXT];
  void *(*fn)(void *) = ruda_thread;
#ifdef RUDA_BENCH_CUDA
  void *pinned = NULL;
  if (raw) {
    void *c = NULL;
    CHECK(ruda_cuda_context(dev, &c));
    rc.cuctx = (CUcontext)c;
    CU(ruda__cu.cuCtxSetCurrent(rc.cuctx));
    rc.f_layer = raw_function(dev, "serve_layer");
    rc.f_bias = raw_function(dev, "serve_bias_relu");
    rc.f_softmax = raw_function(dev, "serve_softmax");
    CU(ruda__cu.cuMemHostAlloc(&pinned, (size_t)NIN * IN_BYTES, 0));
    memcpy(pinned, inputs, (size_t)NIN * IN_BYTES);
    rc.pinned_inputs = pinned;
    if (v->shared) {
      CU(ruda__cu.cuMemAlloc(&rc.dw, IN_BYTES));
      CU(ruda__cu.cuMemAlloc(&rc.db, OUT_BYTES));
      CU(ruda__cu.cuMemcpyHtoD(rc.dw, weights, IN_BYTES));
      CU(ruda__cu.cuMemcpyHtoD(rc.db, bias, OUT_BYTES));
    }
    fn = raw_thread;
  }
#else
  (void)raw;
#endif
  if (!raw && v->shared) {
    make_weights(dev, 0, &rc.w, &rc.b);
    CHECK(ruda_sync(dev, 0, NULL));
  }
  for (int i = 0; i < threads; i++) a[i] = (thread_arg){.rc = &rc, .index = i, .lat = lat_all + (size_t)i * n, .at = at_all + (size_t)i * n};
  const uint64_t t0 = bench_threads_run(&rc.go, threads, fn, a, sizeof a[0]);
  uint64_t end = t0;
  for (int i = 0; i < threads; i++)
    if (a[i].done_ns > end) end = a[i].done_ns;
  if (!raw && v->shared) {
    CHECK(ruda_buffer_free(dev, 0, rc.w));
    CHECK(ruda_buffer_free(dev, 0, rc.b));
    CHECK(ruda_sync(dev, 0, NULL));
  }
#ifdef RUDA_BENCH_CUDA
  if (raw) {
    if (v->shared) {
      CU(ruda__cu.cuMemFree(rc.dw));
      CU(ruda__cu.cuMemFree(rc.db));
    }
    CU(ruda__cu.cuMemFreeHost(pinned));
  }
#endif
  size_t cnt = n * (size_t)threads;
  if (breakdown) {
    /* Fairness: a run's rate is set by its last thread; when some threads
     * are served much later than the rest, their finish times spread. */
    uint64_t fin[MAXT];
    for (int i = 0; i < threads; i++) fin[i] = a[i].done_ns - t0;
    qsort(fin, (size_t)threads, sizeof fin[0], cmp_u64);
    printf("       T=%d %s: threads finished after %.1f ms (first), %.1f (median), %.1f (last)\n", threads,
           raw ? "raw" : "ruda", (double)fin[0] / 1e6, (double)fin[threads / 2] / 1e6, (double)fin[threads - 1] / 1e6);
    /* Read after every thread joined and every stream synced: exact. */
    const counters after = counters_of(dev);
    if (!raw) {
      printf("       T=%d ruda: %llu commands run in place by clients; ordering pushed %llu marks, %llu waits\n",
             threads, (unsigned long long)(after.in_place - before.in_place),
             (unsigned long long)(after.marks - before.marks), (unsigned long long)(after.waits - before.waits));
      printf("       T=%d ruda: automatic graphs: %llu commands replayed, %llu templates made, %llu noted shapes "
             "replaced\n",
             threads, (unsigned long long)(after.auto_cmds - before.auto_cmds),
             (unsigned long long)(after.auto_templates - before.auto_templates),
             (unsigned long long)(after.auto_replaced - before.auto_replaced));
      ruda_staging_stats st;
      if (ruda_staging_usage(dev, &st) == 0)
        printf("       T=%d ruda: staging %.1f MiB page-locked, peak in use %.1f MiB, %llu pageable fallbacks\n",
               threads, (double)st.pinned_bytes / 1048576.0, (double)st.peak_bytes / 1048576.0,
               (unsigned long long)st.fallback_count);
    }
    double ph[4] = {0, 0, 0, 0};
    for (int i = 0; i < threads; i++)
      for (int k = 0; k < 4; k++) ph[k] += (double)a[i].phase_ns[k];
    if (raw)
      printf("       T=%d raw: mean us per request issuing %.2f, waiting %.2f\n", threads, ph[0] / cnt / 1e3,
             ph[3] / cnt / 1e3);
    else if (use_graphs)
      printf("       T=%d ruda: mean us per request in ruda_graph_replay_async %.2f, ruda_future_wait or "
             "ruda_graph_run %.2f\n",
             threads, ph[0] / cnt / 1e3, ph[3] / cnt / 1e3);
    else
      printf("       T=%d ruda: mean us per request in ruda_write %.2f, 3 launches %.2f, ruda_read %.2f, "
             "ruda_future_wait %.2f\n",
             threads, ph[0] / cnt / 1e3, ph[1] / cnt / 1e3, ph[2] / cnt / 1e3, ph[3] / cnt / 1e3);
  }
  if (breakdown) slow_report(threads, n, raw, t0, end);
  qsort(lat_all, cnt, sizeof *lat_all, cmp_u64);
  result r;
  r.rps = (double)cnt / ((double)(end - t0) / 1e9);
  r.p50 = lat_all[(size_t)(0.5 * (double)(cnt - 1))] / 1e3;
  r.p99 = lat_all[(size_t)(0.99 * (double)(cnt - 1))] / 1e3;
  r.p999 = lat_all[(size_t)(0.999 * (double)(cnt - 1))] / 1e3;
  return r;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_serve [-h] [-q] [-a] [-b] [-s] [-g] [-p] [-i|-I] [-P] [-t threads[,threads...]] [-n requests] [-w workers] [-v variants]\n"
          "  -h  this help\n"
          "  -q  quick: few requests per thread\n"
          "  -a  automatic request graphs (cfg.auto_graphs; also RUDA_AUTO_GRAPHS=1)\n"
          "  -b  print where a request's client time goes (ruda: each call, the wait; raw: issuing, waiting)\n"
          "  -P  the raw loop's inputs are preloaded in page-locked memory; default: each request\n"
          "      is first copied into the slot's page-locked block, as ruda's (-s) and the raw\n"
          "      graph's are\n"
          "  -s  ruda's requests use page-locked buffers, as the raw driver's do: the input\n"
          "      arrives in a staging block (ruda_write_staged), the output is read into one\n"
          "  -g  each request is one graph replay, in ruda (upload, launches and download\n"
          "      recorded: ruda_graph_run with 1 in flight, else ruda_graph_replay_async) and in\n"
          "      the raw loop (a CUDA graph per slot, cuGraphLaunch); the input is copied into\n"
          "      the slot's page-locked block first\n"
          "  -p  as -g, but ruda records one graph per thread and moves it onto each slot's\n"
          "      blocks with patches (ruda_graph_run_with, ruda_graph_replay_with)\n"
          "  -I  no client issues in place (ruda_stream_set_in_place(.., 0)); default: ruda's\n"
          "      choice (in place while a stream waits for each request)\n"
          "  -i  each client's stream issues in place (ruda_stream_set_in_place): the client\n"
          "      makes the driver calls itself while its worker is idle\n"
          "  -t  client thread counts (1..%d; default 1,4,16,64)\n"
          "  -n  timed requests per thread (default 4096; quick 256, host backend quick 65)\n"
          "  -w  ruda workers (default: RUDA_STREAMS, else ruda's default)\n"
          "  -v  variants, comma-separated (default 1,2,3,4):\n"
          "      1 shared weights, 1 in flight   2 per-thread weights, 1 in flight\n"
          "      3 shared weights, 4 in flight   4 per-thread weights, 4 in flight\n",
          MAXT);
}

int main(int argc, char **argv) {
  int quick = 0, opt, nt = 0, ts[16];
  long nreq = 0;
  uint32_t workers = 0;
  int vrun[4] = {1, 1, 1, 1};
  int auto_graphs = 0;
  while ((opt = getopt(argc, argv, "habgiIpPqst:n:w:v:")) != -1) {
    if (opt == 'h') {
      usage(stdout);
      return 0;
    } else if (opt == 'a') {
      auto_graphs = 1;
    } else if (opt == 'b') {
      breakdown = 1;
    } else if (opt == 'q') {
      quick = 1;
    } else if (opt == 's') {
      staged_io = 1;
    } else if (opt == 'P') {
      raw_preloaded = 1;
    } else if (opt == 'g') {
      use_graphs = 1;
    } else if (opt == 'p') {
      use_graphs = patch_graphs = 1;
    } else if (opt == 'i') {
      in_place = 1;
    } else if (opt == 'I') {
      in_place = -1;
    } else if (opt == 't') {
      const int k = bench_int_list(optarg, 1, MAXT, ts + nt, 16 - nt); /* each -t adds */
      if (k < 0) {
        usage(stderr);
        return 2;
      }
      nt += k;
    } else if (opt == 'n' && atol(optarg) > 0) {
      nreq = atol(optarg);
    } else if (opt == 'w' && atoi(optarg) > 0) {
      workers = (uint32_t)atoi(optarg);
    } else if (opt == 'v') {
      memset(vrun, 0, sizeof vrun);
      for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ","))
        if (atoi(tok) >= 1 && atoi(tok) <= 4) vrun[atoi(tok) - 1] = 1;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }

  ruda_config cfg;
  ruda_config_init(&cfg);
  if (workers) cfg.num_streams = workers;
  if (auto_graphs) cfg.auto_graphs = 1;
  if (cfg.log_level > RUDA_LOG_WARN) cfg.log_level = RUDA_LOG_WARN;
  ruda_device *dev = NULL;
  CHECK(ruda_device_open(&cfg, &dev));
  on_cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
  int have_raw = 0;
#ifdef RUDA_BENCH_CUDA
  have_raw = on_cuda;
#endif
  if (nt == 0) {
    if (on_cuda)
      ts[0] = 1, ts[1] = 4, ts[2] = 16, ts[3] = 64, nt = 4;
    else
      ts[0] = 1, ts[1] = 4, nt = 2;
  }
  size_t n = nreq ? (size_t)nreq : quick ? (on_cuda ? 256 : 65) : (on_cuda ? 4096 : 256);

  ruda_device_props props;
  CHECK(ruda_device_get_props(dev, &props));
  char date[64];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
  printf("bench_serve: machine %s, backend %s, %u ruda workers, %s%s; ruda's request buffers %s\n", props.name,
         ruda_device_backend(dev), ruda_device_num_streams(dev), date, quick ? ", quick run" : "",
         patch_graphs ? "page-locked; each request one replay of the thread's graph moved onto the slot's blocks "
                        "by patches (raw: a CUDA graph per slot)"
         : use_graphs ? "page-locked; each request one graph replay (ruda and raw)"
         : staged_io ? "page-locked (staging)"
                     : "pageable (ruda_write, ruda_read into the caller's array)");
  if (in_place) printf("ruda's streams %s in place (ruda_stream_set_in_place)\n", in_place > 0 ? "issue" : "never issue");
  if (cfg.auto_graphs) printf("ruda: automatic request graphs on (cfg.auto_graphs)\n");
  printf("request: write 64 KiB, 3 kernels (128x128 layer over 128 rows, bias+ReLU, row softmax), read 512 B, wait;"
         " %zu timed requests per thread after %d warm-up\n",
         n, WARMUP);
  if (!have_raw)
    printf("raw driver baseline: needs a GPU (cuda backend%s); ruda rows only\n",
#ifdef RUDA_BENCH_CUDA
           ""
#else
           " and a build with CUDA"
#endif
    );

  make_model();
  register_kernels(dev);
  int maxt = 1;
  for (int i = 0; i < nt; i++) maxt = ts[i] > maxt ? ts[i] : maxt;
  lat_all = malloc((size_t)maxt * n * sizeof *lat_all);
  at_all = malloc((size_t)maxt * n * sizeof *at_all);

  for (int vi = 0; vi < 4; vi++) {
    if (!vrun[vi]) continue;
    const variant *v = &VARIANTS[vi];
    printf("\n%d. %s (latency in us)\n", vi + 1, v->name);
    /* Call-by-call rows also show the same request as a raw CUDA graph:
     * the ceiling a graph per request reaches (issue 20). */
    const int rawg_col = have_raw && !use_graphs;
    if (have_raw)
      printf("   %3s | %12s %9s %9s %9s | %12s %9s %9s %9s | %8s %8s%s\n", "T", "ruda req/s", "p50", "p99", "p99.9",
             "raw req/s", "p50", "p99", "p99.9", "req/s", "p50",
             rawg_col ? " | raw graph req/s    p50    p99.9 | ruda/rawg" : "");
    else
      printf("   %3s | %12s %9s %9s %9s\n", "T", "ruda req/s", "p50", "p99", "p99.9");
    if (have_raw)
      printf("   %3s | %42s | %42s | %17s\n", "", "", "", "ruda/raw");
    for (int i = 0; i < nt; i++) {
      result r = run(dev, v, ts[i], n, 0);
      if (have_raw) {
        raw_graphs = use_graphs;
        result b = run(dev, v, ts[i], n, 1);
        printf("   %3d | %12.0f %9.1f %9.1f %9.1f | %12.0f %9.1f %9.1f %9.1f | %8.3f %8.3f", ts[i], r.rps, r.p50,
               r.p99, r.p999, b.rps, b.p50, b.p99, b.p999, r.rps / b.rps, r.p50 / b.p50);
        if (rawg_col) {
          raw_graphs = 1;
          result c = run(dev, v, ts[i], n, 1);
          raw_graphs = 0;
          printf(" | %15.0f %6.1f %8.1f | %9.3f", c.rps, c.p50, c.p999, r.rps / c.rps);
        }
        printf("\n");
      } else {
        printf("   %3d | %12.0f %9.1f %9.1f %9.1f\n", ts[i], r.rps, r.p50, r.p99, r.p999);
      }
      fflush(stdout);
    }
  }

  ruda_error *errs = NULL;
  int crc = ruda_device_close(dev, &errs);
  if (crc != 0) {
    fprintf(stderr, "bench_serve: ruda_device_close: %s: %s\n", ruda_err_name(crc), ruda_error_message(errs));
    return 1;
  }
  unsigned long mm = atomic_load(&mismatches), ck = atomic_load(&checks);
  printf("\nchecked %lu results against the CPU reference (tolerance 1e-3 relative): %lu mismatches\n", ck, mm);
  free(lat_all);
  free(at_all);
  free(inputs);
  return mm ? 1 : 0;
}

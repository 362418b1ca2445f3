#define _GNU_SOURCE
/* bench_blas.c - cuBLAS through ruda_call beside the raw cuBLAS loop, in
 * one process (issue 22).
 *
 *   bench_blas [-q] [-g] [-s] [-P] [-i|-I] [-t threads[,threads...]] [-n requests] [-w workers]
 *
 * A request: upload X (32 x 1024 fp32, 128 KiB), H = X W1 (cublasSgemm,
 * W1 1024 x 4096), bias + GELU kernel on H, Y = H W2 (cublasSgemm, W2
 * 4096 x 1024), bias kernel on Y, download Y (128 KiB) and wait. W1 and W2
 * (32 MiB together) and the biases are shared by every thread. T client
 * threads (default 1, 4, 16), each on its own stream, one request in
 * flight each. Rows, each run in the same process on the same primary
 * context:
 *   raw   a CUstream and a cublasHandle_t per thread: cuMemcpyHtoDAsync
 *         from page-locked memory, the 2 GEMMs and 2 kernels
 *         (cuLaunchKernel of the CUfunctions ruda compiled from the same
 *         source), cuMemcpyDtoHAsync into page-locked memory,
 *         cuStreamSynchronize. Each request is first received (copied,
 *         untimed) into the thread's page-locked input block, as a server
 *         receives it and as ruda's -s and graph loops do; -P uploads
 *         preloaded page-locked inputs instead (the method before
 *         2026-12-03).
 *   raw pg  the raw loop with the memory ruda's pageable rows get: the
 *         upload from the caller's pageable input, the download into a
 *         malloc'd output (the driver stages both); run beside the
 *         pageable rows (no -s, no -g), in both tables.
 *   call  ruda: ruda_write, ruda_call (cublasSgemm on the worker's
 *         CUstream, one cublasHandle_t per worker), ruda_launch,
 *         ruda_call, ruda_launch, ruda_read + ruda_future_wait. With -s
 *         the input arrives in a staging block (ruda_write_staged) and the
 *         output is read into one, page-locked as the raw loop's are.
 *   flush ruda before ruda_call, as the issue measured it: the caller
 *         takes the stream's CUstream (ruda_cuda_stream) and raw addresses
 *         (ruda_binding_device_ptr) and calls ruda_flush before each of
 *         its two cublasSgemm, on a cublasHandle_t of its own.
 * The cuBLAS handles of the call row are ruda's per-worker library state
 * (ruda_library_register): made on each worker before its first call,
 * destroyed at close.
 * A second table, the same request with cuBLASLt (examples/
 * cublaslt_dl.h): H = GELU(X W1 + b1) and Y = H W2 + b2 as two
 * cublasLtMatmul with fused epilogues (bias+GELU, bias), no kernels:
 *   lt raw   a CUstream and a cuBLASLt handle and workspace per thread,
 *            the upload, the two matmuls, the download, cuStreamSynchronize.
 *   lt call  ruda: ruda_write, two ruda_call (cuBLASLt's handle, workspace
 *            and plans are the per-worker library state), ruda_read + wait.
 * With -g each request is one graph instead: ruda records the staged
 * upload, both calls, both launches (cuBLASLt: the two calls) and the
 * download (ruda_graph_run per request), the raw loop captures the same
 * sequence into a CUDA graph (cuGraphLaunch + cuStreamSynchronize); the
 * flush row is skipped. -s and -g apply to both tables. By default ruda's
 * streams follow the backend's in-place policy (on cuda a request loop's
 * commands, calls included, are issued by the client thread while the
 * worker is idle); -i turns in place on for every stream, -I off (every
 * command handed to the worker: the hop measured). Without cuBLASLt
 * the second table says why and is skipped.
 *
 * Each thread runs WARMUP untimed requests first (cuBLAS makes its
 * handles and workspaces there). Latency: from the upload's call to the
 * wait's return; req/s: all requests over the wall time from the start
 * barrier to the last thread done. Row 0 of every 25th result (and the
 * first) is checked against a double-precision CPU reference, tolerance
 * 2e-3 relative + 1e-3; any mismatch makes the exit status 1.
 *
 * Needs the cuda backend and cuBLAS (loaded at run time, examples/
 * cublas_dl.h): without either it says why and exits 0, so a machine
 * without a GPU skips it cleanly.
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
#ifdef RUDA_BENCH_CUDA
#include "backends/cuda/cu_loader.h"
#include "backends/cuda/cuda_internal.h"
#include "src/api.h"
#endif
#define BENCH_NAME "bench_blas"
#include "bench/bench_args.h"
#include "bench/bench_check.h"
#include "bench/bench_clock.h"
#include "bench/bench_threads.h"
#include "cublas_dl.h"
#include "cublaslt_dl.h"

enum {
  M = 32, D = 1024, HD = 4096,
  XF = M * D, HF = M * HD, YF = M * D,
  XB = XF * 4, HB = HF * 4, YB = YF * 4,
  NIN = 8, MAXT = 64, WARMUP = 8, CHECK_EVERY = 25
};

/* ---- the model and its reference ---- */

static float *w1, *w2, b1[HD], b2[D], *inputs; /* inputs: NIN x XF */
static double refs[NIN][D];                     /* row 0 of each input's Y */

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static double gelu(double v) { return 0.5 * v * (1.0 + erf(v * 0.70710678118654752)); }

static void make_model(void) {
  uint64_t s = 42;
  w1 = malloc((size_t)D * HD * 4);
  w2 = malloc((size_t)HD * D * 4);
  inputs = malloc((size_t)NIN * XB);
  for (size_t i = 0; i < (size_t)D * HD; i++) w1[i] = frand(&s) / 32.0f;
  for (size_t i = 0; i < (size_t)HD * D; i++) w2[i] = frand(&s) / 64.0f;
  for (int i = 0; i < HD; i++) b1[i] = frand(&s) * 0.1f;
  for (int i = 0; i < D; i++) b2[i] = frand(&s) * 0.1f;
  for (size_t i = 0; i < (size_t)NIN * XF; i++) inputs[i] = frand(&s);
  static double h[HD];
  for (int n = 0; n < NIN; n++) {
    const float *x = inputs + (size_t)n * XF; /* row 0 */
    for (int j = 0; j < HD; j++) h[j] = b1[j];
    for (int k = 0; k < D; k++)
      for (int j = 0; j < HD; j++) h[j] += (double)x[k] * w1[(size_t)k * HD + j];
    for (int j = 0; j < HD; j++) h[j] = gelu(h[j]);
    for (int j = 0; j < D; j++) refs[n][j] = b2[j];
    for (int k = 0; k < HD; k++)
      for (int j = 0; j < D; j++) refs[n][j] += h[k] * w2[(size_t)k * D + j];
  }
}

static int input_of(int thread, size_t req) { return (int)(((size_t)thread * 3 + req) % NIN); }

static atomic_ulong mismatches, checks;

static void check_output(const char *who, int thread, size_t req, const float *y) {
  const double *ref = refs[input_of(thread, req)];
  atomic_fetch_add(&checks, 1);
  for (int j = 0; j < D; j++)
    if (!(fabs((double)y[j] - ref[j]) <= 2e-3 * fabs(ref[j]) + 1e-3)) {
      if (atomic_fetch_add(&mismatches, 1) < 10)
        fprintf(stderr, "bench_blas: MISMATCH %s thread %d request %zu y[0][%d] = %.6f, expected %.6f\n", who,
                thread, req, j, (double)y[j], ref[j]);
      return;
    }
}

static int must_check(size_t req) { return req % CHECK_EVERY == 0; }

static const char SRC[] =
    "extern \"C\" __global__ void blas_bias_gelu(float *h, const float *b, unsigned cols, unsigned n) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  float v = h[i] + b[i % cols];\n"
    "  h[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f));\n"
    "}\n"
    "extern \"C\" __global__ void blas_bias(float *y, const float *b, unsigned cols, unsigned n) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] += b[i % cols];\n"
    "}\n";

/* A failed cuBLAS call of the raw or flush rows ends the run. */
static void blas_check(const char *what, int status) {
  if (status == 0) return;
  fprintf(stderr, "bench_blas: %s: cuBLAS status %d\n", what, status);
  exit(1);
}

/* ---- shared state ---- */

enum { ROW_RAW, ROW_CALL, ROW_FLUSH, ROW_LT_RAW, ROW_LT_CALL };

static const char *row_name(int row) {
  static const char *const names[] = {"raw", "call", "flush", "lt raw", "lt call"};
  return names[row];
}

static ruda_device *dev;
static cublas_dl blas;
static cublaslt_dl lt;
static int have_lt;
static uint32_t blas_lib, lt_lib; /* ruda_library_register's ids */
static ruda_handle rw1, rw2, rb1, rb2;
static int staged_io, use_graphs, in_place = -1; /* -1: the backend's policy */
static int raw_preloaded; /* -P: the raw loop uploads preloaded inputs, receiving none */

typedef struct run_ctx {
  int row, threads;
  size_t n;
  pthread_barrier_t go;
#ifdef RUDA_BENCH_CUDA
  CUcontext cuctx;
  CUfunction f_gelu, f_bias;
  CUdeviceptr dw1, dw2, db1, db2;
  const char *pinned_inputs;
  int pageable; /* raw pg: pageable input and output */
#endif
} run_ctx;

typedef struct thread_arg {
  run_ctx *rc;
  int index;
  uint64_t *lat, done_ns;
} thread_arg;

/* ---- ruda rows ---- */

/* The call rows' libraries: ruda's per-worker state of cuBLAS (a handle
 * bound to the worker's stream) and of cuBLASLt (a handle, a workspace and
 * the shapes' plans), from examples/cublas_dl.h and cublaslt_dl.h. */
static void gemm(ruda_stream_id s, const char *name, ruda_handle x, ruda_handle w, ruda_handle y, cublas_dl_dims g) {
  ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = name, .fn = cublas_dl_call, .user = &blas, .buffers = bufs, .nbuffers = 3, .data = &g,
                      .data_size = sizeof g, .library = blas_lib};
  CHECK(ruda_call(dev, s, &d));
}

static void lt_gemm(ruda_stream_id s, const char *name, ruda_handle x, ruda_handle w, ruda_handle b, ruda_handle y,
                    cublaslt_dl_dims g) {
  CHECK(cublaslt_dl_issue(dev, s, name, cublaslt_dl_call, &lt, lt_lib, x, w, b, y, g));
}

static void bias(ruda_stream_id s, const char *k, ruda_handle v, ruda_handle b, unsigned cols, unsigned n);

/* One request's device work, cuBLAS (with the two kernels) or cuBLASLt. */
static void request_body(int lt_row, ruda_stream_id s, ruda_handle x, ruda_handle h, ruda_handle y) {
  if (lt_row) {
    lt_gemm(s, "lt1", x, rw1, rb1, h, (cublaslt_dl_dims){M, HD, D, CUBLASLT_DL_EPILOGUE_GELU_BIAS});
    lt_gemm(s, "lt2", h, rw2, rb2, y, (cublaslt_dl_dims){M, D, HD, CUBLASLT_DL_EPILOGUE_BIAS});
    return;
  }
  gemm(s, "gemm1", x, rw1, h, (cublas_dl_dims){M, HD, D});
  bias(s, "blas_bias_gelu", h, rb1, HD, HF);
  gemm(s, "gemm2", h, rw2, y, (cublas_dl_dims){M, D, HD});
  bias(s, "blas_bias", y, rb2, D, YF);
}

static void bias(ruda_stream_id s, const char *k, ruda_handle v, ruda_handle b, unsigned cols, unsigned n) {
  ruda_arg a[4] = {ruda_arg_buffer(ruda_bind(v)), ruda_arg_in(ruda_bind(b)), ruda_arg_scalar(&cols, 4),
                   ruda_arg_scalar(&n, 4)};
  ruda_launch_desc l = {.kernel = k, .grid = {(n + 255) / 256, 1, 1}, .block = {256, 1, 1}, .args = a, .nargs = 4};
  CHECK(ruda_launch(dev, s, &l));
}

static void wait_future(ruda_future *f, int thread) {
  ruda_error *err = NULL;
  int rc = ruda_future_wait(f, &err);
  if (rc != 0) {
    fprintf(stderr, "bench_blas: thread %d: %s\n", thread, ruda_err_name(rc));
    ruda_error_print(err, stderr, 0);
    exit(1);
  }
  ruda_future_free(f);
}

static void *ruda_thread(void *p) {
  thread_arg *a = p;
  run_ctx *rc = a->rc;
  const ruda_stream_id s = (ruda_stream_id)a->index;
  ruda_handle x, h, y;
  CHECK(ruda_buffer_create(dev, s, XB, &x));
  CHECK(ruda_buffer_create(dev, s, HB, &h));
  CHECK(ruda_buffer_create(dev, s, YB, &y));
  ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x)), yd = ruda_copy_contiguous(ruda_bind(y));
  float *out = malloc(YB);
  void *gin = NULL, *gout = NULL;
  if (in_place >= 0) CHECK(ruda_stream_set_in_place(dev, s, in_place));
  if (staged_io || use_graphs) {
    CHECK(ruda_staging_alloc(dev, XB, &gin));
    CHECK(ruda_staging_alloc(dev, YB, &gout));
  }
  /* flush row: the caller's own cuBLAS handle on the stream's CUstream. */
  void *own = NULL, *cus = NULL;
  uint64_t px = 0, ph = 0, py = 0, pw1 = 0, pw2 = 0;
  if (rc->row == ROW_FLUSH) {
    CHECK(ruda_cuda_stream(dev, s, &cus));
#ifdef RUDA_BENCH_CUDA
    CU(ruda__cu.cuCtxSetCurrent(rc->cuctx));
#endif
    blas_check("cublasCreate", blas.create(&own));
    blas_check("cublasSetStream", blas.set_stream(own, cus));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(x), &px));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(h), &ph));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(y), &py));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(rw1), &pw1));
    CHECK(ruda_binding_device_ptr(dev, ruda_bind(rw2), &pw2));
  }
  const int lt_row = rc->row == ROW_LT_CALL;
  ruda_graph *g = NULL;
  if (use_graphs) {
    /* The worker's library state is made before the first replay's
     * capture either way (ruda/call.h); the first GEMMs of these shapes
     * load their kernels, which a capture would not allow either. */
    request_body(lt_row, s, x, h, y);
    CHECK(ruda_sync(dev, s, NULL));
    ruda_future *none = NULL;
    CHECK(ruda_graph_begin_capture(dev, s));
    CHECK(ruda_write_staged(dev, s, &xd, gin, XB));
    request_body(lt_row, s, x, h, y);
    CHECK(ruda_read(dev, s, &yd, gout, YB, &none));
    CHECK(ruda_graph_end_capture(dev, s, &g));
  }
  CHECK(ruda_sync(dev, s, NULL));
  for (int phase = 0; phase < 2; phase++) {
    const size_t first = phase ? WARMUP : 0, count = phase ? rc->n : WARMUP;
    if (phase) pthread_barrier_wait(&rc->go);
    for (size_t i = 0; i < count; i++) {
      const size_t r = first + i;
      const float *in = inputs + (size_t)input_of(a->index, r) * XF;
      const float *res = out;
      uint64_t t0;
      if (use_graphs) {
        memcpy(gin, in, XB);
        t0 = mono_ns();
        ruda_error *err = NULL;
        if (ruda_graph_run(dev, s, g, &err) != 0) {
          ruda_error_print(err, stderr, 0);
          exit(1);
        }
        res = gout;
      } else {
        void *blk = NULL; /* -s: the request arrives in page-locked memory, which the write takes */
        if (staged_io) {
          CHECK(ruda_staging_alloc(dev, XB, &blk));
          memcpy(blk, in, XB);
        }
        t0 = mono_ns();
        if (staged_io) {
          CHECK(ruda_write_staged(dev, s, &xd, blk, XB));
        } else {
          CHECK(ruda_write(dev, s, &xd, in, XB));
        }
        if (rc->row != ROW_FLUSH) {
          request_body(lt_row, s, x, h, y);
        } else { /* the flush dance */
          CHECK(ruda_flush(dev, s, NULL));
          blas_check("cublasSgemm", cublas_dl_gemm_rm(&blas, own, M, HD, D, (const float *)(uintptr_t)px,
                                                      (const float *)(uintptr_t)pw1, (float *)(uintptr_t)ph));
          bias(s, "blas_bias_gelu", h, rb1, HD, HF);
          CHECK(ruda_flush(dev, s, NULL));
          blas_check("cublasSgemm", cublas_dl_gemm_rm(&blas, own, M, D, HD, (const float *)(uintptr_t)ph,
                                                      (const float *)(uintptr_t)pw2, (float *)(uintptr_t)py));
          bias(s, "blas_bias", y, rb2, D, YF);
        }
        ruda_future *f = NULL;
        void *dst = staged_io ? gout : (void *)out;
        CHECK(ruda_read(dev, s, &yd, dst, YB, &f));
        wait_future(f, a->index);
        res = dst;
      }
      if (phase) a->lat[i] = mono_ns() - t0;
      if (!phase ? r == 0 : must_check(i)) check_output(row_name(rc->row), a->index, r, res);
    }
  }
  a->done_ns = mono_ns();
  if (g != NULL) CHECK(ruda_graph_destroy(dev, g));
  CHECK(ruda_sync(dev, s, NULL));
  if (own != NULL) blas.destroy(own);
  if (gin != NULL) CHECK(ruda_staging_free(dev, gin));
  if (gout != NULL) CHECK(ruda_staging_free(dev, gout));
  CHECK(ruda_buffer_free(dev, s, x));
  CHECK(ruda_buffer_free(dev, s, h));
  CHECK(ruda_buffer_free(dev, s, y));
  free(out);
  return NULL;
}

/* ---- raw row ---- */

#ifdef RUDA_BENCH_CUDA
static void raw_request(run_ctx *rc, void *hd, cublaslt_ctx *lc, CUstream st, CUdeviceptr x, CUdeviceptr h,
                        CUdeviceptr y, const void *in, float *out) {
  unsigned cols1 = HD, n1 = HF, cols2 = D, n2 = YF;
  void *p1[4] = {&h, &rc->db1, &cols1, &n1}, *p2[4] = {&y, &rc->db2, &cols2, &n2};
  CU(ruda__cu.cuMemcpyHtoDAsync(x, in, XB, st));
  if (lc != NULL) { /* cuBLASLt: the biases and GELU fused into the matmuls */
    blas_check("cublasLtMatmul", cublaslt_gemm_rm(lc, st, M, HD, D, (const float *)(uintptr_t)x,
                                                  (const float *)(uintptr_t)rc->dw1, (const float *)(uintptr_t)rc->db1,
                                                  (float *)(uintptr_t)h, CUBLASLT_DL_EPILOGUE_GELU_BIAS));
    blas_check("cublasLtMatmul", cublaslt_gemm_rm(lc, st, M, D, HD, (const float *)(uintptr_t)h,
                                                  (const float *)(uintptr_t)rc->dw2, (const float *)(uintptr_t)rc->db2,
                                                  (float *)(uintptr_t)y, CUBLASLT_DL_EPILOGUE_BIAS));
    CU(ruda__cu.cuMemcpyDtoHAsync(out, y, YB, st));
    return;
  }
  blas_check("cublasSgemm", cublas_dl_gemm_rm(&blas, hd, M, HD, D, (const float *)(uintptr_t)x,
                                              (const float *)(uintptr_t)rc->dw1, (float *)(uintptr_t)h));
  CU(ruda__cu.cuLaunchKernel(rc->f_gelu, (HF + 255) / 256, 1, 1, 256, 1, 1, 0, st, p1, NULL));
  blas_check("cublasSgemm", cublas_dl_gemm_rm(&blas, hd, M, D, HD, (const float *)(uintptr_t)h,
                                              (const float *)(uintptr_t)rc->dw2, (float *)(uintptr_t)y));
  CU(ruda__cu.cuLaunchKernel(rc->f_bias, (YF + 255) / 256, 1, 1, 256, 1, 1, 0, st, p2, NULL));
  CU(ruda__cu.cuMemcpyDtoHAsync(out, y, YB, st));
}

static void *raw_thread(void *p) {
  thread_arg *a = p;
  run_ctx *rc = a->rc;
  CU(ruda__cu.cuCtxSetCurrent(rc->cuctx));
  CUstream st;
  CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  void *hd = NULL;
  cublaslt_ctx lctx, *lc = NULL;
  if (rc->row == ROW_LT_RAW) {
    blas_check("cublasLtCreate", cublaslt_ctx_init(&lctx, &lt));
    lc = &lctx;
  } else {
    blas_check("cublasCreate", blas.create(&hd));
    blas_check("cublasSetStream", blas.set_stream(hd, st));
  }
  CUdeviceptr x, h, y;
  CU(ruda__cu.cuMemAlloc(&x, XB));
  CU(ruda__cu.cuMemAlloc(&h, HB));
  CU(ruda__cu.cuMemAlloc(&y, YB));
  float *out;
  void *gin;
  CU(ruda__cu.cuMemHostAlloc((void **)&out, YB, 0));
  CU(ruda__cu.cuMemHostAlloc(&gin, XB, 0));
  float *out_pg = rc->pageable ? malloc(YB) : NULL;
  CUgraphExec ge = NULL;
  if (use_graphs) { /* warm the handle first: cuBLAS sets up its workspace outside the capture */
    raw_request(rc, hd, lc, st, x, h, y, rc->pinned_inputs, out);
    CU(ruda__cu.cuStreamSynchronize(st));
    CUgraph graph;
    CU(ruda__cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    raw_request(rc, hd, lc, st, x, h, y, gin, out);
    CU(ruda__cu.cuStreamEndCapture(st, &graph));
    CU(ruda__cu.cuGraphInstantiateWithFlags(&ge, graph, 0));
    CU(ruda__cu.cuGraphDestroy(graph));
  }
  for (int phase = 0; phase < 2; phase++) {
    const size_t first = phase ? WARMUP : 0, count = phase ? rc->n : WARMUP;
    if (phase) pthread_barrier_wait(&rc->go);
    for (size_t i = 0; i < count; i++) {
      const size_t r = first + i;
      const char *in = rc->pinned_inputs + (size_t)input_of(a->index, r) * XB;
      uint64_t t0;
      float *res = out;
      if (use_graphs) {
        memcpy(gin, in, XB);
        t0 = mono_ns();
        CU(ruda__cu.cuGraphLaunch(ge, st));
      } else if (rc->pageable) { /* ruda's pageable rows' memory */
        res = out_pg;
        t0 = mono_ns();
        raw_request(rc, hd, lc, st, x, h, y, inputs + (size_t)input_of(a->index, r) * XF, out_pg);
      } else if (raw_preloaded) {
        t0 = mono_ns();
        raw_request(rc, hd, lc, st, x, h, y, in, out);
      } else { /* the request arrives in its page-locked block, as ruda's -s input does */
        memcpy(gin, in, XB);
        t0 = mono_ns();
        raw_request(rc, hd, lc, st, x, h, y, gin, out);
      }
      CU(ruda__cu.cuStreamSynchronize(st));
      if (phase) a->lat[i] = mono_ns() - t0;
      if (!phase ? r == 0 : must_check(i)) check_output(row_name(rc->row), a->index, r, res);
    }
  }
  a->done_ns = mono_ns();
  if (ge != NULL) CU(ruda__cu.cuGraphExecDestroy(ge));
  if (hd != NULL) blas.destroy(hd);
  if (lc != NULL) cublaslt_ctx_fini(lc);
  free(out_pg);
  CU(ruda__cu.cuMemFreeHost(out));
  CU(ruda__cu.cuMemFreeHost(gin));
  CU(ruda__cu.cuMemFree(x));
  CU(ruda__cu.cuMemFree(h));
  CU(ruda__cu.cuMemFree(y));
  CU(ruda__cu.cuStreamDestroy(st));
  return NULL;
}

static CUfunction raw_function(const char *name) {
  ruda__kernel *k = ruda__kernel_find(dev, name);
  return ((ruda__cu_kernel *)k->impl)->fn;
}
#endif

/* ---- one run ---- */

typedef struct result {
  double rps, p50, p99;
} result;

static uint64_t *lat_all;

/* pageable: a raw row with pageable I/O (raw pg). */
static result run_as(int row, int pageable, int threads, size_t n) {
  run_ctx rc;
  memset(&rc, 0, sizeof rc);
  rc.row = row;
#ifdef RUDA_BENCH_CUDA
  rc.pageable = pageable;
#else
  (void)pageable;
#endif
  rc.threads = threads;
  rc.n = n;
  void *(*fn)(void *) = ruda_thread;
#ifdef RUDA_BENCH_CUDA
  void *c = NULL, *pinned = NULL;
  CHECK(ruda_cuda_context(dev, &c));
  rc.cuctx = (CUcontext)c;
  CU(ruda__cu.cuCtxSetCurrent(rc.cuctx));
  if (row == ROW_RAW || row == ROW_LT_RAW) {
    rc.f_gelu = raw_function("blas_bias_gelu");
    rc.f_bias = raw_function("blas_bias");
    CU(ruda__cu.cuMemHostAlloc(&pinned, (size_t)NIN * XB, 0));
    memcpy(pinned, inputs, (size_t)NIN * XB);
    rc.pinned_inputs = pinned;
    CU(ruda__cu.cuMemAlloc(&rc.dw1, (size_t)D * HD * 4));
    CU(ruda__cu.cuMemAlloc(&rc.dw2, (size_t)HD * D * 4));
    CU(ruda__cu.cuMemAlloc(&rc.db1, sizeof b1));
    CU(ruda__cu.cuMemAlloc(&rc.db2, sizeof b2));
    CU(ruda__cu.cuMemcpyHtoD(rc.dw1, w1, (size_t)D * HD * 4));
    CU(ruda__cu.cuMemcpyHtoD(rc.dw2, w2, (size_t)HD * D * 4));
    CU(ruda__cu.cuMemcpyHtoD(rc.db1, b1, sizeof b1));
    CU(ruda__cu.cuMemcpyHtoD(rc.db2, b2, sizeof b2));
    fn = raw_thread;
  }
#endif
  thread_arg a[MAXT];
  for (int i = 0; i < threads; i++) a[i] = (thread_arg){.rc = &rc, .index = i, .lat = lat_all + (size_t)i * n};
  const uint64_t t0 = bench_threads_run(&rc.go, threads, fn, a, sizeof a[0]);
  uint64_t end = t0;
  for (int i = 0; i < threads; i++)
    if (a[i].done_ns > end) end = a[i].done_ns;
#ifdef RUDA_BENCH_CUDA
  if (row == ROW_RAW || row == ROW_LT_RAW) {
    CU(ruda__cu.cuMemFree(rc.dw1));
    CU(ruda__cu.cuMemFree(rc.dw2));
    CU(ruda__cu.cuMemFree(rc.db1));
    CU(ruda__cu.cuMemFree(rc.db2));
    CU(ruda__cu.cuMemFreeHost(pinned));
  }
#endif
  size_t cnt = n * (size_t)threads;
  qsort(lat_all, cnt, sizeof *lat_all, cmp_u64);
  result r = {(double)cnt / ((double)(end - t0) / 1e9), lat_all[(size_t)(0.5 * (double)(cnt - 1))] / 1e3,
              lat_all[(size_t)(0.99 * (double)(cnt - 1))] / 1e3};
  return r;
}

static result run(int row, int threads, size_t n) { return run_as(row, 0, threads, n); }

static void usage(void) {
  fprintf(stderr,
          "usage: bench_blas [-q] [-g] [-s] [-P] [-i|-I] [-t threads[,threads...]] [-n requests] [-w workers]\n"
          "  -q  quick: 200 requests per thread\n"
          "  -g  each request one graph (ruda: recorded request, ruda_graph_run; raw: a CUDA graph)\n"
          "  -s  ruda's input and output are page-locked staging blocks, as the raw loop's are\n"
          "  -P  the raw loop uploads preloaded page-locked inputs (receives no request)\n"
          "  -i  ruda's streams issue in place (ruda_stream_set_in_place) while their worker is idle\n"
          "  -I  ruda's streams never issue in place: every command goes to the worker\n"
          "  -t  client thread counts (1..%d; default 1,4,16)\n"
          "  -n  timed requests per thread (default 2000)\n"
          "  -w  ruda workers (default: RUDA_STREAMS, else ruda's default)\n",
          MAXT);
}

static void upload(ruda_handle *h, const void *src, size_t len) {
  CHECK(ruda_buffer_create(dev, 0, len, h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(*h));
  CHECK(ruda_write(dev, 0, &d, src, len));
}

int main(int argc, char **argv) {
  int opt, nt = 0, ts[16], quick = 0;
  long nreq = 0;
  uint32_t workers = 0;
  while ((opt = getopt(argc, argv, "gqsPiIt:n:w:")) != -1) {
    if (opt == 'g') use_graphs = 1;
    else if (opt == 'i') in_place = 1;
    else if (opt == 'I') in_place = 0;
    else if (opt == 'q') quick = 1;
    else if (opt == 's') staged_io = 1;
    else if (opt == 'P') raw_preloaded = 1;
    else if (opt == 't') {
      const int k = bench_int_list(optarg, 1, MAXT, ts + nt, 16 - nt); /* each -t adds */
      if (k < 0) {
        usage();
        return 2;
      }
      nt += k;
    } else if (opt == 'n' && atol(optarg) > 0) nreq = atol(optarg);
    else if (opt == 'w' && atoi(optarg) > 0) workers = (uint32_t)atoi(optarg);
    else {
      usage();
      return 2;
    }
  }
  if (optind < argc) {
    usage();
    return 2;
  }
  if (nt == 0) ts[0] = 1, ts[1] = 4, ts[2] = 16, nt = 3;
  const size_t n = nreq ? (size_t)nreq : quick ? 200 : 2000;

  ruda_config cfg;
  ruda_config_init(&cfg);
  if (workers) cfg.num_streams = workers;
  if (cfg.log_level > RUDA_LOG_WARN) cfg.log_level = RUDA_LOG_WARN;
  if (ruda_device_open(&cfg, &dev) != 0) die("ruda_device_open", ruda_error_code(ruda_last_error()));
  const char *why = NULL;
#ifndef RUDA_BENCH_CUDA
  why = "this build has no cuda backend (no CUDA headers at configure)";
#endif
  if (why == NULL && strcmp(ruda_device_backend(dev), "cuda") != 0)
    why = ruda_device_fallback_reason(dev) ? ruda_device_fallback_reason(dev) : "the device opened on the host backend";
  if (why == NULL && cublas_dl_open(&blas) != 0) why = blas.why;
  if (why != NULL) {
    printf("bench_blas: skipped: needs a GPU and cuBLAS: %s\n", why);
    ruda_device_close(dev, NULL);
    return 0;
  }
  ruda_library_desc bl = {.name = "cublas", .create = cublas_dl_state_create, .destroy = cublas_dl_state_destroy,
                          .user = &blas};
  CHECK(ruda_library_register(dev, &bl, &blas_lib));
  const char *lt_why = NULL;
  if (cublaslt_dl_open(&lt) == 0) {
    ruda_library_desc ll = {.name = "cublasLt", .create = cublaslt_dl_state_create,
                            .destroy = cublaslt_dl_state_destroy, .user = &lt};
    CHECK(ruda_library_register(dev, &ll, &lt_lib));
    have_lt = 1;
  } else {
    lt_why = lt.why;
  }
  CHECK(ruda_module_source(dev, "blas.cu", SRC, (const char *const[]){"blas_bias_gelu", "blas_bias"}, 2, NULL));
  make_model();
  upload(&rw1, w1, (size_t)D * HD * 4);
  upload(&rw2, w2, (size_t)HD * D * 4);
  upload(&rb1, b1, sizeof b1);
  upload(&rb2, b2, sizeof b2);
  CHECK(ruda_sync(dev, 0, NULL));
  int maxt = 1;
  for (int i = 0; i < nt; i++) maxt = ts[i] > maxt ? ts[i] : maxt;
  lat_all = malloc((size_t)maxt * n * sizeof *lat_all);

  ruda_device_props props;
  CHECK(ruda_device_get_props(dev, &props));
  char date[64];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
  printf("bench_blas: %s, %u ruda workers, %s; request: upload 32x1024, Sgemm 1024x4096, bias+GELU, Sgemm "
         "4096x1024, bias, download; %zu timed requests per thread after %d warm-up; %s%s%s\n",
         props.name, ruda_device_num_streams(dev), date, n, WARMUP,
         use_graphs ? "each request one graph (ruda_graph_run; raw cuGraphLaunch)" : "one request in flight per thread",
         staged_io && !use_graphs ? "; ruda's I/O page-locked" : "", in_place == 1   ? "; ruda's streams in place"
         : in_place == 0 ? "; ruda's streams never in place"
                         : "");
  /* Pageable ruda rows are also set beside the raw loop on the same
   * pageable memory (raw pg). */
  const int pg = !staged_io && !use_graphs;
  printf("   %3s | %10s %8s %8s | %10s %8s %8s %7s %7s %7s | %10s %8s %8s %7s", "T", "raw req/s", "p50 us",
         "p99 us", "call req/s", "p50 us", "p99 us", "x raw", "p50 x", "p99 x", "flush r/s", "p50 us", "p99 us", "x raw");
  if (pg) printf(" | %10s %8s %8s %7s %7s %7s", "raw pg r/s", "p50 us", "p99 us", "x pg", "p50 x", "p99 x");
  printf("\n");
  for (int i = 0; i < nt; i++) {
    result raw = run(ROW_RAW, ts[i], n), call = run(ROW_CALL, ts[i], n);
    printf("   %3d | %10.0f %8.1f %8.1f | %10.0f %8.1f %8.1f %7.3f %7.3f %7.3f |", ts[i], raw.rps, raw.p50, raw.p99,
           call.rps, call.p50, call.p99, call.rps / raw.rps, call.p50 / raw.p50, call.p99 / raw.p99);
    if (!use_graphs) {
      result fl = run(ROW_FLUSH, ts[i], n);
      printf(" %10.0f %8.1f %8.1f %7.3f", fl.rps, fl.p50, fl.p99, fl.rps / raw.rps);
    } else {
      printf(" %10s", "-");
    }
    if (pg) {
      result rp = run_as(ROW_RAW, 1, ts[i], n);
      printf(" | %10.0f %8.1f %8.1f %7.3f %7.3f %7.3f", rp.rps, rp.p50, rp.p99, call.rps / rp.rps, call.p50 / rp.p50,
             call.p99 / rp.p99);
    }
    printf("\n");
    fflush(stdout);
  }
  if (!have_lt) {
    printf("cuBLASLt (bias+GELU fused): skipped: %s\n", lt_why);
  } else {
    printf("cuBLASLt: upload 32x1024, Lt matmul 1024x4096 + bias+GELU epilogue, Lt matmul 4096x1024 + bias "
           "epilogue, download; %s\n",
           use_graphs ? "each request one graph" : staged_io ? "ruda's I/O page-locked" : "pageable ruda I/O");
    printf("   %3s | %10s %8s %8s | %10s %8s %8s %7s %7s %7s", "T", "lt raw r/s", "p50 us", "p99 us", "lt call r/s",
           "p50 us", "p99 us", "x raw", "p50 x", "p99 x");
    if (pg) printf(" | %10s %8s %8s %7s %7s %7s", "lt raw pg", "p50 us", "p99 us", "x pg", "p50 x", "p99 x");
    printf("\n");
    for (int i = 0; i < nt; i++) {
      result raw = run(ROW_LT_RAW, ts[i], n), call = run(ROW_LT_CALL, ts[i], n);
      printf("   %3d | %10.0f %8.1f %8.1f | %10.0f %8.1f %8.1f %7.3f %7.3f %7.3f", ts[i], raw.rps, raw.p50, raw.p99,
             call.rps, call.p50, call.p99, call.rps / raw.rps, call.p50 / raw.p50, call.p99 / raw.p99);
      if (pg) {
        result rp = run_as(ROW_LT_RAW, 1, ts[i], n);
        printf(" | %10.0f %8.1f %8.1f %7.3f %7.3f %7.3f", rp.rps, rp.p50, rp.p99, call.rps / rp.rps,
               call.p50 / rp.p50, call.p99 / rp.p99);
      }
      printf("\n");
      fflush(stdout);
    }
  }
  CHECK(ruda_buffer_free(dev, 0, rw1));
  CHECK(ruda_buffer_free(dev, 0, rw2));
  CHECK(ruda_buffer_free(dev, 0, rb1));
  CHECK(ruda_buffer_free(dev, 0, rb2));
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    ruda_error_print(errs, stderr, 0);
    return 1;
  }
  unsigned long mm = atomic_load(&mismatches), ck = atomic_load(&checks);
  printf("checked %lu results (row 0) against the CPU reference: %lu mismatches\n", ck, mm);
  free(lat_all);
  free(inputs);
  free(w1);
  free(w2);
  return mm ? 1 : 0;
}

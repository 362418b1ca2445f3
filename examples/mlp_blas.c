#define _POSIX_C_SOURCE 200809L
/* mlp_blas.c - a two-layer MLP served through ruda with a BLAS library's
 * GEMMs as stream commands (ruda_call, ruda/call.h).
 *
 * Request: upload x (ROWS x IN), h = gelu(x W1 + b1), y = h W2 + b2,
 * download y. The GEMMs are library calls on the request's stream: on the
 * cuda backend cublasSgemm on the worker's CUstream (cuBLAS loaded at run
 * time; one handle per worker, ruda's per-worker library state: made on
 * the worker before its first GEMM, destroyed at close after its last);
 * on the host backend a C GEMM stands in for the library, its state a
 * count of the GEMMs its worker ran. The bias kernels
 * are ruda launches between them. W1, W2, b1 and b2 are uploaded once and
 * shared by every stream: the calls and kernels declare them read-only
 * (ruda_arg_in), so requests on different streams read them at once, while
 * ruda orders each GEMM after the upload that wrote its input. Every
 * output is checked against a double-precision CPU reference.
 *
 *   mlp_blas [threads] [requests per thread]
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_dl.h"
#include "ruda/ruda.h"

enum { ROWS = 16, IN = 128, HID = 256, OUT = 32 };

static ruda_device *dev;
static int on_cuda;
static cublas_dl blas;
static uint32_t blas_lib; /* ruda_library_register's id */
static _Atomic long host_gemms; /* the host stand-in's states, summed at destroy */
static float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
static ruda_handle dw1, db1, dw2, db2;

/* ---- the "library" call: y[m x n] = x[m x k] w[k x n], row-major ---- */

typedef struct gemm_dims {
  int m, n, k;
} gemm_dims;

/* The library's per-worker state: a cuBLAS handle bound to the worker's
 * stream (cuda), or a GEMM counter (host). */
static int blas_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)user;
  if (!on_cuda) {
    *state = calloc(1, sizeof(long));
    return *state != NULL ? 0 : 12;
  }
  int st = cublas_dl_bound(&blas, c->cu_stream, state);
  if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasCreate/cublasSetStream: status %d", st);
  return st;
}

/* At close, the worker's work done: cublasDestroy may synchronize. */
static void blas_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)c;
  (void)user;
  if (on_cuda) {
    blas.destroy(state);
  } else {
    atomic_fetch_add(&host_gemms, *(long *)state);
    free(state);
  }
}

static int gemm_call(const ruda_call_ctx *c, void *user) {
  (void)user;
  gemm_dims g;
  memcpy(&g, c->data, sizeof g); /* c->data is aligned: reading it in place would do too */
  const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1);
  float *y = ruda_call_ptr(c, 2);
  if (!on_cuda) { /* the host stand-in */
    for (int r = 0; r < g.m; r++)
      for (int j = 0; j < g.n; j++) {
        float s = 0.0f;
        for (int i = 0; i < g.k; i++) s += x[r * g.k + i] * w[i * g.n + j];
        y[r * g.n + j] = s;
      }
    ++*(long *)c->library;
    return 0;
  }
  int st = cublas_dl_gemm_rm(&blas, c->library, g.m, g.n, g.k, x, w, y);
  if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cuBLAS status %d", st);
  return st;
}

/* ---- bias kernels: v[r][j] += b[j], then gelu when asked ---- */

static const char bias_cuda[] =
    "extern \"C\" __global__ void bias_act(float *v, const float *b, unsigned cols, unsigned n, unsigned gelu) {\n"
    "  unsigned k = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (k >= n) return;\n"
    "  float s = v[k] + b[k % cols];\n"
    "  v[k] = gelu ? 0.5f * s * (1.0f + erff(s * 0.70710678f)) : s;\n"
    "}\n";

static int bias_host(const ruda_host_ctx *c, void *const *a) {
  float *v = a[0];
  const float *b = a[1];
  uint32_t cols = *(const uint32_t *)a[2], n = *(const uint32_t *)a[3], gelu = *(const uint32_t *)a[4];
  uint32_t k = c->block_idx.x * c->block_dim.x + c->thread_idx.x;
  if (k >= n) return 0;
  float s = v[k] + b[k % cols];
  v[k] = gelu ? 0.5f * s * (1.0f + erff(s * 0.70710678f)) : s;
  return 0;
}

/* ---- one request ---- */

static int call3(ruda_stream_id s, const char *name, ruda_handle x, ruda_handle w, ruda_handle y, gemm_dims g) {
  ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = name, .fn = gemm_call, .buffers = bufs, .nbuffers = 3, .data = &g,
                      .data_size = sizeof g, .library = blas_lib};
  return ruda_call(dev, s, &d);
}

static int bias(ruda_stream_id s, ruda_handle v, ruda_handle b, uint32_t cols, uint32_t gelu) {
  uint32_t n = ROWS * cols;
  ruda_arg a[5] = {ruda_arg_buffer(ruda_bind(v)), ruda_arg_in(ruda_bind(b)), ruda_arg_scalar(&cols, 4),
                   ruda_arg_scalar(&n, 4), ruda_arg_scalar(&gelu, 4)};
  ruda_launch_desc l = {.kernel = "bias_act", .grid = {on_cuda ? (n + 127) / 128 : n, 1, 1},
                        .block = {on_cuda ? 128 : 1, 1, 1}, .args = a, .nargs = 5};
  return ruda_launch(dev, s, &l);
}

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void reference(const float *x, double *y) {
  double h[ROWS * HID];
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < HID; j++) {
      double s = b1[j];
      for (int i = 0; i < IN; i++) s += (double)x[r * IN + i] * w1[i * HID + j];
      h[r * HID + j] = 0.5 * s * (1.0 + erf(s * 0.70710678118654752));
    }
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < OUT; j++) {
      double s = b2[j];
      for (int i = 0; i < HID; i++) s += h[r * HID + i] * w2[i * OUT + j];
      y[r * OUT + j] = s;
    }
}

typedef struct thread_arg {
  int index, requests, bad;
  const char *failure;
  char why[256]; /* ruda's message, from this thread's last error */
} thread_arg;

#define TRY(call)                                                                        \
  do {                                                                                   \
    if ((call) != 0) {                                                                   \
      a->failure = #call;                                                                \
      snprintf(a->why, sizeof a->why, "%s", ruda_error_message(ruda_last_error()));     \
      goto out;                                                                          \
    }                                                                                    \
  } while (0)

static void *serve(void *p) {
  thread_arg *a = p;
  ruda_stream_id s = (ruda_stream_id)a->index;
  ruda_handle x = {0, 0}, h = {0, 0}, y = {0, 0};
  TRY(ruda_buffer_create(dev, s, ROWS * IN * 4, &x));
  TRY(ruda_buffer_create(dev, s, ROWS * HID * 4, &h));
  TRY(ruda_buffer_create(dev, s, ROWS * OUT * 4, &y));
  uint64_t seed = 1000 + (uint64_t)a->index;
  for (int r = 0; r < a->requests; r++) {
    float in[ROWS * IN], out[ROWS * OUT];
    double want[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++) in[i] = frand(&seed);
    ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x)), yd = ruda_copy_contiguous(ruda_bind(y));
    TRY(ruda_write(dev, s, &xd, in, sizeof in));
    TRY(call3(s, "gemm1", x, dw1, h, (gemm_dims){ROWS, HID, IN}));
    TRY(bias(s, h, db1, HID, 1));
    TRY(call3(s, "gemm2", h, dw2, y, (gemm_dims){ROWS, OUT, HID}));
    TRY(bias(s, y, db2, OUT, 0));
    ruda_future *f = NULL;
    TRY(ruda_read(dev, s, &yd, out, sizeof out, &f));
    ruda_error *err = NULL;
    int rc = ruda_future_wait(f, &err);
    ruda_future_free(f);
    if (rc != 0) {
      snprintf(a->why, sizeof a->why, "%s", ruda_error_message(ruda_error_cause(err)));
      ruda_error_free(err);
      a->failure = "request";
      goto out;
    }
    reference(in, want);
    for (int i = 0; i < ROWS * OUT; i++)
      if (!(fabs(out[i] - want[i]) <= 1e-3 * fabs(want[i]) + 1e-3)) {
        if (a->bad++ < 3)
          fprintf(stderr, "mlp_blas: thread %d request %d y[%d] = %.6f, expected %.6f\n", a->index, r, i, out[i],
                  want[i]);
      }
  }
out:
  if (x.gen) ruda_buffer_free(dev, s, x);
  if (h.gen) ruda_buffer_free(dev, s, h);
  if (y.gen) ruda_buffer_free(dev, s, y);
  return NULL;
}

static int upload(ruda_handle *out, const float *v, size_t bytes) {
  int rc = ruda_buffer_create(dev, 0, bytes, out);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(*out));
  return rc != 0 ? rc : ruda_write(dev, 0, &d, v, bytes);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 4, requests = argc > 2 ? atoi(argv[2]) : 16;
  if (threads < 1 || threads > 64 || requests < 1) {
    fprintf(stderr, "usage: mlp_blas [threads 1..64] [requests per thread]\n");
    return 2;
  }
  if (ruda_device_open(NULL, &dev) != 0) {
    fprintf(stderr, "mlp_blas: ruda_device_open: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  on_cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
  if (on_cuda && cublas_dl_open(&blas) != 0) {
    printf("mlp_blas: skipped on the cuda backend: %s\n", blas.why);
    ruda_device_close(dev, NULL);
    return 0;
  }
  ruda_library_desc lib = {.name = on_cuda ? "cublas" : "host gemm", .create = blas_create, .destroy = blas_destroy};
  int rc = ruda_library_register(dev, &lib, &blas_lib);
  if (rc == 0) rc = on_cuda ? ruda_kernel_source(dev, "bias_act", bias_cuda, NULL)
                   : ruda_host_kernel_register(dev, "bias_act", bias_host);
  uint64_t seed = 7;
  for (int i = 0; i < IN * HID; i++) w1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID; i++) b1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID * OUT; i++) w2[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < OUT; i++) b2[i] = frand(&seed) * 0.1f;
  if (rc == 0) rc = upload(&dw1, w1, sizeof w1);
  if (rc == 0) rc = upload(&db1, b1, sizeof b1);
  if (rc == 0) rc = upload(&dw2, w2, sizeof w2);
  if (rc == 0) rc = upload(&db2, b2, sizeof b2);
  if (rc != 0) {
    fprintf(stderr, "mlp_blas: setup: %s\n", ruda_error_message(ruda_last_error()));
    ruda_device_close(dev, NULL);
    return 1;
  }
  /* No sync after the uploads: each GEMM is ordered after the write of
   * the weights it reads, whatever stream it runs on. */
  pthread_t t[64];
  thread_arg a[64];
  for (int i = 0; i < threads; i++) {
    a[i] = (thread_arg){.index = i, .requests = requests};
    pthread_create(&t[i], NULL, serve, &a[i]);
  }
  int bad = 0, failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    bad += a[i].bad;
    if (a[i].failure != NULL) {
      fprintf(stderr, "mlp_blas: thread %d: %s failed: %s\n", i, a[i].failure, a[i].why);
      failed = 1;
    }
  }
  ruda_buffer_free(dev, 0, dw1);
  ruda_buffer_free(dev, 0, db1);
  ruda_buffer_free(dev, 0, dw2);
  ruda_buffer_free(dev, 0, db2);
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
    failed = 1;
  }
  /* Close destroyed every worker's state: on host each counted its GEMMs. */
  if (!on_cuda && atomic_load(&host_gemms) != 2L * threads * requests) {
    fprintf(stderr, "mlp_blas: the library states counted %ld GEMMs, %d were issued\n", atomic_load(&host_gemms),
            2 * threads * requests);
    failed = 1;
  }
  printf("mlp_blas: %s backend, %d threads x %d requests, GEMMs through ruda_call (%s): %s, %d outputs wrong\n",
         on_cuda ? "cuda" : "host", threads, requests, on_cuda ? "cuBLAS" : "a C GEMM",
         failed ? "FAILED" : "all served", bad);
  return failed || bad ? 1 : 0;
}

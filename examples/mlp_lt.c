#define _POSIX_C_SOURCE 200809L
/* mlp_lt.c - a two-layer MLP served through ruda with cuBLASLt matmuls
 * whose epilogues do the rest (ruda_call, ruda/call.h): h = GELU(x W1 + b1)
 * and y = h W2 + b2 are one library call each, no kernels between them.
 *
 * Request: upload x (ROWS x IN), the two fused calls, download y; every
 * output is checked against a double-precision CPU reference. The library
 * (cuBLASLt's handle, workspace and per-shape plans, examples/
 * cublaslt_dl.h) is ruda's per-worker state: registered once, made on each
 * worker before its first call, destroyed at close after the worker's
 * last work. On the host backend a C GEMM with the same epilogues stands
 * in for cuBLASLt, its per-worker state a row of accumulators it reuses
 * without a lock (calls holding one worker never run at once). Where the
 * cuda backend has no cuBLASLt the example says so and exits 0.
 *
 *   mlp_lt [threads] [requests per thread]
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublaslt_dl.h"
#include "ruda/ruda.h"

enum { ROWS = 16, IN = 128, HID = 256, OUT = 32 };

static ruda_device *dev;
static int on_cuda;
static cublaslt_dl lt;
static uint32_t lt_lib; /* ruda_library_register's id */
static _Atomic int states_made, states_destroyed;
static float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
static ruda_handle dw1, db1, dw2, db2;

/* ---- the library: per-worker state and the fused call ---- */

typedef struct host_state {
  double acc[HID]; /* one output row's sums, reused by every call of the worker */
} host_state;

static int lt_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)user;
  atomic_fetch_add(&states_made, 1);
  if (!on_cuda) {
    *state = calloc(1, sizeof(host_state));
    return *state != NULL ? 0 : 12;
  }
  /* On the worker, context current, before any capture: cublasLtCreate
   * and the workspace's cuMemAlloc may allocate here. */
  cublaslt_ctx *x = malloc(sizeof *x);
  int st = x != NULL ? cublaslt_ctx_init(x, &lt) : 12;
  if (st != 0) {
    free(x);
    snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasLtCreate or its workspace: status %d", st);
    return st;
  }
  *state = x;
  return 0;
}

/* At close, after the worker's last call: freeing synchronizes, which is
 * allowed here and nowhere inside a call. */
static void lt_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)c;
  (void)user;
  atomic_fetch_add(&states_destroyed, 1);
  if (on_cuda) cublaslt_ctx_fini(state);
  free(state);
}

typedef struct fused_dims {
  int m, n, k, epilogue; /* CUBLASLT_DL_EPILOGUE_GELU_BIAS or _BIAS */
} fused_dims;

static double gelu(double v) { return 0.5 * v * (1.0 + erf(v * 0.70710678118654752)); }

/* y = act(x w + bias): buffers x, w, bias (read), y (written whole). */
static int fused_call(const ruda_call_ctx *c, void *user) {
  (void)user;
  const fused_dims *g = c->data; /* aligned for any type: read in place */
  const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1), *bias = ruda_call_ptr(c, 2);
  float *y = ruda_call_ptr(c, 3);
  if (on_cuda) {
    int st = cublaslt_gemm_rm(c->library, c->cu_stream, g->m, g->n, g->k, x, w, bias, y, g->epilogue);
    if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasLtMatmul: status %d", st);
    return st;
  }
  host_state *hs = c->library;
  for (int r = 0; r < g->m; r++) {
    for (int j = 0; j < g->n; j++) hs->acc[j] = bias[j];
    for (int i = 0; i < g->k; i++)
      for (int j = 0; j < g->n; j++) hs->acc[j] += (double)x[r * g->k + i] * w[i * g->n + j];
    for (int j = 0; j < g->n; j++)
      y[r * g->n + j] = (float)(g->epilogue == CUBLASLT_DL_EPILOGUE_GELU_BIAS ? gelu(hs->acc[j]) : hs->acc[j]);
  }
  return 0;
}

static int fused(ruda_stream_id s, const char *name, ruda_handle x, ruda_handle w, ruda_handle b, ruda_handle y,
                 fused_dims g) {
  ruda_arg bufs[4] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_in(ruda_bind(b)),
                      ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = name, .fn = fused_call, .buffers = bufs, .nbuffers = 4, .data = &g,
                      .data_size = sizeof g, .library = lt_lib};
  return ruda_call(dev, s, &d);
}

/* ---- requests ---- */

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
      h[r * HID + j] = gelu(s);
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
  char why[256];
} thread_arg;

#define TRY(call)                                                                    \
  do {                                                                               \
    if ((call) != 0) {                                                               \
      a->failure = #call;                                                            \
      snprintf(a->why, sizeof a->why, "%s", ruda_error_message(ruda_last_error())); \
      goto out;                                                                      \
    }                                                                                \
  } while (0)

static void *serve(void *p) {
  thread_arg *a = p;
  ruda_stream_id s = (ruda_stream_id)a->index;
  ruda_handle x = {0, 0}, h = {0, 0}, y = {0, 0};
  TRY(ruda_buffer_create(dev, s, ROWS * IN * 4, &x));
  TRY(ruda_buffer_create(dev, s, ROWS * HID * 4, &h));
  TRY(ruda_buffer_create(dev, s, ROWS * OUT * 4, &y));
  uint64_t seed = 2000 + (uint64_t)a->index;
  for (int r = 0; r < a->requests; r++) {
    float in[ROWS * IN], out[ROWS * OUT];
    double want[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++) in[i] = frand(&seed);
    ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x)), yd = ruda_copy_contiguous(ruda_bind(y));
    TRY(ruda_write(dev, s, &xd, in, sizeof in));
    TRY(fused(s, "lt1", x, dw1, db1, h, (fused_dims){ROWS, HID, IN, CUBLASLT_DL_EPILOGUE_GELU_BIAS}));
    TRY(fused(s, "lt2", h, dw2, db2, y, (fused_dims){ROWS, OUT, HID, CUBLASLT_DL_EPILOGUE_BIAS}));
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
    /* cuBLASLt's GELU may use the tanh form: within 1e-3 of erf's here. */
    for (int i = 0; i < ROWS * OUT; i++)
      if (!(fabs(out[i] - want[i]) <= 2e-3 * fabs(want[i]) + 2e-3) && a->bad++ < 3)
        fprintf(stderr, "mlp_lt: thread %d request %d y[%d] = %.6f, expected %.6f\n", a->index, r, i, out[i],
                want[i]);
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
    fprintf(stderr, "usage: mlp_lt [threads 1..64] [requests per thread]\n");
    return 2;
  }
  if (ruda_device_open(NULL, &dev) != 0) {
    fprintf(stderr, "mlp_lt: ruda_device_open: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  on_cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
  if (on_cuda && cublaslt_dl_open(&lt) != 0) {
    printf("mlp_lt: skipped on the cuda backend: %s\n", lt.why);
    ruda_device_close(dev, NULL);
    return 0;
  }
  ruda_library_desc lib = {.name = on_cuda ? "cublasLt" : "host fused gemm", .create = lt_create,
                           .destroy = lt_destroy};
  int rc = ruda_library_register(dev, &lib, &lt_lib);
  uint64_t seed = 11;
  for (int i = 0; i < IN * HID; i++) w1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID; i++) b1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID * OUT; i++) w2[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < OUT; i++) b2[i] = frand(&seed) * 0.1f;
  if (rc == 0) rc = upload(&dw1, w1, sizeof w1);
  if (rc == 0) rc = upload(&db1, b1, sizeof b1);
  if (rc == 0) rc = upload(&dw2, w2, sizeof w2);
  if (rc == 0) rc = upload(&db2, b2, sizeof b2);
  if (rc != 0) {
    fprintf(stderr, "mlp_lt: setup: %s\n", ruda_error_message(ruda_last_error()));
    ruda_device_close(dev, NULL);
    return 1;
  }
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
      fprintf(stderr, "mlp_lt: thread %d: %s failed: %s\n", i, a[i].failure, a[i].why);
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
  /* One state per worker that served a call, each destroyed at close. */
  int made = atomic_load(&states_made), destroyed = atomic_load(&states_destroyed);
  if (made < 1 || made > threads || destroyed != made) {
    fprintf(stderr, "mlp_lt: %d library states made, %d destroyed, for %d threads\n", made, destroyed, threads);
    failed = 1;
  }
  printf("mlp_lt: %s backend, %d threads x %d requests, fused matmuls through ruda_call (%s), %d worker states: "
         "%s, %d outputs wrong\n",
         on_cuda ? "cuda" : "host", threads, requests, on_cuda ? "cuBLASLt" : "a C stand-in", made,
         failed ? "FAILED" : "all served", bad);
  return failed || bad ? 1 : 0;
}

#define _POSIX_C_SOURCE 200809L
/* mlp_lt.c - the MLP of mlp_model.h served through ruda with cuBLASLt
 * matmuls whose epilogues do the rest (ruda_call, ruda/call.h):
 * h = GELU(x W1 + b1) and y = h W2 + b2 are one library call each, no
 * kernels between them.
 *
 * The library (cuBLASLt's handle, workspace and per-shape plans, examples/
 * cublaslt_dl.h) is ruda's per-worker state: registered once, made on
 * each worker before its first call, destroyed at close after the
 * worker's last work. On the host backend a C GEMM with the same
 * epilogues stands in for cuBLASLt, its per-worker state a row of
 * accumulators it reuses without a lock (calls holding one worker never
 * run at once). Where the cuda backend has no cuBLASLt the example says
 * so and exits 0.
 *
 *   mlp_lt [threads] [requests per thread]
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cublaslt_dl.h"
#include "mlp_model.h"

static int on_cuda;
static cublaslt_dl lt;
static uint32_t lt_lib; /* ruda_library_register's id */
static _Atomic int states_made, states_destroyed;

/* ---- the library: per-worker state and the fused call ---- */

typedef struct host_state {
  double acc[HID]; /* one output row's sums, reused by every call of the worker */
} host_state;

static int lt_create(const ruda_call_ctx *c, void *user, void **state) {
  atomic_fetch_add(&states_made, 1);
  if (on_cuda) return cublaslt_dl_state_create(c, user, state); /* allocates: allowed here */
  *state = calloc(1, sizeof(host_state));
  return *state != NULL ? 0 : 12;
}

static void lt_destroy(const ruda_call_ctx *c, void *user, void *state) {
  atomic_fetch_add(&states_destroyed, 1);
  if (on_cuda) cublaslt_dl_state_destroy(c, user, state);
  else free(state);
}

/* y = act(x w + bias): cuBLASLt, or the stand-in. */
static int fused_call(const ruda_call_ctx *c, void *user) {
  if (on_cuda) return cublaslt_dl_call(c, user);
  const cublaslt_dl_dims *g = c->data;
  const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1), *bias = ruda_call_ptr(c, 2);
  float *y = ruda_call_ptr(c, 3);
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

static int request(ruda_device *dev, ruda_stream_id s, ruda_handle x, ruda_handle h, ruda_handle y) {
  int rc = cublaslt_dl_issue(dev, s, "lt1", fused_call, &lt, lt_lib, x, dw1, db1, h,
                             (cublaslt_dl_dims){ROWS, HID, IN, CUBLASLT_DL_EPILOGUE_GELU_BIAS});
  if (rc == 0)
    rc = cublaslt_dl_issue(dev, s, "lt2", fused_call, &lt, lt_lib, h, dw2, db2, y,
                           (cublaslt_dl_dims){ROWS, OUT, HID, CUBLASLT_DL_EPILOGUE_BIAS});
  return rc;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 4, requests = argc > 2 ? atoi(argv[2]) : 16;
  if (threads < 1 || threads > MLP_MAXT || requests < 1) {
    fprintf(stderr, "usage: mlp_lt [threads 1..%d] [requests per thread]\n", MLP_MAXT);
    return 2;
  }
  ruda_device *dev = NULL;
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
                           .destroy = lt_destroy, .user = &lt};
  int bad = 0, failed = 1;
  if (ruda_library_register(dev, &lib, &lt_lib) != 0)
    fprintf(stderr, "mlp_lt: setup: %s\n", ruda_error_message(ruda_last_error()));
  else /* cuBLASLt's GELU may take the tanh form: within 1e-3 of erf's here */
    failed = mlp_serve_all(dev, "mlp_lt", threads, requests, request, 2e-3, &bad);
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

#define _POSIX_C_SOURCE 200809L
/* mlp_blas.c - a two-layer MLP served through ruda with a BLAS library's
 * GEMMs as stream commands (ruda_call, ruda/call.h).
 *
 * Request (mlp_model.h): upload x, h = gelu(x W1 + b1), y = h W2 + b2,
 * download y, checked against a CPU reference. The GEMMs are library
 * calls on the request's stream: on the cuda backend cublasSgemm on the
 * worker's CUstream (cuBLAS loaded at run time; one handle per worker,
 * ruda's per-worker library state: made on the worker before its first
 * GEMM, destroyed at close after its last); on the host backend a C GEMM
 * stands in for the library, its state a count of the GEMMs its worker
 * ran. The bias kernels are ruda launches between them. The weights are
 * shared by every stream: the calls and kernels declare them read-only
 * (ruda_arg_in), so requests on different streams read them at once,
 * while ruda orders each GEMM after the upload that wrote its input.
 *
 *   mlp_blas [threads] [requests per thread]
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cublas_dl.h"
#include "mlp_model.h"

static int on_cuda;
static cublas_dl blas;
static uint32_t blas_lib;       /* ruda_library_register's id */
static _Atomic long host_gemms; /* the host stand-in's states, summed at destroy */

/* ---- the library: per-worker state and the GEMM ---- */

static int host_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)c;
  (void)user;
  *state = calloc(1, sizeof(long));
  return *state != NULL ? 0 : 12;
}

static void host_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)c;
  (void)user;
  atomic_fetch_add(&host_gemms, *(long *)state);
  free(state);
}

/* y[m x n] = x[m x k] w[k x n], row-major: cuBLAS, or the stand-in. */
static int gemm_call(const ruda_call_ctx *c, void *user) {
  if (on_cuda) return cublas_dl_call(c, user);
  const cublas_dl_dims *g = c->data; /* aligned for any type */
  const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1);
  float *y = ruda_call_ptr(c, 2);
  for (int r = 0; r < g->m; r++)
    for (int j = 0; j < g->n; j++) {
      float s = 0.0f;
      for (int i = 0; i < g->k; i++) s += x[r * g->k + i] * w[i * g->n + j];
      y[r * g->n + j] = s;
    }
  ++*(long *)c->library; /* the worker's own: no lock */
  return 0;
}

static int gemm(ruda_device *dev, ruda_stream_id s, const char *name, ruda_handle x, ruda_handle w, ruda_handle y,
                cublas_dl_dims g) {
  ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = name, .fn = gemm_call, .user = &blas, .buffers = bufs, .nbuffers = 3, .data = &g,
                      .data_size = sizeof g, .library = blas_lib};
  return ruda_call(dev, s, &d);
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

static int bias(ruda_device *dev, ruda_stream_id s, ruda_handle v, ruda_handle b, uint32_t cols, uint32_t gelu) {
  uint32_t n = ROWS * cols;
  ruda_arg a[5] = {ruda_arg_buffer(ruda_bind(v)), ruda_arg_in(ruda_bind(b)), ruda_arg_scalar(&cols, 4),
                   ruda_arg_scalar(&n, 4), ruda_arg_scalar(&gelu, 4)};
  ruda_launch_desc l = {.kernel = "bias_act", .grid = {on_cuda ? (n + 127) / 128 : n, 1, 1},
                        .block = {on_cuda ? 128 : 1, 1, 1}, .args = a, .nargs = 5};
  return ruda_launch(dev, s, &l);
}

/* ---- one request ---- */

static int request(ruda_device *dev, ruda_stream_id s, ruda_handle x, ruda_handle h, ruda_handle y) {
  int rc = gemm(dev, s, "gemm1", x, dw1, h, (cublas_dl_dims){ROWS, HID, IN});
  if (rc == 0) rc = bias(dev, s, h, db1, HID, 1);
  if (rc == 0) rc = gemm(dev, s, "gemm2", h, dw2, y, (cublas_dl_dims){ROWS, OUT, HID});
  if (rc == 0) rc = bias(dev, s, y, db2, OUT, 0);
  return rc;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 4, requests = argc > 2 ? atoi(argv[2]) : 16;
  if (threads < 1 || threads > MLP_MAXT || requests < 1) {
    fprintf(stderr, "usage: mlp_blas [threads 1..%d] [requests per thread]\n", MLP_MAXT);
    return 2;
  }
  ruda_device *dev = NULL;
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
  ruda_library_desc lib = {.name = on_cuda ? "cublas" : "host gemm",
                           .create = on_cuda ? cublas_dl_state_create : host_create,
                           .destroy = on_cuda ? cublas_dl_state_destroy : host_destroy,
                           .user = &blas};
  int rc = ruda_library_register(dev, &lib, &blas_lib);
  if (rc == 0)
    rc = on_cuda ? ruda_kernel_source(dev, "bias_act", bias_cuda, NULL)
                 : ruda_host_kernel_register(dev, "bias_act", bias_host);
  int bad = 0, failed = 1;
  if (rc != 0) fprintf(stderr, "mlp_blas: setup: %s\n", ruda_error_message(ruda_last_error()));
  else failed = mlp_serve_all(dev, "mlp_blas", threads, requests, request, 1e-3, &bad);
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
    failed = 1;
  }
  /* Close destroyed every worker's state: on host each counted its GEMMs. */
  if (!on_cuda && !failed && atomic_load(&host_gemms) != 2L * threads * requests) {
    fprintf(stderr, "mlp_blas: the library states counted %ld GEMMs, %d were issued\n", atomic_load(&host_gemms),
            2 * threads * requests);
    failed = 1;
  }
  printf("mlp_blas: %s backend, %d threads x %d requests, GEMMs through ruda_call (%s): %s, %d outputs wrong\n",
         on_cuda ? "cuda" : "host", threads, requests, on_cuda ? "cuBLAS" : "a C GEMM",
         failed ? "FAILED" : "all served", bad);
  return failed || bad ? 1 : 0;
}

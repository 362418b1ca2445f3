/* cublas_dl.h - the few cuBLAS entry points the examples and bench_blas
 * use, loaded at run time (dlopen), so building needs no cuBLAS headers or
 * library. The types are cuBLAS's own ABI: handles are pointers, enums
 * ints, cudaStream_t is a CUstream. cublasDestroy synchronizes the device:
 * call it from a ruda library's destroy (ruda/call.h), never in a call. */
#ifndef RUDA_EXAMPLES_CUBLAS_DL_H
#define RUDA_EXAMPLES_CUBLAS_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "ruda/ruda.h"

typedef struct cublas_dl {
  void *lib;
  int (*create)(void **handle);
  int (*destroy)(void *handle);
  int (*set_stream)(void *handle, void *stream);
  int (*sgemm)(void *handle, int transa, int transb, int m, int n, int k, const float *alpha, const float *a,
               int lda, const float *b, int ldb, const float *beta, float *c, int ldc);
  char why[160]; /* when it failed to load */
} cublas_dl;

#define CUBLAS_DL_OP_N 0

/* Loads cuBLAS (the newest soname found first, then RUDA_CUBLAS if set).
 * 0, or -1 with b->why saying what was missing. */
static int cublas_dl_open(cublas_dl *b) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"};
  const char *env = getenv("RUDA_CUBLAS");
  b->lib = env != NULL && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; b->lib == NULL && i < sizeof names / sizeof names[0]; i++)
    b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (b->lib == NULL) {
    snprintf(b->why, sizeof b->why, "no cuBLAS library (libcublas.so.13/12/11; set RUDA_CUBLAS=path)");
    return -1;
  }
  *(void **)&b->create = dlsym(b->lib, "cublasCreate_v2");
  *(void **)&b->destroy = dlsym(b->lib, "cublasDestroy_v2");
  *(void **)&b->set_stream = dlsym(b->lib, "cublasSetStream_v2");
  *(void **)&b->sgemm = dlsym(b->lib, "cublasSgemm_v2");
  if (b->create == NULL || b->destroy == NULL || b->set_stream == NULL || b->sgemm == NULL) {
    snprintf(b->why, sizeof b->why, "cuBLAS lacks cublasCreate_v2/cublasSetStream_v2/cublasSgemm_v2");
    dlclose(b->lib);
    b->lib = NULL;
    return -1;
  }
  return 0;
}

/* Row-major y[m x n] = x[m x k] w[k x n] (all dense) in cuBLAS's column-
 * major terms: y^T = w^T x^T, i.e. no transposes with the operands swapped. */
static int cublas_dl_gemm_rm(const cublas_dl *b, void *h, int m, int n, int k, const float *x, const float *w,
                             float *y) {
  const float one = 1.0f, zero = 0.0f;
  return b->sgemm(h, CUBLAS_DL_OP_N, CUBLAS_DL_OP_N, n, m, k, &one, w, n, x, k, &zero, y, n);
}

/* A handle bound to stream, for one user at a time (a ruda worker: the
 * create of a library registered with ruda_library_register, whose
 * worker's stream never changes, so the handle is bound once). 0, or
 * cuBLAS's status (nothing kept then). */
static int cublas_dl_bound(const cublas_dl *b, void *stream, void **h) {
  int st = b->create(h);
  if (st == 0 && (st = b->set_stream(*h, stream)) != 0) {
    b->destroy(*h);
    *h = NULL;
  }
  return st;
}

/* ---- as a ruda library (ruda_library_register, ruda/call.h); user: the
 * loaded cublas_dl ---- */

/* create: the worker's handle, bound to its stream once. */
static int cublas_dl_state_create(const ruda_call_ctx *c, void *user, void **state) {
  int st = cublas_dl_bound(user, c->cu_stream, state);
  if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasCreate/cublasSetStream: status %d", st);
  return st;
}

/* destroy, at close: cublasDestroy synchronizes, which is allowed there. */
static void cublas_dl_state_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)c;
  ((const cublas_dl *)user)->destroy(state);
}

typedef struct cublas_dl_dims {
  int m, n, k;
} cublas_dl_dims;

/* A ruda_call function: cublas_dl_gemm_rm with data's dims, buffers x, w
 * (ruda_arg_in) and y (ruda_arg_out: beta is 0), the worker's handle. */
static int cublas_dl_call(const ruda_call_ctx *c, void *user) {
  const cublas_dl_dims *g = c->data; /* aligned for any type */
  int st = cublas_dl_gemm_rm(user, c->library, g->m, g->n, g->k, ruda_call_ptr(c, 0), ruda_call_ptr(c, 1),
                             ruda_call_ptr(c, 2));
  if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasSgemm: status %d", st);
  return st;
}

#endif /* RUDA_EXAMPLES_CUBLAS_DL_H */

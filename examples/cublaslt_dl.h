/* cublaslt_dl.h - the cuBLASLt entry points the examples and bench_blas
 * use for a GEMM with a fused epilogue (bias, bias + GELU), loaded at run
 * time (dlopen), so building needs no cuBLAS headers or library. The
 * types are cuBLASLt's own ABI: handles and descriptors are pointers,
 * enums ints, the algorithm an opaque 64-byte block; the constants are
 * those of CUDA 13's cublasLt.h (tests/unit/cublaslt_abi.c compares them
 * where that header is installed). The device workspace comes from the
 * driver (cuMemAlloc, libcuda.so.1), which cuBLASLt needs anyway.
 *
 * One cublaslt_ctx per worker (or per raw thread): a handle, a workspace
 * and the plans (descriptors, layouts, chosen algorithm) of the shapes it
 * ran, so a request pays for none of them. Not thread-safe: one user at a
 * time, as ruda's per-worker library state guarantees (ruda/call.h). */
#ifndef RUDA_EXAMPLES_CUBLASLT_DL_H
#define RUDA_EXAMPLES_CUBLASLT_DL_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/ruda.h"

/* cublasLt.h's values. */
enum {
  CUBLASLT_DL_R_32F = 0,                    /* cudaDataType CUDA_R_32F */
  CUBLASLT_DL_COMPUTE_32F = 68,             /* cublasComputeType_t CUBLAS_COMPUTE_32F */
  CUBLASLT_DL_DESC_EPILOGUE = 7,            /* CUBLASLT_MATMUL_DESC_EPILOGUE (uint32_t) */
  CUBLASLT_DL_DESC_BIAS_POINTER = 8,        /* CUBLASLT_MATMUL_DESC_BIAS_POINTER (void *) */
  CUBLASLT_DL_PREF_MAX_WORKSPACE_BYTES = 1, /* CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64_t) */
  CUBLASLT_DL_EPILOGUE_BIAS = 4,            /* CUBLASLT_EPILOGUE_BIAS */
  CUBLASLT_DL_EPILOGUE_GELU_BIAS = 36       /* CUBLASLT_EPILOGUE_GELU_BIAS (GELU 32 | BIAS 4) */
};

typedef struct cublaslt_dl_algo {
  uint64_t data[8];
} cublaslt_dl_algo;

/* cublasLtMatmulHeuristicResult_t. */
typedef struct cublaslt_dl_heur {
  cublaslt_dl_algo algo;
  size_t workspace_size;
  int state;
  float waves;
  int reserved[4];
} cublaslt_dl_heur;

typedef struct cublaslt_dl {
  void *lib, *cuda;
  int (*create)(void **handle);
  int (*destroy)(void *handle);
  int (*desc_create)(void **desc, int compute, int scale);
  int (*desc_destroy)(void *desc);
  int (*desc_set)(void *desc, int attr, const void *buf, size_t size);
  int (*layout_create)(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
  int (*layout_destroy)(void *layout);
  int (*pref_create)(void **pref);
  int (*pref_destroy)(void *pref);
  int (*pref_set)(void *pref, int attr, const void *buf, size_t size);
  int (*heuristic)(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref, int n,
                   cublaslt_dl_heur *out, int *found);
  int (*matmul)(void *handle, void *desc, const void *alpha, const void *a, void *adesc, const void *b, void *bdesc,
                const void *beta, const void *c, void *cdesc, void *d, void *ddesc, const cublaslt_dl_algo *algo,
                void *workspace, size_t workspace_size, void *stream);
  int (*mem_alloc)(uint64_t *ptr, size_t bytes); /* cuMemAlloc_v2 */
  int (*mem_free)(uint64_t ptr);                 /* cuMemFree_v2 */
  char why[160];                                 /* when it failed to load */
} cublaslt_dl;

/* Loads cuBLASLt (the newest soname first, then RUDA_CUBLASLT if set) and
 * the driver's allocator. 0, or -1 with b->why saying what was missing. */
static int cublaslt_dl_open(cublaslt_dl *b) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11",
                                      "libcublasLt.so"};
  memset(b, 0, sizeof *b);
  const char *env = getenv("RUDA_CUBLASLT");
  b->lib = env != NULL && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; b->lib == NULL && i < sizeof names / sizeof names[0]; i++)
    b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  b->cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (b->lib == NULL || b->cuda == NULL) {
    snprintf(b->why, sizeof b->why, "%s", b->lib == NULL ? "no cuBLASLt library (libcublasLt.so.13/12/11; set "
                                                           "RUDA_CUBLASLT=path)"
                                                         : "no CUDA driver (libcuda.so.1)");
    if (b->lib != NULL) dlclose(b->lib);
    if (b->cuda != NULL) dlclose(b->cuda);
    b->lib = b->cuda = NULL;
    return -1;
  }
  struct {
    void **fn;
    void *from;
    const char *name;
  } want[] = {
      {(void **)&b->create, b->lib, "cublasLtCreate"},
      {(void **)&b->destroy, b->lib, "cublasLtDestroy"},
      {(void **)&b->desc_create, b->lib, "cublasLtMatmulDescCreate"},
      {(void **)&b->desc_destroy, b->lib, "cublasLtMatmulDescDestroy"},
      {(void **)&b->desc_set, b->lib, "cublasLtMatmulDescSetAttribute"},
      {(void **)&b->layout_create, b->lib, "cublasLtMatrixLayoutCreate"},
      {(void **)&b->layout_destroy, b->lib, "cublasLtMatrixLayoutDestroy"},
      {(void **)&b->pref_create, b->lib, "cublasLtMatmulPreferenceCreate"},
      {(void **)&b->pref_destroy, b->lib, "cublasLtMatmulPreferenceDestroy"},
      {(void **)&b->pref_set, b->lib, "cublasLtMatmulPreferenceSetAttribute"},
      {(void **)&b->heuristic, b->lib, "cublasLtMatmulAlgoGetHeuristic"},
      {(void **)&b->matmul, b->lib, "cublasLtMatmul"},
      {(void **)&b->mem_alloc, b->cuda, "cuMemAlloc_v2"},
      {(void **)&b->mem_free, b->cuda, "cuMemFree_v2"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if ((*want[i].fn = dlsym(want[i].from, want[i].name)) == NULL) {
      snprintf(b->why, sizeof b->why, "cuBLASLt or the driver lacks %s", want[i].name);
      dlclose(b->lib);
      dlclose(b->cuda);
      b->lib = b->cuda = NULL;
      return -1;
    }
  return 0;
}

/* One shape's plan: y[m x n] = act(x[m x k] w[k x n] + bias), row-major,
 * in cuBLASLt's column-major terms y^T = w^T x^T: A = w (n x k), B = x
 * (k x m), D = y (n x m), the bias along D's rows (y's columns). */
typedef struct cublaslt_plan {
  int m, n, k, epilogue, ready;
  void *desc, *a, *b, *d;
  cublaslt_dl_algo algo;
} cublaslt_plan;

enum { CUBLASLT_PLANS = 8, CUBLASLT_WORKSPACE = 4 << 20 };

typedef struct cublaslt_ctx {
  const cublaslt_dl *lt;
  void *handle;
  uint64_t workspace;
  cublaslt_plan plans[CUBLASLT_PLANS];
} cublaslt_ctx;

/* A handle and a workspace, on the thread with the device's context
 * current. 0, or cuBLASLt's (or the driver's) status; nothing kept then. */
static int cublaslt_ctx_init(cublaslt_ctx *c, const cublaslt_dl *lt) {
  memset(c, 0, sizeof *c);
  c->lt = lt;
  int st = lt->create(&c->handle);
  if (st == 0 && (st = lt->mem_alloc(&c->workspace, CUBLASLT_WORKSPACE)) != 0) {
    lt->destroy(c->handle);
    c->handle = NULL;
  }
  return st;
}

static void cublaslt_plan_free(const cublaslt_dl *lt, cublaslt_plan *p) {
  if (p->desc != NULL) lt->desc_destroy(p->desc);
  if (p->a != NULL) lt->layout_destroy(p->a);
  if (p->b != NULL) lt->layout_destroy(p->b);
  if (p->d != NULL) lt->layout_destroy(p->d);
  memset(p, 0, sizeof *p);
}

/* Frees the plans, the workspace and the handle. Synchronizes (cuMemFree
 * waits for the device), so never inside a ruda call: in a library's
 * destroy. */
static void cublaslt_ctx_fini(cublaslt_ctx *c) {
  for (int i = 0; i < CUBLASLT_PLANS; i++) cublaslt_plan_free(c->lt, &c->plans[i]);
  if (c->workspace != 0) c->lt->mem_free(c->workspace);
  if (c->handle != NULL) c->lt->destroy(c->handle);
  memset(c, 0, sizeof *c);
}

/* The plan of a shape, made at its first use (host work only: no device
 * memory, so a first use inside a capture is fine). NULL with *st set
 * when cuBLASLt refuses it or the cache is full. */
static cublaslt_plan *cublaslt_plan_of(cublaslt_ctx *c, int m, int n, int k, int epilogue, int *st) {
  const cublaslt_dl *lt = c->lt;
  cublaslt_plan *p = NULL;
  for (int i = 0; i < CUBLASLT_PLANS && p == NULL; i++) {
    cublaslt_plan *q = &c->plans[i];
    if (q->ready && q->m == m && q->n == n && q->k == k && q->epilogue == epilogue) return q;
    if (!q->ready) p = q;
  }
  if (p == NULL) {
    *st = 7; /* CUBLAS_STATUS_INVALID_VALUE: more shapes than the cache holds */
    return NULL;
  }
  p->m = m, p->n = n, p->k = k, p->epilogue = epilogue;
  const uint32_t epi = (uint32_t)epilogue;
  const uint64_t ws = CUBLASLT_WORKSPACE;
  void *pref = NULL;
  cublaslt_dl_heur h;
  int found = 0;
  if ((*st = lt->desc_create(&p->desc, CUBLASLT_DL_COMPUTE_32F, CUBLASLT_DL_R_32F)) == 0 &&
      (*st = lt->desc_set(p->desc, CUBLASLT_DL_DESC_EPILOGUE, &epi, sizeof epi)) == 0 &&
      (*st = lt->layout_create(&p->a, CUBLASLT_DL_R_32F, (uint64_t)n, (uint64_t)k, n)) == 0 &&
      (*st = lt->layout_create(&p->b, CUBLASLT_DL_R_32F, (uint64_t)k, (uint64_t)m, k)) == 0 &&
      (*st = lt->layout_create(&p->d, CUBLASLT_DL_R_32F, (uint64_t)n, (uint64_t)m, n)) == 0 &&
      (*st = lt->pref_create(&pref)) == 0 &&
      (*st = lt->pref_set(pref, CUBLASLT_DL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) == 0 &&
      (*st = lt->heuristic(c->handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &h, &found)) == 0 && found < 1)
    *st = 15; /* CUBLAS_STATUS_NOT_SUPPORTED: no algorithm for the shape */
  if (pref != NULL) lt->pref_destroy(pref);
  if (*st != 0) {
    cublaslt_plan_free(lt, p);
    return NULL;
  }
  p->algo = h.algo;
  p->ready = 1;
  return p;
}

/* Row-major y[m x n] = act(x[m x k] w[k x n] + bias[n]) on stream, act by
 * epilogue (CUBLASLT_DL_EPILOGUE_BIAS: none, _GELU_BIAS: GELU). y is
 * written only (beta 0). 0, or cuBLASLt's status. */
static int cublaslt_gemm_rm(cublaslt_ctx *c, void *stream, int m, int n, int k, const float *x, const float *w,
                            const float *bias, float *y, int epilogue) {
  int st = 0;
  cublaslt_plan *p = cublaslt_plan_of(c, m, n, k, epilogue, &st);
  if (p == NULL) return st;
  /* The bias address is the descriptor's: set at every call (a host
   * store), so one plan serves any bias buffer. */
  if ((st = c->lt->desc_set(p->desc, CUBLASLT_DL_DESC_BIAS_POINTER, &bias, sizeof bias)) != 0) return st;
  const float one = 1.0f, zero = 0.0f;
  return c->lt->matmul(c->handle, p->desc, &one, w, p->a, x, p->b, &zero, y, p->d, y, p->d, &p->algo,
                       (void *)(uintptr_t)c->workspace, CUBLASLT_WORKSPACE, stream);
}

/* ---- as a ruda library (ruda_library_register, ruda/call.h); user: the
 * loaded cublaslt_dl ---- */

/* create: the worker's cublaslt_ctx (a handle and a workspace). */
static int cublaslt_dl_state_create(const ruda_call_ctx *c, void *user, void **state) {
  cublaslt_ctx *x = malloc(sizeof *x);
  int st = x != NULL ? cublaslt_ctx_init(x, user) : 12;
  if (st != 0) {
    free(x);
    snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasLtCreate or its workspace: status %d", st);
    return st;
  }
  *state = x;
  return 0;
}

/* destroy, at close: freeing the workspace synchronizes, allowed there. */
static void cublaslt_dl_state_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)c;
  (void)user;
  cublaslt_ctx_fini(state);
  free(state);
}

typedef struct cublaslt_dl_dims {
  int m, n, k, epilogue;
} cublaslt_dl_dims;

/* A ruda_call function: cublaslt_gemm_rm with data's dims on the worker's
 * context and stream; buffers x, w, bias, y. */
static int cublaslt_dl_call(const ruda_call_ctx *c, void *user) {
  (void)user;
  const cublaslt_dl_dims *g = c->data; /* aligned for any type */
  int st = cublaslt_gemm_rm(c->library, c->cu_stream, g->m, g->n, g->k, ruda_call_ptr(c, 0), ruda_call_ptr(c, 1),
                            ruda_call_ptr(c, 2), ruda_call_ptr(c, 3), g->epilogue);
  if (st != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cublasLtMatmul: status %d", st);
  return st;
}

/* Issues fn (cublaslt_dl_call, or a stand-in taking the same buffers) on
 * s: x, w and the bias are read (ruda_arg_in), y written whole
 * (ruda_arg_out: beta is 0). ruda_call's return. */
static int cublaslt_dl_issue(ruda_device *dev, ruda_stream_id s, const char *name, ruda_call_fn fn, void *user,
                             uint32_t library, ruda_handle x, ruda_handle w, ruda_handle bias, ruda_handle y,
                             cublaslt_dl_dims g) {
  ruda_arg bufs[4] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)), ruda_arg_in(ruda_bind(bias)),
                      ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = name, .fn = fn, .user = user, .buffers = bufs, .nbuffers = 4, .data = &g,
                      .data_size = sizeof g, .library = library};
  return ruda_call(dev, s, &d);
}

#endif /* RUDA_EXAMPLES_CUBLASLT_DL_H */

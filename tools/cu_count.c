/* cu_count.c - a stand-in libcuda that counts and times the driver calls
 * ruda makes, by thread kind, and forwards them to the real driver.
 *
 * Diagnostic, not part of the library. Build and use:
 *   cc -O2 -shared -fPIC -o cu_count.so tools/cu_count.c -ldl -I<cuda>/include
 *   RUDA_CUDA_DRIVER=$PWD/cu_count.so bench/bench_serve -v 1 -t 4 -n 2048
 * At exit it prints, per thread name (ruda-w3 counts as "ruda-w") and per
 * call, the number of calls, their mean duration, the longest and how
 * many took over a millisecond. CU_COUNT_REAL names
 * the real driver (default libcuda.so.1). Only the calls listed below are
 * wrapped; every other symbol is the real driver's. ruda's loader asks
 * for symbols through cuGetProcAddress_v2, which is what this intercepts.
 * Thread-safe: counters are per thread, merged at exit under a lock. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALLS(X)                                                                                   \
  X(cuLaunchKernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                     unsigned bz, unsigned sh, CUstream s, void **p, void **e),                    \
    (f, gx, gy, gz, bx, by, bz, sh, s, p, e))                                                      \
  X(cuEventRecord, (CUevent e, CUstream s), (e, s))                                                \
  X(cuEventQuery, (CUevent e), (e))                                                                \
  X(cuEventSynchronize, (CUevent e), (e))                                                          \
  X(cuEventCreate, (CUevent * e, unsigned f), (e, f))                                              \
  X(cuStreamSynchronize, (CUstream s), (s))                                                        \
  X(cuStreamQuery, (CUstream s), (s))                                                              \
  X(cuStreamWaitEvent, (CUstream s, CUevent e, unsigned f), (s, e, f))                             \
  X(cuMemcpyHtoDAsync, (CUdeviceptr d, const void *h, size_t n, CUstream s), (d, h, n, s))         \
  X(cuMemcpyDtoHAsync, (void *h, CUdeviceptr d, size_t n, CUstream s), (h, d, n, s))               \
  X(cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s))                                            \
  X(cuCtxGetCurrent, (CUcontext * c), (c))                                                         \
  X(cuCtxSetCurrent, (CUcontext c), (c))                                                           \
  X(cuMemAlloc, (CUdeviceptr * p, size_t n), (p, n))                                               \
  X(cuMemHostAlloc, (void **p, size_t n, unsigned f), (p, n, f))                                   \
  X(cuGraphExecKernelNodeSetParams, (CUgraphExec g, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *k), \
    (g, n, k))                                                                                     \
  X(cuGraphExecMemcpyNodeSetParams,                                                                \
    (CUgraphExec g, CUgraphNode n, const CUDA_MEMCPY3D *c, CUcontext x), (g, n, c, x))

enum {
#define X(name, params, args) I_##name,
  CALLS(X)
#undef X
      NCALLS
};
static const char *const names[] = {
#define X(name, params, args) #name,
    CALLS(X)
#undef X
};

typedef struct tstats {
  char kind[16];
  unsigned named; /* calls that read the name: a thread may name itself after its first calls */
  uint64_t n[NCALLS], ns[NCALLS], mx[NCALLS], over[NCALLS]; /* over: calls longer than 1 ms */
  struct tstats *next;
} tstats;

static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static tstats *all;
static __thread tstats *mine;

static void read_kind(tstats *t) {
  char name[16] = "";
  pthread_getname_np(pthread_self(), name, sizeof name);
  /* "ruda-w12" -> "ruda-w": one row per kind of thread. */
  size_t k = strlen(name);
  while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9') k--;
  memset(t->kind, 0, sizeof t->kind);
  memcpy(t->kind, name, k);
}

static tstats *me(void) {
  if (mine != NULL) {
    if (mine->named < 64) mine->named++, read_kind(mine);
    return mine;
  }
  tstats *t = calloc(1, sizeof *t);
  read_kind(t);
  pthread_mutex_lock(&all_lock);
  t->next = all;
  all = t;
  pthread_mutex_unlock(&all_lock);
  return mine = t;
}

static uint64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define X(name, params, args)                                                                      \
  static CUresult(CUDAAPI *real_##name) params;                                                    \
  static CUresult CUDAAPI wrap_##name params {                                                     \
    tstats *t = me();                                                                              \
    uint64_t t0 = now();                                                                           \
    CUresult r = real_##name args;                                                                 \
    const uint64_t dt_ = now() - t0;                                                               \
    t->ns[I_##name] += dt_;                                                                        \
    t->n[I_##name]++;                                                                              \
    if (dt_ > t->mx[I_##name]) t->mx[I_##name] = dt_;                                              \
    if (dt_ > 1000000) t->over[I_##name]++;                                                        \
    return r;                                                                                      \
  }
CALLS(X)
#undef X

static void *lib;
static CUresult(CUDAAPI *real_getproc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static CUresult(CUDAAPI *real_getver)(int *);

static void load(void) {
  if (lib != NULL) return;
  const char *p = getenv("CU_COUNT_REAL");
  lib = dlopen(p && *p ? p : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "cu_count: %s\n", dlerror());
    exit(3);
  }
  void *g = dlsym(lib, "cuGetProcAddress_v2"), *v = dlsym(lib, "cuDriverGetVersion");
  memcpy(&real_getproc, &g, sizeof g);
  memcpy(&real_getver, &v, sizeof v);
}

CUresult CUDAAPI cuDriverGetVersion(int *v) {
  load();
  return real_getver(v);
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *q) {
  load();
  CUresult r = real_getproc(sym, pfn, ver, flags, q);
  if (r != CUDA_SUCCESS || *pfn == NULL) return r;
#define X(name, params, args)                                                                      \
  if (strcmp(sym, #name) == 0) {                                                                   \
    memcpy(&real_##name, pfn, sizeof *pfn);                                                        \
    *pfn = (void *)wrap_##name;                                                                    \
    return r;                                                                                      \
  }
  CALLS(X)
#undef X
  return r;
}

__attribute__((destructor)) static void report(void) {
  pthread_mutex_lock(&all_lock);
  /* Merge threads of one kind. */
  for (tstats *a = all; a != NULL; a = a->next) {
    if (a->kind[0] == 1) continue;
    uint64_t n[NCALLS], ns[NCALLS], mx[NCALLS], over[NCALLS];
    memcpy(n, a->n, sizeof n);
    memcpy(ns, a->ns, sizeof ns);
    memcpy(mx, a->mx, sizeof mx);
    memcpy(over, a->over, sizeof over);
    int threads = 1;
    for (tstats *b = a->next; b != NULL; b = b->next)
      if (b->kind[0] != 1 && strcmp(a->kind, b->kind) == 0) {
        for (int i = 0; i < NCALLS; i++) {
          n[i] += b->n[i], ns[i] += b->ns[i], over[i] += b->over[i];
          if (b->mx[i] > mx[i]) mx[i] = b->mx[i];
        }
        b->kind[0] = 1; /* merged */
        threads++;
      }
    for (int i = 0; i < NCALLS; i++)
      if (n[i] != 0)
        fprintf(stderr, "cu_count %-12s threads %3d %-32s calls %10llu mean %8.0f ns longest %8.3f ms, %llu over 1 ms\n",
                a->kind[0] ? a->kind : "(unnamed)", threads, names[i], (unsigned long long)n[i],
                (double)ns[i] / (double)n[i], (double)mx[i] / 1e6, (unsigned long long)over[i]);
  }
  pthread_mutex_unlock(&all_lock);
}

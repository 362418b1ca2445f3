#define _GNU_SOURCE
/* bench_comm.c - all-reduce between two GPUs: ruda_all_reduce beside NCCL
 * called directly, in one process.
 *
 *   bench_comm [iterations]
 *
 * f32 sum, in place, sizes 1 MiB .. 256 MiB. ruda: each rank enqueues
 * `iterations` all-reduces, then ruda_comm_sync on both. Raw: the same
 * count of ncclAllReduce calls on a communicator pair of its own (one
 * ncclGroupStart/End per iteration, one thread), then cuStreamSynchronize.
 * Reported: bus bandwidth as NCCL's tests define it for all-reduce,
 * 2 (n-1)/n x bytes / time, with n = 2 ranks: bytes / time.
 */
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define DIE(...)                      \
  do {                                \
    fprintf(stderr, "bench_comm: ");  \
    fprintf(stderr, __VA_ARGS__);     \
    fprintf(stderr, "\n");            \
    exit(1);                          \
  } while (0)

static ruda_device *open_ordinal(int ordinal) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_CUDA;
  cfg.device_ordinal = ordinal;
  cfg.log_level = RUDA_LOG_ERROR;
  ruda_device *dev = NULL;
  if (ruda_device_open(&cfg, &dev) != 0) DIE("open GPU %d: %s", ordinal, ruda_error_message(ruda_last_error()));
  return dev;
}

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && atoi(argv[1]) <= 0)) {
    int help = !strcmp(argv[1], "-h");
    fprintf(help ? stdout : stderr,
            "usage: bench_comm [iterations]\n"
            "  all-reduce (f32 sum, in place, 1 MiB .. 256 MiB) between GPUs 0 and 1:\n"
            "  ruda_all_reduce beside NCCL called directly; iterations per size\n"
            "  (default 20). Needs two GPUs.\n");
    return help ? 0 : 2;
  }
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  ruda_device *d[2] = {open_ordinal(0), open_ordinal(1)};
  ruda_comm *comm;
  if (ruda_comm_init(d, 2, &comm) != 0) DIE("ruda_comm_init: %s", ruda_error_message(ruda_last_error()));

  void *lib = dlopen(getenv("RUDA_NCCL") ? getenv("RUDA_NCCL") : "libnccl.so.2", RTLD_NOW);
  if (lib == NULL) DIE("dlopen NCCL: %s", dlerror());
  __typeof__(&ncclCommInitAll) init = (__typeof__(&ncclCommInitAll))dlsym(lib, "ncclCommInitAll");
  __typeof__(&ncclAllReduce) allreduce = (__typeof__(&ncclAllReduce))dlsym(lib, "ncclAllReduce");
  __typeof__(&ncclGroupStart) gstart = (__typeof__(&ncclGroupStart))dlsym(lib, "ncclGroupStart");
  __typeof__(&ncclGroupEnd) gend = (__typeof__(&ncclGroupEnd))dlsym(lib, "ncclGroupEnd");
  __typeof__(&ncclCommDestroy) destroy = (__typeof__(&ncclCommDestroy))dlsym(lib, "ncclCommDestroy");
  if (!init || !allreduce || !gstart || !gend || !destroy) DIE("NCCL lacks an entry point this benchmark calls");
  ncclComm_t raw[2];
  int devs[2] = {0, 1};
  ncclResult_t nr = init(raw, 2, devs);
  if (nr != ncclSuccess) DIE("ncclCommInitAll failed: result %d", (int)nr);
  CUstream st[2];
  for (int r = 0; r < 2; r++) {
    void *ctx;
    if (ruda_cuda_context(d[r], &ctx) != 0) DIE("ruda_cuda_context: %s", ruda_error_message(ruda_last_error()));
    CUresult cr = ruda__cu.cuCtxSetCurrent((CUcontext)ctx);
    if (cr == CUDA_SUCCESS) cr = ruda__cu.cuStreamCreate(&st[r], CU_STREAM_NON_BLOCKING);
    if (cr != CUDA_SUCCESS) DIE("GPU %d: cuCtxSetCurrent/cuStreamCreate: CUresult %d", r, (int)cr);
  }

  /* What was opened, not what the benchmark was written on. */
  ruda_device_props props[2];
  for (int r = 0; r < 2; r++)
    if (ruda_device_get_props(d[r], &props[r]) != 0) DIE("ruda_device_get_props: %s", ruda_error_message(ruda_last_error()));
  printf("# bench_comm: all-reduce f32 sum in place, GPU 0 %s and GPU 1 %s, %d iterations per size; bus GB/s\n",
         props[0].name, props[1].name, iters);
  printf("| size | ruda GB/s | raw NCCL GB/s | ruda / raw |\n|---:|---:|---:|---:|\n");
  for (uint64_t bytes = 1u << 20; bytes <= (256u << 20); bytes <<= 2) {
    ruda_handle h[2];
    uint64_t ptr[2];
    for (int r = 0; r < 2; r++) {
      if (ruda_buffer_create(d[r], 0, bytes, &h[r]) != 0 || ruda_binding_device_ptr(d[r], ruda_bind(h[r]), &ptr[r]) != 0)
        DIE("buffer of %llu bytes on GPU %d: %s", (unsigned long long)bytes, r, ruda_error_message(ruda_last_error()));
    }
    double best_ruda = 0, best_raw = 0;
    for (int rep = 0; rep < 3; rep++) {
      uint64_t t0 = now_ns();
      for (int i = 0; i < iters; i++)
        for (int r = 0; r < 2; r++)
          if (ruda_all_reduce(comm, d[r], ruda_bind(h[r]), ruda_bind(h[r]), RUDA_DTYPE_F32, RUDA_REDUCE_SUM) != 0)
            DIE("ruda_all_reduce: %s", ruda_error_message(ruda_last_error()));
      for (int r = 0; r < 2; r++)
        if (ruda_comm_sync(comm, d[r], NULL) != 0) DIE("ruda_comm_sync");
      double gbs = (double)bytes * iters / ((now_ns() - t0) / 1e9) / 1e9;
      if (gbs > best_ruda) best_ruda = gbs;
      /* The baseline's every result is checked: a failing NCCL call
       * returns at once and would print an inflated bandwidth. */
      t0 = now_ns();
      for (int i = 0; i < iters; i++) {
        if ((nr = gstart()) != ncclSuccess) DIE("ncclGroupStart: result %d", (int)nr);
        for (int r = 0; r < 2; r++)
          if ((nr = allreduce((void *)(uintptr_t)ptr[r], (void *)(uintptr_t)ptr[r], bytes / 4, ncclFloat32, ncclSum,
                              raw[r], (cudaStream_t)st[r])) != ncclSuccess)
            DIE("ncclAllReduce (GPU %d, %llu bytes): result %d", r, (unsigned long long)bytes, (int)nr);
        if ((nr = gend()) != ncclSuccess) DIE("ncclGroupEnd: result %d", (int)nr);
      }
      for (int r = 0; r < 2; r++) {
        CUresult cr = ruda__cu.cuStreamSynchronize(st[r]);
        if (cr != CUDA_SUCCESS) DIE("cuStreamSynchronize (GPU %d): CUresult %d", r, (int)cr);
      }
      gbs = (double)bytes * iters / ((now_ns() - t0) / 1e9) / 1e9;
      if (gbs > best_raw) best_raw = gbs;
    }
    printf("| %llu MiB | %.1f | %.1f | %.3f |\n", (unsigned long long)(bytes >> 20), best_ruda, best_raw,
           best_ruda / best_raw);
    for (int r = 0; r < 2; r++) ruda_buffer_free(d[r], 0, h[r]);
  }
  for (int r = 0; r < 2; r++) {
    ruda__cu.cuStreamDestroy(st[r]);
    destroy(raw[r]);
  }
  ruda_comm_destroy(comm);
  ruda_device_close(d[0], NULL);
  ruda_device_close(d[1], NULL);
  return 0;
}

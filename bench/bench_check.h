/* bench_check.h - the benchmarks' error path: a failed call ends the run,
 * naming the call, its code and ruda's last message. Define BENCH_NAME
 * (the program's name) before including it. */
#ifndef RUDA_BENCH_CHECK_H
#define RUDA_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "ruda/ruda.h"

static void die(const char *what, int rc) {
  fprintf(stderr, "%s: %s: %s: %s\n", BENCH_NAME, what, ruda_err_name(rc), ruda_error_message(ruda_last_error()));
  exit(1);
}

#define CHECK(call)                \
  do {                             \
    int rc_ = (call);              \
    if (rc_ != 0) die(#call, rc_); \
  } while (0)

/* CU(call): a raw driver call of the baseline (through ruda's loader);
 * failure ends the run with the driver's message. Include the cuda
 * backend's headers before this one. */
#ifdef RUDA_CU_LOADER_H
#define CU(call)                                                                               \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      char d_[160];                                                                            \
      fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #call, ruda__cu_describe(r_, d_, sizeof d_)); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)
#endif

#endif /* RUDA_BENCH_CHECK_H */

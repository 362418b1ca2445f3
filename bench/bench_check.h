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

#endif /* RUDA_BENCH_CHECK_H */

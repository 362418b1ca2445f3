/* bench_args.h - the benchmarks' command-line lists ("1,4,16"). */
#ifndef RUDA_BENCH_ARGS_H
#define RUDA_BENCH_ARGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads the comma-separated numbers of s (as atoi reads each) into out,
 * at most max of them (the rest ignored). Returns how many, or -1 when one
 * lies outside lo..hi. s is not changed. */
static inline int bench_int_list(const char *s, int lo, int hi, int *out, int max) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  int n = 0;
  for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
    const int v = atoi(tok);
    if (v < lo || v > hi) return -1;
    out[n++] = v;
  }
  return n;
}

#endif /* RUDA_BENCH_ARGS_H */

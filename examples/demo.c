#define _POSIX_C_SOURCE 200809L
/* demo.c - several threads launch work on several streams, then check it.
 *
 * Each thread owns a buffer of N floats, writes x, launches "axpy" on its
 * own stream a few hundred times, reads the result back and verifies it.
 * On the host backend the kernel is a registered C function; on the cuda
 * backend the same kernel is given as CUDA C source.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ruda/ruda.h"

#define THREADS 4
#define N 4096
#define LAUNCHES 500

static ruda_device *dev;

/* y[i] += a * x[i] for every thread of the grid. */
static int axpy_host(const ruda_host_ctx *c, void *const *args) {
  uint32_t i = c->block_idx.x * c->block_dim.x + c->thread_idx.x;
  uint32_t n = *(const uint32_t *)args[3];
  if (i < n) {
    float a = *(const float *)args[0];
    const float *x = args[1];
    float *y = args[2];
    y[i] += a * x[i];
  }
  return 0;
}

static const char axpy_cuda[] =
    "extern \"C\" __global__ void axpy(float a, const float *x, float *y, unsigned n) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] += a * x[i];\n"
    "}\n";

typedef struct job {
  int index;
  double seconds;
  int ok;
} job;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != 0) {                                                                      \
      fprintf(stderr, "%s failed: %s\n", #call, ruda_error_message(ruda_last_error())); \
      return NULL;                                                                       \
    }                                                                                    \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run(void *p) {
  job *j = p;
  ruda_stream_id s = (ruda_stream_id)j->index; /* explicit stream per thread */
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *out = malloc(N * sizeof *out);
  for (int i = 0; i < N; i++) x[i] = (float)(i % 17) * 0.25f, y[i] = (float)j->index;
  ruda_handle hx, hy;
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &hx));
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &hy));
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(hx)), dy = ruda_copy_contiguous(ruda_bind(hy));
  CHECK(ruda_write(dev, s, &dx, x, sizeof(float) * N));
  CHECK(ruda_write(dev, s, &dy, y, sizeof(float) * N));
  float a = 0.5f;
  uint32_t n = N;
  ruda_arg args[4] = {ruda_arg_scalar(&a, sizeof a), ruda_arg_buffer(ruda_bind(hx)),
                      ruda_arg_buffer(ruda_bind(hy)), ruda_arg_scalar(&n, sizeof n)};
  ruda_launch_desc l = {.kernel = "axpy", .grid = {N / 256, 1, 1}, .block = {256, 1, 1}, .args = args, .nargs = 4};
  double t0 = now();
  for (int k = 0; k < LAUNCHES; k++) CHECK(ruda_launch(dev, s, &l));
  ruda_future *f;
  CHECK(ruda_read(dev, s, &dy, out, sizeof(float) * N, &f));
  ruda_error *err = NULL;
  if (ruda_future_wait(f, &err) != 0) {
    ruda_error_print(err, stderr, 0);
    ruda_error_free(err);
  }
  j->seconds = now() - t0;
  ruda_future_free(f);
  j->ok = 1;
  for (int i = 0; i < N; i++) {
    float want = (float)j->index + LAUNCHES * a * x[i];
    if (out[i] != want) {
      fprintf(stderr, "thread %d: y[%d] = %g, want %g\n", j->index, i, out[i], want);
      j->ok = 0;
      break;
    }
  }
  ruda_buffer_free(dev, s, hx);
  ruda_buffer_free(dev, s, hy);
  free(x);
  free(y);
  free(out);
  return NULL;
}

/* The same axpy captured once into a graph and replayed, timed with a
 * profile: device time per kernel, and the result checked again. */
static void *graph_demo(void) { /* NULL on failure, as CHECK returns */
  const ruda_stream_id s = 100;
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *out = malloc(N * sizeof *out);
  for (int i = 0; i < N; i++) x[i] = (float)(i % 13), y[i] = 1.0f;
  ruda_handle hx, hy;
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &hx));
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &hy));
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(hx)), dy = ruda_copy_contiguous(ruda_bind(hy));
  CHECK(ruda_write(dev, s, &dx, x, sizeof(float) * N));
  CHECK(ruda_write(dev, s, &dy, y, sizeof(float) * N));
  float a = 0.25f;
  uint32_t n = N;
  ruda_arg args[4] = {ruda_arg_scalar(&a, sizeof a), ruda_arg_buffer(ruda_bind(hx)),
                      ruda_arg_buffer(ruda_bind(hy)), ruda_arg_scalar(&n, sizeof n)};
  ruda_launch_desc l = {.kernel = "axpy", .grid = {N / 256, 1, 1}, .block = {256, 1, 1}, .args = args, .nargs = 4};
  enum { KERNELS = 50, REPLAYS = 20 };
  ruda_graph *g;
  CHECK(ruda_graph_begin_capture(dev, s));
  for (int k = 0; k < KERNELS; k++) CHECK(ruda_launch(dev, s, &l));
  CHECK(ruda_graph_end_capture(dev, s, &g));
  ruda_profile_token tok;
  CHECK(ruda_profile_begin(dev, s, &tok));
  for (int r = 0; r < REPLAYS; r++) CHECK(ruda_graph_replay(dev, s, g));
  uint64_t ns = 0;
  CHECK(ruda_profile_end(dev, s, tok, &ns, NULL));
  ruda_future *f;
  CHECK(ruda_read(dev, s, &dy, out, sizeof(float) * N, &f));
  CHECK(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  int ok = 1;
  for (int i = 0; i < N && ok; i++) {
    float want = 1.0f + (float)(KERNELS * REPLAYS) * a * x[i];
    if (out[i] != want) {
      fprintf(stderr, "graph: y[%d] = %g, want %g\n", i, out[i], want);
      ok = 0;
    }
  }
  printf("  graph of %d axpy launches replayed %d times: %.2f us of device time per kernel, result %s\n", KERNELS,
         REPLAYS, ns / 1e3 / (KERNELS * REPLAYS), ok ? "verified" : "WRONG");
  CHECK(ruda_graph_destroy(dev, g));
  ruda_buffer_free(dev, s, hx);
  ruda_buffer_free(dev, s, hy);
  free(x);
  free(y);
  free(out);
  return ok ? (void *)dev : NULL;
}

int main(void) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.num_streams = THREADS;
  if (ruda_device_open(&cfg, &dev) != 0) {
    fprintf(stderr, "ruda_device_open: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  int rc = strcmp(ruda_device_backend(dev), "host") == 0
               ? ruda_host_kernel_register(dev, "axpy", axpy_host)
               : ruda_kernel_source(dev, "axpy", axpy_cuda, NULL);
  if (rc != 0) {
    fprintf(stderr, "registering axpy: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  printf("ruda %s demo: backend %s, %d threads on %d streams, %d launches of axpy over %d floats each\n",
         ruda_version_string(), ruda_device_backend(dev), THREADS, THREADS, LAUNCHES, N);
  pthread_t t[THREADS];
  job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (job){.index = i};
    pthread_create(&t[i], NULL, run, &jobs[i]);
  }
  int failures = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    printf("  stream %d: %d launches + read in %.3f ms, result %s\n", i, LAUNCHES, jobs[i].seconds * 1e3,
           jobs[i].ok ? "verified" : "WRONG");
    failures += !jobs[i].ok;
  }
  failures += graph_demo() == NULL;
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
    failures++;
  }
  printf("%s\n", failures ? "demo FAILED" : "demo OK: every result matched the CPU reference");
  return failures ? 1 : 0;
}

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

/* Its signature: launches are checked against it (docs/host_backend.md). */
static const ruda_host_param axpy_params[] = {
    {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}};

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

/* One axpy problem on stream s: x and y in buffers, the launch built. */
typedef struct axpy {
  ruda_stream_id s;
  float *x, *y, *out; /* host copies; out receives the result */
  float a;
  uint32_t n;
  ruda_handle hx, hy;
  ruda_arg args[4];
  ruda_launch_desc l;
} axpy;

static void *axpy_setup(axpy *w, ruda_stream_id s, float a, float x_mod, float y0) {
  w->s = s;
  w->a = a;
  w->n = N;
  w->x = malloc(N * sizeof *w->x), w->y = malloc(N * sizeof *w->y), w->out = malloc(N * sizeof *w->out);
  for (int i = 0; i < N; i++) w->x[i] = (float)(i % (int)x_mod) * 0.25f, w->y[i] = y0;
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &w->hx));
  CHECK(ruda_buffer_create(dev, s, sizeof(float) * N, &w->hy));
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(w->hx)), dy = ruda_copy_contiguous(ruda_bind(w->hy));
  CHECK(ruda_write(dev, s, &dx, w->x, sizeof(float) * N));
  CHECK(ruda_write(dev, s, &dy, w->y, sizeof(float) * N));
  w->args[0] = ruda_arg_scalar(&w->a, sizeof w->a);
  w->args[1] = ruda_arg_buffer(ruda_bind(w->hx));
  w->args[2] = ruda_arg_buffer(ruda_bind(w->hy));
  w->args[3] = ruda_arg_scalar(&w->n, sizeof w->n);
  w->l = (ruda_launch_desc){.kernel = "axpy", .grid = {N / 256, 1, 1}, .block = {256, 1, 1}, .args = w->args,
                            .nargs = 4};
  return w;
}

/* Reads y back and checks y0 + times * a * x against it. */
static int axpy_check(axpy *w, int times, const char *who) {
  ruda_copy_desc dy = ruda_copy_contiguous(ruda_bind(w->hy));
  ruda_future *f;
  ruda_error *err = NULL;
  if (ruda_read(dev, w->s, &dy, w->out, sizeof(float) * N, &f) != 0 || ruda_future_wait(f, &err) != 0) {
    fprintf(stderr, "%s: read failed: %s\n", who, ruda_error_message(err ? err : ruda_last_error()));
    ruda_error_free(err);
    return 0;
  }
  ruda_future_free(f);
  for (int i = 0; i < N; i++) {
    float want = w->y[i] + (float)times * w->a * w->x[i];
    if (w->out[i] != want) {
      fprintf(stderr, "%s: y[%d] = %g, want %g\n", who, i, w->out[i], want);
      return 0;
    }
  }
  return 1;
}

static void axpy_free(axpy *w) {
  ruda_buffer_free(dev, w->s, w->hx);
  ruda_buffer_free(dev, w->s, w->hy);
  free(w->x);
  free(w->y);
  free(w->out);
}

static void *run(void *p) {
  job *j = p;
  axpy w;
  /* An explicit stream per thread. */
  if (axpy_setup(&w, (ruda_stream_id)j->index, 0.5f, 17, (float)j->index) == NULL) return NULL;
  double t0 = now();
  for (int k = 0; k < LAUNCHES; k++) CHECK(ruda_launch(dev, w.s, &w.l));
  char who[32];
  snprintf(who, sizeof who, "thread %d", j->index);
  j->ok = axpy_check(&w, LAUNCHES, who);
  j->seconds = now() - t0;
  axpy_free(&w);
  return NULL;
}

/* The same axpy captured once into a graph and replayed, timed with a
 * profile: device time per kernel, and the result checked again. */
static void *graph_demo(void) { /* NULL on failure, as CHECK returns */
  enum { KERNELS = 50, REPLAYS = 20 };
  axpy w;
  if (axpy_setup(&w, 100, 0.25f, 13, 1.0f) == NULL) return NULL;
  ruda_graph *g;
  CHECK(ruda_graph_begin_capture(dev, w.s));
  for (int k = 0; k < KERNELS; k++) CHECK(ruda_launch(dev, w.s, &w.l));
  CHECK(ruda_graph_end_capture(dev, w.s, &g));
  ruda_profile_token tok;
  CHECK(ruda_profile_begin(dev, w.s, &tok));
  for (int r = 0; r < REPLAYS; r++) CHECK(ruda_graph_replay(dev, w.s, g));
  uint64_t ns = 0;
  CHECK(ruda_profile_end(dev, w.s, tok, &ns, NULL));
  int ok = axpy_check(&w, KERNELS * REPLAYS, "graph");
  printf("  graph of %d axpy launches replayed %d times: %.2f us of device time per kernel, result %s\n", KERNELS,
         REPLAYS, ns / 1e3 / (KERNELS * REPLAYS), ok ? "verified" : "WRONG");
  CHECK(ruda_graph_destroy(dev, g));
  axpy_free(&w);
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
               ? ruda_host_kernel_register_typed(dev, "axpy", axpy_host, axpy_params, 4)
               : ruda_kernel_source(dev, "axpy", axpy_cuda, NULL);
  if (rc != 0) {
    fprintf(stderr, "registering axpy: %s\n", ruda_error_message(ruda_last_error()));
    return 1;
  }
  ruda_device_props props;
  const char *device = ruda_device_get_props(dev, &props) == 0 ? props.name : "?";
  printf("ruda %s demo: backend %s (%s), %d threads on %d streams, %d launches of axpy over %d floats each\n",
         ruda_version(), ruda_device_backend(dev), device, THREADS, THREADS, LAUNCHES, N);
  if (ruda_device_fallback_reason(dev) != NULL)
    printf("  not on a GPU: %s\n", ruda_device_fallback_reason(dev));
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

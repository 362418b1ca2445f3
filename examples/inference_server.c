#define _POSIX_C_SOURCE 200809L
/* inference_server.c - request threads serving a small MLP through ruda.
 *
 * The weights are uploaded once and shared by every stream: kernels take
 * them as ruda_arg_in, so requests on different streams read them at the
 * same time. Each request thread owns a stream; a request takes its
 * buffers from that stream's pools, writes its input, runs two dense
 * layers (64 -> 64 with ReLU, 64 -> 8), reads the output back, waits for
 * it and frees the buffers. Every output is checked against the CPU;
 * requests per second and latency percentiles are printed.
 *
 *   inference_server [threads] [requests per thread]
 *
 * On the host backend the kernel is a C function registered with its
 * signature; on the cuda backend the same kernel is CUDA C source.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ruda/ruda.h"

enum { IN = 64, HID = 64, OUT = 8, ROWS = 16 };

/* y[r][o] = act(b[o] + sum_i x[r][i] * w[o][i]), one device thread per
 * output element; act is ReLU when relu != 0. */
static const char dense_cuda[] =
    "extern \"C\" __global__ void dense(const float *w, const float *b, const float *x, float *y,\n"
    "                                   unsigned in, unsigned out, unsigned n, unsigned relu) {\n"
    "  unsigned k = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (k >= n) return;\n"
    "  unsigned r = k / out, o = k % out;\n"
    "  float s = b[o];\n"
    "  for (unsigned i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];\n"
    "  y[k] = relu && s < 0.0f ? 0.0f : s;\n"
    "}\n";

static float dense_one(const float *w, const float *b, const float *x, uint32_t in, uint32_t out, uint32_t k,
                       uint32_t relu) {
  uint32_t r = k / out, o = k % out;
  float s = b[o];
  for (uint32_t i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
  return relu && s < 0.0f ? 0.0f : s;
}

static int dense_host(const ruda_host_ctx *c, void *const *a) {
  uint32_t k = c->block_idx.x * c->block_dim.x + c->thread_idx.x;
  uint32_t in = *(const uint32_t *)a[4], out = *(const uint32_t *)a[5], n = *(const uint32_t *)a[6];
  if (k < n) ((float *)a[3])[k] = dense_one(a[0], a[1], a[2], in, out, k, *(const uint32_t *)a[7]);
  return 0;
}

/* The signature: w, b, x, y, then in, out, n, relu (4 bytes each). How a
 * buffer is used (in, out) is said at each launch. */
static const ruda_host_param dense_params[] = {
    {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0},
    {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4},
};

/* The model: on the host for the reference, on the device for serving. */
static float w1[HID * IN], b1[HID], w2[OUT * HID], b2[OUT];
static ruda_handle hw1, hb1, hw2, hb2;
static ruda_device *dev;

typedef struct worker {
  ruda_stream_id stream;
  int requests;
  double *latency_us; /* one per request */
  int wrong, failed;
} worker;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int upload(ruda_handle *h, const float *data, size_t n) {
  ruda_copy_desc d;
  if (ruda_buffer_create(dev, 0, n * sizeof(float), h) != 0) return -1;
  d = ruda_copy_contiguous(ruda_bind(*h));
  return ruda_write(dev, 0, &d, data, n * sizeof(float));
}

/* One dense layer as a launch on stream s: y = act(W x + b). */
static int dense(ruda_stream_id s, ruda_handle w, ruda_handle b, ruda_handle x, ruda_handle y, uint32_t in,
                 uint32_t out, uint32_t relu) {
  uint32_t n = ROWS * out;
  ruda_arg args[8] = {ruda_arg_in(ruda_bind(w)),          ruda_arg_in(ruda_bind(b)),
                      ruda_arg_in(ruda_bind(x)),          ruda_arg_out(ruda_bind(y)),
                      ruda_arg_scalar(&in, sizeof in),    ruda_arg_scalar(&out, sizeof out),
                      ruda_arg_scalar(&n, sizeof n),      ruda_arg_scalar(&relu, sizeof relu)};
  ruda_launch_desc l = {.kernel = "dense", .grid = {(n + 127) / 128, 1, 1}, .block = {128, 1, 1},
                        .args = args, .nargs = 8};
  return ruda_launch(dev, s, &l);
}

/* One request: input in, output back, checked. 0, or -1 on a failed call. */
static int serve_one(worker *wk, const float *x, float *y) {
  const ruda_stream_id s = wk->stream;
  ruda_handle hx, hh, hy;
  ruda_future *f = NULL;
  ruda_error *err = NULL;
  if (ruda_buffer_create(dev, s, sizeof(float) * ROWS * IN, &hx) != 0) return -1;
  if (ruda_buffer_create(dev, s, sizeof(float) * ROWS * HID, &hh) != 0) return -1;
  if (ruda_buffer_create(dev, s, sizeof(float) * ROWS * OUT, &hy) != 0) return -1;
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(hx)), dy = ruda_copy_contiguous(ruda_bind(hy));
  int rc = ruda_write(dev, s, &dx, x, sizeof(float) * ROWS * IN);
  if (rc == 0) rc = dense(s, hw1, hb1, hx, hh, IN, HID, 1);
  if (rc == 0) rc = dense(s, hw2, hb2, hh, hy, HID, OUT, 0);
  if (rc == 0) rc = ruda_read(dev, s, &dy, y, sizeof(float) * ROWS * OUT, &f);
  if (rc == 0) rc = ruda_future_wait(f, &err);
  if (rc != 0) ruda_error_print(err ? err : ruda_last_error(), stderr, 0);
  ruda_error_free(err);
  ruda_future_free(f);
  /* Freed at once: the memory returns to the stream's pool once the
   * commands queued on it ran. */
  ruda_buffer_free(dev, s, hx);
  ruda_buffer_free(dev, s, hh);
  ruda_buffer_free(dev, s, hy);
  return rc == 0 ? 0 : -1;
}

static void *request_thread(void *p) {
  worker *wk = p;
  float x[ROWS * IN], y[ROWS * OUT], h[ROWS * HID];
  unsigned seed = (unsigned)wk->stream * 7919u + 1u;
  for (int q = 0; q < wk->requests; q++) {
    for (int i = 0; i < ROWS * IN; i++) x[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
    double t0 = now_s();
    if (serve_one(wk, x, y) != 0) {
      wk->failed++;
      break;
    }
    wk->latency_us[q] = (now_s() - t0) * 1e6;
    for (uint32_t k = 0; k < ROWS * HID; k++) h[k] = dense_one(w1, b1, x, IN, HID, k, 1);
    for (uint32_t k = 0; k < ROWS * OUT; k++) {
      float want = dense_one(w2, b2, h, HID, OUT, k, 0);
      if (fabsf(y[k] - want) > 1e-4f * (1.0f + fabsf(want))) wk->wrong++;
    }
  }
  return NULL;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 4, requests = argc > 2 ? atoi(argv[2]) : 500;
  if (threads < 1 || threads > 64 || requests < 1) {
    fprintf(stderr, "usage: inference_server [threads (1-64, default 4)] [requests per thread (default 500)]\n");
    return 2;
  }
  ruda_config cfg;
  ruda_config_init(&cfg);
  if (ruda_device_open(&cfg, &dev) != 0) {
    ruda_error_print(ruda_last_error(), stderr, 0);
    return 1;
  }
  int rc = strcmp(ruda_device_backend(dev), "host") == 0
               ? ruda_host_kernel_register_typed(dev, "dense", dense_host, dense_params, 8)
               : ruda_kernel_source(dev, "dense", dense_cuda, NULL);
  unsigned seed = 42;
  for (int i = 0; i < HID * IN; i++) w1[i] = (float)(rand_r(&seed) % 2001 - 1000) / 8000.0f;
  for (int i = 0; i < OUT * HID; i++) w2[i] = (float)(rand_r(&seed) % 2001 - 1000) / 8000.0f;
  for (int i = 0; i < HID; i++) b1[i] = (float)(i % 7) * 0.01f;
  for (int i = 0; i < OUT; i++) b2[i] = (float)i * 0.1f;
  /* Written on stream 0; a request on another stream that reads them waits
   * for these writes (ruda orders streams by the buffers they share). */
  if (rc == 0) rc = upload(&hw1, w1, HID * IN) | upload(&hb1, b1, HID) | upload(&hw2, w2, OUT * HID) |
                    upload(&hb2, b2, OUT);
  if (rc != 0) {
    ruda_error_print(ruda_last_error(), stderr, 0);
    ruda_device_close(dev, NULL);
    return 1;
  }
  printf("inference_server: backend %s (%s), %d request threads, %d requests each, %d rows x %d -> %d -> %d\n",
         ruda_device_backend(dev), ruda_version(), threads, requests, ROWS, IN, HID, OUT);

  worker *wk = calloc((size_t)threads, sizeof *wk);
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  double *lat = calloc((size_t)threads * (size_t)requests, sizeof *lat);
  if (wk == NULL || t == NULL || lat == NULL) return 1;
  double t0 = now_s();
  for (int i = 0; i < threads; i++) {
    wk[i] = (worker){.stream = (ruda_stream_id)i, .requests = requests, .latency_us = lat + (size_t)i * requests};
    pthread_create(&t[i], NULL, request_thread, &wk[i]);
  }
  int wrong = 0, failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    wrong += wk[i].wrong;
    failed += wk[i].failed;
  }
  double secs = now_s() - t0;
  size_t n = (size_t)threads * (size_t)requests;
  qsort(lat, n, sizeof *lat, by_value);
  printf("  %.0f requests/s; latency p50 %.1f us, p99 %.1f us\n", (double)n / secs, lat[n / 2], lat[n * 99 / 100]);

  ruda_buffer_free(dev, 0, hw1);
  ruda_buffer_free(dev, 0, hb1);
  ruda_buffer_free(dev, 0, hw2);
  ruda_buffer_free(dev, 0, hb2);
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    ruda_error_print(errs, stderr, 0);
    failed++;
  }
  ruda_error_free(errs);
  free(wk);
  free(t);
  free(lat);
  if (wrong || failed) {
    printf("inference_server FAILED: %d wrong outputs, %d failed threads\n", wrong, failed);
    return 1;
  }
  printf("inference_server OK: every output matched the CPU reference\n");
  return 0;
}

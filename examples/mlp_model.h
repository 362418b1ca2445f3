/* mlp_model.h - the two-layer MLP the library-call examples serve
 * (mlp_blas.c with cuBLAS, mlp_lt.c with cuBLASLt), and the serving loop
 * they share: y = gelu(x W1 + b1) W2 + b2 for ROWS x IN inputs, weights
 * uploaded once and shared by every stream, T threads each on its own
 * stream, every output checked against a double-precision CPU reference.
 * The example supplies one request's device work (mlp_request_fn).
 * Include from one file of a program: the model is its static state. */
#ifndef RUDA_EXAMPLES_MLP_MODEL_H
#define RUDA_EXAMPLES_MLP_MODEL_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ruda/ruda.h"

enum { ROWS = 16, IN = 128, HID = 256, OUT = 32, MLP_MAXT = 64 };

static float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
static ruda_handle dw1, db1, dw2, db2; /* on the device, written by stream 0 */

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static double gelu(double v) { return 0.5 * v * (1.0 + erf(v * 0.70710678118654752)); }

static void reference(const float *x, double *y) {
  double h[ROWS * HID];
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < HID; j++) {
      double s = b1[j];
      for (int i = 0; i < IN; i++) s += (double)x[r * IN + i] * w1[i * HID + j];
      h[r * HID + j] = gelu(s);
    }
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < OUT; j++) {
      double s = b2[j];
      for (int i = 0; i < HID; i++) s += h[r * HID + i] * w2[i * OUT + j];
      y[r * OUT + j] = s;
    }
}

/* One request's work on stream s after x (ROWS x IN) was written: h
 * (ROWS x HID) and y (ROWS x OUT) from it, with dw1, db1, dw2, db2. 0, or
 * a failed call's code (ruda's last error says why). */
typedef int (*mlp_request_fn)(ruda_device *dev, ruda_stream_id s, ruda_handle x, ruda_handle h, ruda_handle y);

typedef struct mlp_thread {
  ruda_device *dev;
  mlp_request_fn body;
  const char *who;
  double tol; /* |got - want| <= tol * |want| + tol */
  int index, requests, bad;
  const char *failure;
  char why[256]; /* ruda's message, from this thread's last error */
} mlp_thread;

#define MLP_TRY(call)                                                                \
  do {                                                                               \
    if ((call) != 0) {                                                               \
      a->failure = #call;                                                            \
      snprintf(a->why, sizeof a->why, "%s", ruda_error_message(ruda_last_error())); \
      goto out;                                                                      \
    }                                                                                \
  } while (0)

static void *mlp_serve(void *p) {
  mlp_thread *a = p;
  ruda_device *dev = a->dev;
  ruda_stream_id s = (ruda_stream_id)a->index;
  ruda_handle x = {0, 0}, h = {0, 0}, y = {0, 0};
  MLP_TRY(ruda_buffer_create(dev, s, ROWS * IN * 4, &x));
  MLP_TRY(ruda_buffer_create(dev, s, ROWS * HID * 4, &h));
  MLP_TRY(ruda_buffer_create(dev, s, ROWS * OUT * 4, &y));
  uint64_t seed = 1000 + (uint64_t)a->index;
  for (int r = 0; r < a->requests; r++) {
    float in[ROWS * IN], out[ROWS * OUT];
    double want[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++) in[i] = frand(&seed);
    ruda_copy_desc xd = ruda_copy_contiguous(ruda_bind(x)), yd = ruda_copy_contiguous(ruda_bind(y));
    MLP_TRY(ruda_write(dev, s, &xd, in, sizeof in));
    MLP_TRY(a->body(dev, s, x, h, y));
    ruda_future *f = NULL;
    MLP_TRY(ruda_read(dev, s, &yd, out, sizeof out, &f));
    ruda_error *err = NULL;
    int rc = ruda_future_wait(f, &err);
    ruda_future_free(f);
    if (rc != 0) {
      snprintf(a->why, sizeof a->why, "%s", ruda_error_message(ruda_error_cause(err)));
      ruda_error_free(err);
      a->failure = "request";
      goto out;
    }
    reference(in, want);
    for (int i = 0; i < ROWS * OUT; i++)
      if (!(fabs(out[i] - want[i]) <= a->tol * fabs(want[i]) + a->tol) && a->bad++ < 3)
        fprintf(stderr, "%s: thread %d request %d y[%d] = %.6f, expected %.6f\n", a->who, a->index, r, i, out[i],
                want[i]);
  }
out:
  if (x.gen) ruda_buffer_free(dev, s, x);
  if (h.gen) ruda_buffer_free(dev, s, h);
  if (y.gen) ruda_buffer_free(dev, s, y);
  return NULL;
}

static int mlp_upload(ruda_device *dev, ruda_handle *out, const float *v, size_t bytes) {
  int rc = ruda_buffer_create(dev, 0, bytes, out);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(*out));
  return rc != 0 ? rc : ruda_write(dev, 0, &d, v, bytes);
}

/* Makes and uploads the weights (no sync: each request's calls and kernels
 * are ordered after the writes of what they read, whatever stream), runs
 * `threads` threads of `requests` requests, frees the weights. 0 when
 * every request was served, else 1 (what failed is on stderr); *bad: the
 * outputs outside tol. */
static int mlp_serve_all(ruda_device *dev, const char *who, int threads, int requests, mlp_request_fn body, double tol,
                         int *bad) {
  uint64_t seed = 7;
  for (int i = 0; i < IN * HID; i++) w1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID; i++) b1[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < HID * OUT; i++) w2[i] = frand(&seed) * 0.1f;
  for (int i = 0; i < OUT; i++) b2[i] = frand(&seed) * 0.1f;
  int rc = mlp_upload(dev, &dw1, w1, sizeof w1);
  if (rc == 0) rc = mlp_upload(dev, &db1, b1, sizeof b1);
  if (rc == 0) rc = mlp_upload(dev, &dw2, w2, sizeof w2);
  if (rc == 0) rc = mlp_upload(dev, &db2, b2, sizeof b2);
  *bad = 0;
  if (rc != 0) {
    fprintf(stderr, "%s: setup: %s\n", who, ruda_error_message(ruda_last_error()));
    return 1;
  }
  pthread_t t[MLP_MAXT];
  mlp_thread a[MLP_MAXT];
  for (int i = 0; i < threads; i++) {
    a[i] = (mlp_thread){.dev = dev, .body = body, .who = who, .tol = tol, .index = i, .requests = requests};
    pthread_create(&t[i], NULL, mlp_serve, &a[i]);
  }
  int failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    *bad += a[i].bad;
    if (a[i].failure != NULL) {
      fprintf(stderr, "%s: thread %d: %s failed: %s\n", who, i, a[i].failure, a[i].why);
      failed = 1;
    }
  }
  ruda_buffer_free(dev, 0, dw1);
  ruda_buffer_free(dev, 0, db1);
  ruda_buffer_free(dev, 0, dw2);
  ruda_buffer_free(dev, 0, db2);
  return failed;
}

#endif /* RUDA_EXAMPLES_MLP_MODEL_H */

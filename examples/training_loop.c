#define _POSIX_C_SOURCE 200809L
/* training_loop.c - data-parallel training on two devices through ruda.
 *
 * A linear model y = x . w is fitted to synthetic data by gradient
 * descent. Each of two ranks (devices) has a loader thread that uploads
 * batches on one stream while the rank's training thread computes on
 * another; every step the ranks average their gradients with
 * ruda_all_reduce and apply the same update, so their weights stay
 * identical. Nothing here waits for the device inside the loop: the
 * loader runs up to SLOTS steps ahead of the steps issued, and ruda orders
 * each upload after the (device) step that last read its buffer, and each
 * step after the upload it reads. The two threads wait only for each
 * other's calls (the trainer for the upload of its batch to be issued, the
 * loader for the step that last reads a slot to be issued): which batch a
 * step reads is the program's to decide, the device-side order is ruda's.
 *
 *   training_loop [steps]
 *
 * Checked at the end: the loss fell a hundredfold, the weights are those
 * the data was made with, and both ranks hold the same bytes. Uses two
 * GPUs when two are usable, else two host devices.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/ruda.h"
#include "linear_model.h"

enum { RANKS = 2, D = 16, B = 256, SLOTS = 2 };
enum { COMPUTE = 0, LOADER = 1 }; /* the two streams of a rank */
static const float LR = 0.1f;

static float w_true[D];
static int steps = 300;
static ruda_comm *comm;

typedef struct rank {
  int index;
  _Atomic int issued; /* steps whose gradient launch the trainer issued */
  _Atomic int loaded; /* steps whose batch the loader issued */
  ruda_device *dev;
  ruda_handle x[SLOTS], y[SLOTS], w, g;
  float loss_first, loss_last;
  float w_final[D];
  _Atomic int failed;
} rank;

/* Uploads step s's batch into slot s % SLOTS: synthetic rows of rank r. */
static void *loader(void *p) {
  rank *rk = p;
  static _Thread_local float x[B * D], y[B];
  unsigned seed = 1000u + (unsigned)rk->index;
  for (int s = 0; s < steps && !rk->failed; s++) {
    /* Slot s % SLOTS was last read by step s - SLOTS: issued yet? */
    while (atomic_load_explicit(&rk->issued, memory_order_acquire) < s - SLOTS + 1 && !rk->failed) sched_yield();
    for (int r = 0; r < B; r++) {
      y[r] = 0.0f;
      for (int k = 0; k < D; k++) {
        x[r * D + k] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
        y[r] += x[r * D + k] * w_true[k];
      }
      y[r] += (float)(rand_r(&seed) % 201 - 100) / 100000.0f; /* a little noise */
    }
    ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(rk->x[s % SLOTS]));
    ruda_copy_desc dy = ruda_copy_contiguous(ruda_bind(rk->y[s % SLOTS]));
    if (ruda_write(rk->dev, LOADER, &dx, x, sizeof x) != 0 || ruda_write(rk->dev, LOADER, &dy, y, sizeof y) != 0) {
      ruda_error_print(ruda_last_error(), stderr, 0);
      rk->failed = 1;
    }
    atomic_store_explicit(&rk->loaded, s + 1, memory_order_release);
  }
  return NULL;
}

static int read_floats(rank *rk, ruda_binding b, float *out, size_t n) {
  ruda_copy_desc d = ruda_copy_contiguous(b);
  ruda_future *f = NULL;
  ruda_error *err = NULL;
  int rc = ruda_read(rk->dev, COMPUTE, &d, out, n * sizeof(float), &f);
  if (rc == 0) rc = ruda_future_wait(f, &err);
  if (rc != 0) ruda_error_print(err ? err : ruda_last_error(), stderr, 0);
  ruda_error_free(err);
  ruda_future_free(f);
  return rc;
}

/* The training steps of one rank: gradient, all-reduce, update. */
static void *trainer(void *p) {
  rank *rk = p;
  uint32_t b = B, d = D;
  float lr = LR;
  for (int s = 0; s < steps && !rk->failed; s++) {
    while (atomic_load_explicit(&rk->loaded, memory_order_acquire) < s + 1 && !rk->failed) sched_yield();
    ruda_arg ga[6] = {ruda_arg_in(ruda_bind(rk->x[s % SLOTS])), ruda_arg_in(ruda_bind(rk->y[s % SLOTS])),
                      ruda_arg_in(ruda_bind(rk->w)), ruda_arg_out(ruda_bind(rk->g)),
                      ruda_arg_scalar(&b, sizeof b), ruda_arg_scalar(&d, sizeof d)};
    ruda_arg ua[4] = {ruda_arg_buffer(ruda_bind(rk->w)), ruda_arg_in(ruda_bind(rk->g)),
                      ruda_arg_scalar(&lr, sizeof lr), ruda_arg_scalar(&d, sizeof d)};
    ruda_launch_desc gl = {.kernel = "grad", .grid = {1, 1, 1}, .block = {D + 1, 1, 1}, .args = ga, .nargs = 6};
    ruda_launch_desc ul = {.kernel = "update", .grid = {1, 1, 1}, .block = {D, 1, 1}, .args = ua, .nargs = 4};
    int rc = ruda_launch(rk->dev, COMPUTE, &gl);
    atomic_store_explicit(&rk->issued, s + 1, memory_order_release);
    /* The mean over ranks of every gradient entry and of the loss. */
    if (rc == 0)
      rc = ruda_all_reduce(comm, rk->dev, ruda_bind(rk->g), ruda_bind(rk->g), RUDA_DTYPE_F32, RUDA_REDUCE_MEAN);
    if (rc == 0) rc = ruda_launch(rk->dev, COMPUTE, &ul);
    if (rc == 0 && (s == 0 || s == steps - 1 || s % 50 == 0)) {
      float g[D + 1];
      rc = read_floats(rk, ruda_bind(rk->g), g, D + 1);
      if (rc == 0 && s == 0) rk->loss_first = g[D];
      if (rc == 0) rk->loss_last = g[D];
      if (rc == 0 && rk->index == 0) printf("  step %4d: loss %.3e\n", s, (double)g[D]);
    }
    if (rc != 0) {
      ruda_error_print(ruda_last_error(), stderr, 0);
      rk->failed = 1;
    }
  }
  if (!rk->failed && read_floats(rk, ruda_bind(rk->w), rk->w_final, D) != 0) rk->failed = 1;
  return NULL;
}

/* Opens two cuda devices when two GPUs are usable, else two host ones. */
static int open_ranks(rank *r) {
  for (int pass = 0; pass < 2; pass++) {
    int ok = 1;
    for (int i = 0; i < RANKS; i++) {
      ruda_config cfg;
      ruda_config_init(&cfg);
      cfg.num_streams = 2;
      cfg.device_ordinal = i;
      cfg.log_level = RUDA_LOG_ERROR;
      if (pass == 1) cfg.backend = RUDA_BACKEND_HOST;
      r[i].dev = NULL;
      if (ok && ruda_device_open(&cfg, &r[i].dev) != 0) ok = 0;
    }
    if (ok && ruda_comm_init((ruda_device *const[]){r[0].dev, r[1].dev}, RANKS, &comm) == 0) return 0;
    for (int i = 0; i < RANKS; i++)
      if (r[i].dev != NULL) ruda_device_close(r[i].dev, NULL);
  }
  ruda_error_print(ruda_last_error(), stderr, 0);
  return -1;
}

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && atoi(argv[1]) < 2)) {
    fprintf(stderr, "usage: training_loop [steps (at least 2, default 300)]\n");
    return 2;
  }
  if (argc == 2) steps = atoi(argv[1]);
  for (int k = 0; k < D; k++) w_true[k] = (float)(k % 5) - 2.0f + 0.125f * (float)k;
  rank r[RANKS] = {{.index = 0}, {.index = 1}};
  if (open_ranks(r) != 0) return 1;
  int failures = 0;
  const float zeros[D] = {0};
  for (int i = 0; i < RANKS && !failures; i++) {
    ruda_device *dev = r[i].dev;
    int rc = linear_model_register(dev);
    for (int s = 0; s < SLOTS && rc == 0; s++)
      rc = ruda_buffer_create(dev, LOADER, sizeof(float) * B * D, &r[i].x[s]) |
           ruda_buffer_create(dev, LOADER, sizeof(float) * B, &r[i].y[s]);
    if (rc == 0) rc = ruda_buffer_create(dev, COMPUTE, sizeof(float) * D, &r[i].w);
    if (rc == 0) rc = ruda_buffer_create(dev, COMPUTE, sizeof(float) * (D + 1), &r[i].g);
    ruda_copy_desc dw = ruda_copy_contiguous(ruda_bind(r[i].w));
    if (rc == 0) rc = ruda_write(dev, COMPUTE, &dw, zeros, sizeof zeros);
    if (rc != 0) {
      ruda_error_print(ruda_last_error(), stderr, 0);
      failures++;
    }
  }
  if (!failures) {
    printf("training_loop: backend %s, %d ranks, %d steps of %d rows x %d features per rank\n",
           ruda_device_backend(r[0].dev), RANKS, steps, B, D);
    pthread_t lt[RANKS], tt[RANKS];
    for (int i = 0; i < RANKS; i++) {
      pthread_create(&lt[i], NULL, loader, &r[i]);
      pthread_create(&tt[i], NULL, trainer, &r[i]);
    }
    for (int i = 0; i < RANKS; i++) {
      pthread_join(lt[i], NULL);
      pthread_join(tt[i], NULL);
      failures += r[i].failed;
    }
  }
  if (!failures) {
    float worst = 0.0f;
    for (int k = 0; k < D; k++) worst = fmaxf(worst, fabsf(r[0].w_final[k] - w_true[k]));
    int same = memcmp(r[0].w_final, r[1].w_final, sizeof r[0].w_final) == 0;
    int fell = r[0].loss_last * 100.0f < r[0].loss_first;
    printf("  loss %.3e -> %.3e; weights within %.2g of the truth; ranks %s\n", (double)r[0].loss_first,
           (double)r[0].loss_last, (double)worst, same ? "identical" : "DIFFER");
    failures += !same + !fell + !(worst < 0.01f);
  }
  for (int i = 0; i < RANKS; i++) {
    ruda_error *errs = NULL;
    if (comm != NULL && ruda_comm_sync(comm, r[i].dev, &errs) != 0) failures++;
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
  }
  if (comm != NULL) ruda_comm_destroy(comm);
  for (int i = 0; i < RANKS; i++) {
    ruda_error *errs = NULL;
    if (ruda_device_close(r[i].dev, &errs) != 0) failures++;
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
  }
  printf("%s\n", failures ? "training_loop FAILED" : "training_loop OK: loss fell, weights found, ranks agree");
  return failures ? 1 : 0;
}

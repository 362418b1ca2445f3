#define _POSIX_C_SOURCE 200809L
/* train_mpi.c - data-parallel training across processes: one rank per
 * process under mpirun, through ruda/mpi.h.
 *
 * Each process fits the linear model of linear_model.h to its own
 * synthetic batches on its own device (a GPU when one is usable, else the
 * host backend), and every step the ranks average their gradients with
 * ruda_all_reduce over the communicator ruda_mpi_comm_init made (NCCL on
 * GPUs, MPI between host devices), so every rank applies the same update.
 *
 *   mpirun -np 4 train_mpi [steps]
 *
 * Checked at the end, on every rank: the loss fell a hundredfold, the
 * weights are those the data was made with, and every rank holds the same
 * bytes (compared over MPI). Exit 0 when all of that held everywhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/mpi.h"
#include "linear_model.h"

enum { D = 16, B = 256 };

static int rank, size;

static int fail(const char *what) {
  fprintf(stderr, "train_mpi rank %d: %s: %s\n", rank, what, ruda_error_message(ruda_last_error()));
  return 1;
}

static int read_floats(ruda_device *dev, ruda_handle h, float *out, size_t n) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *f = NULL;
  int rc = ruda_read(dev, 0, &d, out, n * sizeof *out, &f);
  if (rc == 0) rc = ruda_future_wait(f, NULL);
  ruda_future_free(f);
  return rc;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int steps = argc > 1 ? atoi(argv[1]) : 300;
  float w_true[D];
  for (int k = 0; k < D; k++) w_true[k] = (float)(k % 5) - 2.0f + 0.125f * (float)k;

  /* A GPU per rank (the local rank's ordinal: NCCL wants one GPU per
   * rank) when every rank has one, else host devices on every rank: the
   * ranks of a communicator must agree on the backend. */
  const char *lr_env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (lr_env == NULL) lr_env = getenv("MPI_LOCALRANKID");
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.num_streams = 2;
  cfg.log_level = RUDA_LOG_ERROR;
  cfg.device_ordinal = lr_env ? atoi(lr_env) : 0;
  ruda_device *dev = NULL;
  ruda_comm *comm = NULL;
  int bad = 0;
  if (ruda_device_open(&cfg, &dev) != 0) return fail("ruda_device_open");
  int gpu = strcmp(ruda_device_backend(dev), "cuda") == 0, all_gpu = 0;
  MPI_Allreduce(&gpu, &all_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (gpu && !all_gpu) {
    ruda_device_close(dev, NULL);
    cfg.backend = RUDA_BACKEND_HOST;
    if (ruda_device_open(&cfg, &dev) != 0) return fail("ruda_device_open (host)");
  }
  if (linear_model_register(dev) != 0) bad = fail("registering the model's kernels");
  if (!bad && ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &comm) != 0) bad = fail("ruda_mpi_comm_init");
  if (!bad && rank == 0)
    printf("train_mpi: %d ranks, backend %s, %d steps of %d rows each per rank\n", size, ruda_device_backend(dev),
           steps, B);
  ruda_handle x, y, w, g;
  if (!bad && (ruda_buffer_create(dev, 0, sizeof(float) * B * D, &x) | ruda_buffer_create(dev, 0, sizeof(float) * B, &y) |
               ruda_buffer_create(dev, 0, sizeof(float) * D, &w) | ruda_buffer_create(dev, 0, sizeof(float) * (D + 1), &g)))
    bad = fail("ruda_buffer_create");
  const float zeros[D] = {0};
  ruda_copy_desc dw = ruda_copy_contiguous(ruda_bind(w)), dx = ruda_copy_contiguous(ruda_bind(x)),
                 dy = ruda_copy_contiguous(ruda_bind(y));
  if (!bad && ruda_write(dev, 0, &dw, zeros, sizeof zeros) != 0) bad = fail("ruda_write");
  static float bx[B * D], by[B];
  unsigned seed = 7000u + (unsigned)rank; /* each rank its own data */
  uint32_t b = B, d = D;
  float lr = 0.1f, loss_first = 0, loss_last = 0;
  for (int s = 0; s < steps && !bad; s++) {
    for (int r = 0; r < B; r++) {
      by[r] = 0.0f;
      for (int k = 0; k < D; k++) {
        bx[r * D + k] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
        by[r] += bx[r * D + k] * w_true[k];
      }
    }
    ruda_arg ga[6] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(y)),  ruda_arg_in(ruda_bind(w)),
                      ruda_arg_out(ruda_bind(g)), ruda_arg_scalar(&b, sizeof b), ruda_arg_scalar(&d, sizeof d)};
    ruda_arg ua[4] = {ruda_arg_buffer(ruda_bind(w)), ruda_arg_in(ruda_bind(g)), ruda_arg_scalar(&lr, sizeof lr),
                      ruda_arg_scalar(&d, sizeof d)};
    ruda_launch_desc gl = {.kernel = "grad", .grid = {1, 1, 1}, .block = {D + 1, 1, 1}, .args = ga, .nargs = 6};
    ruda_launch_desc ul = {.kernel = "update", .grid = {1, 1, 1}, .block = {D, 1, 1}, .args = ua, .nargs = 4};
    /* Nothing waits here but the occasional loss read: the upload, the
     * gradient, the all-reduce (on the rank's collective stream, ordered
     * by the buffer g) and the update follow each other on the device. */
    if (ruda_write(dev, 0, &dx, bx, sizeof bx) | ruda_write(dev, 0, &dy, by, sizeof by) | ruda_launch(dev, 0, &gl) |
        ruda_all_reduce(comm, dev, ruda_bind(g), ruda_bind(g), RUDA_DTYPE_F32, RUDA_REDUCE_MEAN) |
        ruda_launch(dev, 0, &ul)) {
      bad = fail("a step's calls");
      break;
    }
    if (s == 0 || s == steps - 1 || s % 100 == 0) {
      float gg[D + 1];
      if (read_floats(dev, g, gg, D + 1) != 0) {
        bad = fail("reading the loss");
        break;
      }
      if (s == 0) loss_first = gg[D];
      loss_last = gg[D];
      if (rank == 0) printf("  step %4d: mean loss over ranks %.3e\n", s, (double)gg[D]);
    }
  }
  float wf[D] = {0}, lo[D], hi[D], worst = 0;
  if (!bad && read_floats(dev, w, wf, D) != 0) bad = fail("reading the weights");
  MPI_Allreduce(wf, lo, D, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(wf, hi, D, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  int same = memcmp(lo, hi, sizeof lo) == 0;
  for (int k = 0; k < D; k++) worst = fmaxf(worst, fabsf(wf[k] - w_true[k]));
  if (!bad && !(loss_last < loss_first / 100.0f && worst < 1e-3f && same)) {
    fprintf(stderr, "train_mpi rank %d: loss %.3e -> %.3e, weights off by %.1e, ranks %s\n", rank, (double)loss_first,
            (double)loss_last, (double)worst, same ? "identical" : "DIFFER");
    bad = 1;
  }
  if (comm != NULL && ruda_comm_destroy(comm) != 0) bad = fail("ruda_comm_destroy");
  if (ruda_device_close(dev, NULL) != 0) bad = fail("ruda_device_close");
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf(any ? "train_mpi FAILED\n" : "train_mpi OK: loss %.3e -> %.3e, weights within %.1e, %d ranks agree\n",
           (double)loss_first, (double)loss_last, (double)worst, size);
  MPI_Finalize();
  return any ? 1 : 0;
}

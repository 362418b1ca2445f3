/* comm_mpi.c - communicators across processes (ruda/mpi.h), run by ctest
 * under mpirun with 2 and 4 ranks on the host backend: every all-reduce
 * type and reduction against a CPU reference, in place and not, a ring of
 * sends and receives, ranks that disagree on a count told so with the
 * values, and a clean destroy and close. Exit 0: all passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/mpi.h"

static int rank, size, failed;

#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "rank %d: FAILED: ", rank);         \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
      failed = 1;                                         \
    }                                                     \
  } while (0)

#define OK(call) EXPECT((call) == 0, "%s: %s", #call, ruda_error_message(ruda_last_error()))

enum { N = 1000 };

/* Rank r's element i: distinct per rank and element, exact in every type. */
static double value(int r, int i) { return (double)((r + 1) * 7 + i % 13) - 40.0; }

static double reference(ruda_reduce_op op, int i, int is_int) {
  double acc = value(0, i);
  for (int r = 1; r < size; r++) {
    double v = value(r, i);
    acc = op == RUDA_REDUCE_MIN ? fmin(acc, v) : op == RUDA_REDUCE_MAX ? fmax(acc, v) : acc + v;
  }
  if (op == RUDA_REDUCE_MEAN) acc = is_int ? trunc(acc / size) : acc / size;
  return acc;
}

static void fill(void *p, ruda_dtype t) {
  for (int i = 0; i < N; i++) switch (t) {
      case RUDA_DTYPE_F32: ((float *)p)[i] = (float)value(rank, i); break;
      case RUDA_DTYPE_F64: ((double *)p)[i] = value(rank, i); break;
      case RUDA_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)value(rank, i); break;
      default: ((int64_t *)p)[i] = (int64_t)value(rank, i); break;
    }
}

static double at(const void *p, ruda_dtype t, int i) {
  switch (t) {
    case RUDA_DTYPE_F32: return ((const float *)p)[i];
    case RUDA_DTYPE_F64: return ((const double *)p)[i];
    case RUDA_DTYPE_I32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
  }
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  ruda_device *dev = NULL;
  ruda_comm *comm = NULL;
  OK(ruda_device_open(&cfg, &dev));
  EXPECT(ruda_mpi_comm_init(dev, MPI_COMM_WORLD, NULL) == RUDA_EINVAL, "NULL out accepted");
  OK(ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &comm));
  EXPECT(ruda_comm_size(comm) == (uint32_t)size && ruda_comm_rank(comm, dev) == rank, "size %u rank %d",
         ruda_comm_size(comm), ruda_comm_rank(comm, dev));
  static const size_t es[] = {4, 8, 4, 8};
  ruda_handle src, dst;
  OK(ruda_buffer_create(dev, 0, N * 8, &src));
  OK(ruda_buffer_create(dev, 0, N * 8, &dst));
  unsigned char in[N * 8], back[N * 8];
  for (int t = RUDA_DTYPE_F32; t <= RUDA_DTYPE_I64; t++)
    for (int op = RUDA_REDUCE_SUM; op <= RUDA_REDUCE_MAX; op++)
      for (int in_place = 0; in_place < 2; in_place++) {
        fill(in, (ruda_dtype)t);
        ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(src, 0, N * es[t]));
        OK(ruda_write(dev, 0, &d, in, N * es[t]));
        ruda_binding s = ruda_bind_range(src, 0, N * es[t]), o = in_place ? s : ruda_bind_range(dst, 0, N * es[t]);
        OK(ruda_all_reduce(comm, dev, s, o, (ruda_dtype)t, (ruda_reduce_op)op));
        ruda_error *errs = NULL;
        int rc = ruda_comm_sync(comm, dev, &errs);
        EXPECT(rc == 0, "all-reduce type %d op %d: %s", t, op, errs ? ruda_error_message(errs) : "");
        ruda_error_free(errs);
        ruda_future *f = NULL;
        ruda_copy_desc od = ruda_copy_contiguous(o);
        OK(ruda_read(dev, 0, &od, back, N * es[t], &f));
        OK(ruda_future_wait(f, NULL));
        ruda_future_free(f);
        for (int i = 0; i < N; i++) {
          double want = reference((ruda_reduce_op)op, i, t >= RUDA_DTYPE_I32), got = at(back, (ruda_dtype)t, i);
          if (fabs(got - want) > 1e-4 * (1 + fabs(want))) {
            EXPECT(0, "type %d op %d%s element %d: %g, expected %g", t, op, in_place ? " in place" : "", i, got, want);
            break;
          }
        }
      }
  /* A ring: even ranks send first, odd ranks receive first. */
  int32_t token[64], got[64];
  for (int i = 0; i < 64; i++) token[i] = rank * 1000 + i;
  ruda_copy_desc td = ruda_copy_contiguous(ruda_bind_range(src, 0, sizeof token));
  OK(ruda_write(dev, 0, &td, token, sizeof token));
  const uint32_t next = (uint32_t)((rank + 1) % size), prev = (uint32_t)((rank + size - 1) % size);
  ruda_binding sb = ruda_bind_range(src, 0, sizeof token), rb = ruda_bind_range(dst, 0, sizeof got);
  if (rank % 2 == 0) {
    OK(ruda_send(comm, dev, sb, next));
    OK(ruda_recv(comm, dev, rb, prev));
  } else {
    OK(ruda_recv(comm, dev, rb, prev));
    OK(ruda_send(comm, dev, sb, next));
  }
  OK(ruda_comm_sync(comm, dev, NULL));
  ruda_future *f = NULL;
  ruda_copy_desc gd = ruda_copy_contiguous(rb);
  OK(ruda_read(dev, 0, &gd, got, sizeof got, &f));
  OK(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  for (int i = 0; i < 64; i++)
    if (got[i] != (int32_t)prev * 1000 + i) {
      EXPECT(0, "ring: element %d is %d, expected %d", i, got[i], (int)prev * 1000 + i);
      break;
    }
  /* Ranks that disagree on the count: every rank is told, with the values. */
  const uint64_t mine = rank == 0 ? 8 : 16;
  OK(ruda_all_reduce(comm, dev, ruda_bind_range(src, 0, mine * 4), ruda_bind_range(dst, 0, mine * 4), RUDA_DTYPE_F32,
                     RUDA_REDUCE_SUM));
  ruda_error *errs = NULL;
  int rc = ruda_comm_sync(comm, dev, &errs);
  const ruda_error *e = errs ? ruda_error_cause(errs) : NULL;
  EXPECT(rc == RUDA_EUNHEALTHY && e != NULL && ruda_error_code(e) == RUDA_EINVAL &&
             strstr(ruda_error_message(e), "counts 8..16") != NULL,
         "a count mismatch came back as %s: %s", ruda_err_name(rc), e ? ruda_error_message(e) : "(no error)");
  ruda_error_free(errs);
  /* Still usable after a refused collective. */
  OK(ruda_all_reduce(comm, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_I32,
                     RUDA_REDUCE_MAX));
  OK(ruda_comm_sync(comm, dev, NULL));
  EXPECT(ruda_device_close(dev, NULL) == RUDA_EBUSY, "a device in a live communicator closed");
  OK(ruda_buffer_free(dev, 0, src));
  OK(ruda_buffer_free(dev, 0, dst));
  OK(ruda_comm_destroy(comm));
  OK(ruda_device_close(dev, NULL));
  int all = 0;
  MPI_Allreduce(&failed, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("comm_mpi: %d ranks, %s\n", size, all ? "FAILED" : "every check passed");
  MPI_Finalize();
  return all ? 1 : 0;
}

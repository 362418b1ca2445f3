#define _DEFAULT_SOURCE
/* comm_mpi.c - communicators across processes (ruda/mpi.h), run by ctest
 * under mpirun with 2 and 4 ranks on the host backend: every all-reduce
 * type and reduction against a CPU reference, in place and not (8-bit
 * sums that wrap among them); reduce, broadcast, all-gather and
 * reduce-scatter of every type likewise, with what they must not write
 * left alone; a ring of sends and receives; ranks that disagree on a
 * count or type told so with the values, and every collective refused on
 * every rank when counts differ; and a clean destroy and close. Exit 0:
 * all passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* f16 and bf16 by hand, independent of the library's conversions: the
 * values here are exact in both, so no rounding is needed. */
static uint16_t f16_of(double v) {
  if (v == 0) return 0;
  int e;
  const double m = frexp(fabs(v), &e); /* |v| = 2m * 2^(e-1), 2m in [1, 2) */
  return (uint16_t)((v < 0 ? 0x8000u : 0) | (unsigned)(e + 14) << 10 | (unsigned)((2 * m - 1) * 1024));
}

static double f16_to(uint16_t h) {
  const int e = (h >> 10) & 0x1f, f = h & 0x3ff;
  const double a = e == 0 ? ldexp(f, -24) : ldexp(1 + f / 1024.0, e - 15);
  return h & 0x8000 ? -a : a;
}

static uint16_t bf16_of(double v) {
  const float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

static double bf16_to(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Rank r's element i of type t: distinct per rank and element, small
 * integers exact in every type (and their sums and halves, in f16 and
 * bf16 too); u8 shifted up to stay positive; every 97th element of i8 and
 * u8 large enough that the sum wraps. */
static double value(ruda_dtype t, int r, int i) {
  if (i % 97 == 5 && t == RUDA_DTYPE_I8) return 100 + r;
  if (i % 97 == 5 && t == RUDA_DTYPE_U8) return 200 + r;
  return (double)((r + 1) * 7 + i % 13) - (t == RUDA_DTYPE_U8 ? 0.0 : 40.0);
}

static int is_int(ruda_dtype t) {
  return t == RUDA_DTYPE_I32 || t == RUDA_DTYPE_I64 || t == RUDA_DTYPE_I8 || t == RUDA_DTYPE_U8;
}

/* op over every rank's element i; 8-bit sums wrap modulo 2^8, and integer
 * means truncate that wrapped sum, as NCCL does. */
static double reference(ruda_dtype t, ruda_reduce_op op, int i) {
  double acc = value(t, 0, i);
  for (int r = 1; r < size; r++) {
    double v = value(t, r, i);
    acc = op == RUDA_REDUCE_MIN ? fmin(acc, v) : op == RUDA_REDUCE_MAX ? fmax(acc, v) : acc + v;
  }
  if ((op == RUDA_REDUCE_SUM || op == RUDA_REDUCE_MEAN) && (t == RUDA_DTYPE_I8 || t == RUDA_DTYPE_U8)) {
    const int w = ((int)acc % 256 + 256) % 256;
    acc = t == RUDA_DTYPE_I8 && w >= 128 ? w - 256 : w;
  }
  if (op == RUDA_REDUCE_MEAN) acc = is_int(t) ? trunc(acc / size) : acc / size;
  return acc;
}

static void put(void *p, ruda_dtype t, int i, double v) {
  switch (t) {
    case RUDA_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case RUDA_DTYPE_F64: ((double *)p)[i] = v; break;
    case RUDA_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case RUDA_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case RUDA_DTYPE_F16: ((uint16_t *)p)[i] = f16_of(v); break;
    case RUDA_DTYPE_BF16: ((uint16_t *)p)[i] = bf16_of(v); break;
    case RUDA_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

static double at(const void *p, ruda_dtype t, int i) {
  switch (t) {
    case RUDA_DTYPE_F32: return ((const float *)p)[i];
    case RUDA_DTYPE_F64: return ((const double *)p)[i];
    case RUDA_DTYPE_I32: return ((const int32_t *)p)[i];
    case RUDA_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case RUDA_DTYPE_F16: return f16_to(((const uint16_t *)p)[i]);
    case RUDA_DTYPE_BF16: return bf16_to(((const uint16_t *)p)[i]);
    case RUDA_DTYPE_I8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

/* Rank r's elements 0..n of type t. */
static void fill(void *p, ruda_dtype t, int r, int n) {
  for (int i = 0; i < n; i++) put(p, t, i, value(t, r, i));
}

/* Whether got is want, within half a unit in the last place of t (means
 * of 3 ranks are not exact; every other result here is). */
static int close_to(ruda_dtype t, double got, double want) {
  const double tol = t == RUDA_DTYPE_F16 ? 1e-3 : t == RUDA_DTYPE_BF16 ? 8e-3 : 1e-4;
  return fabs(got - want) <= tol * (1 + fabs(want));
}

static const char *const tname[] = {"f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8"};
static const char *const oname[] = {"sum", "mean", "min", "max"};

enum { C = 101, PAD = 0xa5 }; /* elements per rank of all-gather and reduce-scatter; a dst's filler */

static void upload(ruda_device *dev, ruda_handle b, const void *p, size_t bytes) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(b, 0, bytes));
  OK(ruda_write(dev, 0, &d, p, bytes));
}

static void download(ruda_device *dev, ruda_handle b, void *p, size_t bytes) {
  ruda_future *f = NULL;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(b, 0, bytes));
  OK(ruda_read(dev, 0, &d, p, bytes, &f));
  OK(ruda_future_wait(f, NULL));
  ruda_future_free(f);
}

static void synced(ruda_comm *comm, ruda_device *dev, const char *what) {
  ruda_error *errs = NULL;
  int rc = ruda_comm_sync(comm, dev, &errs);
  EXPECT(rc == 0, "%s: %s", what, errs ? ruda_error_message(errs) : "");
  ruda_error_free(errs);
}

/* got's elements 0..n of type t against want (the first mismatch only). */
static void check(const char *what, ruda_dtype t, const void *got, const double *want, int n) {
  for (int i = 0; i < n; i++)
    if (!close_to(t, at(got, t, i), want[i])) {
      EXPECT(0, "%s element %d: %g, expected %g", what, i, at(got, t, i), want[i]);
      return;
    }
}

/* Bytes from..to of got still hold the filler. */
static void untouched(const char *what, const unsigned char *got, size_t from, size_t to) {
  for (size_t b = from; b < to; b++)
    if (got[b] != PAD) {
      EXPECT(0, "%s: byte %zu of dst written (%#x), none expected", what, b, got[b]);
      return;
    }
}

/* A collective the ranks disagree on: refused on every rank, at the call
 * or by the collective, never by a peer's timeout. */
static void refused(ruda_comm *comm, ruda_device *dev, int rc, const char *what, const char *says) {
  if (rc != 0) {
    EXPECT(rc == RUDA_EINVAL, "%s: the call failed with %s", what, ruda_err_name(rc));
    return;
  }
  ruda_error *errs = NULL;
  rc = ruda_comm_sync(comm, dev, &errs);
  const ruda_error *e = errs ? ruda_error_cause(errs) : NULL;
  EXPECT(rc == RUDA_EUNHEALTHY && e != NULL && ruda_error_code(e) != RUDA_ETIMEDOUT &&
             (says == NULL || strstr(ruda_error_message(e), says) != NULL),
         "%s came back as %s: %s", what, ruda_err_name(rc), e ? ruda_error_message(e) : "(no error)");
  ruda_error_free(errs);
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
  ruda_handle src, dst;
  OK(ruda_buffer_create(dev, 0, N * 8, &src));
  OK(ruda_buffer_create(dev, 0, N * 8, &dst));
  unsigned char in[N * 8], back[N * 8];
  for (int t = RUDA_DTYPE_F32; t <= RUDA_DTYPE_U8; t++)
    for (int op = RUDA_REDUCE_SUM; op <= RUDA_REDUCE_MAX; op++)
      for (int in_place = 0; in_place < 2; in_place++) {
        const size_t es = ruda_dtype_size((ruda_dtype)t);
        fill(in, (ruda_dtype)t, rank, N);
        ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(src, 0, N * es));
        OK(ruda_write(dev, 0, &d, in, N * es));
        ruda_binding s = ruda_bind_range(src, 0, N * es), o = in_place ? s : ruda_bind_range(dst, 0, N * es);
        OK(ruda_all_reduce(comm, dev, s, o, (ruda_dtype)t, (ruda_reduce_op)op));
        ruda_error *errs = NULL;
        int rc = ruda_comm_sync(comm, dev, &errs);
        EXPECT(rc == 0, "all-reduce %s %s: %s", tname[t], oname[op], errs ? ruda_error_message(errs) : "");
        ruda_error_free(errs);
        ruda_future *f = NULL;
        ruda_copy_desc od = ruda_copy_contiguous(o);
        OK(ruda_read(dev, 0, &od, back, N * es, &f));
        OK(ruda_future_wait(f, NULL));
        ruda_future_free(f);
        for (int i = 0; i < N; i++) {
          double want = reference((ruda_dtype)t, (ruda_reduce_op)op, i), got = at(back, (ruda_dtype)t, i);
          if (!close_to((ruda_dtype)t, got, want)) {
            EXPECT(0, "all-reduce %s %s%s element %d: %g, expected %g", tname[t], oname[op],
                   in_place ? " in place" : "", i, got, want);
            break;
          }
        }
      }
  /* The other four collectives, every type, against the CPU. dst starts
   * as filler: what a collective must not write stays so. */
  static double want[N];
  unsigned char pad[N * 8], got_dst[N * 8];
  memset(pad, PAD, sizeof pad);
  char what[96];
  EXPECT(size * C <= N, "%d ranks: too many for these buffers", size);
  for (int t = RUDA_DTYPE_F32; t <= RUDA_DTYPE_U8 && size * C <= N; t++) {
    const ruda_dtype dt = (ruda_dtype)t;
    const size_t es = ruda_dtype_size(dt);
    /* Reduce to the first and the last rank; non-roots pass src as dst
     * (in place) or a dst of their own, which stays as it was. */
    for (int op = RUDA_REDUCE_SUM; op <= RUDA_REDUCE_MAX; op++)
      for (int last = 0; last < 2; last++)
        for (int in_place = 0; in_place < 2; in_place++) {
          const uint32_t root = last ? (uint32_t)size - 1 : 0;
          snprintf(what, sizeof what, "reduce %s %s to %u%s", tname[t], oname[op], root, in_place ? " in place" : "");
          fill(in, dt, rank, N);
          upload(dev, src, in, N * es);
          upload(dev, dst, pad, sizeof pad);
          ruda_binding s = ruda_bind_range(src, 0, N * es), o = in_place ? s : ruda_bind_range(dst, 0, N * es);
          OK(ruda_reduce(comm, dev, s, o, dt, (ruda_reduce_op)op, root));
          synced(comm, dev, what);
          /* src: the result in place on the root, as it was elsewhere. */
          const int mine = (uint32_t)rank == root;
          for (int i = 0; i < N; i++)
            want[i] = in_place && mine ? reference(dt, (ruda_reduce_op)op, i) : value(dt, rank, i);
          download(dev, src, back, N * es);
          check(what, dt, back, want, N);
          if (!in_place) {
            download(dev, dst, got_dst, sizeof got_dst);
            if (mine) {
              for (int i = 0; i < N; i++) want[i] = reference(dt, (ruda_reduce_op)op, i);
              check(what, dt, got_dst, want, N);
            }
            untouched(what, got_dst, mine ? N * es : 0, sizeof got_dst);
          }
        }
    /* Broadcast from rank 1 (0 of one rank), into dst and in place. */
    const uint32_t root = 1 % (uint32_t)size;
    for (int in_place = 0; in_place < 2; in_place++) {
      snprintf(what, sizeof what, "broadcast %s from %u%s", tname[t], root, in_place ? " in place" : "");
      fill(in, dt, rank, N);
      upload(dev, src, in, N * es);
      upload(dev, dst, pad, sizeof pad);
      ruda_binding s = ruda_bind_range(src, 0, N * es), o = in_place ? s : ruda_bind_range(dst, 0, N * es);
      OK(ruda_broadcast(comm, dev, s, o, dt, root));
      synced(comm, dev, what);
      for (int i = 0; i < N; i++) want[i] = value(dt, (int)root, i);
      download(dev, in_place ? src : dst, got_dst, in_place ? N * es : sizeof got_dst);
      check(what, dt, got_dst, want, N);
      if (!in_place) {
        untouched(what, got_dst, N * es, sizeof got_dst);
        for (int i = 0; i < N; i++) want[i] = value(dt, rank, i);
        download(dev, src, back, N * es);
        check(what, dt, back, want, N);
      }
    }
    /* All-gather: rank r's C elements at r * C. */
    snprintf(what, sizeof what, "all-gather %s", tname[t]);
    fill(in, dt, rank, C);
    upload(dev, src, in, C * es);
    upload(dev, dst, pad, sizeof pad);
    OK(ruda_all_gather(comm, dev, ruda_bind_range(src, 0, C * es), ruda_bind_range(dst, 0, size * C * es), dt));
    synced(comm, dev, what);
    for (int r = 0; r < size; r++)
      for (int i = 0; i < C; i++) want[r * C + i] = value(dt, r, i);
    download(dev, dst, got_dst, sizeof got_dst);
    check(what, dt, got_dst, want, size * C);
    untouched(what, got_dst, size * C * es, sizeof got_dst);
    /* Reduce-scatter: rank r gets elements r * C .. (r + 1) * C of the
     * all-reduce of size * C. */
    for (int op = RUDA_REDUCE_SUM; op <= RUDA_REDUCE_MAX; op++) {
      snprintf(what, sizeof what, "reduce-scatter %s %s", tname[t], oname[op]);
      fill(in, dt, rank, size * C);
      upload(dev, src, in, size * C * es);
      upload(dev, dst, pad, sizeof pad);
      OK(ruda_reduce_scatter(comm, dev, ruda_bind_range(src, 0, size * C * es), ruda_bind_range(dst, 0, C * es), dt,
                             (ruda_reduce_op)op));
      synced(comm, dev, what);
      for (int i = 0; i < C; i++) want[i] = reference(dt, (ruda_reduce_op)op, rank * C + i);
      download(dev, dst, got_dst, sizeof got_dst);
      check(what, dt, got_dst, want, C);
      untouched(what, got_dst, C * es, sizeof got_dst);
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
  /* Ranks that disagree on the type (of one size): named in the message. */
  static const ruda_dtype pairs[][2] = {{RUDA_DTYPE_F16, RUDA_DTYPE_BF16}, {RUDA_DTYPE_I8, RUDA_DTYPE_U8}};
  for (int p = 0; p < 2; p++) {
    const ruda_dtype t = pairs[p][rank == 0 ? 0 : 1];
    char says[32];
    snprintf(says, sizeof says, "types %s..%s", tname[pairs[p][0]], tname[pairs[p][1]]);
    refused(comm, dev,
            ruda_all_reduce(comm, dev, ruda_bind_range(src, 0, 16), ruda_bind_range(dst, 0, 16), t, RUDA_REDUCE_SUM),
            "a type mismatch", says);
  }
  /* The other collectives with counts that differ (rank 0 brings 8
   * elements, the others 16): refused on every rank. */
  const uint64_t cnt = rank == 0 ? 8 : 16;
  refused(comm, dev,
          ruda_reduce(comm, dev, ruda_bind_range(src, 0, cnt * 4), ruda_bind_range(dst, 0, cnt * 4), RUDA_DTYPE_F32,
                      RUDA_REDUCE_SUM, 0),
          "reduce with a count mismatch", "counts 8..16");
  refused(comm, dev,
          ruda_broadcast(comm, dev, ruda_bind_range(src, 0, cnt * 4), ruda_bind_range(dst, 0, cnt * 4), RUDA_DTYPE_F32,
                         1 % (uint32_t)size),
          "broadcast with a count mismatch", "counts 8..16");
  refused(comm, dev,
          ruda_all_gather(comm, dev, ruda_bind_range(src, 0, cnt), ruda_bind_range(dst, 0, size * cnt), RUDA_DTYPE_U8),
          "all-gather with a count mismatch", "counts 8..16");
  refused(comm, dev,
          ruda_reduce_scatter(comm, dev, ruda_bind_range(src, 0, size * cnt * 2), ruda_bind_range(dst, 0, cnt * 2),
                              RUDA_DTYPE_F16, RUDA_REDUCE_MAX),
          "reduce-scatter with a count mismatch", "counts 8..16");
  /* Ranks that disagree only on the root, or on the collective: told so
   * (the transport would not see either). */
  refused(comm, dev,
          ruda_reduce(comm, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_I32,
                      RUDA_REDUCE_SUM, rank == 0 ? 0 : 1),
          "reduce with roots that differ", "roots 0..1");
  if (rank == 0)
    refused(comm, dev,
            ruda_broadcast(comm, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_U8, 0),
            "broadcast against reduce", "collectives reduce..broadcast");
  else
    refused(comm, dev,
            ruda_reduce(comm, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_U8,
                        RUDA_REDUCE_SUM, 0),
            "reduce against broadcast", "collectives reduce..broadcast");
  /* Still usable after a refused collective. */
  OK(ruda_all_reduce(comm, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_I32,
                     RUDA_REDUCE_MAX));
  OK(ruda_comm_sync(comm, dev, NULL));
  /* A rank that comes late (RUDA_COMM_TIMEOUT 300 ms, it comes after
   * 1.5 s): the others time out naming the timeout, the late one times
   * out too rather than hang, and the broken communicator refuses what
   * follows at once. */
  setenv("RUDA_COMM_TIMEOUT", "300", 1);
  ruda_comm *slow = NULL;
  OK(ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &slow));
  unsetenv("RUDA_COMM_TIMEOUT");
  const int late = size - 1;
  if (rank == late) usleep(1500 * 1000);
  for (int round = 0; round < 2; round++) {
    OK(ruda_all_reduce(slow, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_I32,
                       RUDA_REDUCE_SUM));
    errs = NULL;
    rc = ruda_comm_sync(slow, dev, &errs);
    e = errs ? ruda_error_cause(errs) : NULL;
    const char *says = round == 0 ? "(RUDA_COMM_TIMEOUT)" : "the communicator is broken";
    EXPECT(rc == RUDA_EUNHEALTHY && e != NULL && ruda_error_code(e) == RUDA_ETIMEDOUT &&
               strstr(ruda_error_message(e), says) != NULL,
           "a late rank, round %d: %s: %s", round, ruda_err_name(rc), e ? ruda_error_message(e) : "(no error)");
    ruda_error_free(errs);
  }
  OK(ruda_comm_destroy(slow));
  /* A rank that is gone (destroyed its communicator and never issues):
   * the others time out instead of waiting for it for ever. */
  setenv("RUDA_COMM_TIMEOUT", "300", 1);
  ruda_comm *gone = NULL;
  OK(ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &gone));
  unsetenv("RUDA_COMM_TIMEOUT");
  if (rank != late) {
    OK(ruda_all_reduce(gone, dev, ruda_bind_range(src, 0, 64), ruda_bind_range(dst, 0, 64), RUDA_DTYPE_F32,
                       RUDA_REDUCE_MAX));
    errs = NULL;
    rc = ruda_comm_sync(gone, dev, &errs);
    e = errs ? ruda_error_cause(errs) : NULL;
    EXPECT(rc == RUDA_EUNHEALTHY && e != NULL && ruda_error_code(e) == RUDA_ETIMEDOUT,
           "a rank that is gone: %s: %s", ruda_err_name(rc), e ? ruda_error_message(e) : "(no error)");
    ruda_error_free(errs);
  }
  OK(ruda_comm_destroy(gone));
  /* A send waits for its receiver (comm.h), whatever its size: ranks 0
   * and 1 sending 64 bytes to each other first both time out, and so does
   * a send to a rank that never receives. MPI's eager protocol used to
   * complete both at once, the second with its bytes lost. */
  for (int crossed = 1; crossed >= 0; crossed--) {
    setenv("RUDA_COMM_TIMEOUT", "300", 1);
    ruda_comm *p2p = NULL;
    OK(ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &p2p));
    unsetenv("RUDA_COMM_TIMEOUT");
    if (rank == 0 || (crossed && rank == 1)) {
      OK(ruda_send(p2p, dev, ruda_bind_range(src, 0, 64), (uint32_t)(1 - rank)));
      errs = NULL;
      rc = ruda_comm_sync(p2p, dev, &errs);
      e = errs ? ruda_error_cause(errs) : NULL;
      EXPECT(rc == RUDA_EUNHEALTHY && e != NULL && ruda_error_code(e) == RUDA_ETIMEDOUT,
             "%s: %s: %s", crossed ? "crossed sends" : "a send nobody receives", ruda_err_name(rc),
             e ? ruda_error_message(e) : "(no error: the send completed without its receiver)");
      ruda_error_free(errs);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    OK(ruda_comm_destroy(p2p));
  }
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

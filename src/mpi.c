/* mpi.c - libruda_mpi: communicators across MPI processes (ruda/mpi.h).
 *
 * Public API only: it builds on ruda_comm_init_rank. On cuda the ranks
 * share NCCL's unique id over MPI; on host MPI is the transport
 * (ruda_comm_transport), whose functions the rank's worker calls one at a
 * time in stream order. Each waits for its request by polling MPI_Test up
 * to the deadline: MPI has no timeout of its own, and a rank that never
 * comes must not hang the others for ever. */
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/comm_timeout.h"
#include "base/half.h"
#include "ruda/mpi.h"

/* Reductions of our own (MPI_Op_create) where MPI's will not do: f16 and
 * bf16 have no MPI type (their bits travel as MPI_UINT16_T, so each needs
 * ops of its own: sum, min, max), and Open MPI's vectorised MPI_SUM
 * saturates 8-bit integers (op/avx, 4.1) where NCCL's sums wrap. */
enum { OWN_F16 = 0, OWN_BF16 = 3, OWN_BYTE_SUM = 6, OWN_OPS };

typedef struct mpi_link {
  MPI_Comm comm; /* a duplicate: our traffic never meets the application's */
  int rank, size;
  uint64_t timeout_ns; /* 0: wait for ever */
  uint64_t seq;        /* collectives issued, for messages */
  int broken;          /* a wait timed out: the ranks are out of step for good */
  MPI_Op own[OWN_OPS]; /* MPI_OP_NULL where not made */
  /* What MPI reads and writes: the link's own memory, never the caller's.
   * A request that timed out stays pending, and a late peer can still
   * complete it; it then touches these, which a broken link never frees,
   * rather than a buffer or a stack frame long gone. */
  int64_t agree[12]; /* the agreement check's values and maxima */
  unsigned char *bounce;
  size_t bounce_cap;
} mpi_link;

/* The bounce block, at least bytes long (grown only between requests). */
static void *bounce(mpi_link *l, size_t bytes, const char *what, char *why, size_t n) {
  if (bytes <= l->bounce_cap && l->bounce != NULL) return l->bounce;
  unsigned char *b = realloc(l->bounce, bytes ? bytes : 1);
  if (b == NULL) {
    snprintf(why, n, "%s #%llu: no host memory for %zu bytes", what, (unsigned long long)l->seq, bytes);
    return NULL;
  }
  l->bounce = b;
  l->bounce_cap = bytes;
  return b;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Every transport call starts here: numbers it, refuses it on a broken
 * link, and counts MPI cannot carry (its counts are int). */
static int begin(mpi_link *l, const char *what, uint64_t count, const char *unit, char *why, size_t n) {
  l->seq++;
  if (l->broken) {
    snprintf(why, n, "%s #%llu: the communicator is broken (an earlier collective timed out); destroy it", what,
             (unsigned long long)l->seq);
    return RUDA_ETIMEDOUT;
  }
  if (count > INT_MAX) {
    snprintf(why, n, "%s #%llu: %llu %s; MPI counts are int", what, (unsigned long long)l->seq,
             (unsigned long long)count, unit);
    return RUDA_ERANGE;
  }
  return 0;
}

/* Polls rq to completion or the deadline. */
static int wait_req(mpi_link *l, MPI_Request *rq, MPI_Status *st, const char *what, char *why, size_t n) {
  const uint64_t until = l->timeout_ns ? now_ns() + l->timeout_ns : UINT64_MAX;
  for (unsigned spins = 0;; spins++) {
    int done = 0;
    int e = MPI_Test(rq, &done, st);
    if (e != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(e, msg, &len);
      snprintf(why, n, "%s #%llu: MPI: %.*s", what, (unsigned long long)l->seq, len, msg);
      return RUDA_EGENERIC;
    }
    if (done) return 0;
    if (now_ns() > until) {
      l->broken = 1;
      snprintf(why, n,
               "%s #%llu timed out after %llu ms waiting for the other ranks (RUDA_COMM_TIMEOUT); the "
               "communicator is broken: destroy it",
               what, (unsigned long long)l->seq, (unsigned long long)(l->timeout_ns / 1000000));
      return RUDA_ETIMEDOUT;
    }
    if (spins > 64) sched_yield();
  }
}

static MPI_Datatype type_of(ruda_dtype t) {
  switch (t) {
    case RUDA_DTYPE_F32: return MPI_FLOAT;
    case RUDA_DTYPE_F64: return MPI_DOUBLE;
    case RUDA_DTYPE_I32: return MPI_INT32_T;
    case RUDA_DTYPE_I64: return MPI_INT64_T;
    case RUDA_DTYPE_I8: return MPI_INT8_T;
    case RUDA_DTYPE_U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* f16, bf16: the bits, under our ops */
  }
}

/* inout = in op inout, element by element: each half widened to float,
 * combined, and rounded back to nearest even, as NCCL does. */
#define HALF_REDUCE(name, to_f32, of_f32, combine)                     \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) { \
    (void)dt;                                                          \
    const uint16_t *a = in;                                            \
    uint16_t *b = inout;                                               \
    for (int i = 0; i < *len; i++) {                                   \
      const float x = to_f32(a[i]), y = to_f32(b[i]);                  \
      b[i] = of_f32(combine);                                          \
    }                                                                  \
  }
HALF_REDUCE(f16_sum, ruda__f16_to_f32, ruda__f32_to_f16, x + y)
HALF_REDUCE(f16_min, ruda__f16_to_f32, ruda__f32_to_f16, x < y ? x : y)
HALF_REDUCE(f16_max, ruda__f16_to_f32, ruda__f32_to_f16, x > y ? x : y)
HALF_REDUCE(bf16_sum, ruda__bf16_to_f32, ruda__f32_to_bf16, x + y)
HALF_REDUCE(bf16_min, ruda__bf16_to_f32, ruda__f32_to_bf16, x < y ? x : y)
HALF_REDUCE(bf16_max, ruda__bf16_to_f32, ruda__f32_to_bf16, x > y ? x : y)
#undef HALF_REDUCE

/* Sums modulo 2^8: the same bits for i8 and u8. */
static void byte_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const unsigned char *a = in;
  unsigned char *b = inout;
  for (int i = 0; i < *len; i++) b[i] = (unsigned char)(a[i] + b[i]);
}

static void own_ops_free(mpi_link *l) {
  for (int i = 0; i < OWN_OPS; i++)
    if (l->own[i] != MPI_OP_NULL) MPI_Op_free(&l->own[i]);
}

/* Made with the link and freed with it: ops are local objects, and the
 * link is released (the communicator destroyed) before MPI_Finalize. */
static int own_ops_create(mpi_link *l) {
  static MPI_User_function *const fn[OWN_OPS] = {f16_sum, f16_min, f16_max, bf16_sum, bf16_min, bf16_max, byte_sum};
  for (int i = 0; i < OWN_OPS; i++) l->own[i] = MPI_OP_NULL;
  for (int i = 0; i < OWN_OPS; i++)
    if (MPI_Op_create(fn[i], 1, &l->own[i]) != MPI_SUCCESS) {
      l->own[i] = MPI_OP_NULL;
      own_ops_free(l);
      return RUDA_EGENERIC;
    }
  return 0;
}

/* Mean is the sum, divided afterwards. */
static MPI_Op op_of(const mpi_link *l, ruda_dtype t, ruda_reduce_op op) {
  const int k = op == RUDA_REDUCE_MIN ? 1 : op == RUDA_REDUCE_MAX ? 2 : 0;
  if (t == RUDA_DTYPE_F16) return l->own[OWN_F16 + k];
  if (t == RUDA_DTYPE_BF16) return l->own[OWN_BF16 + k];
  if ((t == RUDA_DTYPE_I8 || t == RUDA_DTYPE_U8) && k == 0) return l->own[OWN_BYTE_SUM];
  return k == 1 ? MPI_MIN : k == 2 ? MPI_MAX : MPI_SUM;
}

static const char *const dtype_name[] = {"f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8"};
static const char *const op_name[] = {"sum", "mean", "min", "max"};

/* Checks that every rank brought the same count, type and reduction: one
 * small all-reduce of each value and its negation under MAX gives the
 * largest and the smallest of each. */
static int agree(mpi_link *l, uint64_t count, ruda_dtype t, ruda_reduce_op op, char *why, size_t n) {
  int64_t *v = l->agree, *m = l->agree + 6;
  const int64_t mine[6] = {(int64_t)count, -(int64_t)count, t, -(int64_t)t, op, -(int64_t)op};
  memcpy(v, mine, sizeof mine);
  MPI_Request rq;
  if (MPI_Iallreduce(v, m, 6, MPI_INT64_T, MPI_MAX, l->comm, &rq) != MPI_SUCCESS) {
    snprintf(why, n, "all-reduce #%llu: MPI refused the agreement check", (unsigned long long)l->seq);
    return RUDA_EGENERIC;
  }
  int rc = wait_req(l, &rq, MPI_STATUS_IGNORE, "all-reduce", why, n);
  if (rc != 0) return rc;
  if (m[0] == -m[1] && m[2] == -m[3] && m[4] == -m[5]) return 0;
  snprintf(why, n,
           "all-reduce #%llu: ranks disagree: counts %lld..%lld, types %s..%s, reductions %s..%s (rank %d brought "
           "%llu %s %s)",
           (unsigned long long)l->seq, (long long)-m[1], (long long)m[0], dtype_name[-m[3]], dtype_name[m[2]],
           op_name[-m[5]], op_name[m[4]], l->rank, (unsigned long long)count, dtype_name[t], op_name[op]);
  return RUDA_EINVAL;
}

static int t_all_reduce(void *ctx, const void *src, void *dst, uint64_t count, ruda_dtype t, ruda_reduce_op op,
                        char *why, size_t n) {
  mpi_link *l = ctx;
  /* The count is checked after the agreement, so every rank refuses it. */
  int rc = begin(l, "all-reduce", 0, "elements", why, n);
  if (rc == 0) rc = agree(l, count, t, op, why, n);
  if (rc == 0 && count > INT_MAX) {
    snprintf(why, n, "all-reduce #%llu: %llu elements; MPI counts are int", (unsigned long long)l->seq,
             (unsigned long long)count);
    rc = RUDA_ERANGE;
  }
  if (rc != 0) return rc;
  const size_t bytes = (size_t)count * ruda_dtype_size(t);
  void *b = bounce(l, bytes, "all-reduce", why, n);
  if (b == NULL) return RUDA_ENOMEM;
  memcpy(b, src, bytes);
  MPI_Request rq;
  if (MPI_Iallreduce(MPI_IN_PLACE, b, (int)count, type_of(t), op_of(l, t, op), l->comm, &rq) != MPI_SUCCESS) {
    snprintf(why, n, "all-reduce #%llu: MPI_Iallreduce refused", (unsigned long long)l->seq);
    return RUDA_EGENERIC;
  }
  if ((rc = wait_req(l, &rq, MPI_STATUS_IGNORE, "all-reduce", why, n)) != 0) return rc;
  memcpy(dst, b, bytes);
  /* Mean: the sum divided here; integers truncate, as the other backends',
   * halves divide in float and round back. */
  if (op == RUDA_REDUCE_MEAN)
    for (uint64_t i = 0; i < count; i++) switch (t) {
        case RUDA_DTYPE_F32: ((float *)dst)[i] /= (float)l->size; break;
        case RUDA_DTYPE_F64: ((double *)dst)[i] /= (double)l->size; break;
        case RUDA_DTYPE_I32: ((int32_t *)dst)[i] /= l->size; break;
        case RUDA_DTYPE_I64: ((int64_t *)dst)[i] /= l->size; break;
        case RUDA_DTYPE_I8: ((int8_t *)dst)[i] = (int8_t)(((int8_t *)dst)[i] / l->size); break;
        case RUDA_DTYPE_U8: ((uint8_t *)dst)[i] = (uint8_t)(((uint8_t *)dst)[i] / l->size); break;
        case RUDA_DTYPE_F16: {
          uint16_t *h = (uint16_t *)dst + i;
          *h = ruda__f32_to_f16(ruda__f16_to_f32(*h) / (float)l->size);
          break;
        }
        default: {
          uint16_t *h = (uint16_t *)dst + i;
          *h = ruda__f32_to_bf16(ruda__bf16_to_f32(*h) / (float)l->size);
          break;
        }
      }
  return 0;
}

enum { TAG = 0x7275 };

static int t_send(void *ctx, const void *src, uint64_t bytes, uint32_t peer, char *why, size_t n) {
  mpi_link *l = ctx;
  int rc = begin(l, "send", bytes, "bytes", why, n);
  if (rc != 0) return rc;
  void *b = bounce(l, (size_t)bytes, "send", why, n);
  if (b == NULL) return RUDA_ENOMEM;
  memcpy(b, src, (size_t)bytes);
  MPI_Request rq;
  /* Synchronous mode: complete only once the receiver's recv matched it,
   * as comm.h promises (and NCCL and the in-process exchange do). A
   * standard send of a few bytes completes on its own under MPI's eager
   * protocol: crossed sends would both succeed, and a send to a rank that
   * never receives would return 0 with its bytes lost. */
  if (MPI_Issend(b, (int)bytes, MPI_BYTE, (int)peer, TAG, l->comm, &rq) != MPI_SUCCESS) {
    snprintf(why, n, "send #%llu to rank %u: MPI_Issend refused", (unsigned long long)l->seq, peer);
    return RUDA_EGENERIC;
  }
  return wait_req(l, &rq, MPI_STATUS_IGNORE, "send", why, n);
}

static int t_recv(void *ctx, void *dst, uint64_t bytes, uint32_t peer, char *why, size_t n) {
  mpi_link *l = ctx;
  int rc = begin(l, "recv", bytes, "bytes", why, n);
  if (rc != 0) return rc;
  void *b = bounce(l, (size_t)bytes, "recv", why, n);
  if (b == NULL) return RUDA_ENOMEM;
  MPI_Request rq;
  MPI_Status st;
  if (MPI_Irecv(b, (int)bytes, MPI_BYTE, (int)peer, TAG, l->comm, &rq) != MPI_SUCCESS) {
    snprintf(why, n, "recv #%llu from rank %u: MPI_Irecv refused", (unsigned long long)l->seq, peer);
    return RUDA_EGENERIC;
  }
  rc = wait_req(l, &rq, &st, "recv", why, n);
  if (rc != 0) return rc;
  int got = 0;
  MPI_Get_count(&st, MPI_BYTE, &got);
  if ((uint64_t)got != bytes) {
    snprintf(why, n, "recv #%llu from rank %u: %d bytes came, %llu expected", (unsigned long long)l->seq, peer, got,
             (unsigned long long)bytes);
    return RUDA_ERANGE;
  }
  memcpy(dst, b, (size_t)bytes);
  return 0;
}

static void t_release(void *ctx) {
  mpi_link *l = ctx;
  /* Freeing an op a pending request uses is allowed: MPI frees it after. */
  own_ops_free(l);
  /* A broken link may hold a request that completes only when a late peer
   * comes, or never: its duplicate is left to MPI_Finalize rather than
   * block here, and the memory the request uses (the link itself and its
   * bounce block) is kept for the rest of the process. */
  if (l->broken) return;
  MPI_Comm_free(&l->comm);
  free(l->bounce);
  free(l);
}

int ruda_mpi_comm_init(ruda_device *dev, MPI_Comm comm, ruda_comm **out) {
  if (out != NULL) *out = NULL;
  if (dev == NULL || out == NULL) return RUDA_EINVAL;
  int init = 0, level = 0, rank = 0, size = 0;
  MPI_Initialized(&init);
  if (init) MPI_Query_thread(&level);
  if (!init || level < MPI_THREAD_MULTIPLE) return RUDA_EINVAL; /* the workers call MPI too */
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (strcmp(ruda_device_backend(dev), "host") != 0) {
    ruda_comm_id id;
    int rc = rank == 0 ? ruda_comm_unique_id(dev, &id) : 0;
    MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
    if (rc != 0) return rc;
    MPI_Bcast(id.bytes, (int)sizeof id.bytes, MPI_BYTE, 0, comm);
    return ruda_comm_init_rank(dev, (uint32_t)size, (uint32_t)rank, &id, NULL, out);
  }
  mpi_link *l = calloc(1, sizeof *l);
  if (l == NULL) return RUDA_ENOMEM;
  if (MPI_Comm_dup(comm, &l->comm) != MPI_SUCCESS) {
    free(l);
    return RUDA_EGENERIC;
  }
  MPI_Comm_set_errhandler(l->comm, MPI_ERRORS_RETURN);
  if (own_ops_create(l) != 0) {
    MPI_Comm_free(&l->comm);
    free(l);
    return RUDA_EGENERIC;
  }
  l->rank = rank;
  l->size = size;
  l->timeout_ns = ruda__comm_timeout_ms() * 1000000;
  const ruda_comm_transport t = {l, t_all_reduce, t_send, t_recv, t_release};
  int rc = ruda_comm_init_rank(dev, (uint32_t)size, (uint32_t)rank, NULL, &t, out);
  if (rc != 0) t_release(l);
  return rc;
}

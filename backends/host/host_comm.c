/* host_comm.c - collectives of the host backend: the ranks' workers meet
 * in memory, or go through the application's transport.
 *
 * A collective (all-reduce, reduce, broadcast, all-gather, reduce-scatter)
 * waits until every rank arrived with its k-th one, the last to arrive
 * computes the result into a scratch buffer, every rank copies its part
 * out and the last to leave opens the next round; a send waits in its
 * pair's mailbox until the receiver copied. Through a transport (ranks in
 * several processes) the four newer collectives are made of the
 * transport's all-reduce: reduce and reduce-scatter reduce everything and
 * keep their part; broadcast and all-gather sum bytes (u8) that only one
 * rank contributes, so the transport needs nothing more; a small
 * all-reduce before each checks that the ranks agree. A worker blocks here as a
 * GPU stream waits in an NCCL kernel for its peers. One lock per
 * communicator; every wait is on its condition variable, bounded by
 * RUDA_COMM_TIMEOUT: a rank that never comes breaks the communicator
 * with an error naming it, instead of hanging its peers for ever.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/host_backend.h"
#include "base/comm_timeout.h"
#include "base/half.h"
#include "ruda/comm.h"

/* One round at a time for all-reduces, one mailbox per ordered pair of
 * ranks for sends. */
typedef struct mailbox {
  const void *src;
  uint64_t bytes;
  int full, taken;
} mailbox;

typedef struct host_exchange {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* CLOCK_MONOTONIC */
  uint32_t n;         /* ranks */
  uint32_t refs;      /* rank handles not destroyed yet, under lock */
  uint64_t round;     /* all-reduces finished */
  uint32_t arrived, left;
  int leaving; /* every rank arrived: copying the result out */
  const void **src; /* per rank, this round */
  uint8_t *here;    /* per rank: arrived this round */
  struct {
    uint64_t count;
    uint32_t kind, dtype, op, root;
  } *asked; /* per rank, this round: what it brought */
  void *scratch;
  size_t scratch_bytes;
  uint64_t count;
  uint32_t kind, dtype, op, root;
  int mismatch; /* ranks disagreed on the collective, count, type, op or root */
  mailbox *box; /* n x n: box[from * n + to] */
  uint64_t timeout_ns; /* RUDA_COMM_TIMEOUT; 0: wait for ever */
  /* Set once a wait timed out: the ranks are out of step for good, so
   * every waiter and every later collective fails with this message. */
  char *broken;
} host_exchange;

/* A rank's handle: its exchange (ranks of one process), or the
 * application's transport (ranks in several: ruda_comm_init_rank). */
typedef struct host_rank {
  host_exchange *x;
  uint32_t rank, nranks;
  int external;
  ruda_comm_transport t;
} host_rank;

static const size_t dtype_size[] = {4, 8, 4, 8, 2, 2, 1, 1};

static void exchange_free(host_exchange *h) {
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->cond);
  free(h->broken);
  free(h->here);
  free(h->asked);
  free(h->src);
  free(h->scratch);
  free(h->box);
  free(h);
}

static const char *const dtype_name[] = {"f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8"};
static const char *const op_name[] = {"sum", "mean", "min", "max"};
/* By ruda__coll_kind. */
static const char *const kind_name[] = {"all-reduce", "send",      "recv",          "reduce",
                                        "broadcast",  "all-gather", "reduce-scatter"};

/* Waits on the exchange until ready(h, arg) holds, the exchange broke, or
 * the deadline passed (then breaks it with a message from why). Lock
 * held. 0, or RUDA_ETIMEDOUT with *err. */
static int wait_for(host_exchange *h, int (*ready)(host_exchange *, const void *), const void *arg,
                    const struct timespec *deadline, void (*why)(host_exchange *, const void *, char *, size_t),
                    ruda_error **err) {
  while (!ready(h, arg)) {
    if (h->broken == NULL) {
      int r = deadline ? pthread_cond_timedwait(&h->cond, &h->lock, deadline) : pthread_cond_wait(&h->cond, &h->lock);
      if (r != ETIMEDOUT || ready(h, arg) || h->broken != NULL) continue; /* another waiter broke it */
      char msg[400];
      why(h, arg, msg, sizeof msg);
      h->broken = strdup(msg);
      pthread_cond_broadcast(&h->cond);
    }
    *err = ruda__error_new(RUDA_ETIMEDOUT, 0, "%s%s", h->broken ? h->broken : "timed out",
                           "; the communicator is broken: destroy it");
    return RUDA_ETIMEDOUT;
  }
  return 0;
}

static struct timespec *deadline_of(const host_exchange *h, struct timespec *ts) {
  if (h->timeout_ns == 0) return NULL;
  clock_gettime(CLOCK_MONOTONIC, ts);
  uint64_t ns = (uint64_t)ts->tv_nsec + h->timeout_ns % 1000000000u;
  ts->tv_sec += (time_t)(h->timeout_ns / 1000000000u + ns / 1000000000u);
  ts->tv_nsec = (long)(ns % 1000000000u);
  return ts;
}

int ruda__host_comm_init(void *const *states, uint32_t n, void **ranks) {
  (void)states;
  host_exchange *h = calloc(1, sizeof *h);
  if (h == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_comm_init: out of host memory");
  pthread_mutex_init(&h->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cond, &ca);
  pthread_condattr_destroy(&ca);
  h->n = n;
  h->timeout_ns = ruda__comm_timeout_ms() * 1000000;
  h->src = calloc(n, sizeof *h->src);
  h->here = calloc(n, sizeof *h->here);
  h->asked = calloc(n, sizeof *h->asked);
  h->box = calloc((size_t)n * n, sizeof *h->box);
  uint32_t made = 0;
  if (h->src != NULL && h->box != NULL && h->here != NULL && h->asked != NULL) {
    for (; made < n; made++) {
      host_rank *r = calloc(1, sizeof *r); /* not external */
      if (r == NULL) break;
      r->x = h;
      r->rank = made;
      ranks[made] = r;
    }
  }
  if (made == n) {
    h->refs = n;
    return 0;
  }
  for (uint32_t r = 0; r < made; r++) {
    free(ranks[r]);
    ranks[r] = NULL;
  }
  exchange_free(h);
  return ruda__fail(RUDA_ENOMEM, "ruda_comm_init: out of host memory");
}

int ruda__host_comm_init_rank(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                              const ruda_comm_transport *transport, void **handle) {
  (void)state;
  (void)id;
  if (transport == NULL)
    return ruda__fail(RUDA_ENOBACKEND,
                      "ruda_comm_init_rank: the host backend reaches ranks in other processes only through a "
                      "transport (ruda_mpi_comm_init, or a ruda_comm_transport of your own)");
  host_rank *r = calloc(1, sizeof *r);
  if (r == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_comm_init_rank: out of host memory");
  r->rank = rank;
  r->nranks = nranks;
  r->external = 1;
  r->t = *transport;
  *handle = r;
  return 0;
}

/* Broadcast and all-gather through the transport's all-reduce: a sum of
 * bytes that one rank contributes and the others zero, exact in u8. */
static int external_bytes(host_rank *r, const ruda__coll *k, size_t es, char *why, size_t why_len) {
  const size_t part = (size_t)k->count * es;
  const size_t total = k->kind == RUDA__COLL_ALL_GATHER ? part * r->nranks : part;
  unsigned char *buf = calloc(total ? total : 1, 1);
  if (buf == NULL) {
    snprintf(why, why_len, "no host memory for %zu bytes", total);
    return RUDA_ENOMEM;
  }
  const void *src = (const void *)(uintptr_t)k->src;
  if (k->kind == RUDA__COLL_ALL_GATHER) memcpy(buf + part * r->rank, src, part);
  else if (r->rank == k->peer) memcpy(buf, src, part);
  int rc = r->t.all_reduce(r->t.ctx, buf, buf, total, RUDA_DTYPE_U8, RUDA_REDUCE_SUM, why, why_len);
  if (rc == 0) memcpy((void *)(uintptr_t)k->dst, buf, total);
  free(buf);
  return rc;
}

/* Reduce and reduce-scatter through the transport's all-reduce: every
 * rank reduces the whole source and keeps its part. */
static int external_reduce(host_rank *r, const ruda__coll *k, size_t es, char *why, size_t why_len) {
  const uint64_t total = ruda__coll_src_count(k);
  void *buf = malloc(total ? (size_t)total * es : 1);
  if (buf == NULL) {
    snprintf(why, why_len, "no host memory for %llu bytes", (unsigned long long)(total * es));
    return RUDA_ENOMEM;
  }
  int rc = r->t.all_reduce(r->t.ctx, (const void *)(uintptr_t)k->src, buf, total, (ruda_dtype)k->dtype,
                           (ruda_reduce_op)k->op, why, why_len);
  if (rc == 0 && k->kind == RUDA__COLL_REDUCE_SCATTER)
    memcpy((void *)(uintptr_t)k->dst, (char *)buf + (size_t)k->count * es * r->rank, (size_t)k->count * es);
  else if (rc == 0 && r->rank == k->peer)
    memcpy((void *)(uintptr_t)k->dst, buf, (size_t)k->count * es);
  free(buf);
  return rc;
}

/* The newer collectives first check, with one all-reduce (i64, max) of
 * each value and its negation, that every rank brought the same one: the
 * all-reduce they are made of would only see the bytes it moves (and
 * never a root). */
static int external_agree(host_rank *r, const ruda__coll *k, char *why, size_t n) {
  const int64_t mine[5] = {k->kind, (int64_t)k->count, k->dtype, k->op, k->peer};
  int64_t v[10];
  for (int i = 0; i < 5; i++) v[2 * i] = mine[i], v[2 * i + 1] = -mine[i];
  int rc = r->t.all_reduce(r->t.ctx, v, v, 10, RUDA_DTYPE_I64, RUDA_REDUCE_MAX, why, n);
  if (rc != 0) return rc;
  int same = 1;
  for (int i = 0; i < 5; i++) same &= v[2 * i] == -v[2 * i + 1];
  if (same) return 0;
  /* Every value is a valid index on the rank that brought it. */
  snprintf(why, n,
           "ranks disagree: collectives %s..%s, counts %lld..%lld, types %s..%s, reductions %s..%s, roots %lld..%lld",
           kind_name[-v[1]], kind_name[v[0]], (long long)-v[3], (long long)v[2], dtype_name[-v[5]], dtype_name[v[4]],
           op_name[-v[7]], op_name[v[6]], (long long)-v[9], (long long)v[8]);
  return RUDA_EINVAL;
}

/* A collective through the application's transport, on the worker. */
static int external_collective(host_rank *r, const ruda__coll *k, ruda_error **err) {
  char why[300] = "";
  int rc;
  const size_t es = dtype_size[k->dtype];
  switch (k->kind) {
    case RUDA__COLL_ALL_REDUCE:
      rc = r->t.all_reduce(r->t.ctx, (const void *)(uintptr_t)k->src, (void *)(uintptr_t)k->dst, k->count,
                           (ruda_dtype)k->dtype, (ruda_reduce_op)k->op, why, sizeof why);
      break;
    case RUDA__COLL_SEND: rc = r->t.send(r->t.ctx, (const void *)(uintptr_t)k->src, k->count, k->peer, why, sizeof why); break;
    case RUDA__COLL_RECV: rc = r->t.recv(r->t.ctx, (void *)(uintptr_t)k->dst, k->count, k->peer, why, sizeof why); break;
    case RUDA__COLL_BROADCAST:
    case RUDA__COLL_ALL_GATHER:
      if ((rc = external_agree(r, k, why, sizeof why)) == 0) rc = external_bytes(r, k, es, why, sizeof why);
      break;
    default:
      if ((rc = external_agree(r, k, why, sizeof why)) == 0) rc = external_reduce(r, k, es, why, sizeof why);
      break;
  }
  if (rc == 0) return 0;
  if (rc > 0) rc = RUDA_EGENERIC; /* a transport that returned a positive code */
  const int p2p = k->kind == RUDA__COLL_SEND || k->kind == RUDA__COLL_RECV;
  const int rooted = k->kind == RUDA__COLL_REDUCE || k->kind == RUDA__COLL_BROADCAST;
  char with[32] = "";
  if (p2p || rooted) snprintf(with, sizeof with, "%s %u, ", p2p ? "peer" : "root", k->peer);
  *err = ruda__error_new(rc, 0, "%s on rank %u (%s%llu %s) through the transport: %.300s", kind_name[k->kind], r->rank,
                         with, (unsigned long long)k->count, p2p ? "bytes" : dtype_name[k->dtype],
                         why[0] ? why : ruda_err_name(rc));
  return rc;
}

void ruda__host_comm_destroy(void *state, void *rank) {
  (void)state;
  host_rank *r = rank;
  if (r->external) {
    if (r->t.release != NULL) r->t.release(r->t.ctx);
    free(r);
    return;
  }
  host_exchange *h = r->x;
  free(r);
  pthread_mutex_lock(&h->lock);
  int last = --h->refs == 0;
  pthread_mutex_unlock(&h->lock);
  if (last) exchange_free(h);
}

/* Sums add in U: integers in their unsigned type, so that they wrap as
 * NCCL's do instead of overflowing (undefined behaviour in C). */
#define REDUCE(T, U)                                                              \
  static void reduce_##T(T *acc, const T *x, uint64_t n, uint32_t op) {          \
    for (uint64_t i = 0; i < n; i++) {                                            \
      if (op == RUDA_REDUCE_MIN) acc[i] = x[i] < acc[i] ? x[i] : acc[i];          \
      else if (op == RUDA_REDUCE_MAX) acc[i] = x[i] > acc[i] ? x[i] : acc[i];     \
      else acc[i] = (T)((U)acc[i] + (U)x[i]);                                     \
    }                                                                             \
  }                                                                               \
  static void mean_##T(T *acc, uint64_t n, uint32_t ranks) {                      \
    for (uint64_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)ranks);             \
  }
REDUCE(float, float)
REDUCE(double, double)
REDUCE(int32_t, uint32_t)
REDUCE(int64_t, uint64_t)
REDUCE(int8_t, uint8_t)
REDUCE(uint8_t, uint8_t)

/* f16 and bf16: each step in f32, rounded back to the type, as a device
 * reduction step stores it. */
#define REDUCE_HALF(NAME, TO, FROM)                                               \
  static void reduce_##NAME(uint16_t *acc, const uint16_t *x, uint64_t n, uint32_t op) { \
    for (uint64_t i = 0; i < n; i++) {                                            \
      float a = TO(acc[i]), b = TO(x[i]);                                         \
      acc[i] = FROM(op == RUDA_REDUCE_MIN ? (b < a ? b : a) : op == RUDA_REDUCE_MAX ? (b > a ? b : a) : a + b); \
    }                                                                             \
  }                                                                               \
  static void mean_##NAME(uint16_t *acc, uint64_t n, uint32_t ranks) {            \
    for (uint64_t i = 0; i < n; i++) acc[i] = FROM(TO(acc[i]) / (float)ranks);    \
  }
REDUCE_HALF(f16, ruda__f16_to_f32, ruda__f32_to_f16)
REDUCE_HALF(bf16, ruda__bf16_to_f32, ruda__f32_to_bf16)

/* acc = op(acc, x) over n elements of type t. */
static void reduce_into(void *acc, const void *x, uint64_t n, uint32_t t, uint32_t op) {
  switch (t) {
    case RUDA_DTYPE_F32: reduce_float(acc, x, n, op); break;
    case RUDA_DTYPE_F64: reduce_double(acc, x, n, op); break;
    case RUDA_DTYPE_I32: reduce_int32_t(acc, x, n, op); break;
    case RUDA_DTYPE_I64: reduce_int64_t(acc, x, n, op); break;
    case RUDA_DTYPE_F16: reduce_f16(acc, x, n, op); break;
    case RUDA_DTYPE_BF16: reduce_bf16(acc, x, n, op); break;
    case RUDA_DTYPE_I8: reduce_int8_t(acc, x, n, op); break;
    default: reduce_uint8_t(acc, x, n, op); break;
  }
}

static void mean_of(void *acc, uint64_t n, uint32_t t, uint32_t ranks) {
  switch (t) {
    case RUDA_DTYPE_F32: mean_float(acc, n, ranks); break;
    case RUDA_DTYPE_F64: mean_double(acc, n, ranks); break;
    case RUDA_DTYPE_I32: mean_int32_t(acc, n, ranks); break;
    case RUDA_DTYPE_I64: mean_int64_t(acc, n, ranks); break;
    case RUDA_DTYPE_F16: mean_f16(acc, n, ranks); break;
    case RUDA_DTYPE_BF16: mean_bf16(acc, n, ranks); break;
    case RUDA_DTYPE_I8: mean_int8_t(acc, n, ranks); break;
    default: mean_uint8_t(acc, n, ranks); break;
  }
}

/* Elements of the round's scratch: what one rank brings (all-reduce,
 * reduce, broadcast, reduce-scatter's whole source) or all of them
 * (all-gather). */
static uint64_t scratch_count(const host_exchange *h) {
  return h->kind == RUDA__COLL_ALL_GATHER || h->kind == RUDA__COLL_REDUCE_SCATTER ? h->count * h->n : h->count;
}

/* The last rank to arrive: the round's result into scratch. */
static void compute_round(host_exchange *h) {
  const size_t es = dtype_size[h->dtype], part = (size_t)h->count * es;
  if (h->kind == RUDA__COLL_BROADCAST) {
    memcpy(h->scratch, h->src[h->root], part);
    return;
  }
  if (h->kind == RUDA__COLL_ALL_GATHER) {
    for (uint32_t r = 0; r < h->n; r++) memcpy((char *)h->scratch + part * r, h->src[r], part);
    return;
  }
  const uint64_t n = scratch_count(h);
  memcpy(h->scratch, h->src[0], (size_t)n * es);
  for (uint32_t r = 1; r < h->n; r++) reduce_into(h->scratch, h->src[r], n, h->dtype, h->op);
  if (h->op == RUDA_REDUCE_MEAN) mean_of(h->scratch, n, h->dtype, h->n);
}

/* A rank leaving the round: its part of the result into its dst. */
static void copy_out(const host_exchange *h, const ruda__coll *k) {
  const size_t es = dtype_size[h->dtype], part = (size_t)h->count * es;
  void *dst = (void *)(uintptr_t)k->dst;
  switch (h->kind) {
    case RUDA__COLL_REDUCE:
      if (k->rank == h->root) memcpy(dst, h->scratch, part);
      break;
    case RUDA__COLL_ALL_GATHER: memcpy(dst, h->scratch, part * h->n); break;
    case RUDA__COLL_REDUCE_SCATTER: memcpy(dst, (const char *)h->scratch + part * k->rank, part); break;
    default: memcpy(dst, h->scratch, part); break;
  }
}

/* A broken communicator refuses every collective at once. */
static int refuse_broken(host_exchange *h, ruda_error **err) {
  if (h->broken == NULL) return 0;
  *err = ruda__error_new(RUDA_ETIMEDOUT, 0, "%s; the communicator is broken: destroy it", h->broken);
  return RUDA_ETIMEDOUT;
}

static int not_leaving(host_exchange *h, const void *arg) {
  (void)arg;
  return !h->leaving;
}

static int all_here(host_exchange *h, const void *arg) {
  (void)arg;
  return h->leaving;
}

/* Which ranks the round is still waiting for. */
static void missing_ranks(host_exchange *h, const void *arg, char *out, size_t len) {
  const ruda__coll *k = arg;
  int at = snprintf(out, len, "%s #%llu timed out after %llu ms on rank %u: rank%s ", kind_name[k->kind],
                    (unsigned long long)h->round + 1, (unsigned long long)(h->timeout_ns / 1000000), k->rank,
                    h->n - h->arrived == 1 ? "" : "s");
  int first = 1;
  for (uint32_t r = 0; r < h->n && at > 0 && (size_t)at < len; r++)
    if (!h->here[r]) {
      at += snprintf(out + at, len - (size_t)at, "%s%u", first ? "" : ", ", r);
      first = 0;
    }
  if (at > 0 && (size_t)at < len) snprintf(out + at, len - (size_t)at, " did not arrive");
}

static void previous_round(host_exchange *h, const void *arg, char *out, size_t len) {
  const ruda__coll *k = arg;
  snprintf(out, len, "%s #%llu on rank %u: ranks still leaving the previous round after %llu ms",
           kind_name[k->kind], (unsigned long long)h->round + 1, k->rank, (unsigned long long)(h->timeout_ns / 1000000));
}

/* What each rank brought, for the mismatch message. */
static void describe_round(host_exchange *h, char *out, size_t len) {
  int at = 0;
  for (uint32_t r = 0; r < h->n && at >= 0 && (size_t)at < len; r++)
    if (h->here[r]) {
      const uint32_t kind = h->asked[r].kind;
      const int reduces = kind != RUDA__COLL_BROADCAST && kind != RUDA__COLL_ALL_GATHER;
      const int rooted = kind == RUDA__COLL_REDUCE || kind == RUDA__COLL_BROADCAST;
      at += snprintf(out + at, len - (size_t)at, "%srank %u: %s%s%llu x %s%s%s", r ? ", " : "", r,
                     kind == h->kind && kind == RUDA__COLL_ALL_REDUCE ? "" : kind_name[kind],
                     kind == h->kind && kind == RUDA__COLL_ALL_REDUCE ? "" : " ",
                     (unsigned long long)h->asked[r].count, dtype_name[h->asked[r].dtype], reduces ? " " : "",
                     reduces ? op_name[h->asked[r].op] : "");
      if (rooted && at > 0 && (size_t)at < len)
        at += snprintf(out + at, len - (size_t)at, " to root %u", h->asked[r].root);
    }
}

static int host_round(host_exchange *h, const ruda__coll *k, ruda_error **err) {
  const size_t es = dtype_size[k->dtype];
  int rc = 0;
  struct timespec ts, *dl = deadline_of(h, &ts);
  pthread_mutex_lock(&h->lock);
  if ((rc = refuse_broken(h, err)) != 0) goto out;
  /* Two phases per round: gather until every rank arrived, then leave
   * until every rank copied its part out. A rank back for the next round
   * waits for the last one to leave this one. */
  if ((rc = wait_for(h, not_leaving, k, dl, previous_round, err)) != 0) goto out;
  if (h->arrived == 0) {
    h->kind = k->kind;
    h->count = k->count;
    h->dtype = k->dtype;
    h->op = k->op;
    h->root = k->peer;
    h->mismatch = 0;
    memset(h->here, 0, h->n);
  } else if (h->kind != k->kind || h->count != k->count || h->dtype != k->dtype || h->op != k->op ||
             h->root != k->peer) {
    h->mismatch = 1;
  }
  h->src[k->rank] = (const void *)(uintptr_t)k->src;
  h->here[k->rank] = 1;
  h->asked[k->rank].kind = k->kind;
  h->asked[k->rank].count = k->count;
  h->asked[k->rank].dtype = k->dtype;
  h->asked[k->rank].op = k->op;
  h->asked[k->rank].root = k->peer;
  if (++h->arrived == h->n) {
    size_t bytes = (size_t)scratch_count(h) * es;
    if (!h->mismatch && bytes > h->scratch_bytes) {
      void *p = realloc(h->scratch, bytes);
      if (p == NULL) h->mismatch = 2;
      else h->scratch = p, h->scratch_bytes = bytes;
    }
    if (!h->mismatch) compute_round(h);
    h->leaving = 1;
    pthread_cond_broadcast(&h->cond);
  }
  if ((rc = wait_for(h, all_here, k, dl, missing_ranks, err)) != 0) goto out;
  if (h->mismatch == 0) {
    copy_out(h, k);
  } else if (h->mismatch == 2) {
    rc = RUDA_ENOMEM;
    *err = ruda__error_new(rc, 0, "%s #%llu on rank %u: no host memory for the result", kind_name[h->kind],
                           (unsigned long long)h->round + 1, k->rank);
  } else {
    char what[400];
    describe_round(h, what, sizeof what);
    rc = RUDA_EINVAL;
    *err = ruda__error_new(rc, 0, "%s #%llu on rank %u: ranks disagree (%s)", kind_name[k->kind],
                           (unsigned long long)h->round + 1, k->rank, what);
  }
  if (++h->left == h->n) {
    h->left = h->arrived = 0;
    h->leaving = 0;
    h->round++;
    pthread_cond_broadcast(&h->cond);
  }
out:
  pthread_mutex_unlock(&h->lock);
  return rc;
}

typedef struct box_wait {
  mailbox *m;
  const ruda__coll *k;
} box_wait;

static int box_empty(host_exchange *h, const void *arg) {
  (void)h;
  return !((const box_wait *)arg)->m->full;
}
static int box_taken(host_exchange *h, const void *arg) {
  (void)h;
  return ((const box_wait *)arg)->m->taken;
}
static int box_full(host_exchange *h, const void *arg) {
  (void)h;
  const mailbox *m = ((const box_wait *)arg)->m;
  return m->full && !m->taken;
}
static void send_late(host_exchange *h, const void *arg, char *out, size_t len) {
  const ruda__coll *k = ((const box_wait *)arg)->k;
  snprintf(out, len, "send from rank %u to rank %u timed out after %llu ms: rank %u did not receive", k->rank,
           k->peer, (unsigned long long)(h->timeout_ns / 1000000), k->peer);
}
static void recv_late(host_exchange *h, const void *arg, char *out, size_t len) {
  const ruda__coll *k = ((const box_wait *)arg)->k;
  snprintf(out, len, "recv on rank %u from rank %u timed out after %llu ms: rank %u did not send", k->rank, k->peer,
           (unsigned long long)(h->timeout_ns / 1000000), k->peer);
}

static int host_p2p(host_exchange *h, const ruda__coll *k, ruda_error **err) {
  int rc = 0;
  struct timespec ts, *dl = deadline_of(h, &ts);
  pthread_mutex_lock(&h->lock);
  if ((rc = refuse_broken(h, err)) != 0) goto out;
  if (k->kind == RUDA__COLL_SEND) {
    box_wait bw = {&h->box[(size_t)k->rank * h->n + k->peer], k};
    mailbox *m = bw.m;
    if ((rc = wait_for(h, box_empty, &bw, dl, send_late, err)) != 0) goto out; /* an earlier send not taken yet */
    m->src = (const void *)(uintptr_t)k->src;
    m->bytes = k->count;
    m->full = 1;
    m->taken = 0;
    pthread_cond_broadcast(&h->cond);
    if ((rc = wait_for(h, box_taken, &bw, dl, send_late, err)) != 0) goto out;
    m->full = 0;
    pthread_cond_broadcast(&h->cond);
  } else {
    box_wait bw = {&h->box[(size_t)k->peer * h->n + k->rank], k};
    mailbox *m = bw.m;
    if ((rc = wait_for(h, box_full, &bw, dl, recv_late, err)) != 0) goto out;
    if (m->bytes != k->dst_bytes) { /* NCCL needs the counts to match */
      rc = RUDA_ERANGE;
      *err = ruda__error_new(rc, 0, "recv on rank %u from rank %u: %llu bytes sent, the recv binding holds %llu",
                             k->rank, k->peer, (unsigned long long)m->bytes, (unsigned long long)k->dst_bytes);
    } else {
      memcpy((void *)(uintptr_t)k->dst, m->src, m->bytes);
    }
    m->taken = 1;
    pthread_cond_broadcast(&h->cond);
  }
out:
  pthread_mutex_unlock(&h->lock);
  return rc;
}

int ruda__host_collective(void *wstate, void *rank, const ruda__coll *k, ruda_error **err) {
  (void)wstate;
  host_rank *r = rank;
  if (r->external) return external_collective(r, k, err);
  host_exchange *h = r->x;
  return k->kind == RUDA__COLL_SEND || k->kind == RUDA__COLL_RECV ? host_p2p(h, k, err) : host_round(h, k, err);
}

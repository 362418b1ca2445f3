/* host_comm.c - collectives of the host backend: the ranks' workers meet
 * in memory.
 *
 * An all-reduce waits until every rank arrived with its k-th collective,
 * the last to arrive reduces into a scratch buffer, every rank copies the
 * result out and the last to leave opens the next round; a send waits in
 * its pair's mailbox until the receiver copied. A worker blocks here as a
 * GPU stream waits in an NCCL kernel for its peers. One lock per
 * communicator; every wait is on its condition variable.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/host_backend.h"
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
  pthread_cond_t cond;
  uint32_t n;         /* ranks */
  uint32_t refs;      /* rank handles not destroyed yet, under lock */
  uint64_t round;     /* all-reduces finished */
  uint32_t arrived, left;
  int leaving; /* every rank arrived: copying the result out */
  const void **src; /* per rank, this round */
  void *scratch;
  size_t scratch_bytes;
  uint64_t count;
  uint32_t dtype, op;
  int mismatch; /* ranks disagreed on count, type or op */
  mailbox *box; /* n x n: box[from * n + to] */
} host_exchange;

/* A rank's handle: its exchange. */
typedef struct host_rank {
  host_exchange *x;
  uint32_t rank;
} host_rank;

static const size_t dtype_size[] = {4, 8, 4, 8};

static void exchange_free(host_exchange *h) {
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->cond);
  free(h->src);
  free(h->scratch);
  free(h->box);
  free(h);
}

int ruda__host_comm_init(void *const *states, uint32_t n, void **ranks) {
  (void)states;
  host_exchange *h = calloc(1, sizeof *h);
  if (h == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_comm_init: out of host memory");
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->cond, NULL);
  h->n = n;
  h->src = calloc(n, sizeof *h->src);
  h->box = calloc((size_t)n * n, sizeof *h->box);
  uint32_t made = 0;
  if (h->src != NULL && h->box != NULL) {
    for (; made < n; made++) {
      host_rank *r = malloc(sizeof *r);
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

void ruda__host_comm_destroy(void *state, void *rank) {
  (void)state;
  host_rank *r = rank;
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
    for (uint64_t i = 0; i < n; i++) acc[i] /= (T)ranks;                          \
  }
REDUCE(float, float)
REDUCE(double, double)
REDUCE(int32_t, uint32_t)
REDUCE(int64_t, uint64_t)

static void host_reduce(host_exchange *h, uint32_t n) {
  const size_t es = dtype_size[h->dtype], bytes = h->count * es;
  memcpy(h->scratch, h->src[0], bytes);
  for (uint32_t r = 1; r < n; r++) switch (h->dtype) {
      case RUDA_DTYPE_F32: reduce_float(h->scratch, h->src[r], h->count, h->op); break;
      case RUDA_DTYPE_F64: reduce_double(h->scratch, h->src[r], h->count, h->op); break;
      case RUDA_DTYPE_I32: reduce_int32_t(h->scratch, h->src[r], h->count, h->op); break;
      default: reduce_int64_t(h->scratch, h->src[r], h->count, h->op); break;
    }
  if (h->op != RUDA_REDUCE_MEAN) return;
  switch (h->dtype) {
    case RUDA_DTYPE_F32: mean_float(h->scratch, h->count, n); break;
    case RUDA_DTYPE_F64: mean_double(h->scratch, h->count, n); break;
    case RUDA_DTYPE_I32: mean_int32_t(h->scratch, h->count, n); break;
    default: mean_int64_t(h->scratch, h->count, n); break;
  }
}

static int host_all_reduce(host_exchange *h, const ruda__coll *k, ruda_error **err) {
  const size_t es = dtype_size[k->dtype];
  int rc = 0;
  pthread_mutex_lock(&h->lock);
  /* Two phases per round: gather until every rank arrived, then leave
   * until every rank copied the result out. A rank back for the next
   * round waits for the last one to leave this one. */
  while (h->leaving) pthread_cond_wait(&h->cond, &h->lock);
  if (h->arrived == 0) {
    h->count = k->count;
    h->dtype = k->dtype;
    h->op = k->op;
    h->mismatch = 0;
  } else if (h->count != k->count || h->dtype != k->dtype || h->op != k->op) {
    h->mismatch = 1;
  }
  h->src[k->rank] = (const void *)(uintptr_t)k->src;
  if (++h->arrived == h->n) {
    size_t bytes = (size_t)h->count * es;
    if (!h->mismatch && bytes > h->scratch_bytes) {
      void *p = realloc(h->scratch, bytes);
      if (p == NULL) h->mismatch = 2;
      else h->scratch = p, h->scratch_bytes = bytes;
    }
    if (!h->mismatch) host_reduce(h, h->n);
    h->leaving = 1;
    pthread_cond_broadcast(&h->cond);
  }
  while (!h->leaving) pthread_cond_wait(&h->cond, &h->lock);
  if (h->mismatch == 0) {
    memcpy((void *)(uintptr_t)k->dst, h->scratch, (size_t)h->count * es);
  } else {
    rc = h->mismatch == 2 ? RUDA_ENOMEM : RUDA_EINVAL;
    *err = ruda__error_new(rc, 0, "all-reduce round %llu on rank %u: %s", (unsigned long long)h->round, k->rank,
                           rc == RUDA_ENOMEM ? "no host memory for the reduction"
                                             : "ranks disagree on element count, type or reduction");
  }
  if (++h->left == h->n) {
    h->left = h->arrived = 0;
    h->leaving = 0;
    h->round++;
    pthread_cond_broadcast(&h->cond);
  }
  pthread_mutex_unlock(&h->lock);
  return rc;
}

static int host_p2p(host_exchange *h, const ruda__coll *k, ruda_error **err) {
  int rc = 0;
  pthread_mutex_lock(&h->lock);
  if (k->kind == RUDA__COLL_SEND) {
    mailbox *m = &h->box[(size_t)k->rank * h->n + k->peer];
    while (m->full) pthread_cond_wait(&h->cond, &h->lock); /* an earlier send not taken yet */
    m->src = (const void *)(uintptr_t)k->src;
    m->bytes = k->count;
    m->full = 1;
    m->taken = 0;
    pthread_cond_broadcast(&h->cond);
    while (!m->taken) pthread_cond_wait(&h->cond, &h->lock);
    m->full = 0;
    pthread_cond_broadcast(&h->cond);
  } else {
    mailbox *m = &h->box[(size_t)k->peer * h->n + k->rank];
    while (!m->full || m->taken) pthread_cond_wait(&h->cond, &h->lock);
    if (m->bytes != k->dst_bytes) { /* NCCL needs the counts to match */
      rc = RUDA_ERANGE;
      *err = ruda__error_new(rc, 0, "recv on rank %u from rank %u: %llu bytes sent, the recv binding holds %llu",
                             k->rank, k->peer,
                             (unsigned long long)m->bytes, (unsigned long long)k->dst_bytes);
    } else {
      memcpy((void *)(uintptr_t)k->dst, m->src, m->bytes);
    }
    m->taken = 1;
    pthread_cond_broadcast(&h->cond);
  }
  pthread_mutex_unlock(&h->lock);
  return rc;
}

int ruda__host_collective(void *wstate, void *rank, const ruda__coll *k, ruda_error **err) {
  (void)wstate;
  host_exchange *h = ((host_rank *)rank)->x;
  return k->kind == RUDA__COLL_ALL_REDUCE ? host_all_reduce(h, k, err) : host_p2p(h, k, err);
}

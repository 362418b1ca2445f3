/* cuda_comm.c - collectives through NCCL, loaded at run time.
 *
 * One NCCL communicator per rank from ncclCommInitAll over the ranks' GPU
 * ordinals (one process, one thread per GPU: each rank's collectives are
 * issued by its worker, on the worker's stream, in the order the rank's
 * collective stream holds them; src/comm.c). libnccl.so.2 is opened at the
 * first communicator (RUDA_NCCL names another path; then the library
 * beside the nccl.h ruda was built with, e.g. NVIDIA's wheel unpacked by
 * tools/deps.sh), so a process that never makes one never needs it. Built
 * without nccl.h, collectives are refused (RUDA_ENOBACKEND).
 *
 * A rank across processes (ncclCommInitRankConfig) is made non-blocking
 * where NCCL can: its creation and its calls are then polled up to
 * RUDA_COMM_TIMEOUT, and a peer that never comes aborts the communicator
 * (ncclCommAbort) with an error saying so, instead of hanging the rank.
 */
#include "backends/cuda/cuda_internal.h"

#ifndef RUDA_HAVE_NCCL
int ruda__cu_comm_init(void *const *states, uint32_t n, void **ranks) {
  (void)states;
  (void)n;
  (void)ranks;
  return ruda__fail(RUDA_ENOBACKEND,
                    "ruda_comm_init: this libruda was built without NCCL's header (nccl.h), so the cuda backend "
                    "has no collectives; install NCCL (or run tools/deps.sh) and rebuild");
}

void ruda__cu_comm_destroy(void *state, void *rank) {
  (void)state;
  (void)rank;
}

int ruda__cu_collective(void *ws, void *rank, const ruda__coll *c, ruda_error **err) {
  (void)ws;
  (void)rank;
  (void)c;
  *err = ruda__error_new(RUDA_ENOBACKEND, 0, "collectives need NCCL, which this libruda was built without");
  return RUDA_ENOBACKEND;
}

int ruda__cu_comm_id(void *state, ruda_comm_id *id) {
  (void)state;
  (void)id;
  return ruda__fail(RUDA_ENOBACKEND, "ruda_comm_unique_id: this libruda was built without NCCL's header");
}

int ruda__cu_comm_init_rank(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                            const ruda_comm_transport *transport, void **handle) {
  (void)state, (void)nranks, (void)rank, (void)id, (void)transport, (void)handle;
  return ruda__fail(RUDA_ENOBACKEND, "ruda_comm_init_rank: this libruda was built without NCCL's header");
}
#else
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/comm_timeout.h"
#include "base/sync.h"

#define NCCL_FUNCS(X)                                                                            \
  X(ncclGetVersion) X(ncclCommInitAll) X(ncclCommDestroy) X(ncclAllReduce) X(ncclSend) X(ncclRecv) \
  X(ncclGetErrorString) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclReduce) X(ncclBroadcast) X(ncclAllGather)     \
  X(ncclReduceScatter)

/* Optional: without them ranks across processes are made blocking. */
#define NCCL_OPTIONAL(X) X(ncclCommInitRankConfig) X(ncclCommGetAsyncError) X(ncclCommAbort) X(ncclCommFinalize)

static struct {
#define NCCL_FIELD(name) __typeof__(&name) name;
  NCCL_FUNCS(NCCL_FIELD)
  NCCL_OPTIONAL(NCCL_FIELD)
#undef NCCL_FIELD
  int version;
  char path[256];
} nccl;

/* A rank's handle. Non-blocking ranks are polled (nccl_settle); an aborted
 * one refuses every later call and is only freed. */
typedef struct nccl_rank {
  ncclComm_t comm;
  int nonblocking, aborted;
} nccl_rank;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_why[600];

static void nccl_load(void) {
  const char *env = getenv("RUDA_NCCL");
  const char *path = env && *env ? env : "libnccl.so.2";
  snprintf(nccl.path, sizeof nccl.path, "%s", path);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#ifdef RUDA_NCCL_LIB_DIR
  if (lib == NULL && !(env && *env)) { /* the system's first, then the one built against */
    snprintf(nccl.path, sizeof nccl.path, "%s/libnccl.so.2", RUDA_NCCL_LIB_DIR);
    lib = dlopen(nccl.path, RTLD_NOW | RTLD_LOCAL);
    path = nccl.path;
  }
#endif
  if (lib == NULL) {
    snprintf(nccl_why, sizeof nccl_why, "dlopen(\"%s\") failed: %s", path, dlerror());
    return;
  }
#define NCCL_SYM(name)                                                                   \
  if ((*(void **)&nccl.name = dlsym(lib, #name)) == NULL) {                              \
    snprintf(nccl_why, sizeof nccl_why, "%s has no %s", path, #name);                   \
    nccl.ncclCommInitAll = NULL;                                                          \
    return;                                                                               \
  }
  NCCL_FUNCS(NCCL_SYM)
#undef NCCL_SYM
#define NCCL_OPT(name) *(void **)&nccl.name = dlsym(lib, #name);
  NCCL_OPTIONAL(NCCL_OPT)
#undef NCCL_OPT
  nccl.ncclGetVersion(&nccl.version);
}

static uint64_t now_ms(void) { return ruda__now_ns() / 1000000u; }

/* A non-blocking rank's last call: polls ncclCommGetAsyncError while it is
 * in progress, up to RUDA_COMM_TIMEOUT; past it the communicator is
 * aborted (its kernels and threads stop) and ncclInProgress returned. */
static ncclResult_t nccl_settle(nccl_rank *r, ncclResult_t res) {
  if (!r->nonblocking || res != ncclInProgress) return res;
  const uint64_t limit = ruda__comm_timeout_ms(), until = limit ? now_ms() + limit : UINT64_MAX;
  for (unsigned wait = 10;; wait = wait < 1000 ? 2 * wait : 1000) {
    ncclResult_t state = ncclInProgress;
    if (nccl.ncclCommGetAsyncError(r->comm, &state) != ncclSuccess || state != ncclInProgress) return state;
    if (now_ms() > until) {
      nccl.ncclCommAbort(r->comm);
      r->aborted = 1;
      return ncclInProgress;
    }
    struct timespec ts = {0, (long)wait * 1000};
    nanosleep(&ts, NULL);
  }
}

static nccl_rank *rank_new(ncclComm_t comm, int nonblocking) {
  nccl_rank *r = calloc(1, sizeof *r);
  if (r != NULL) r->comm = comm, r->nonblocking = nonblocking;
  return r;
}

static int nccl_fail(ncclResult_t r, const char *what) {
  return ruda__fail(RUDA_ECUDA, "%s: NCCL %d.%d.%d: %s", what, nccl.version / 10000, nccl.version / 100 % 100,
                    nccl.version % 100, nccl.ncclGetErrorString(r));
}

int ruda__cu_comm_init(void *const *states, uint32_t n, void **ranks) {
  pthread_once(&nccl_once, nccl_load);
  if (nccl.ncclCommInitAll == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_comm_init: NCCL is not available (%s); set RUDA_NCCL to its path",
                      nccl_why);
  int *ordinals = malloc(n * sizeof *ordinals);
  ncclComm_t *comms = calloc(n, sizeof *comms);
  if (ordinals == NULL || comms == NULL) {
    free(ordinals);
    free(comms);
    return ruda__fail(RUDA_ENOMEM, "ruda_comm_init: out of host memory");
  }
  for (uint32_t r = 0; r < n; r++) {
    ordinals[r] = ((ruda__cu_backend *)states[r])->ordinal;
    for (uint32_t q = 0; q < r; q++)
      if (ordinals[q] == ordinals[r]) {
        const int gpu = ordinals[r];
        free(ordinals);
        free(comms);
        return ruda__fail(RUDA_EINVAL, "ruda_comm_init: ranks %u and %u are both GPU %d; NCCL needs one GPU per rank",
                          q, r, gpu);
      }
  }
  ncclResult_t res = nccl.ncclCommInitAll(comms, (int)n, ordinals);
  free(ordinals);
  if (res != ncclSuccess) {
    free(comms);
    return nccl_fail(res, "ruda_comm_init: ncclCommInitAll");
  }
  for (uint32_t r = 0; r < n; r++) {
    if ((ranks[r] = rank_new(comms[r], 0)) != NULL) continue;
    for (uint32_t q = 0; q < n; q++) {
      if (q < r) free(ranks[q]);
      nccl.ncclCommDestroy(comms[q]);
      ranks[q] = NULL;
    }
    free(comms);
    return ruda__fail(RUDA_ENOMEM, "ruda_comm_init: out of host memory");
  }
  free(comms);
  return 0;
}

_Static_assert(sizeof(ncclUniqueId) <= sizeof(ruda_comm_id), "NCCL's unique id fits a ruda_comm_id");

int ruda__cu_comm_id(void *state, ruda_comm_id *id) {
  (void)state;
  pthread_once(&nccl_once, nccl_load);
  if (nccl.ncclCommInitAll == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_comm_unique_id: NCCL is not available (%s); set RUDA_NCCL to its path",
                      nccl_why);
  ncclUniqueId u;
  ncclResult_t res = nccl.ncclGetUniqueId(&u);
  if (res != ncclSuccess) return nccl_fail(res, "ruda_comm_unique_id: ncclGetUniqueId");
  memcpy(id->bytes, &u, sizeof u);
  return 0;
}

int ruda__cu_comm_init_rank(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                            const ruda_comm_transport *transport, void **handle) {
  if (transport != NULL)
    return ruda__fail(RUDA_EINVAL,
                      "ruda_comm_init_rank: the cuda backend's collectives go through NCCL: pass no transport, and "
                      "the id from ruda_comm_unique_id");
  if (id == NULL) return ruda__fail(RUDA_EINVAL, "ruda_comm_init_rank: id is NULL (ruda_comm_unique_id on one rank)");
  pthread_once(&nccl_once, nccl_load);
  if (nccl.ncclCommInitAll == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_comm_init_rank: NCCL is not available (%s); set RUDA_NCCL to its path",
                      nccl_why);
  ncclUniqueId u;
  memcpy(&u, id->bytes, sizeof u);
  /* NCCL takes the device from the calling thread's context: ruda's. */
  ruda__cu_guard g;
  if (ruda__cu_enter(state, &g) != 0) return ruda_error_code(ruda_last_error());
  nccl_rank probe = {NULL, 0, 0};
  ncclResult_t res;
  const char *what = "ncclCommInitRank";
  if (nccl.ncclCommInitRankConfig != NULL && nccl.ncclCommGetAsyncError != NULL && nccl.ncclCommAbort != NULL) {
    /* Non-blocking, so that ranks that never join time out. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    probe.nonblocking = 1;
    what = "ncclCommInitRankConfig";
    res = nccl_settle(&probe, nccl.ncclCommInitRankConfig(&probe.comm, (int)nranks, u, (int)rank, &cfg));
  } else {
    res = nccl.ncclCommInitRank(&probe.comm, (int)nranks, u, (int)rank);
  }
  ruda__cu_leave(&g);
  if (probe.aborted)
    return ruda__fail(RUDA_ETIMEDOUT,
                      "ruda_comm_init_rank: rank %u of %u: the other ranks did not join within %llu ms "
                      "(RUDA_COMM_TIMEOUT); the NCCL communicator was aborted",
                      rank, nranks, (unsigned long long)ruda__comm_timeout_ms());
  if (res != ncclSuccess) {
    if (probe.comm != NULL && nccl.ncclCommAbort != NULL) nccl.ncclCommAbort(probe.comm);
    char what_rank[96];
    snprintf(what_rank, sizeof what_rank, "ruda_comm_init_rank: %s (rank %u of %u)", what, rank, nranks);
    return nccl_fail(res, what_rank);
  }
  nccl_rank *r = rank_new(probe.comm, probe.nonblocking);
  if (r == NULL) {
    nccl.ncclCommDestroy(probe.comm);
    return ruda__fail(RUDA_ENOMEM, "ruda_comm_init_rank: out of host memory");
  }
  *handle = r;
  return 0;
}

void ruda__cu_comm_destroy(void *state, void *rank) {
  (void)state;
  nccl_rank *r = rank;
  if (r == NULL) return;
  /* A non-blocking rank flushes first; one that cannot within the timeout
   * is aborted. An aborted one was freed by NCCL already. */
  if (!r->aborted && r->nonblocking && nccl.ncclCommFinalize != NULL)
    nccl_settle(r, nccl.ncclCommFinalize(r->comm));
  if (!r->aborted) nccl_settle(r, nccl.ncclCommDestroy(r->comm));
  free(r);
}

static const ncclDataType_t nccl_type[] = {ncclFloat32, ncclFloat64, ncclInt32, ncclInt64,
                                           ncclFloat16, ncclBfloat16, ncclInt8,  ncclUint8};
static const ncclRedOp_t nccl_op[] = {ncclSum, ncclAvg, ncclMin, ncclMax};

int ruda__cu_collective(void *ws, void *rank, const ruda__coll *c, ruda_error **err) {
  ruda__cu_worker *w = ws;
  nccl_rank *r = rank;
  ncclComm_t comm = r->comm;
  cudaStream_t st = (cudaStream_t)w->stream;
  ncclResult_t res;
  if (r->aborted) {
    *err = ruda__error_new(RUDA_ETIMEDOUT, 0, "rank %u: the NCCL communicator was aborted after a peer did not "
                           "answer within RUDA_COMM_TIMEOUT; destroy it", c->rank);
    return RUDA_ETIMEDOUT;
  }
  const char *what;
  const void *src = (const void *)(uintptr_t)c->src;
  void *dst = (void *)(uintptr_t)c->dst;
  const ncclDataType_t t = nccl_type[c->dtype];
  switch (c->kind) {
    case RUDA__COLL_ALL_REDUCE:
      what = "ncclAllReduce";
      res = nccl.ncclAllReduce(src, dst, c->count, t, nccl_op[c->op], comm, st);
      break;
    case RUDA__COLL_REDUCE:
      what = "ncclReduce";
      res = nccl.ncclReduce(src, dst, c->count, t, nccl_op[c->op], (int)c->peer, comm, st);
      break;
    case RUDA__COLL_BROADCAST:
      what = "ncclBroadcast";
      res = nccl.ncclBroadcast(src, dst, c->count, t, (int)c->peer, comm, st);
      break;
    case RUDA__COLL_ALL_GATHER:
      what = "ncclAllGather";
      res = nccl.ncclAllGather(src, dst, c->count, t, comm, st);
      break;
    case RUDA__COLL_REDUCE_SCATTER:
      what = "ncclReduceScatter";
      res = nccl.ncclReduceScatter(src, dst, c->count, t, nccl_op[c->op], comm, st);
      break;
    case RUDA__COLL_SEND:
      what = "ncclSend";
      res = nccl.ncclSend(src, c->count, ncclUint8, (int)c->peer, comm, st);
      break;
    default:
      what = "ncclRecv";
      res = nccl.ncclRecv(dst, c->count, ncclUint8, (int)c->peer, comm, st);
      break;
  }
  res = nccl_settle(r, res); /* a non-blocking rank's call may still be in progress */
  if (res == ncclSuccess) return 0;
  if (r->aborted) {
    *err = ruda__error_new(RUDA_ETIMEDOUT, 0, "%s (rank %u): still in progress after %llu ms (RUDA_COMM_TIMEOUT): a "
                           "peer did not answer; the NCCL communicator was aborted, destroy it", what, c->rank,
                           (unsigned long long)ruda__comm_timeout_ms());
    return RUDA_ETIMEDOUT;
  }
  const int p2p = c->kind == RUDA__COLL_SEND || c->kind == RUDA__COLL_RECV;
  const int rooted = c->kind == RUDA__COLL_REDUCE || c->kind == RUDA__COLL_BROADCAST;
  char with[32] = "";
  if (p2p || rooted) snprintf(with, sizeof with, "%s %u, ", p2p ? "peer" : "root", c->peer);
  *err = ruda__error_new(RUDA_ECUDA, res, "%s (rank %u, %s%llu %s): NCCL %d.%d.%d: %s", what, c->rank, with,
                         (unsigned long long)c->count, p2p ? "bytes" : "elements",
                         nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100,
                         nccl.ncclGetErrorString(res));
  return RUDA_ECUDA;
}
#endif /* RUDA_HAVE_NCCL */

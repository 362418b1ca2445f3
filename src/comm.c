/* comm.c - collectives between devices (ruda/comm.h): of one process
 * (ruda_comm_init), or one rank each in several (ruda_comm_init_rank).
 *
 * Each rank has a collective stream of its own: a private stream (not in
 * the stream table) on one of its device's workers, so that the rank's
 * collectives reach the backend in the order the application issued them,
 * which NCCL requires of every rank. A collective is a RUDA__CMD_COLL
 * command pinning its buffers, ordered against other streams through them
 * (scheduler/order.h) like a copy.
 *
 * The worker hands it to the backend's collective op: NCCL on cuda
 * (backends/cuda/cuda_comm.c), an in-memory exchange between the ranks'
 * workers on host (backends/host/host_comm.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_timeout.h"
#include "src/device.h"
#include "scheduler/order.h"
#include "scheduler/submit.h"
#include "src/api.h"

struct ruda_comm {
  uint32_t n;      /* ranks in all */
  uint32_t nlocal; /* ranks in this process: the arrays below */
  uint32_t base;   /* the rank of devs[0]; the rest follow it */
  ruda_device **devs;
  ruda__stream **streams; /* each rank's collective stream */
  void **ranks;           /* the backend's handle of each rank */
  int live;               /* counted in each device's comms */
};

static const size_t dtype_size[] = {4, 8, 4, 8, 2, 2, 1, 1};

size_t ruda_dtype_size(ruda_dtype t) { return (unsigned)t <= RUDA_DTYPE_U8 ? dtype_size[t] : 0; }

static uint64_t next_comm_id = 1;

static int check_dtype(ruda_dtype t, ruda_reduce_op op, const char *fn) {
  if ((unsigned)t > RUDA_DTYPE_U8) return ruda__fail(RUDA_EINVAL, "%s: unknown element type %d", fn, (int)t);
  if ((unsigned)op > RUDA_REDUCE_MAX) return ruda__fail(RUDA_EINVAL, "%s: unknown reduction %d", fn, (int)op);
  return 0;
}

/* ---- communicators ---- */

/* A rank's collective stream on dev for communicator number id: ids from
 * the top of the reserved range, spread over the workers by communicator. */
static ruda__stream *collective_stream(ruda_device *dev, uint64_t id) {
  return ruda__stream_private(UINT64_MAX - (1ull << 32) - id, ruda__lane_of(&dev->sched, id));
}

/* Frees what comm_init made, however far it got (any field may be NULL). */
static void comm_free(ruda_comm *c) {
  for (uint32_t r = 0; c->devs != NULL && r < c->nlocal; r++) {
    ruda_device *dev = c->devs[r];
    if (dev == NULL) continue;
    if (c->ranks != NULL && c->ranks[r] != NULL && dev->sched.backend.ops->comm_destroy != NULL)
      dev->sched.backend.ops->comm_destroy(dev->sched.backend.state, c->ranks[r]);
    if (c->streams != NULL) ruda__stream_private_free(&dev->sched, c->streams[r], "collective, never reported,");
    if (c->live) atomic_fetch_sub(&dev->comms, 1);
  }
  free(c->ranks);
  free(c->streams);
  free(c->devs);
  free(c);
}

int ruda_comm_init(ruda_device *const *devices, uint32_t n, ruda_comm **out) {
  static const char fn[] = "ruda_comm_init";
  if (out != NULL) *out = NULL;
  if (devices == NULL || out == NULL) return ruda__fail(RUDA_EINVAL, "%s: %s is NULL", fn, devices ? "out" : "devices");
  if (n == 0) return ruda__fail(RUDA_EINVAL, "%s: no devices", fn);
  int trc = ruda__comm_timeout_check(fn);
  if (trc != 0) return trc;
  for (uint32_t r = 0; r < n; r++) {
    RUDA__CHECK_DEV(devices[r], fn);
    if (devices[r]->sched.backend.ops != devices[0]->sched.backend.ops)
      return ruda__fail(RUDA_EINVAL, "%s: rank %u is on the %s backend, rank 0 on %s", fn, r,
                        devices[r]->sched.backend.ops->name, devices[0]->sched.backend.ops->name);
    for (uint32_t q = 0; q < r; q++)
      if (devices[q] == devices[r]) return ruda__fail(RUDA_EINVAL, "%s: ranks %u and %u are one device", fn, q, r);
  }
  ruda_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  c->n = c->nlocal = n;
  c->devs = calloc(n, sizeof *c->devs);
  c->streams = calloc(n, sizeof *c->streams);
  c->ranks = calloc(n, sizeof *c->ranks);
  int rc = 0;
  if (c->devs == NULL || c->streams == NULL || c->ranks == NULL) goto nomem;
  uint64_t id = __atomic_fetch_add(&next_comm_id, 1, __ATOMIC_RELAXED);
  for (uint32_t r = 0; r < n; r++) {
    ruda_device *dev = devices[r];
    c->devs[r] = dev;
    c->streams[r] = collective_stream(dev, id);
    if (c->streams[r] == NULL) goto nomem;
  }
  const ruda__backend_ops *ops = devices[0]->sched.backend.ops;
  void **states = calloc(n, sizeof *states);
  if (states == NULL) goto nomem;
  for (uint32_t r = 0; r < n; r++) states[r] = devices[r]->sched.backend.state;
  rc = ops->comm_init(states, n, c->ranks);
  free(states);
  if (rc != 0) {
    free(c->ranks);
    c->ranks = NULL;
    comm_free(c);
    return rc;
  }
  for (uint32_t r = 0; r < n; r++) atomic_fetch_add(&devices[r]->comms, 1);
  c->live = 1; /* the devices refuse to close until it is destroyed */
  *out = c;
  return 0;
nomem:
  comm_free(c);
  return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
}

int ruda_comm_unique_id(ruda_device *dev, ruda_comm_id *id) {
  static const char fn[] = "ruda_comm_unique_id";
  RUDA__CHECK_DEV(dev, fn);
  if (id == NULL) return ruda__fail(RUDA_EINVAL, "%s: id is NULL", fn);
  memset(id, 0, sizeof *id);
  return dev->sched.backend.ops->comm_id != NULL ? dev->sched.backend.ops->comm_id(dev->sched.backend.state, id) : 0;
}

int ruda_comm_init_rank(ruda_device *dev, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                        const ruda_comm_transport *transport, ruda_comm **out) {
  static const char fn[] = "ruda_comm_init_rank";
  if (out != NULL) *out = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  if (nranks == 0 || rank >= nranks)
    return ruda__fail(RUDA_EINVAL, "%s: rank %u of %u ranks", fn, rank, nranks);
  int trc = ruda__comm_timeout_check(fn);
  if (trc != 0) return trc;
  if (transport != NULL && (transport->all_reduce == NULL || transport->send == NULL || transport->recv == NULL))
    return ruda__fail(RUDA_EINVAL, "%s: the transport lacks all_reduce, send or recv", fn);
  if (dev->sched.backend.ops->comm_init_rank == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: the %s backend has no communicators across processes", fn,
                      dev->sched.backend.ops->name);
  ruda_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  c->n = nranks;
  c->nlocal = 1;
  c->base = rank;
  c->devs = calloc(1, sizeof *c->devs);
  c->streams = calloc(1, sizeof *c->streams);
  c->ranks = calloc(1, sizeof *c->ranks);
  if (c->devs == NULL || c->streams == NULL || c->ranks == NULL) goto nomem;
  uint64_t cid = __atomic_fetch_add(&next_comm_id, 1, __ATOMIC_RELAXED);
  c->devs[0] = dev;
  c->streams[0] = collective_stream(dev, cid);
  if (c->streams[0] == NULL) goto nomem;
  int rc = dev->sched.backend.ops->comm_init_rank(dev->sched.backend.state, nranks, rank, id, transport, &c->ranks[0]);
  if (rc != 0) {
    c->ranks[0] = NULL;
    comm_free(c);
    return rc;
  }
  atomic_fetch_add(&dev->comms, 1);
  c->live = 1;
  *out = c;
  return 0;
nomem:
  comm_free(c);
  return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
}

uint32_t ruda_comm_size(const ruda_comm *c) { return c ? c->n : 0; }

int ruda_comm_rank(const ruda_comm *c, const ruda_device *dev) {
  if (c == NULL) return -1;
  for (uint32_t r = 0; r < c->nlocal; r++)
    if (c->devs[r] == dev) return (int)(c->base + r);
  return -1;
}

static int rank_of(ruda_comm *c, ruda_device *dev, const char *fn, uint32_t *rank) {
  if (c == NULL) return ruda__fail(RUDA_EINVAL, "%s: communicator is NULL", fn);
  RUDA__CHECK_DEV(dev, fn);
  int r = ruda_comm_rank(c, dev);
  if (r < 0) return ruda__fail(RUDA_EINVAL, "%s: the device is not a rank of this communicator", fn);
  *rank = (uint32_t)r - c->base; /* the index of its arrays */
  return 0;
}

int ruda_comm_sync(ruda_comm *c, ruda_device *dev, ruda_error **errors) {
  static const char fn[] = "ruda_comm_sync";
  if (errors) *errors = NULL;
  uint32_t r = 0;
  int rc = rank_of(c, dev, fn, &r);
  if (rc != 0) return rc;
  ruda_future *f;
  if ((rc = ruda__push_control(&dev->sched, c->streams[r], RUDA__CMD_SYNC, 1, fn, &f)) != 0) return rc;
  rc = ruda_future_wait(f, errors);
  ruda_future_free(f);
  return rc;
}

int ruda_comm_destroy(ruda_comm *c) {
  if (c == NULL) return ruda__fail(RUDA_EINVAL, "ruda_comm_destroy: communicator is NULL");
  int rc = 0;
  /* The devices must still be open (ruda/comm.h): a closed one is freed. */
  for (uint32_t r = 0; r < c->nlocal; r++) {
    ruda_error *errs = NULL;
    int x = ruda_comm_sync(c, c->devs[r], &errs);
    ruda_error_free(errs);
    if (rc == 0) rc = x;
  }
  comm_free(c);
  return rc;
}

/* ---- issuing ---- */

/* Pushes a collective for rank r after the buffers' earlier uses. */
static int issue(ruda_comm *c, uint32_t r, ruda__coll *k, const uint32_t *pins, uint32_t npins, ruda__order *o,
                 const char *fn) {
  ruda_device *dev = c->devs[r];
  ruda__stream *s = c->streams[r];
  ruda__cmd *cmd = ruda__cmd_alloc(npins * sizeof(uint32_t));
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  cmd->kind = RUDA__CMD_COLL;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  memcpy(cmd->pins, pins, npins * sizeof *pins);
  cmd->npins = (uint8_t)npins;
  cmd->u.coll = *k;
  int rc = ruda__submit(&dev->sched, s, cmd, o);
  if (rc != 0) ruda__cmd_free(cmd);
  return rc;
}

static void unpin_all(ruda_device *dev, const uint32_t *pins, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) ruda__handles_unpin(&dev->handles, pins[i], NULL);
}

static const char *const coll_name[] = {"ruda_all_reduce", "ruda_send", "ruda_recv", "ruda_reduce",
                                        "ruda_broadcast", "ruda_all_gather", "ruda_reduce_scatter"};

/* The five collectives: src read, dst written, sizes checked against the
 * kind (ruda/comm.h), then one command on the rank's collective stream. */
static int collective(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype,
                      ruda_reduce_op op, uint32_t root, uint32_t kind) {
  const char *fn = coll_name[kind];
  uint32_t r = 0;
  int rc = rank_of(c, dev, fn, &r);
  const int reduces = kind != RUDA__COLL_BROADCAST && kind != RUDA__COLL_ALL_GATHER;
  if (rc == 0) rc = check_dtype(dtype, reduces ? op : RUDA_REDUCE_SUM, fn);
  if (rc != 0) return rc;
  if ((kind == RUDA__COLL_REDUCE || kind == RUDA__COLL_BROADCAST) && root >= c->n)
    return ruda__fail(RUDA_EINVAL, "%s: root %u is no rank (ranks 0..%u)", fn, root, c->n - 1);
  ruda__stream *s = c->streams[r];
  ruda__order o;
  ruda__order_init(&o);
  uint64_t sa, sl, da, dl;
  if ((rc = ruda__pin_binding(&dev->sched, s, src, fn, "src", -1, &sa, &sl, &o, 0, RUDA__USE_READ)) != 0) return rc;
  if ((rc = ruda__pin_binding(&dev->sched, s, dst, fn, "dst", -1, &da, &dl, &o, 0, RUDA__USE_WRITE)) != 0) {
    ruda__order_abandon(&o);
    ruda__handles_unpin(&dev->handles, src.handle.slot, NULL);
    return rc;
  }
  uint32_t pins[2] = {src.handle.slot, dst.handle.slot};
  const uint64_t es = dtype_size[dtype], n = c->n;
  uint64_t count = sl / es, need = sl; /* elements per rank; dst bytes needed */
  if (kind == RUDA__COLL_ALL_GATHER) need = sl * n;
  if (kind == RUDA__COLL_REDUCE_SCATTER) count = sl / es / n, need = count * es;
  const char *bad = NULL;
  char why[160];
  if (sl % es != 0) {
    bad = "src does not hold a whole number of elements";
  } else if (kind == RUDA__COLL_REDUCE_SCATTER && (sl / es) % n != 0) {
    snprintf(why, sizeof why, "src holds %llu elements, not a multiple of the %llu ranks",
             (unsigned long long)(sl / es), (unsigned long long)n);
    bad = why;
  } else if (dl < need) {
    snprintf(why, sizeof why, "dst holds %llu bytes, %llu needed", (unsigned long long)dl, (unsigned long long)need);
    bad = why;
  } else if (sa % es != 0 || da % es != 0) { /* elements are loaded as their type */
    snprintf(why, sizeof why, "the %s binding starts at offset %llu, not a multiple of the %llu-byte element",
             sa % es ? "src" : "dst", (unsigned long long)(sa % es ? src.offset : dst.offset),
             (unsigned long long)es);
    bad = why;
  }
  if (bad != NULL) {
    ruda__order_abandon(&o);
    unpin_all(dev, pins, 2);
    return ruda__fail(RUDA_EINVAL, "%s: %s", fn, bad);
  }
  const uint32_t me = c->base + r;
  ruda__coll k = {.rank_handle = c->ranks[r],
                  .kind = kind,
                  .rank = me,
                  .peer = (kind == RUDA__COLL_REDUCE || kind == RUDA__COLL_BROADCAST) ? root : 0,
                  .dtype = (uint32_t)dtype,
                  .op = reduces ? (uint32_t)op : RUDA_REDUCE_SUM,
                  .src = sa,
                  .dst = da,
                  .count = count,
                  .dst_bytes = dl,
                  .nranks = c->n};
  if ((rc = issue(c, r, &k, pins, 2, &o, fn)) != 0) {
    ruda__order_abandon(&o);
    unpin_all(dev, pins, 2);
  }
  return rc;
}

int ruda_all_reduce(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype,
                    ruda_reduce_op op) {
  return collective(c, dev, src, dst, dtype, op, 0, RUDA__COLL_ALL_REDUCE);
}

int ruda_reduce(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype,
                ruda_reduce_op op, uint32_t root) {
  return collective(c, dev, src, dst, dtype, op, root, RUDA__COLL_REDUCE);
}

int ruda_broadcast(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype,
                   uint32_t root) {
  return collective(c, dev, src, dst, dtype, RUDA_REDUCE_SUM, root, RUDA__COLL_BROADCAST);
}

int ruda_all_gather(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype) {
  return collective(c, dev, src, dst, dtype, RUDA_REDUCE_SUM, 0, RUDA__COLL_ALL_GATHER);
}

int ruda_reduce_scatter(ruda_comm *c, ruda_device *dev, ruda_binding src, ruda_binding dst, ruda_dtype dtype,
                        ruda_reduce_op op) {
  return collective(c, dev, src, dst, dtype, op, 0, RUDA__COLL_REDUCE_SCATTER);
}

static int p2p(ruda_comm *c, ruda_device *dev, ruda_binding b, uint32_t peer, uint32_t kind, const char *fn) {
  uint32_t r = 0;
  int rc = rank_of(c, dev, fn, &r);
  if (rc != 0) return rc;
  if (peer >= c->n || peer == c->base + r)
    return ruda__fail(RUDA_EINVAL, "%s: peer %u is %s (ranks 0..%u)", fn, peer, peer == c->base + r ? "this rank" : "no rank",
                      c->n - 1);
  ruda__order o;
  ruda__order_init(&o);
  uint64_t a, l;
  const char *what = kind == RUDA__COLL_SEND ? "src" : "dst";
  if ((rc = ruda__pin_binding(&dev->sched, c->streams[r], b, fn, what, -1, &a, &l, &o, 0,
                              kind == RUDA__COLL_SEND ? RUDA__USE_READ : RUDA__USE_WRITE)) != 0)
    return rc;
  uint32_t slot = b.handle.slot;
  ruda__coll k = {.rank_handle = c->ranks[r],
                  .kind = kind,
                  .rank = c->base + r,
                  .peer = peer,
                  .src = kind == RUDA__COLL_SEND ? a : 0,
                  .dst = kind == RUDA__COLL_RECV ? a : 0,
                  .count = l,
                  .dst_bytes = l,
                  .nranks = c->n};
  if ((rc = issue(c, r, &k, &slot, 1, &o, fn)) != 0) {
    ruda__order_abandon(&o);
    unpin_all(dev, &slot, 1);
  }
  return rc;
}

int ruda_send(ruda_comm *c, ruda_device *dev, ruda_binding src, uint32_t peer) {
  return p2p(c, dev, src, peer, RUDA__COLL_SEND, "ruda_send");
}

int ruda_recv(ruda_comm *c, ruda_device *dev, ruda_binding dst, uint32_t peer) {
  return p2p(c, dev, dst, peer, RUDA__COLL_RECV, "ruda_recv");
}

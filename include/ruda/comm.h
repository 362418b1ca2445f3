/* ruda/comm.h - collectives between devices of one process. Included by
 * ruda/ruda.h; include that instead.
 *
 * A communicator joins n open devices (one rank each, in the order given);
 * on the cuda backend it is an NCCL communicator per GPU (ncclCommInitAll,
 * NCCL loaded at run time), on the host backend the workers of the ranks
 * meet in memory. Every rank must issue the same collectives in the same
 * order, as with NCCL; a send on one rank needs the matching recv on the
 * peer.
 *
 * Calls return at once. Each rank's collectives run in order on a stream
 * of their own (on one of the device's workers), and are ordered against
 * other streams through their buffers, as any command: an all-reduce
 * follows the kernel that wrote its source on whatever stream, and a read
 * of its destination follows the all-reduce. Failures go to the rank's
 * collective stream; ruda_comm_sync waits for the rank's collectives and
 * hands them back.
 *
 * Element types and reductions: f32, f64, i32, i64; sum, mean (integers
 * truncate), min, max. The devices must outlive the communicator:
 * destroy it before closing any of them.
 */
#ifndef RUDA_COMM_H
#define RUDA_COMM_H

#include <stdint.h>

#include "ruda/error.h"
#include "ruda/export.h"
#include "ruda/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator (ruda_comm_init). Opaque. */
typedef struct ruda_comm ruda_comm;

/* Element types of collectives. */
typedef enum ruda_dtype { RUDA_DTYPE_F32 = 0, RUDA_DTYPE_F64, RUDA_DTYPE_I32, RUDA_DTYPE_I64 } ruda_dtype;

/* Reductions of ruda_all_reduce. */
typedef enum ruda_reduce_op {
  RUDA_REDUCE_SUM = 0,
  RUDA_REDUCE_MEAN,
  RUDA_REDUCE_MIN,
  RUDA_REDUCE_MAX
} ruda_reduce_op;

/* Joins devices[0..n) as ranks 0..n-1. n >= 1, each device once, all on
 * one backend. RUDA_ENOBACKEND when the cuda backend cannot load NCCL;
 * RUDA_ECUDA with NCCL's message when it refuses. While the communicator
 * lives its devices refuse ruda_device_close (RUDA_EBUSY). On the host
 * backend a rank waits for its peers at most RUDA_COMM_TIMEOUT
 * milliseconds per collective (default 60000, 0: for ever); past it the
 * collective fails with RUDA_ETIMEDOUT naming the ranks that did not come
 * and the communicator is broken (every later collective fails; destroy
 * it). Ranks that disagree on a collective's count, type or reduction get
 * RUDA_EINVAL listing what each brought. Blocking. */
RUDA_EXTERN int ruda_comm_init(struct ruda_device *const *devices, uint32_t n, ruda_comm **out);

/* Waits for every rank's collectives, then frees the communicator. */
RUDA_EXTERN int ruda_comm_destroy(ruda_comm *comm);

/* Number of ranks in the communicator (0 for NULL). */
RUDA_EXTERN uint32_t ruda_comm_size(const ruda_comm *comm);
/* The rank of dev, or -1 if it is not a member. */
RUDA_EXTERN int ruda_comm_rank(const ruda_comm *comm, const struct ruda_device *dev);

/* dst = op over every rank's src, on every rank. src and dst may be the
 * same binding; dst must hold src's bytes, a whole number of elements.
 * dev names the rank. */
RUDA_EXTERN int ruda_all_reduce(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                                ruda_dtype dtype, ruda_reduce_op op);

/* Point to point: src's bytes from dev's rank to peer, where the peer's
 * matching ruda_recv writes them into dst, whose binding must be exactly
 * as large (NCCL matches counts; RUDA_ERANGE on the receiver otherwise).
 * A send waits for its receiver: two ranks sending to each other first
 * wait for ever, as with NCCL; let one of them receive first. */
RUDA_EXTERN int ruda_send(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, uint32_t peer);
/* The receiving side of ruda_send: dev's rank takes peer's bytes into dst. */
RUDA_EXTERN int ruda_recv(ruda_comm *comm, struct ruda_device *dev, ruda_binding dst, uint32_t peer);

/* Waits until dev's rank ran its collectives so far (a sync of the rank's
 * collective stream); RUDA_EUNHEALTHY with their failures in *errors. */
RUDA_EXTERN int ruda_comm_sync(ruda_comm *comm, struct ruda_device *dev, ruda_error **errors);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_COMM_H */

/* ruda/comm.h - collectives between devices, of one process or several.
 * Included by ruda/ruda.h; include that instead.
 *
 * A communicator joins n open devices (one rank each, in the order given);
 * on the cuda backend it is an NCCL communicator per GPU (ncclCommInitAll,
 * NCCL loaded at run time), on the host backend the workers of the ranks
 * meet in memory. Across processes each process joins its device as one
 * rank (ruda_comm_init_rank): NCCL with a shared id on cuda, a transport
 * of the application's on host; ruda/mpi.h (libruda_mpi) does both over
 * MPI. Every rank must issue the same collectives in the same
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
 * Collectives: all-reduce, reduce, broadcast, all-gather, reduce-scatter
 * (NCCL's five), and point to point send and recv. Element types f32, f64,
 * f16, bf16, i32, i64, i8, u8; reductions sum, mean (integers truncate),
 * min, max (integer sums wrap, as NCCL's do). The devices must outlive the
 * communicator: destroy it before closing any of them.
 */
#ifndef RUDA_COMM_H
#define RUDA_COMM_H

#include <stddef.h>
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
typedef enum ruda_dtype {
  RUDA_DTYPE_F32 = 0,
  RUDA_DTYPE_F64,
  RUDA_DTYPE_I32,
  RUDA_DTYPE_I64,
  RUDA_DTYPE_F16,  /* IEEE binary16 */
  RUDA_DTYPE_BF16, /* bfloat16: the upper half of an f32 */
  RUDA_DTYPE_I8,
  RUDA_DTYPE_U8
} ruda_dtype;

/* Bytes of one element of t, or 0 for an unknown type. Thread-safe, non-blocking. */
RUDA_EXTERN size_t ruda_dtype_size(ruda_dtype t);

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
 * RUDA_EINVAL listing what each brought. Blocking. Thread-safe; blocks until every rank joined. */
RUDA_EXTERN int ruda_comm_init(struct ruda_device *const *devices, uint32_t n, ruda_comm **out);

/* ---- ranks in several processes ---- */

/* What the ranks of one communicator share to find each other (NCCL's
 * unique id on the cuda backend). Made by one rank, carried to the others
 * by whatever channel the application has (ruda_mpi_comm_init uses MPI). */
typedef struct ruda_comm_id {
  unsigned char bytes[128];
} ruda_comm_id;

/* A transport between the processes of a communicator, for backends whose
 * collectives do not cross processes themselves (host). Its functions run
 * on the rank's worker, one at a time, in the order the rank issued its
 * collectives, and return 0 or a RUDA_E* code with a message in
 * why[0..why_len). all_reduce: dst = op over every rank's src (count
 * elements; src == dst in place). send / recv: bytes to / from peer.
 * release: the communicator is gone. ruda_mpi_comm_init (ruda/mpi.h)
 * supplies one over MPI. */
typedef struct ruda_comm_transport {
  void *ctx;
  int (*all_reduce)(void *ctx, const void *src, void *dst, uint64_t count, ruda_dtype dtype, ruda_reduce_op op,
                    char *why, size_t why_len);
  int (*send)(void *ctx, const void *src, uint64_t bytes, uint32_t peer, char *why, size_t why_len);
  int (*recv)(void *ctx, void *dst, uint64_t bytes, uint32_t peer, char *why, size_t why_len);
  void (*release)(void *ctx);
} ruda_comm_transport;

/* Fills *id for ruda_comm_init_rank (call it on one rank). On the host
 * backend the id is not needed (a transport carries the data) and is
 * zeroed. RUDA_ENOBACKEND when the cuda backend cannot load NCCL.
 * Thread-safe, non-blocking (on cuda it may load NCCL). */
RUDA_EXTERN int ruda_comm_unique_id(struct ruda_device *dev, ruda_comm_id *id);

/* Carries rank 0's *id to the other ranks (they pass any *id; it is
 * filled): where is "file:PATH" (rank 0 writes PATH whole; the others wait
 * for it; a file system every rank sees, and a path no earlier run left
 * behind; anything but a regular file is refused) or "tcp:HOST:PORT"
 * (rank 0 listens on HOST's address only, the others connect, retrying
 * until rank 0 is there). tcp peers prove they belong to the job with a
 * key from RUDA_COMM_SECRET, else the launcher's job id
 * (docs/collectives.md); strangers are dropped and never take a rank's
 * place, and every rank returns the same outcome (rank 0 returns 0 only
 * once every rank confirmed it has the id, a rank only once its
 * confirmation is sent; a connection that breaks between the two leaves
 * that rank with 0 and rank 0 failing: docs/collectives.md). Blocking, every wait within RUDA_COMM_TIMEOUT ms
 * (RUDA_ETIMEDOUT saying what was waited for). RUDA_EINVAL for a where of
 * neither form, rank >= nranks, ranks started for different nranks, ranks
 * with different keys, or a RUDA_COMM_TIMEOUT that is not 0..2147483647;
 * RUDA_ENOMEM or RUDA_EIO when HOST cannot be resolved for lack of memory
 * or a resolver. Thread-safe. */
RUDA_EXTERN int ruda_comm_rendezvous(const char *where, uint32_t nranks, uint32_t rank, ruda_comm_id *id);

/* This process's RANK, WORLD_SIZE and LOCAL_RANK (0 when unset), as
 * launchers such as torchrun set them: LOCAL_RANK usually picks the GPU
 * ordinal to open. RUDA_EINVAL naming a variable missing or malformed.
 * Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_comm_env(uint32_t *rank, uint32_t *nranks, uint32_t *local_rank);

/* Joins dev as this process's rank of a communicator described by the
 * environment: RANK and WORLD_SIZE (ruda_comm_env); the rendezvous
 * RUDA_COMM_RENDEZVOUS (file:PATH or tcp:HOST:PORT), else MASTER_ADDR and
 * MASTER_PORT + 1 (MASTER_PORT itself may be the launcher's own store).
 * Rank 0 makes the id (ruda_comm_unique_id), ruda_comm_rendezvous carries
 * it, ruda_comm_init_rank joins. Blocking. The host backend needs a
 * transport across processes: RUDA_ENOBACKEND, pointing to
 * ruda_mpi_comm_init. Thread-safe; blocks. */
RUDA_EXTERN int ruda_comm_init_env(struct ruda_device *dev, ruda_comm **out);

/* Joins dev as rank `rank` of nranks ranks living in any processes (one
 * device per rank in this call; the others call it in theirs). transport
 * NULL: the backend's own (NCCL, with id, on cuda); the host backend needs
 * a transport (RUDA_ENOBACKEND without one). Blocking until every rank
 * joined (cuda) or at once (host: the transport's job). The communicator
 * is used and destroyed as one from ruda_comm_init; ruda_comm_size is
 * nranks and ruda_comm_rank(comm, dev) is rank. On success the
 * communicator owns the transport (release is called when it is
 * destroyed); on failure the caller still does. Thread-safe; blocks as said. */
RUDA_EXTERN int ruda_comm_init_rank(struct ruda_device *dev, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                                    const ruda_comm_transport *transport, ruda_comm **out);

/* Waits for every rank's collectives, then frees the communicator.
 * Not thread-safe on one communicator: no other call may use comm beside it or after. Blocks
 * until the collectives ran. */
RUDA_EXTERN int ruda_comm_destroy(ruda_comm *comm);

/* Number of ranks in the communicator (0 for NULL). Thread-safe, non-blocking. */
RUDA_EXTERN uint32_t ruda_comm_size(const ruda_comm *comm);
/* The rank of dev, or -1 if it is not a member. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_comm_rank(const ruda_comm *comm, const struct ruda_device *dev);

/* dst = op over every rank's src, on every rank. src and dst may be the
 * same binding; dst must hold src's bytes, a whole number of elements.
 * dev names the rank. Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_all_reduce(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                                ruda_dtype dtype, ruda_reduce_op op);

/* dst = op over every rank's src, on the root only (other ranks' dst is
 * not written; pass src). Sizes and bindings as for ruda_all_reduce;
 * RUDA_EINVAL for a root that is no rank.
 * Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_reduce(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                            ruda_dtype dtype, ruda_reduce_op op, uint32_t root);

/* dst = the root's src, on every rank (the root's too: src and dst may be
 * the same binding). Every rank passes a src of the same size, which
 * gives the element count (only the root's is read: others may pass dst);
 * dst must hold as many bytes. Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_broadcast(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                               ruda_dtype dtype, uint32_t root);

/* dst = every rank's src, in rank order: rank r's count elements land at
 * element r * count of dst, which must hold nranks * count elements (count:
 * src's elements, the same on every rank).
 * Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_all_gather(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                                ruda_dtype dtype);

/* The all-reduce of src (nranks * count elements, the same on every rank),
 * scattered: rank r's dst gets elements r * count .. (r + 1) * count of the
 * result. src must hold a whole multiple of nranks elements; dst at least
 * count elements. Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_reduce_scatter(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, ruda_binding dst,
                                    ruda_dtype dtype, ruda_reduce_op op);

/* Point to point: src's bytes from dev's rank to peer, where the peer's
 * matching ruda_recv writes them into dst, whose binding must be exactly
 * as large (NCCL matches counts; RUDA_ERANGE on the receiver otherwise).
 * A send waits for its receiver, whatever its size: two ranks sending to
 * each other first wait for ever, as with NCCL (on the host backend, in
 * one process or over MPI, until RUDA_COMM_TIMEOUT, when both fail); let
 * one of them receive first. Thread-safe; the call is non-blocking (the
 * wait is the worker's). */
RUDA_EXTERN int ruda_send(ruda_comm *comm, struct ruda_device *dev, ruda_binding src, uint32_t peer);
/* The receiving side of ruda_send: dev's rank takes peer's bytes into dst.
 * Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_recv(ruda_comm *comm, struct ruda_device *dev, ruda_binding dst, uint32_t peer);

/* Waits until dev's rank ran its collectives so far (a sync of the rank's
 * collective stream); RUDA_EUNHEALTHY with their failures in *errors.
 * Thread-safe; blocks until the rank's collectives ran. */
RUDA_EXTERN int ruda_comm_sync(ruda_comm *comm, struct ruda_device *dev, ruda_error **errors);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_COMM_H */

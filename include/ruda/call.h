/* ruda/call.h - library calls as stream commands. Included by
 * ruda/ruda.h; include that instead.
 *
 * Libraries that take a CUstream and issue their own kernels (cuBLAS,
 * cuBLASLt, cuDNN, CUTLASS's host API, NCCL) run through ruda_call as one
 * command of a stream: the caller's function runs on the stream's worker,
 * in stream order, with the worker's CUstream and the device's context
 * current, and gets the device address of every buffer the call names.
 * Each buffer carries an access mode (ruda_arg_in, ruda_arg_out,
 * ruda_arg_buffer), so other streams' work on those buffers is ordered
 * against the library's exactly as against a kernel that declared them:
 *
 *   static int gemm(const ruda_call_ctx *c, void *user) {
 *     cublasHandle_t h = handle_of_worker(user, c->worker);  (one per worker)
 *     cublasSetStream(h, (cudaStream_t)c->cu_stream);
 *     const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1);
 *     float *y = ruda_call_ptr(c, 2);
 *     return cublasSgemm(h, ...);            (a nonzero status is an error)
 *   }
 *   ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)),
 *                       ruda_arg_out(ruda_bind(y))};
 *   ruda_call_desc d = {.name = "layer1", .fn = gemm, .user = lib,
 *                       .buffers = bufs, .nbuffers = 3};
 *   ruda_call(dev, s, &d);                    returns at once, like ruda_launch
 *
 * What the function may do. It runs on a worker thread while that worker
 * runs nothing else, and holds up every later command of every stream on
 * the worker until it returns; ruda holds none of its own locks while it
 * runs. It should only issue work on ctx->cu_stream (any number of library
 * calls, kernels, async copies), or order work issued elsewhere after and
 * before it with events: work the library puts on other streams without
 * such ordering is invisible to ruda. It may call ruda's non-waiting
 * functions (ruda_launch, ruda_call, ruda_write, ...; what it enqueues on
 * its own stream queues behind whatever the stream held when it started).
 * It must not call functions that wait for
 * a worker or the device (ruda_flush, ruda_sync, ruda_future_wait,
 * ruda_graph_run, a push into a full queue under RUDA_BACKPRESSURE_BLOCK),
 * nor block on other ruda streams' progress (for instance a host spin on
 * memory another stream writes): its own worker, or one it waits for,
 * may be the one that would have to run. It must not synchronize the
 * whole device or context (cudaDeviceSynchronize), destroy the stream or
 * change the current context. A library call that synchronizes its stream
 * internally is allowed but stalls the worker for that long.
 *
 * Calls on one worker run one at a time, in stream order, on that
 * worker's thread (ctx->worker names it): library state kept per worker
 * (a cublasHandle_t, its workspace) needs no lock. Several stream ids may
 * share a worker (explicit id i uses worker i % num_streams).
 *
 * Graphs (ruda/graph.h): a call issued on a capturing stream is recorded
 * like a launch, unless its desc has RUDA_CALL_NOT_CAPTURABLE, which is
 * refused with RUDA_EGRAPHSTATE (the capture stays open). On the cuda
 * backend a replay is a CUDA graph captured from the worker's stream at
 * the first replay: the function runs once then, with ctx->capturing set
 * and the stream in capture (thread-local mode), and later replays launch
 * what it enqueued, not the function; so a recorded function must enqueue
 * the same work whatever it is called for, and libraries must support
 * stream capture (cuBLAS does; give it a workspace set up before the
 * capture). On the host backend the function runs at every replay.
 *
 * The host backend runs the same command: ctx->cu_stream and
 * ctx->cu_context are NULL, the addresses are host pointers, and the
 * function does the work itself (a C GEMM standing in for the library).
 */
#ifndef RUDA_CALL_H
#define RUDA_CALL_H

#include <stdint.h>

#include "ruda/export.h"
#include "ruda/ruda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of ctx->msg, where a failing function may say why. */
#define RUDA_CALL_MSG_MAX 256
/* Most bytes of desc->data (copied into the command). */
#define RUDA_CALL_MAX_DATA 4096
/* Bytes of desc->name kept in the command (longer names are cut). */
#define RUDA_CALL_NAME_MAX 64

/* What the function sees when it runs. Valid during the call only. */
typedef struct ruda_call_ctx {
  ruda_device *dev;
  ruda_stream_id stream; /* the stream the call was issued (or captured) on */
  uint64_t seq;          /* its command number (recorded: its place in the graph) */
  uint32_t worker;       /* the worker running it, 0..num_streams-1 */
  uint32_t nbuffers;     /* entries in addr and size */
  const uint64_t *addr;  /* addr[i]: buffer i's first byte (device address on
                            cuda, host address on host) */
  const uint64_t *size;  /* size[i]: bytes of binding i */
  void *cu_stream;       /* cuda: the worker's CUstream; host: NULL */
  void *cu_context;      /* cuda: the CUcontext, current on the thread; host: NULL */
  const void *data;      /* desc->data's bytes, copied at the call (NULL if none) */
  uint32_t data_size;
  int capturing;         /* 1 while cu_stream is being captured into a graph */
  char *msg;             /* RUDA_CALL_MSG_MAX bytes, "" on entry: a failing
                            function may write why (NUL-terminated) */
  uint64_t reserved[4];  /* zero */
} ruda_call_ctx;

/* Buffer i of a call as a pointer. */
static inline void *ruda_call_ptr(const ruda_call_ctx *ctx, uint32_t i) {
  return (void *)(uintptr_t)ctx->addr[i];
}

/* The caller's function: 0 on success; any other value (a library's
 * status, a negative RUDA_E* code) fails the command: the stream gets a
 * RUDA_ECALL error naming the call, the stream and the command number,
 * with ctx->msg, and the value as ruda_error_backend_code. */
typedef int (*ruda_call_fn)(const ruda_call_ctx *ctx, void *user);

/* Call flags. */
#define RUDA_CALL_NOT_CAPTURABLE 0x1u /* refused on a capturing stream */

/* A library call. Build it with a designated initializer, so that the
 * fields left out (reserved above all) are zero. */
typedef struct ruda_call_desc {
  const char *name;        /* names the call in errors; copied (NULL: "call") */
  ruda_call_fn fn;         /* required */
  void *user;              /* handed to fn as is: must stay valid until the
                              command ran (recorded: while the graph lives) */
  const ruda_arg *buffers; /* nbuffers buffers: ruda_arg_in, ruda_arg_out or
                              ruda_arg_buffer (no scalars: use data) */
  uint32_t nbuffers;       /* at most RUDA_MAX_ARGS */
  uint32_t flags;          /* RUDA_CALL_* */
  const void *data;        /* data_size bytes copied at the call, handed to fn */
  uint32_t data_size;      /* at most RUDA_CALL_MAX_DATA */
  uint64_t reserved[4];    /* zero */
} ruda_call_desc;

/* Enqueues a library call on stream. Checks at the call: fn is set, the
 * buffers are at most RUDA_MAX_ARGS, each a live handle with its range
 * inside the buffer and a buffer kind, data fits, flags and reserved are
 * known (RUDA_EINVAL, RUDA_ENOTFOUND, RUDA_ERANGE). On a capturing stream
 * the call is recorded (RUDA_EGRAPHSTATE with RUDA_CALL_NOT_CAPTURABLE).
 * The function's failure reaches the stream's error queue (flush, sync)
 * as RUDA_ECALL. Thread-safe, non-blocking (see ruda_write for a full
 * queue). */
RUDA_EXTERN int ruda_call(ruda_device *dev, ruda_stream_id stream, const ruda_call_desc *desc);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_CALL_H */

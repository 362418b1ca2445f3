/* ruda/call.h - library calls as stream commands. Included by
 * ruda/ruda.h; include that instead.
 *
 * Libraries that take a CUstream and issue their own kernels (cuBLAS,
 * cuBLASLt, cuDNN, CUTLASS's host API, NCCL) run through ruda_call as one
 * command of a stream: the caller's function runs holding the stream's worker,
 * in stream order, with the stream's CUstream and the device's context
 * current, and gets the device address of every buffer the call names.
 * Each buffer carries an access mode (ruda_arg_in, ruda_arg_out,
 * ruda_arg_buffer), so other streams' work on those buffers is ordered
 * against the library's exactly as against a kernel that declared them:
 *
 *   static int gemm(const ruda_call_ctx *c, void *user) {
 *     cublasHandle_t h = c->library;         (its CUstream's: see ruda_library_register)
 *     const float *x = ruda_call_ptr(c, 0), *w = ruda_call_ptr(c, 1);
 *     float *y = ruda_call_ptr(c, 2);
 *     return cublasSgemm(h, ...);            (a nonzero status is an error)
 *   }
 *   ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(w)),
 *                       ruda_arg_out(ruda_bind(y))};
 *   ruda_call_desc d = {.name = "layer1", .fn = gemm, .buffers = bufs,
 *                       .nbuffers = 3, .library = cublas_id};
 *   ruda_call(dev, s, &d);                    returns at once, like ruda_launch
 *
 * Where and when the function runs. It runs holding the worker of its
 * stream: on that worker's thread, or on the thread of a client that ran
 * the command in place while the worker was idle (a stream set with
 * ruda_stream_set_in_place, a ruda_graph_run), with the device's context
 * current either way. Calls holding one worker run one at a time, in
 * stream order, never two at once: state kept per worker needs no lock,
 * and ctx->worker (0..num_streams-1) is its key. The thread is not a key:
 * per-thread caches (thread-local handles) may meet several workers, or
 * miss one. Several stream ids share a worker (explicit id i uses worker
 * i % num_streams), and a worker may issue to several CUstreams, its
 * lanes (ruda_config.lanes, one by default; ruda_device_num_lanes in
 * all): stream ids of one worker get one each in turn
 * (i / num_streams % lanes), so their work overlaps on the device. ctx->cu_stream is the CUstream of the
 * call's stream id (in a graph replay, of the replaying stream): fixed
 * while the device is open, and shared only by stream ids that share it.
 * A library handle bound to it once (cublasSetStream, which also resets
 * the handle's workspace) stays bound if it is kept per lane
 * (ruda_library_register does so); one kept per worker (ctx->worker) must
 * be bound to ctx->cu_stream at each call.
 *
 * What the function may do. While it runs, its worker issues nothing else
 * and every later command of every stream on that worker waits; ruda
 * holds none of its own locks. It should only issue work on ctx->cu_stream
 * (any number of library calls, kernels, async copies), or order work
 * issued elsewhere after and before it with events: work the library puts
 * on other streams without such ordering is invisible to ruda. It may call
 * ruda's non-waiting functions (ruda_launch, ruda_call, ruda_write, ...;
 * what it enqueues on its own stream queues behind whatever the stream
 * held when it started). It must not call functions that wait for a
 * worker or the device (ruda_flush, ruda_sync, ruda_future_wait,
 * ruda_graph_run, a push into a full queue under RUDA_BACKPRESSURE_BLOCK),
 * nor block on other ruda streams' progress (for instance a host spin on
 * memory another stream writes): its own worker, or one it waits for, may
 * be the one that would have to run. It must not synchronize the whole
 * device or context (cudaDeviceSynchronize, cublasDestroy), destroy the
 * stream or change the current context. It may allocate (cudaMalloc, a
 * library's first use of a shape loading its kernels and workspace): that
 * is allowed and correct, but the allocation may synchronize the device
 * and holds up every stream on the worker meanwhile, so do it in the
 * library's create (below) or a warm-up call, not on the request path,
 * and never while ctx->capturing is set (a capture forbids it). A library
 * call that synchronizes its stream internally is allowed but stalls the
 * worker for that long.
 *
 * Library state per device stream (ruda_library_register): a library
 * registered on the device gets one state per lane (a CUstream of a
 * worker), made by its create callback holding that worker, with that
 * lane's ctx->cu_stream (lazily: right before the first call naming the
 * library runs on the lane, never inside a capture) and handed to every
 * call naming it there as ctx->library. Its destroy callback runs once per
 * state at ruda_device_close, on the worker's thread after the worker ran
 * its last command, before the CUstream is destroyed. The device may still
 * be running what those commands issued: synchronizing (the stream, or
 * even the whole device, as cublasDestroy does) is allowed there, and
 * needed before freeing memory that work uses. So a cuBLAS
 * user needs no table of handles:
 *
 *   static int make(const ruda_call_ctx *c, void *user, void **state) {
 *     cublasHandle_t h;
 *     int st = cublasCreate(&h);
 *     if (st == 0) st = cublasSetStream(h, (cudaStream_t)c->cu_stream);
 *     *state = h;                              (bound once: the lane's stream is fixed)
 *     return st;
 *   }
 *   static void drop(const ruda_call_ctx *c, void *user, void *state) { cublasDestroy(state); }
 *   ruda_library_desc l = {.name = "cublas", .create = make, .destroy = drop};
 *   ruda_library_register(dev, &l, &cublas_id);
 *   ... d.library = cublas_id; and in gemm: cublasHandle_t h = c->library;
 *
 * Operands and access modes. Name every buffer the library reads as
 * ruda_arg_in, every one it only writes in full as ruda_arg_out, and one it
 * reads and writes as ruda_arg_buffer. For a GEMM C = alpha A B + beta C:
 * A and B are ruda_arg_in; C is ruda_arg_out with beta == 0 (not read),
 * ruda_arg_buffer with beta != 0 (read, then written); a fused epilogue's
 * bias is ruda_arg_in, an auxiliary output (a GELU input kept for the
 * backward pass) ruda_arg_out; a workspace the library owns needs no
 * entry, one taken from a ruda buffer is ruda_arg_buffer. The mode orders
 * the call against other streams: a mode too weak (in for a written
 * buffer) lets another stream's read overlap the write.
 *
 * ctx->data holds a copy of desc->data aligned to RUDA_CALL_DATA_ALIGN
 * bytes, so a struct of any C type may be read through it in place.
 *
 * Graphs (ruda/graph.h): a call issued on a capturing stream is recorded
 * like a launch, unless its desc has RUDA_CALL_NOT_CAPTURABLE, which is
 * refused with RUDA_EGRAPHSTATE (the capture stays open). On the cuda
 * backend a replay is a CUDA graph captured from the replaying stream's CUstream at
 * the first replay: the function runs once then, with ctx->capturing set
 * and the stream in capture (thread-local mode), and later replays launch
 * what it enqueued, not the function; so a recorded function must enqueue
 * the same work whatever it is called for, and libraries must support
 * stream capture (cuBLAS does; its handle and workspace come from the
 * library's create, made before the capture starts). On the host backend
 * the function runs at every replay.
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
/* ctx->data's alignment in bytes. */
#define RUDA_CALL_DATA_ALIGN 16
/* Most libraries registered on one device. */
#define RUDA_LIBRARY_MAX 16

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
  void *cu_stream;       /* cuda: the CUstream of the call's lane; host: NULL */
  void *cu_context;      /* cuda: the CUcontext, current on the thread; host: NULL */
  const void *data;      /* desc->data's bytes, copied at the call (NULL if none) */
  uint32_t data_size;
  int capturing;         /* 1 while cu_stream is being captured into a graph */
  char *msg;             /* RUDA_CALL_MSG_MAX bytes, "" on entry: a failing
                            function may write why (NUL-terminated) */
  union {                /* library took reserved[0] (ruda/ruda.h, "Versions and ABI") */
    void *library;       /* the lane's state of desc->library (what its
                            create made), or NULL without one */
    uint64_t reserved[4]; /* [1..3] zero */
  };
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
  union {                  /* library took reserved[0] (ruda/ruda.h, "Versions and ABI") */
    uint64_t library;      /* a ruda_library_register id: ctx->library is
                              the worker's state of it; 0: none */
    uint64_t reserved[4];  /* [1..3] zero */
  };
} ruda_call_desc;

/* Enqueues a library call on stream. Checks at the call: fn is set, the
 * buffers are at most RUDA_MAX_ARGS, each a live handle with its range
 * inside the buffer and a buffer kind, data fits, library is 0 or
 * registered on dev, flags and reserved are known (RUDA_EINVAL,
 * RUDA_ENOTFOUND, RUDA_ERANGE). On a capturing stream
 * the call is recorded (RUDA_EGRAPHSTATE with RUDA_CALL_NOT_CAPTURABLE).
 * The function's failure reaches the stream's error queue (flush, sync)
 * as RUDA_ECALL. Thread-safe, non-blocking (see ruda_write for a full
 * queue). */
RUDA_EXTERN int ruda_call(ruda_device *dev, ruda_stream_id stream, const ruda_call_desc *desc);

/* A library's per-worker state (see "Per-worker library state" above).
 * create makes one worker's state in *state (NULL is a valid state); 0,
 * or a nonzero status that fails the call about to run (RUDA_ECALL on its
 * stream, with ctx->msg) and is tried again at the worker's next call
 * naming the library. The ctx it gets is that call's (its stream,
 * worker, cu_stream; nbuffers 0, capturing 0). destroy gets every state
 * create made, at close, with a ctx naming the worker (stream 0, seq 0,
 * cu_stream still valid); it may synchronize, must not call ruda, and
 * does not run for a worker whose create never succeeded. */
typedef struct ruda_library_desc {
  const char *name; /* names the library in errors; copied (NULL: "library") */
  int (*create)(const ruda_call_ctx *ctx, void *user, void **state);   /* required */
  void (*destroy)(const ruda_call_ctx *ctx, void *user, void *state); /* may be NULL */
  void *user;            /* handed to both as is; valid until close returned */
  uint64_t reserved[4];  /* zero */
} ruda_library_desc;

/* Registers a library on dev: *id (from 1) goes into ruda_call_desc's
 * library field. Nothing runs yet: each worker's state is made at its
 * first call naming the library, and destroyed at ruda_device_close.
 * With cfg.lanes left at its default, stream ids first used after the
 * first registration spread over two CUstreams per worker instead of one
 * (ruda/ruda.h, lanes): register before the serving threads start.
 * RUDA_EINVAL (create NULL, reserved set, or RUDA_LIBRARY_MAX libraries
 * registered already). Thread-safe; blocks only on a short lock of the
 * registry, never waits for a worker or the device. */
RUDA_EXTERN int ruda_library_register(ruda_device *dev, const ruda_library_desc *desc, uint32_t *id);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_CALL_H */

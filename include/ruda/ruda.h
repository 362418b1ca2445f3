/* ruda/ruda.h - the one header users include.
 *
 * ruda lets many host threads drive a GPU concurrently without blocking on
 * it. Every stream id maps to a worker thread that drains a lock-free
 * command queue into its own device stream; client calls validate their
 * input, enqueue and return. Failures found by a worker wait on that
 * stream's error queue until ruda_flush() or ruda_sync() hands them back.
 *
 * Conventions
 *  - Functions return 0 or a negative RUDA_E* code (ruda/error.h). When a
 *    call fails at the call, ruda_last_error() describes why.
 *  - Every function's comment states its contract in three words:
 *    "Thread-safe" means any number of threads may call the function on the
 *    same device (or object) at once; "not thread-safe on X" names what
 *    must not be used beside it. "Non-blocking" means it never waits for a
 *    worker or the device (it may still allocate host memory or take a
 *    short lock); "blocks" says what it waits for.
 *  - Calls on a closing device fail with RUDA_ECLOSED; a call that was in
 *    progress when ruda_device_close() started completes first, and one
 *    that starts while close runs (a second close too) fails and is waited
 *    for: close frees the device only once no call is left in it. Calling
 *    anything on a device handle after ruda_device_close() returned is
 *    undefined, as with any freed object.
 *
 * Versions and ABI
 *  - RUDA_VERSION_* (ruda/version.h) give the headers' version,
 *    ruda_version() that of the library loaded. The shared library's
 *    soname is libruda.so.0.MINOR while the major version is 0, and
 *    find_package(ruda 0.MINOR) accepts only that minor version. The soname
 *    changes only when the ABI breaks (abidiff against the last release's
 *    ABI, tests/abi, says so); additions keep it.
 *  - Structs the caller allocates and hands in, or has the library fill,
 *    are made to grow without breaking callers:
 *    . ruda_config starts with a `size` field that ruda_config_init() sets
 *      to sizeof(ruda_config); ruda_device_open() refuses any other size
 *      with RUDA_EINVAL. It ends in reserved words, where later settings
 *      go with 0 meaning their default; open refuses a nonzero one. Always
 *      fill a config with ruda_config_init().
 *    . Descriptors and result structs (ruda_copy_desc, ruda_launch_desc,
 *      ruda_call_desc, ruda_pool_config, ruda_tensor_map_desc, ruda_device_props,
 *      ruda_memory_stats, ruda_pool_report, ruda_staging_stats) end in
 *      `uint64_t reserved[N]` words, which a later version may give a
 *      meaning without changing the struct's size. Callers must leave them
 *      zero: designated initializers (`{.kernel = "k", ...}`), `= {0}` and
 *      memset do that, as do the ruda_* helpers that build descriptors.
 *      The library zeroes them in the structs it fills, and refuses with
 *      RUDA_EINVAL, naming the word, a struct handed in with one set.
 *    . A field added within a soname takes reserved words in place: an
 *      anonymous union of the new field and the reserved array, so every
 *      other field keeps its offset and 0 still means what it meant
 *      (abidiff, tests/abi, accepts that and refuses any other change).
 *    . Small value types (ruda_handle, ruda_binding, ruda_dim3, ruda_arg,
 *      ruda_profile_token, ruda_tensor_map) are passed by value and do not
 *      change within a soname.
 *  - The headers are C11 and C++17 (every declaration is extern "C").
 */
#ifndef RUDA_RUDA_H
#define RUDA_RUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ruda/error.h"
#include "ruda/export.h"
#include "ruda/memory.h"
#include "ruda/types.h"
#include "ruda/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library loaded, "MAJOR.MINOR.PATCH" (compare with
 * RUDA_VERSION_STRING, the headers' version). Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_version(void);

/* The same as MAJOR * 10000 + MINOR * 100 + PATCH (compare with
 * RUDA_VERSION_NUMBER). Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_version_number(void);

/* ruda_version() under the name 0.1.0 gave it first; kept for the 0.1
 * series, where nothing is removed (the version policy: README). New code
 * calls ruda_version(). Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_version_string(void);

/* ------------------------------------------------------------------ */
/* Device                                                              */
/* ------------------------------------------------------------------ */

/* ruda_device, an open device, is declared in ruda/types.h. */

/* Which backend a device runs on. */
typedef enum ruda_backend_kind {
  RUDA_BACKEND_AUTO = 0, /* cuda when a usable GPU is present, else host */
  RUDA_BACKEND_CUDA = 1,
  RUDA_BACKEND_HOST = 2
} ruda_backend_kind;

/* What a device logs to stderr. */
typedef enum ruda_log_level {
  RUDA_LOG_OFF = 0,
  RUDA_LOG_ERROR = 1,
  RUDA_LOG_WARN = 2,
  RUDA_LOG_INFO = 3,
  RUDA_LOG_DEBUG = 4
} ruda_log_level;

/* What a producer meets when its stream's queue holds queue_bound commands. */
typedef enum ruda_backpressure {
  RUDA_BACKPRESSURE_BLOCK = 0, /* wait (sleeping) until the worker drains */
  RUDA_BACKPRESSURE_ERROR = 1  /* fail at once with RUDA_EQUEUEFULL */
} ruda_backpressure;

/* How to open a device. Fill it with ruda_config_init(), then change
 * fields: the size field tells ruda_device_open() which layout it got. */
typedef struct ruda_config {
  uint32_t size;             /* sizeof(ruda_config), set by ruda_config_init */
  ruda_backend_kind backend; /* RUDA_BACKEND */
  int device_ordinal;        /* RUDA_DEVICE: GPU ordinal for cuda */
  uint32_t num_streams;      /* RUDA_STREAMS: worker threads (1..1024) */
  uint32_t queue_bound;      /* RUDA_QUEUE_BOUND: commands a worker holds, queued
                                or running (the command it runs counts) */
  ruda_backpressure backpressure; /* RUDA_BACKPRESSURE: block|error */
  ruda_log_level log_level;  /* RUDA_LOG: off|error|warn|info|debug */
  int bounds_checked;        /* RUDA_BOUNDS_CHECK: kernels built with
                                RUDA_BOUNDS_CHECKED defined (cuda) */
  const char *cache_dir;     /* RUDA_CACHE_DIR: on-disk kernel cache; NULL
                                selects $XDG_CACHE_HOME/ruda, "" disables */
  int launch_blocking;       /* RUDA_LAUNCH_BLOCKING: debugging: each worker waits
                                for the device after every command, so a failure
                                (a fault above all) is reported on the command
                                that caused it, with the backtrace of the call
                                that enqueued it. Slow; 0 by default. */
  uint32_t spin_us;          /* RUDA_SPIN_US: how long a worker that ran out of
                                work, or a thread waiting on a future, polls
                                before it sleeps (default 50; 0: sleeps at
                                once). A worker polls only while work keeps
                                coming back within that time. */
  int auto_graphs;           /* RUDA_AUTO_GRAPHS: a worker that finds several
                                launches and copies of one stream queued in a
                                row, of a shape it saw before, issues them as
                                one graph with what changed patched in
                                (docs/graphs.md); same results, ordering and
                                errors as one by one. A stream's launches and
                                copies issued in place are held until its next
                                read, sync or flush and go with it the same
                                way (ruda_stream_set_in_place). 1 on, 0 off; -1 (the
                                default) on where graphs pay: the cuda
                                backend (a driver launch per command costs
                                more than a replay), not host. Not while
                                tracing, NVTX, RUDA_WORKER_STATS or
                                RUDA_LAUNCH_BLOCKING are on. */
  union {                    /* lanes took reserved[0]'s low half */
    uint32_t lanes;          /* RUDA_LANES: device streams (CUstreams) per
                                worker, 1..32, at most 1024 in all: stream
                                ids of one worker get one each in turn, so
                                their work overlaps on the device as a
                                CUstream per client thread would (a GEMM
                                server with more clients than workers:
                                64 / num_streams). 0 (the default): one
                                CUstream per worker, which issues small
                                kernels fastest, until a library is
                                registered (ruda_library_register, ruda/
                                call.h); stream ids first used after that
                                take two per worker (with num_streams at
                                most 32), so GEMMs of clients sharing a
                                worker overlap (docs/benchmarks.md). A
                                stream keeps the lane it started on. */
    uint64_t reserved[8];    /* zero but lanes: room for later settings, each of which
                                will mean "the default" when 0, so a config
                                of these headers opens the same under a
                                later 0.3.x library; ruda_device_open
                                refuses a nonzero word (a setting of newer
                                headers it does not know) */
  };
} ruda_config;

/* Sets cfg->size and fills cfg with defaults (auto backend, 8 streams,
 * 65536 commands per queue, block on a full queue, warn logging), then
 * applies any RUDA_*
 * environment variables named above. Fields set afterwards by the caller
 * win over the environment. Thread-safe, non-blocking. */
RUDA_EXTERN void ruda_config_init(ruda_config *cfg);

/* Opens a device and starts its stream workers. cfg may be NULL (defaults
 * plus environment). Fails with RUDA_ENOBACKEND when the cuda backend was
 * asked for and is unusable, RUDA_EINVAL for out-of-range settings, a
 * cfg->size other than sizeof(ruda_config) (a config not filled by
 * ruda_config_init, or built against another version's headers) or a
 * reserved word that is not zero (the message names it).
 * Thread-safe; blocks while workers start. */
RUDA_EXTERN int ruda_device_open(const ruda_config *cfg, ruda_device **out);

/* Closes the device: new calls fail with RUDA_ECLOSED, every command
 * already enqueued is executed (or reported), workers stop, all memory is
 * released. Errors still queued on any stream are returned through *errors
 * (owned by the caller; errors may be NULL to discard them), and the
 * return value is RUDA_EUNHEALTHY when there were any. Calls already in
 * progress on other threads when close starts are waited for, and what
 * they enqueued runs before close returns; calls that start after it began
 * fail with RUDA_ECLOSED. Calls that start after close returned use a freed
 * handle (undefined): stop other threads before the handle dies.
 * Futures (from ruda_read, ruda_sync_async, ruda_graph_replay_async and
 * ruda_graph_replay_with) still held by any thread do not stop it and
 * outlive the device: a wait already in progress when close starts
 * finishes with its own result; every other future not yet waited is
 * completed by close with RUDA_ECLOSED (its result dropped: a read's
 * destination is not written), and all of them stay valid to wait, poll
 * and free afterwards, on any thread. A call racing close either fails
 * with RUDA_ECLOSED or hands out a future that close completes.
 * Refuses with RUDA_EBUSY, the device staying open, while the device is a
 * rank of a live communicator: a communicator is freed without naming the
 * device, so it must go first. What is freed by naming the device goes
 * with it: close destroys live graphs, frees staging blocks and drops open profile
 * tokens (ruda_graph_destroy, ruda_staging_free and ruda_profile_end on
 * them after close are calls on a freed handle). Blocks until calls in
 * progress and the workers are done. Thread-safe in that sense: other
 * threads' calls on dev are waited for or refused, a second close fails
 * with RUDA_ECLOSED. */
RUDA_EXTERN int ruda_device_close(ruda_device *dev, ruda_error **errors);

/* Name of the backend in use ("host" or "cuda"). Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_device_backend(const ruda_device *dev);

/* Why RUDA_BACKEND_AUTO opened the host backend instead of cuda (no
 * driver, no GPU, ...), as the cuda backend's error said; NULL when no
 * fallback happened. Valid while dev is open. Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_device_fallback_reason(const ruda_device *dev);

/* Number of worker streams. Thread-safe, non-blocking. */
RUDA_EXTERN uint32_t ruda_device_num_streams(const ruda_device *dev);

/* Number of device streams (lanes) of all workers together: num_streams
 * times the lanes per worker (ruda_config.lanes); ruda_call_ctx.lane lies
 * below it. Thread-safe, non-blocking. */
RUDA_EXTERN uint32_t ruda_device_num_lanes(const ruda_device *dev);

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

/* ruda_stream_id, RUDA_STREAM_CURRENT and RUDA_STREAM_EXPLICIT_MAX are in
 * ruda/types.h. */

/* The calling thread's stream id (stable for the thread's life; a
 * thread-exit destructor that calls ruda after ruda's own thread-exit hook
 * ran gets a new one). Thread-safe, non-blocking. */
RUDA_EXTERN ruda_stream_id ruda_stream_current(void);

/* Writes up to cap ids of the streams used so far into ids; returns how
 * many streams exist (which may exceed cap). A thread's own stream is
 * listed while its thread runs and, after the thread exited, until its
 * work has run, its errors were drained (ruda_sync by this id, or
 * ruda_device_sync) and no future from it is left unfreed; it is then
 * retired without any call: its cached pages go back to the device's
 * arena, its id is refused like one never handed out, and its record is
 * freed once no call that named the id can still be using it (listing is
 * one of the moments that happens, so it may take those streams' pool
 * locks briefly). Thread-safe, non-blocking. */
RUDA_EXTERN size_t ruda_stream_ids(ruda_device *dev, ruda_stream_id *ids, size_t cap);

/* The name messages give stream id (RUDA_STREAM_CURRENT: the calling
 * thread's), into buf of len bytes, cut to fit: "stream 5" for an
 * explicit id, "thread stream #3" for a thread's own (whose id, as
 * ruda_stream_ids lists it, is 2^63 + 3). RUDA_EINVAL when buf is NULL or
 * len is 0. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_stream_name(ruda_stream_id id, char *buf, size_t len);

/* on != 0: stream's writes, reads, copies and launches are issued by the
 * calling thread itself whenever the stream's worker has nothing queued
 * or running; the call then returns once the driver took the command
 * (microseconds on cuda, the whole kernel on host) instead of after a
 * queue push, and the command skips the hand-over to the worker and back.
 * For request loops that wait for each result, where that hand-over is
 * latency; not for a thread that issues many launches back to back, which
 * gains from handing them over. Order, errors and results are as without
 * it; commands go to the worker as usual while it is busy, or while the
 * device is traced or observed (RUDA_TRACE, NVTX, RUDA_WORKER_STATS). On
 * cuda the device's context is made current on the calling thread; a
 * thread that had none keeps it after (as the CUDA runtime would bind
 * it), another one is put back. With automatic graphs on
 * (cfg.auto_graphs, the default on cuda) a launch or copy in place is
 * held rather than issued (on cuda while other threads issue too): the
 * stream's next read, sync or flush issues
 * the run with itself, as one graph once its shape repeats, so a request
 * costs one driver launch for its kernels; anything else issued on the
 * worker first issues it before itself, and the worker issues a run no
 * wait follows within about 0.1-0.2 ms (that stream's launches then go
 * at once for a while). Library calls (ruda_call) run in place
 * too, after the caller released what it held to issue them, so their
 * code may issue on their own buffers (ruda/call.h: ctx->worker, not the
 * thread, keys per-worker state). on == 0 turns it off for the stream. By
 * default (neither called) the cuda backend runs a stream's command in
 * place while the stream looks like a request loop: no other future of it
 * is outstanding and it was waited on within its last 16 commands; the
 * host backend never does (in place there runs the kernel on the caller).
 * RUDA_EINVAL as any stream call.
 * Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_stream_set_in_place(ruda_device *dev, ruda_stream_id stream, int on);

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

/* ruda_handle (a buffer) and ruda_binding (a byte range of one) are in
 * ruda/types.h. */

/* Builds a binding covering the whole buffer. */
static inline ruda_binding ruda_bind(ruda_handle h) {
  ruda_binding b = {h, 0, 0};
  return b;
}

/* Builds a binding of size bytes at offset. */
static inline ruda_binding ruda_bind_range(ruda_handle h, uint64_t offset, uint64_t size) {
  ruda_binding b = {h, offset, size};
  return b;
}

/* Allocates a device buffer of size bytes for stream. The memory is usable
 * by commands enqueued afterwards on any stream. Fails with RUDA_EINVAL for
 * size 0, RUDA_EBUFFERTOOBIG when it can never fit, RUDA_EOUTOFMEMORY.
 * Thread-safe; may call the device allocator.
 * Non-blocking, except out of device memory: it then waits up to about 50 ms for the workers to
 * pass their fences before it tries again. */
RUDA_EXTERN int ruda_buffer_create(ruda_device *dev, ruda_stream_id stream, uint64_t size,
                                   ruda_handle *out);

/* Frees a buffer, ordered on stream: the handle is dead for new calls at
 * once, the memory is released after every command already enqueued that
 * uses it has run. RUDA_EFREE for a second free, RUDA_ENOTFOUND for a
 * handle that never existed. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_buffer_free(ruda_device *dev, ruda_stream_id stream, ruda_handle h);

/* Size in bytes of a live buffer. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_buffer_size(ruda_device *dev, ruda_handle h, uint64_t *size);

/* ------------------------------------------------------------------ */
/* Copies                                                              */
/* ------------------------------------------------------------------ */

#define RUDA_MAX_RANK 8

/* Where and how a tensor lies in a buffer: rank dims of shape[i] elements
 * with strides[i] (in elements) between consecutive indices of dim i, each
 * element elem_size bytes. rank 0 means "binding.size contiguous bytes".
 * Host-side data is always dense (row-major, last dim fastest). */
typedef struct ruda_copy_desc {
  ruda_binding binding;
  uint32_t rank;
  uint64_t shape[RUDA_MAX_RANK];
  uint64_t strides[RUDA_MAX_RANK];
  uint32_t elem_size;
  uint64_t reserved[2]; /* zero */
} ruda_copy_desc;

/* Builds a contiguous descriptor for a whole binding. */
static inline ruda_copy_desc ruda_copy_contiguous(ruda_binding b) {
  ruda_copy_desc d;
  d.binding = b;
  d.rank = 0;
  for (int i = 0; i < RUDA_MAX_RANK; i++) d.shape[i] = d.strides[i] = 0;
  d.elem_size = 1;
  d.reserved[0] = d.reserved[1] = 0;
  return d;
}

/* Writes len bytes from src into the buffer region described by dst.
 * src is copied before the call returns (the caller may reuse it at once);
 * the device copy runs later, in stream order. len must equal the
 * descriptor's element count times elem_size. Thread-safe, non-blocking
 * unless the queue is full under RUDA_BACKPRESSURE_BLOCK. A full queue
 * refuses a write whole; after any other failure the destination's
 * contents are unspecified. */
RUDA_EXTERN int ruda_write(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *dst,
                           const void *src, size_t len);

/* Futures (ruda/types.h): wait for or free every future before closing
 * its device, which a future refers to. */

/* Enqueues a read of the region src into dst (len bytes, dense). dst must
 * stay valid until the future completes; its bytes are final once
 * ruda_future_wait returns and unspecified before (on every backend: the
 * host backend, too, fills dst only at the wait). A dst inside a block from ruda_staging_alloc
 * (page-locked) receives the device's copy directly; any other dst is
 * filled from a page-locked bounce buffer by the thread that waits.
 * *fut receives the future, owned by the caller. On a stream capturing a
 * graph the read is recorded instead (dst must then be staging memory)
 * and *fut is NULL: ruda/graph.h. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_read(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *src,
                          void *dst, size_t len, ruda_future **fut);

/* Copies src.size bytes between two buffers in stream order (src.size 0:
 * the whole source binding). Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_copy(ruda_device *dev, ruda_stream_id stream, ruda_binding dst,
                          ruda_binding src);

/* Returns 1 when the future completed, 0 when not yet. Never blocks
 * (except beside a close completing futures, until close let go of this
 * one); thread-safe against one waiter. */
RUDA_EXTERN int ruda_future_poll(ruda_future *fut);

/* Blocks until the future completes. Returns 0, or the error code of the
 * completion; then *err (if err is non-NULL) receives an owned error with
 * the stream's queued errors as its list. Waiting twice returns the same
 * result (the error is handed over only once). A stream holding errors
 * yields RUDA_EUNHEALTHY as for ruda_flush. A future not waited before its
 * device closed returns RUDA_ECLOSED (ruda_device_close).
 * Not thread-safe on one future: one waiter at a time (ruda_future_poll may run beside it). */
RUDA_EXTERN int ruda_future_wait(ruda_future *fut, ruda_error **err);

/* Frees a future. A future not yet waited is detached: the work still
 * runs and its result is dropped (a read's dst is then never written,
 * except a dst in staging memory, which the device may already have
 * filled). NULL is a no-op. A future may be freed after
 * ruda_device_close returned (ruda_device_close says what it holds then).
 * Not thread-safe on one future: no wait or poll of it beside or after it.
 * Non-blocking, except beside a close that is completing futures (it
 * waits until close let go of this one). */
RUDA_EXTERN void ruda_future_free(ruda_future *fut);

/* ------------------------------------------------------------------ */
/* Kernels                                                             */
/* ------------------------------------------------------------------ */

/* A grid or block shape. */
typedef struct ruda_dim3 {
  uint32_t x, y, z;
} ruda_dim3;

/* What a kernel argument is. A buffer argument also says how the kernel
 * uses the buffer, which decides what other streams' work it waits for:
 *   RUDA_ARG_BUFFER      read and written (the default): waits for every
 *                        earlier use on other streams.
 *   RUDA_ARG_BUFFER_IN   only read: waits for the last write only, so
 *                        kernels of many streams that read one buffer (a
 *                        model's weights) run at the same time.
 *   RUDA_ARG_BUFFER_OUT  only written: ordered like RUDA_ARG_BUFFER.
 * ruda_read and the source of ruda_copy read; ruda_write and a copy's
 * destination write. Declaring a written buffer IN is a data race, as
 * declaring a pointer const and writing through it would be.
 * "Earlier" is the order of the calls. Two calls that conflict on a buffer
 * (one writes it) made at the same moment from two threads still run one
 * after the other, in an order the program does not choose; such a call
 * may wait, inside the call, while the other thread finishes issuing its
 * own (for a large ruda_write, its copy into staging memory). */
typedef enum ruda_arg_kind {
  RUDA_ARG_BUFFER = 0,     /* a binding; the kernel sees a pointer to its first byte */
  RUDA_ARG_SCALAR = 1,     /* bytes copied at enqueue, passed by value */
  RUDA_ARG_BUFFER_IN = 2,  /* a binding the kernel only reads */
  RUDA_ARG_BUFFER_OUT = 3  /* a binding the kernel only writes */
} ruda_arg_kind;

/* One kernel argument; build it with ruda_arg_buffer, ruda_arg_in,
 * ruda_arg_out or ruda_arg_scalar. */
typedef struct ruda_arg {
  ruda_arg_kind kind;
  ruda_binding binding; /* RUDA_ARG_BUFFER, _IN, _OUT */
  const void *data;     /* RUDA_ARG_SCALAR */
  uint32_t size;        /* RUDA_ARG_SCALAR, 1..RUDA_MAX_SCALAR_BYTES */
} ruda_arg;

#define RUDA_MAX_ARGS 64
#define RUDA_MAX_SCALAR_BYTES 256

/* A buffer argument: the kernel gets a pointer to b's first byte. */
static inline ruda_arg ruda_arg_buffer(ruda_binding b) {
  ruda_arg a = {RUDA_ARG_BUFFER, b, NULL, 0};
  return a;
}

/* A buffer argument the kernel only reads (see ruda_arg_kind). */
static inline ruda_arg ruda_arg_in(ruda_binding b) {
  ruda_arg a = {RUDA_ARG_BUFFER_IN, b, NULL, 0};
  return a;
}

/* A buffer argument the kernel only writes (see ruda_arg_kind). */
static inline ruda_arg ruda_arg_out(ruda_binding b) {
  ruda_arg a = {RUDA_ARG_BUFFER_OUT, b, NULL, 0};
  return a;
}

/* A scalar argument: size bytes at data, copied when the launch is
 * enqueued (data need not outlive the ruda_launch call). */
static inline ruda_arg ruda_arg_scalar(const void *data, uint32_t size) {
  ruda_handle none = {0, 0};
  ruda_arg a = {RUDA_ARG_SCALAR, ruda_bind(none), data, size};
  return a;
}

/* Launch flags. */
#define RUDA_LAUNCH_DRY_RUN 0x1u  /* validate (and compile), dispatch nothing */
#define RUDA_LAUNCH_INDIRECT 0x2u /* grid read from indirect_grid (u32[3]) when the
                                     launch runs; a zero in it dispatches nothing
                                     (the count comes from the device, as with
                                     indirect dispatch elsewhere), while a direct
                                     grid with a zero is refused at the call */
#define RUDA_LAUNCH_NOWAIT 0x4u   /* a full queue fails the call with
                                     RUDA_EQUEUEFULL at once (nothing is
                                     queued) instead of waiting for room,
                                     whatever cfg.backpressure says: for a
                                     caller that holds a lock while it
                                     launches and waits only after letting
                                     it go (the Python package and its GIL) */

/* A kernel launch. Build it with a designated initializer, so that the
 * fields left out (reserved above all) are zero. */
typedef struct ruda_launch_desc {
  const char *kernel;        /* registered kernel name */
  ruda_dim3 grid;            /* blocks; ignored with RUDA_LAUNCH_INDIRECT */
  ruda_dim3 block;           /* threads per block */
  uint32_t shared_mem;       /* dynamic shared memory bytes */
  const ruda_arg *args;      /* nargs arguments, in kernel parameter order */
  uint32_t nargs;
  uint32_t flags;            /* RUDA_LAUNCH_* */
  ruda_binding indirect_grid; /* RUDA_LAUNCH_INDIRECT: 12 bytes, u32[3] */
  const struct ruda_kernel_ref *ref; /* NULL, or the kernel resolved once by
                                ruda_kernel_lookup: then `kernel` is not
                                looked up (it may be NULL) */
  uint64_t reserved[3];      /* zero */
} ruda_launch_desc;

/* A registered kernel, resolved once (ruda_kernel_lookup) so that a launch
 * carries it instead of a name to look up on every call. Valid until the
 * device closes; registering the name again (a replacement) is what it
 * launches from then on. Opaque. */
typedef struct ruda_kernel_ref ruda_kernel_ref;

/* *out: the reference of the kernel registered as name, for
 * ruda_launch_desc.ref. RUDA_EKERNEL when no kernel has that name,
 * RUDA_EINVAL for NULL arguments. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_kernel_lookup(ruda_device *dev, const char *name, const ruda_kernel_ref **out);

/* Enqueues a kernel launch. Checks at the call: the kernel name is known,
 * dims are non-zero and within device limits, every binding is live and in
 * range, scalars fit. Device-side failures surface on flush/sync.
 * Thread-safe, non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_launch(ruda_device *dev, ruda_stream_id stream, const ruda_launch_desc *l);

/* Host-backend kernels: C functions registered by name. The worker calls fn
 * once per thread of every block, in block order, with the indices set in
 * ctx. args[i] points at the first byte of a buffer argument, or at the
 * bytes of a scalar argument. A kernel reports a failure by returning a
 * negative RUDA_E* code; the worker queues it on the stream. A kernel runs
 * on a worker thread and must not call ruda functions that wait for a
 * worker (flush, sync, future waits, or a push into a full queue under
 * RUDA_BACKPRESSURE_BLOCK): if that worker is its own, it deadlocks.
 * Non-waiting calls are fine, also on the buffers its own launch uses or
 * replaying the graph it belongs to, wherever it runs (a kernel issued in
 * place runs on the issuing thread, holding nothing of ruda's). */
typedef struct ruda_host_ctx {
  ruda_dim3 grid_dim, block_dim, block_idx, thread_idx;
  void *shared;   /* shared_mem bytes, per block */
  uint32_t nargs; /* entries in args */
} ruda_host_ctx;

/* A host kernel: one call per thread; 0 or a negative RUDA_E* code. */
typedef int (*ruda_host_kernel_fn)(const ruda_host_ctx *ctx, void *const *args);

/* Registers (or replaces) a host kernel without a signature: launches of
 * it are not checked, so one with too few arguments makes fn read past
 * args (a crash) and a wrong order runs silently. Only for a kernel that
 * checks ctx->nargs itself; prefer ruda_host_kernel_register_typed (how
 * to write a host kernel: docs/host_backend.md). RUDA_ENOBACKEND on a cuda
 * device. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_host_kernel_register(ruda_device *dev, const char *name,
                                          ruda_host_kernel_fn fn);

/* A host kernel's parameter: RUDA_ARG_BUFFER (a pointer; any access mode
 * may be passed) or RUDA_ARG_SCALAR of size bytes. */
typedef struct ruda_host_param {
  ruda_arg_kind kind;
  uint32_t size; /* RUDA_ARG_SCALAR: bytes */
} ruda_host_param;

/* Registers (or replaces) a host kernel with its signature, params[0..n):
 * every launch is checked as on the cuda backend (argument count, buffer
 * or scalar, scalar sizes) and refused at the call with the same
 * RUDA_EINVAL messages. RUDA_ENOBACKEND on a cuda device. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_host_kernel_register_typed(ruda_device *dev, const char *name, ruda_host_kernel_fn fn,
                                                const ruda_host_param *params, uint32_t n);

/* Registers (or replaces) a CUDA C++ kernel given as source, launched
 * afterwards by name. name is the kernel as the source spells it: an
 * extern "C" function ("scale"), a C++ function ("vectorAdd",
 * "ns::saxpy"), a template instance ("MatrixMulCUDA<32>",
 * "ns::kernel<float, 4>"), or a mangled name. options is a
 * NULL-terminated list of extra NVRTC options, or NULL; the toolkit's
 * include directory and its CCCL directory are searched after them, so
 * cooperative_groups.h, cuda/std/..., cuda_fp16.h and cuda_bf16.h work
 * without options. The cuda backend compiles for the device (once per
 * source and options, cached in memory and on disk) and reports compile
 * errors with the NVRTC log as RUDA_ECOMPILE (full log:
 * ruda_compile_log), a name the source does not define as RUDA_EKERNEL
 * listing the kernels it does. Several kernels of one source: see
 * ruda_module_source. RUDA_ENOBACKEND on a host device. Thread-safe; blocks
 * while it compiles (not when the cache has the source). */
RUDA_EXTERN int ruda_kernel_source(ruda_device *dev, const char *name, const char *source,
                                   const char *const *options);

/* Registers every kernel in names[0..n) from one CUDA C++ source, compiled
 * once: names as for ruda_kernel_source, each registered (and launched)
 * under the text given. file_name names the source in compile messages
 * (NULL: "module.cu"); options as for ruda_kernel_source. All or nothing:
 * on failure none is registered. RUDA_ENOBACKEND on a host device.
 * Thread-safe; blocks while it compiles (not when the cache has the source). */
RUDA_EXTERN int ruda_module_source(ruda_device *dev, const char *file_name, const char *source,
                                   const char *const *names, uint32_t n, const char *const *options);

/* Registers the kernels names[0..n) of a precompiled image: a cubin for
 * the device, PTX (which the driver compiles), or a fatbin, as nvcc
 * writes them (-cubin, -ptx, -fatbin). Names are extern "C" or mangled
 * (an image carries no C++ names); the launch checks are the same as for
 * sources. The image is copied; the caller may free it on return. All or
 * nothing. RUDA_ENOBACKEND on a host device. Thread-safe.
 * Blocks while the driver loads the image. */
RUDA_EXTERN int ruda_module_image(ruda_device *dev, const void *image, size_t size, const char *const *names,
                                  uint32_t n);

/* ruda_module_image of a file (.cubin, .ptx, .fatbin), or, for a .cu
 * file, ruda_module_source of its text named after the file. Thread-safe;
 * reads the file. Blocks reading the file and loading or compiling it. */
RUDA_EXTERN int ruda_module_file(ruda_device *dev, const char *path, const char *const *names, uint32_t n,
                                 const char *const *options);


/* ------------------------------------------------------------------ */
/* Flush and sync                                                      */
/* ------------------------------------------------------------------ */

/* Returns once the stream's worker has submitted everything enqueued on
 * the stream before this call, then drains the stream's error queue: 0 if
 * it was empty, else RUDA_EUNHEALTHY with *errors (if non-NULL) receiving
 * an owned RUDA_EUNHEALTHY error whose cause is the first queued error;
 * ruda_error_next() walks the rest in the order they happened.
 * Thread-safe; blocks for the worker, never for the device. */
RUDA_EXTERN int ruda_flush(ruda_device *dev, ruda_stream_id stream, ruda_error **errors);

/* Like ruda_flush, but returns once the device has also finished that
 * work. Thread-safe; blocks. */
RUDA_EXTERN int ruda_sync(ruda_device *dev, ruda_stream_id stream, ruda_error **errors);

/* ruda_sync for every stream of the device, explicit ones and every
 * thread's own (also of threads that have exited): returns once the
 * device finished all work enqueued before the call, with every stream's
 * errors in *errors (owned by the caller; NULL to discard) and
 * RUDA_EUNHEALTHY when there were any. A thread's own stream can also be
 * synced alone by the id ruda_stream_ids lists. Thread-safe; blocks. */
RUDA_EXTERN int ruda_device_sync(ruda_device *dev, ruda_error **errors);

/* The asynchronous form of ruda_sync: *fut completes when the work
 * enqueued before the call finished; its wait returns the stream's errors.
 * Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_sync_async(ruda_device *dev, ruda_stream_id stream, ruda_future **fut);

/* ------------------------------------------------------------------ */
/* Profiling                                                           */
/* ------------------------------------------------------------------ */

/* A point marked on a stream by ruda_profile_begin. Profiles may nest and
 * overlap: each token is ended on its own. */
typedef struct ruda_profile_token {
  uint64_t id;
} ruda_profile_token;

/* Marks the point the stream's work has reached so far; returns at once.
 * RUDA_EUNHEALTHY if the stream holds unreported errors (drain them with
 * ruda_flush first), RUDA_EGRAPHSTATE while it captures a graph. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_profile_begin(ruda_device *dev, ruda_stream_id stream, ruda_profile_token *token);

/* Waits until the stream's work up to this call is done and stores in *ns
 * the time it took from the token's point to here: device time between
 * two events on the cuda backend, the worker's clock on the host backend.
 * A sync point, like ruda_sync. RUDA_EPROFILETOKEN for a token this stream
 * did not hand out or that was ended already; RUDA_EPROFILE when commands
 * failed in between (they are in *errors, as ruda_sync hands them back;
 * the token is ended). RUDA_EGRAPHSTATE while the stream captures.
 * Thread-safe; blocks as ruda_sync. */
RUDA_EXTERN int ruda_profile_end(ruda_device *dev, ruda_stream_id stream, ruda_profile_token token, uint64_t *ns,
                                 ruda_error **errors);

/* A timeline of what every worker runs, written as Chrome trace-event JSON
 * (open it in ui.perfetto.dev or chrome://tracing; tools/trace_svg.py
 * draws it): one lane per worker, a span per command named after its
 * kernel, with its stream, command number, bytes and time queued; failures
 * as instant events; the device memory ruda holds over time; with
 * RUDA_TRACE_DEVICE=1 in the environment, device spans from timing events
 * (costly: docs/benchmarks.md). Setting RUDA_TRACE=path traces from open to
 * close. ruda_trace_start opens path for writing now (RUDA_EIO if it
 * cannot) and starts tracing each worker from the commands queued after
 * this call; RUDA_EBUSY while tracing. ruda_trace_stop waits until every
 * worker has stopped (the commands queued before it ran), writes the file
 * and closes it; RUDA_EINVAL when not tracing, RUDA_EIO if the write
 * failed. Either without host memory: RUDA_ENOMEM, and nothing changed
 * (not tracing after a failed start, still tracing after a failed stop).
 * Thread-safe; stop blocks. */
RUDA_EXTERN int ruda_trace_start(ruda_device *dev, const char *path);
/* Ends what ruda_trace_start (or RUDA_TRACE) began and writes the file.
 * Thread-safe; blocks until every worker handed its buffer back, and while writing. */
RUDA_EXTERN int ruda_trace_stop(ruda_device *dev);

/* NVTX ranges on the calling thread, in the domain "ruda" where ruda's
 * workers put a range per command (kernel name, stream as category). They
 * show in Nsight Systems or any NVTX tool; ranges are emitted only while
 * a tool is attached (NVTX_INJECTION64_PATH set when the process opened
 * its first device or called these; RUDA_NVTX=1 forces, 0 disables) and
 * when libruda was built with the NVTX headers. push: RUDA_EINVAL for a
 * NULL name, else 0 (also when nothing is emitted); pop closes the
 * thread's innermost range. Thread-safe, non-blocking, no device needed. */
RUDA_EXTERN int ruda_range_push(const char *name);
/* Closes the calling thread's innermost ruda_range_push range.
 * Thread-safe (ranges are per thread), non-blocking. */
RUDA_EXTERN void ruda_range_pop(void);

#ifdef __cplusplus
}
#endif

/* Device properties, staging buffers, CUDA interop; graphs; collectives;
 * library calls in stream order (ruda_call). */
#include "ruda/cuda.h"
#include "ruda/graph.h"
#include "ruda/comm.h"
#include "ruda/call.h"

#endif /* RUDA_RUDA_H */

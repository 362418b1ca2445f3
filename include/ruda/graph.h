/* ruda/graph.h - graph capture and replay. Included by ruda/ruda.h;
 * include that instead.
 *
 * A stream can record the launches, library calls (ruda/call.h) and
 * device-to-device copies issued on it into a graph instead of running them, and the graph can then be
 * replayed, on that stream or any other, as one command: on the cuda
 * backend a CUDA graph (captured on the worker at the first replay and
 * instantiated once, then one cuGraphLaunch per replay); on the host
 * backend the recorded commands, run in order.
 *
 *   ruda_graph_prepare(dev, s);        optional: allocations go to the
 *                                      persistent pool until end_capture
 *   ... warm-up run, allocating what the graph will use ...
 *   ruda_graph_begin_capture(dev, s);
 *   ruda_launch(dev, s, ...);          recorded, not run
 *   ruda_graph_end_capture(dev, s, &g);
 *   ruda_graph_replay(dev, s2, g);     fire-and-forget, like a launch
 *   ruda_graph_destroy(dev, g);
 *
 * A graph keeps the buffers its commands use: freeing one of them only
 * drops the handle, and the memory returns once the graph is destroyed
 * and its last replay ran (on another stream, once that stream's work has
 * passed, as for any command). A replay is ordered after other streams'
 * earlier uses of those buffers, and later uses after it, like a launch
 * that uses all of them.
 *
 * A whole request can be one graph: uploads and downloads between buffers
 * and page-locked staging blocks the caller keeps are recorded too, and a
 * replay then costs one command and, on the cuda backend, one
 * cuGraphLaunch instead of a driver call per copy and launch:
 *
 *   ruda_staging_alloc(dev, in_bytes, &in);   the caller's, reused
 *   ruda_staging_alloc(dev, out_bytes, &out);
 *   ruda_graph_begin_capture(dev, s);
 *   ruda_write_staged(dev, s, &x, in, in_bytes);   recorded: each replay
 *                                                  uploads in's bytes
 *   ruda_launch(dev, s, ...);
 *   ruda_read(dev, s, &y, out, out_bytes, &f);     recorded (f = NULL):
 *                                                  each replay fills out
 *   ruda_graph_end_capture(dev, s, &g);
 *   per request: fill in; ruda_graph_replay_async(dev, s, g, &f);
 *                ruda_future_wait(f, NULL); use out; ruda_future_free(f);
 *
 * A recorded ruda_write_staged does not take the block (unlike one run at
 * once) and a recorded ruda_read sets *fut to NULL; both need the whole
 * host range inside one block from ruda_staging_alloc (RUDA_EINVAL
 * otherwise: a device copy from pageable memory cannot be recorded) and a
 * contiguous region. The blocks must outlive the graph; the caller must
 * not change the input block while a replay may still read it, nor read
 * the output block before the replay's future completed. A block that a
 * queued replay uses (recorded, or named by a patch's `host`) is kept
 * for it: ruda_staging_free returns 0 at once and the block goes back once
 * every such replay ran (on cuda: once the device passed it).
 *
 * One graph can serve requests on other buffers, blocks, scalars or grids
 * without a new capture: ruda_graph_replay_with and ruda_graph_run_with
 * take patches that apply to that replay only (below).
 *
 * While a stream captures, what cannot be recorded is refused with
 * RUDA_EGRAPHSTATE at the call and leaves the capture open: ruda_write
 * (it copies its source at the call), ruda_sync and ruda_sync_async,
 * launches with RUDA_LAUNCH_INDIRECT (their grid is read when they run),
 * library calls marked RUDA_CALL_NOT_CAPTURABLE, replaying a graph, and a
 * second begin. ruda_flush, allocations and
 * frees work as usual; dry-run launches are checked and not recorded.
 * Commands issued on other streams, even ones sharing the worker, are not
 * captured.
 */
#ifndef RUDA_GRAPH_H
#define RUDA_GRAPH_H

#include <stdint.h>
#include <string.h>

#include "ruda/error.h"
#include "ruda/export.h"
#include "ruda/ruda.h" /* ruda_arg, ruda_dim3 (ruda.h includes this file last) */
#include "ruda/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A recorded graph (ruda_graph_end_capture). Opaque. */
typedef struct ruda_graph ruda_graph;

/* Routes stream's allocations to the persistent pool (as
 * ruda_memory_mode_push(RUDA_ALLOC_PERSISTENT)) until the stream's next
 * ruda_graph_end_capture or ruda_graph_abort_capture, so that buffers a
 * warm-up allocates for the graph live apart from the churn of the pools.
 * RUDA_EGRAPHSTATE if already prepared or capturing. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_graph_prepare(struct ruda_device *dev, ruda_stream_id stream);

/* Starts recording stream's launches, calls and copies. RUDA_EGRAPHSTATE
 * if the stream is capturing already; RUDA_EUNHEALTHY if it holds errors
 * not yet reported (drain them with ruda_flush first). Thread-safe,
 * non-blocking. */
RUDA_EXTERN int ruda_graph_begin_capture(struct ruda_device *dev, ruda_stream_id stream);

/* Stops recording and returns the graph in *out (possibly empty). A
 * launch racing with this call from another thread is either recorded or
 * run, never lost. RUDA_EGRAPHSTATE if the stream is not capturing. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_graph_end_capture(struct ruda_device *dev, ruda_stream_id stream, ruda_graph **out);

/* Stops recording and discards what was recorded (their buffers are
 * released as if the commands had run). RUDA_EGRAPHSTATE if the stream is
 * not capturing. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_graph_abort_capture(struct ruda_device *dev, ruda_stream_id stream);

/* Enqueues one replay of g on stream and returns. Failures (a kernel
 * fault, a capture the driver refused) go to stream's error queue, named
 * "ruda_graph_replay". RUDA_EINVAL for a NULL graph or one of another
 * device, RUDA_EGRAPHSTATE if stream is capturing, RUDA_EQUEUEFULL or
 * blocking per the backpressure policy. Thread-safe: one graph may be
 * replayed from several threads and streams at once (replays of one
 * graph run one after another on the device). */
RUDA_EXTERN int ruda_graph_replay(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g);

/* ruda_graph_replay, and *fut receives a future that completes once the
 * replay ran (its recorded downloads filled their blocks). Waiting on it
 * hands back the stream's errors as for ruda_sync. RUDA_EINVAL for a NULL
 * fut; otherwise as ruda_graph_replay. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_graph_replay_async(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g,
                                        ruda_future **fut);

/* Replays g on stream and waits until it ran: ruda_graph_replay_async
 * and ruda_future_wait in one call, for a request served synchronously
 * (upload, kernels, download, result). Blocking. When stream's worker has
 * nothing queued or running, the calling thread issues the replay itself
 * (library calls included: ruda/call.h) instead of handing it to the worker and waiting for the hand-back; it
 * is then ordered and reported exactly as if the worker had (the context
 * rule of ruda_stream_set_in_place applies). Returns 0, a
 * code of ruda_graph_replay_async (nothing ran, *err NULL), or the code
 * ruda_future_wait returns, with the stream's errors in *err (free with
 * ruda_error_free; err may be NULL). Thread-safe. */
RUDA_EXTERN int ruda_graph_run(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g,
                               ruda_error **err);

/* ---- replays with new arguments ---- */

/* What a patch changes in one recorded command (ruda_graph_patch). */
typedef enum ruda_graph_patch_kind {
  RUDA_GRAPH_PATCH_ARG = 1,  /* a launch's argument `index` becomes `arg` */
  RUDA_GRAPH_PATCH_GRID = 2, /* a launch's grid becomes `grid` */
  RUDA_GRAPH_PATCH_DST = 3,  /* a copy's or upload's destination buffer becomes
                                `binding`; a download's host block, `host` */
  RUDA_GRAPH_PATCH_SRC = 4   /* a copy's or download's source buffer becomes
                                `binding`; an upload's host block, `host` */
} ruda_graph_patch_kind;

/* One change a replay makes to the recorded command `command` (counted
 * from 0 in recording order, below ruda_graph_length). Build it with
 * ruda_graph_patch_arg, _grid, _buffer or _host, so that the other fields
 * (reserved above all) are zero. */
typedef struct ruda_graph_patch {
  ruda_graph_patch_kind kind;
  uint32_t command;
  uint32_t index;        /* RUDA_GRAPH_PATCH_ARG: the argument, from 0 */
  ruda_arg arg;          /* RUDA_GRAPH_PATCH_ARG */
  ruda_dim3 grid;        /* RUDA_GRAPH_PATCH_GRID */
  ruda_binding binding;  /* RUDA_GRAPH_PATCH_DST, _SRC on the device side */
  void *host;            /* RUDA_GRAPH_PATCH_DST of a download, _SRC of an upload */
  uint64_t reserved[2];  /* zero */
} ruda_graph_patch;

/* At most this many patches per replay. */
#define RUDA_GRAPH_MAX_PATCHES 64

/* What the builders below start from: a patch of `kind` to `command`,
 * every other field zero. Internal to this header. */
static inline ruda_graph_patch ruda__graph_patch_new(ruda_graph_patch_kind kind, uint32_t command) {
  ruda_graph_patch p;
  memset(&p, 0, sizeof p);
  p.kind = kind;
  p.command = command;
  return p;
}

static inline ruda_graph_patch ruda_graph_patch_arg(uint32_t command, uint32_t index, ruda_arg arg) {
  ruda_graph_patch p = ruda__graph_patch_new(RUDA_GRAPH_PATCH_ARG, command);
  p.index = index;
  p.arg = arg;
  return p;
}

static inline ruda_graph_patch ruda_graph_patch_grid(uint32_t command, ruda_dim3 grid) {
  ruda_graph_patch p = ruda__graph_patch_new(RUDA_GRAPH_PATCH_GRID, command);
  p.grid = grid;
  return p;
}

/* kind: RUDA_GRAPH_PATCH_DST or _SRC, the device side of a copy. */
static inline ruda_graph_patch ruda_graph_patch_buffer(ruda_graph_patch_kind kind, uint32_t command,
                                                       ruda_binding b) {
  ruda_graph_patch p = ruda__graph_patch_new(kind, command);
  p.binding = b;
  return p;
}

/* kind: RUDA_GRAPH_PATCH_SRC of an upload, _DST of a download. */
static inline ruda_graph_patch ruda_graph_patch_host(ruda_graph_patch_kind kind, uint32_t command, void *host) {
  ruda_graph_patch p = ruda__graph_patch_new(kind, command);
  p.host = host;
  return p;
}

/* ruda_graph_replay_async with patches[0..n) applied to this replay only:
 * the graph itself is not changed, so each caller passes its own request's
 * buffers and sizes (one graph per batch-size bucket, per-request buffers,
 * replays of several requests in flight at once). fut may be NULL (fire
 * and forget, as ruda_graph_replay). Patches apply in order; a later one
 * of the same field wins.
 *
 * Checked at the call, all or nothing (RUDA_EINVAL unless said): n at most
 * RUDA_GRAPH_MAX_PATCHES and patches non-NULL when n > 0; `command` below
 * the graph's length and of the kind the patch names (ARG and GRID:
 * a launch; DST and SRC: a copy, upload or download, with `binding` on
 * the device side and `host` on the host side); `index` below the
 * launch's argument count; a buffer for a buffer argument and a scalar of
 * the recorded size for a scalar one; a grid as ruda_launch checks it
 * (zero: RUDA_EINVAL, above the device's: RUDA_EGRIDDIM); buffers live
 * (RUDA_ENOTFOUND) and at least as large as the ones recorded (the
 * kernel, or the recorded copy size, may use all of them: RUDA_ERANGE); a
 * host block inside one ruda_staging_alloc block, as when recording. A
 * refused call enqueues nothing and leaves the graph as it was.
 *
 * Ordering: a replay is ordered like a launch using the buffers it uses:
 * the new ones, with the access mode the recorded argument had (a read
 * only if both the recorded argument and the patch say ruda_arg_in), and
 * the recorded ones no patch replaced; a recorded buffer replaced in every
 * command that uses it is not waited for. Scalars are copied at the call.
 * On the cuda backend the executable graph is patched in place before its
 * launch (cuGraphExecKernelNodeSetParams, cuGraphExecMemcpyNodeSetParams)
 * and put back for the next replay that does not patch those commands:
 * nothing is captured or instantiated again. Thread-safe, non-blocking as
 * ruda_graph_replay. */
RUDA_EXTERN int ruda_graph_replay_with(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g,
                                       const ruda_graph_patch *patches, uint32_t n, ruda_future **fut);

/* ruda_graph_run with patches: replays g with patches[0..n) applied (as
 * ruda_graph_replay_with) and waits. Blocking, thread-safe; returns as
 * ruda_graph_run. */
RUDA_EXTERN int ruda_graph_run_with(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g,
                                    const ruda_graph_patch *patches, uint32_t n, ruda_error **err);

/* Releases g. Replays already enqueued still run; the graph's memory and
 * buffers go back after the last of them. g must not be used after.
 * Not thread-safe on one graph: no call may use g beside it (as with any free); non-blocking. */
RUDA_EXTERN int ruda_graph_destroy(struct ruda_device *dev, ruda_graph *g);

/* Commands recorded in g (launches, library calls, copies, uploads and
 * downloads). Thread-safe, non-blocking. */
RUDA_EXTERN uint32_t ruda_graph_length(const ruda_graph *g);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_GRAPH_H */

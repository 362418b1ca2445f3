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
 * the output block before the replay's future completed.
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

#include "ruda/error.h"
#include "ruda/export.h"
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
 * (unless the graph holds library calls, which run on the worker)
 * instead of handing it to the worker and waiting for the hand-back; it
 * is then ordered and reported exactly as if the worker had (the context
 * rule of ruda_stream_set_in_place applies). Returns 0, a
 * code of ruda_graph_replay_async (nothing ran, *err NULL), or the code
 * ruda_future_wait returns, with the stream's errors in *err (free with
 * ruda_error_free; err may be NULL). Thread-safe. */
RUDA_EXTERN int ruda_graph_run(struct ruda_device *dev, ruda_stream_id stream, ruda_graph *g,
                               ruda_error **err);

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

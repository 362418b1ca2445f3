/* auto_graph.h - automatic request graphs (scheduler/auto_graph.c).
 *
 * With cfg.auto_graphs (RUDA_AUTO_GRAPHS=1), a worker that finds, in the
 * batch it took, several launches, copies and contiguous writes of one
 * stream in a row (a run: no other stream's command, no cross-stream wait
 * or mark between them) ending at a wait point of that stream (a read,
 * sync or flush), and not starting right after a launch or copy of that
 * stream (the tail of a request a batch boundary split: a shape of its
 * own, whose capture would cost as much as a whole request's),
 * replays the run as one backend graph once it has seen the same run
 * twice: same kernels, grids, blocks, shared memory,
 * argument kinds and scalar sizes, copy and write sizes. What differs
 * from the recorded run (buffer addresses, scalar bytes, a write's staged
 * block) is patched in (scheduler/graph.c's fixes, the executable graph's
 * node updates on cuda). The runs come from the worker's batches, and
 * from requests a client issued in place, held until their wait point
 * (inline.c). Exec holder only (the worker thread, or a client in place);
 * off while commands are observed (NVTX, RUDA_WORKER_STATS) or
 * RUDA_LAUNCH_BLOCKING is on, so those still see each command; RUDA_TRACE
 * records a replayed run as one command. */
#ifndef RUDA_AUTO_GRAPH_H
#define RUDA_AUTO_GRAPH_H

#include <stdint.h>

#include "scheduler/scheduler.h"

/* Whether cmd may be part of a run: a launch or a copy with nothing the
 * worker must do beside issuing it, or a contiguous write (its staged
 * block, moved by a fix, is retired after the run like a write's own:
 * backend stage_retire). */
static inline int ruda__auto_eligible(const ruda__cmd *cmd) {
  return (cmd->kind == RUDA__CMD_LAUNCH && cmd->u.launch.flags == 0) || cmd->kind == RUDA__CMD_COPY ||
         (cmd->kind == RUDA__CMD_WRITE && cmd->u.write.layout.contiguous);
}

/* Whether cmd, right after a run of its stream, is the wait point that
 * makes the run replayable: a read, sync or flush of that stream (the
 * client waits there, so the run is a whole request). */
static inline int ruda__auto_wait_point(const ruda__cmd *cmd, const ruda__stream *s) {
  return cmd->stream == s &&
         (cmd->kind == RUDA__CMD_READ || cmd->kind == RUDA__CMD_SYNC || cmd->kind == RUDA__CMD_FENCE);
}

/* Exec holder: issues run[0..n) (one stream's, n >= 2) as one graph when the
 * run is known. Returns how many of its first commands were issued
 * without a failure; when *rc is non-zero, run[that count] failed too,
 * with *err (issued: report and finish it). The caller runs the rest one
 * by one as usual: all of them when the run was not replayed, or when a
 * backend graph failed before anything of it was launched. */
uint32_t ruda__auto_run(ruda__worker *w, ruda__cmd *const *run, uint32_t n, int *rc, ruda_error **err);

/* Worker stop: frees the worker's recorded runs. */
void ruda__auto_free(ruda__worker *w);

#endif /* RUDA_AUTO_GRAPH_H */

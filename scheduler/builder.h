/* builder.h - the graph builder: one thread per device that makes the
 * backend graphs of automatic graphs' templates (scheduler/auto_graph.c)
 * off the workers' path (scheduler/builder.c).
 *
 * Capturing and instantiating a graph takes the driver's locks: under
 * many issuing threads a worker doing it inline held every request queued
 * behind it for milliseconds. The builder does it on a stream of its own
 * (a wstate from the backend's worker_start); the worker runs the run one
 * by one meanwhile and replays the template once it is READY.
 */
#ifndef RUDA_SCHEDULER_BUILDER_H
#define RUDA_SCHEDULER_BUILDER_H

#include "scheduler/graph.h"

struct ruda__sched;

/* Queues template g (build RUDA__BUILD_QUEUED, a reference taken) for the
 * builder, starting its thread at the first call. g ends READY or FAILED.
 * 0, or a code (no memory, no thread) with g FAILED and not queued. Any
 * thread (exec holders); takes the builder's lock, never blocks on the
 * device. */
int ruda__builder_submit(struct ruda__sched *sch, ruda_graph *g);

/* Device close, after the workers stopped: stops and joins the builder;
 * what it had not built yet ends FAILED, unbuilt. Blocks for the graph
 * being built. */
void ruda__builder_stop(struct ruda__sched *sch);

#endif /* RUDA_SCHEDULER_BUILDER_H */

/* trace.h - RUDA_TRACE=path: a timeline of what every worker ran, written
 * when the device closes as Chrome trace-event JSON (open it in
 * ui.perfetto.dev or chrome://tracing): one lane per worker, one span per
 * command named after its kernel or kind, with its stream and command
 * number, bytes for copies, the time it waited from the client's call to
 * its worker (queued_us; commands the client submitted), an instant
 * event for each failure, and counters of the device memory ruda holds
 * and of the staging arena's page-locked memory (sampled by each worker
 * at most once a millisecond).
 *
 * Each worker records into its own buffer (written by that worker only, no
 * locks; it grows by doubling); close writes the file once the workers
 * have stopped. Host spans are the host's monotonic clock: on the host
 * backend a span is the command's execution, on cuda the driver call that
 * issued it. With RUDA_TRACE_DEVICE=1, on a backend with timing events
 * (cuda), the device work gets spans too, in a second process "device",
 * one lane per worker's stream, where kernels of different streams are
 * seen overlapping. Each span is a batch: a timing event before the first
 * command of what the worker took from its queue at once, and one after
 * the last (at most RUDA__TRACE_SPAN_MAX commands a span; its name says
 * how many). An idle worker's batch is one command, so a light load is
 * timed command by command; under load a few events time dozens of
 * commands, where an event pair per command would double the driver calls
 * every issuing thread waits for. A worker keeps its first
 * RUDA__TRACE_DEVICE_MAX spans. Device times are tied to the host clock
 * by one event each worker waits for before its first span (a few us of
 * skew between lanes). An automatic graph run (scheduler/auto_graph.h) is
 * one record, "auto graph (n commands)". A worker keeps its first
 * RUDA__TRACE_MAX commands and counts the rest as dropped. While tracing,
 * clients do not issue commands in place (scheduler/inline.c): every
 * command is a worker's, so it is in the timeline.
 */
#ifndef RUDA_SCHEDULER_TRACE_H
#define RUDA_SCHEDULER_TRACE_H

#include <stdint.h>

#include "scheduler/scheduler.h"

#define RUDA__TRACE_MAX (1u << 20)
#define RUDA__TRACE_DEVICE_MAX (1u << 16)
#define RUDA__TRACE_SPAN_MAX 32u

typedef struct ruda__trace ruda__trace;

/* What a timeline calls cmd: its kernel's name, else its kind ("write",
 * "read", "wait", ...). Also the NVTX range's name (scheduler/nvtx.h). */
const char *ruda__trace_cmd_name(const ruda__cmd *cmd);

/* Reads RUDA_TRACE at open; gives every worker a buffer when it is set.
 * Without memory tracing is off (with a warning), never an error. */
void ruda__trace_open(struct ruda__sched *sch);
/* Worker w only (w->trace set): cmd is about to run (kept until
 * ruda__trace_end). The first timed command waits once for the device. */
void ruda__trace_begin(ruda__worker *w, const ruda__cmd *cmd);
/* Worker w only: the command begun last in t finished, rc its result (t:
 * the buffer it began in; a TRACE command changes w->trace). */
void ruda__trace_end(ruda__worker *w, ruda__trace *t, int rc);
/* Worker w only (w->trace set): an automatic graph run of n commands
 * (scheduler/auto_graph.h) is about to run, as one record; ended by
 * ruda__trace_end. */
void ruda__trace_begin_run(ruda__worker *w, ruda__cmd *const *run, uint32_t n);
/* Worker w only: the batch it ran is issued; closes t's open device span
 * (no-op without one, or with t NULL). */
void ruda__trace_batch_end(ruda__worker *w, ruda__trace *t);
/* After the workers stopped: writes the file when `write` (close; not
 * after a failed open), frees the buffers. */
void ruda__trace_close(struct ruda__sched *sch, int write);

/* ruda_trace_start / ruda_trace_stop (ruda.h): any client thread, one at
 * a time per device (sch->trace_lock). start hands every worker a buffer
 * through its queue; stop takes them back, waits until every worker has,
 * and writes the file. fn names the call in errors. */
int ruda__trace_start(struct ruda__sched *sch, const char *path, const char *fn);
int ruda__trace_stop(struct ruda__sched *sch, const char *fn);

#endif /* RUDA_SCHEDULER_TRACE_H */

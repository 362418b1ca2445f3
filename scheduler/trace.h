/* trace.h - RUDA_TRACE=path: a timeline of what every worker ran, written
 * when the device closes as Chrome trace-event JSON (open it in
 * ui.perfetto.dev or chrome://tracing): one lane per worker, one span per
 * command named after its kernel or kind, with its stream and command
 * number, bytes for copies, and an instant event for each failure.
 *
 * Each worker records into its own buffer (written by that worker only, no
 * locks; it grows by doubling); close writes the file once the workers
 * have stopped. Times are the host's monotonic clock: on the host backend a
 * span is the command's execution, on cuda the driver call that issued it
 * (device-side start and end are not recorded). A worker keeps its first
 * RUDA__TRACE_MAX commands and counts the rest as dropped.
 */
#ifndef RUDA_SCHEDULER_TRACE_H
#define RUDA_SCHEDULER_TRACE_H

#include <stdint.h>

#include "scheduler/scheduler.h"

#define RUDA__TRACE_MAX (1u << 20)

typedef struct ruda__trace ruda__trace;

/* What a timeline calls cmd: its kernel's name, else its kind ("write",
 * "read", "wait", ...). Also the NVTX range's name (scheduler/nvtx.h). */
const char *ruda__trace_cmd_name(const ruda__cmd *cmd);

/* Reads RUDA_TRACE at open; gives every worker a buffer when it is set.
 * Without memory tracing is off (with a warning), never an error. */
void ruda__trace_open(struct ruda_device *dev);
/* Worker only: cmd is about to run (kept until ruda__trace_end). */
void ruda__trace_begin(ruda__trace *t, const ruda__cmd *cmd);
/* Worker only: the command begun last finished, rc its result. */
void ruda__trace_end(ruda__trace *t, int rc);
/* After the workers stopped: writes the file when `write` (close; not
 * after a failed open), frees the buffers. */
void ruda__trace_close(struct ruda_device *dev, int write);

#endif /* RUDA_SCHEDULER_TRACE_H */

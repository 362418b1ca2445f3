/* nvtx.h - NVTX ranges for profilers (Nsight Systems, or any NVTX tool).
 *
 * When a tool is attached (NVTX_INJECTION64_PATH is set at device open, as
 * Nsight Systems sets it; RUDA_NVTX=1 forces it, RUDA_NVTX=0 turns it
 * off), each worker names its thread "ruda worker N" and wraps every
 * command it runs in a range of the domain "ruda": the kernel's name or
 * the command's kind (as RUDA_TRACE names it), the stream as the range's
 * category (named "stream N"), the command number as its payload. Users
 * add their own ranges with ruda_range_push/pop (ruda/ruda.h). Built
 * without the NVTX v3 headers (RUDA_HAVE_NVTX unset), everything here is a
 * no-op and ruda__nvtx_on() is 0.
 *
 * Thread-safety: ruda__nvtx_on may be called anywhere; begin/end only on
 * the worker whose command runs (NVTX ranges are per thread).
 */
#ifndef RUDA_SCHEDULER_NVTX_H
#define RUDA_SCHEDULER_NVTX_H

#include "scheduler/scheduler.h"

/* 1 when ranges are emitted (decided once per process). */
int ruda__nvtx_on(void);
/* Worker start: names the calling thread after worker index. */
void ruda__nvtx_name_worker(uint32_t index);
/* Around one command on its worker. */
void ruda__nvtx_begin(const ruda__cmd *cmd);
void ruda__nvtx_end(void);
/* Users' ranges (ruda_range_push/pop), on the calling thread. push
 * returns 1 when a range was opened. */
int ruda__nvtx_range_push(const char *name);
void ruda__nvtx_range_pop(void);

#endif /* RUDA_SCHEDULER_NVTX_H */

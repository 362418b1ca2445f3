/* libcall.h - library calls as commands (RUDA__CMD_CALL, ruda/call.h):
 * built by src/call.c, run here (scheduler/libcall.c) by the worker and by
 * graph replays. */
#ifndef RUDA_SCHEDULER_LIBCALL_H
#define RUDA_SCHEDULER_LIBCALL_H

#include "base/error.h"
#include "scheduler/scheduler.h"

/* Runs cmd's function on w's state; the caller holds w->exec and no ruda
 * lock. capturing: w's native stream is being captured into a graph (the
 * first replay on cuda). 0, or RUDA_ECALL with *err saying what the
 * function returned (its message included); the caller adds the call's
 * name, stream and command number. */
int ruda__libcall_run(ruda__worker *w, const ruda__cmd *cmd, int capturing, ruda_error **err);

#endif /* RUDA_SCHEDULER_LIBCALL_H */

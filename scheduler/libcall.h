/* libcall.h - library calls as commands (RUDA__CMD_CALL, ruda/call.h):
 * built by src/call.c, run here (scheduler/libcall.c) by the worker and by
 * graph replays; the libraries registered on the device and every
 * lane's state of each (ruda_library_register). */
#ifndef RUDA_SCHEDULER_LIBCALL_H
#define RUDA_SCHEDULER_LIBCALL_H

#include "base/error.h"
#include "scheduler/scheduler.h"

struct ruda__sched;

/* Runs cmd's function on lane ln (the replaying stream's, which need not
 * be cmd's own for a graph); the caller holds its worker's exec and no
 * ruda lock. capturing: ln's native stream is being captured into a graph
 * (the first replay on cuda). The call's library state is made first if
 * ln has none yet (never while capturing: ruda__libcall_prepare ran before the
 * capture). 0, or RUDA_ECALL with *err saying what the function (or the
 * library's create) returned, its message included; the caller adds the
 * call's name, stream and command number. */
int ruda__libcall_run(ruda__lane *ln, const ruda__cmd *cmd, int capturing, ruda_error **err);

/* Holding ln's worker's exec, before a capture that will run cmd (a
 * graph's first replay on cuda): makes ln's state of cmd's library if it
 * has none, so
 * create never runs inside the capture. 0 for any other command. 0, or
 * RUDA_ECALL with *err. */
int ruda__libcall_prepare(ruda__lane *ln, const ruda__cmd *cmd, ruda_error **err);

/* Registers a library (ruda_library_register's checks done by the
 * caller): *id from 1. RUDA_EINVAL past RUDA_LIBRARY_MAX, RUDA_ENOMEM.
 * Thread-safe; a short lock. */
int ruda__library_add(struct ruda__sched *sch, const ruda_library_desc *d, uint32_t *id);

/* 1 when id names a registered library of sch. Thread-safe, non-blocking. */
int ruda__library_known(struct ruda__sched *sch, uint32_t id);

/* The worker's thread at its end, after its last command and before the
 * backend's worker_stop: destroys every library state made on w's lanes,
 * newest library first. */
void ruda__libcall_worker_end(ruda__worker *w);

/* After the workers were joined: frees the registry. Not thread-safe. */
void ruda__libraries_free(struct ruda__sched *sch);

#endif /* RUDA_SCHEDULER_LIBCALL_H */

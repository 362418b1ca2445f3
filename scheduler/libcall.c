/* libcall.c - running a library call (ruda/call.h) on a worker.
 *
 * Worker (or the thread replaying a graph, which holds the worker's exec
 * word): the command's buffers are pinned and ordered like a launch's, so
 * all that is left is to hand the caller's function the worker's native
 * stream and the buffers' addresses. ruda holds none of its locks here:
 * a call never runs in place under a client's issue locks
 * (scheduler/inline.c), and the worker takes none around a command. On
 * cuda the worker's thread has the device's context current since it
 * started (cu_worker_start).
 */
#include <string.h>

#include "scheduler/sched.h"
#include "scheduler/libcall.h"

int ruda__libcall_run(ruda__worker *w, const ruda__cmd *cmd, int capturing, ruda_error **err) {
  struct ruda__sched *sch = w->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  const ruda__libcall_cmd *c = &cmd->u.call;
  char msg[RUDA_CALL_MSG_MAX];
  msg[0] = '\0';
  ruda_call_ctx ctx = {
      .dev = sch->handle,
      .stream = c->stream,
      .seq = cmd->seq,
      .worker = w->index,
      .nbuffers = c->nbuf,
      .addr = c->addr,
      .size = c->size,
      .cu_stream = ops->native_stream != NULL ? ops->native_stream(w->wstate) : NULL,
      .cu_context = ops->native_context != NULL ? ops->native_context(sch->backend.state) : NULL,
      .data = c->data,
      .data_size = c->data_size,
      .capturing = capturing,
      .msg = msg,
  };
  if (ops->call_begin != NULL) ops->call_begin(w->wstate, ctx.stream, ctx.seq);
  const int status = c->fn(&ctx, c->user);
  if (status == 0) return 0;
  msg[sizeof msg - 1] = '\0'; /* the function may have filled it to the end */
  *err = ruda__error_new(RUDA_ECALL, status, "the function returned %d%s%s", status, msg[0] ? ": " : "", msg);
  return RUDA_ECALL;
}

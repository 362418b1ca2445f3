/* submit.c - control commands (scheduler/submit.h). */
#include "scheduler/submit.h"

#include <execinfo.h>

int ruda__push_control(struct ruda__sched *sch, ruda__stream *s, int kind, int drains, const char *fn, ruda_future **out) {
  *out = NULL;
  ruda__cmd *cmd = ruda__cmd_alloc(0);
  ruda_future *f = cmd ? ruda__future_new(sch, s, drains) : NULL;
  if (f == NULL) {
    ruda__cmd_free(cmd);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  }
  cmd->kind = (uint8_t)kind;
  cmd->future = f;
  cmd->stream = s;
  cmd->seq = atomic_fetch_add_explicit(&s->seq, 1, memory_order_relaxed) + 1;
  /* Control commands skip the bound: their caller waits for them anyway,
   * so they cannot pile up, and refusing a flush would strand its errors. */
  ruda__queue_push_unbounded(s->worker, cmd);
  *out = f;
  return 0;
}

void ruda__origin_capture(ruda__cmd *cmd) {
  ruda__origin *o = malloc(sizeof *o);
  if (o == NULL) return; /* a debugging aid: the command runs without it */
  o->nframes = backtrace(o->frames, 24);
  cmd->origin = o;
}

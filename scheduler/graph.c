/* graph.c - graph capture and replay inside the scheduler: recordings,
 * the replay command, graphs' lifetime. The public calls are in
 * src/graph.c; graph.h has the shape and ruda/graph.h the rules. */
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "scheduler/graph.h"
#include "scheduler/libcall.h"
#include "scheduler/order.h"

/* The stream's recording, made once (never freed before the stream). */
ruda__capture *ruda__capture_get(ruda__stream *s) {
  ruda__capture *c = atomic_load_explicit(&s->cap, memory_order_acquire);
  if (c != NULL) return c;
  ruda__capture *made = calloc(1, sizeof *made);
  if (made == NULL) return NULL;
  pthread_mutex_init(&made->lock, NULL);
  if (atomic_compare_exchange_strong_explicit(&s->cap, &c, made, memory_order_acq_rel, memory_order_acquire))
    return made;
  pthread_mutex_destroy(&made->lock); /* another thread made it first */
  free(made);
  return c;
}

void ruda__capture_free(ruda__capture *c) {
  if (c == NULL) return;
  free(c->cmds);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Drops the pins of recorded commands and frees them. */
void ruda__capture_discard(struct ruda__sched *sch, ruda__cmd **cmds, uint32_t n, void *wstate) {
  for (uint32_t i = 0; i < n; i++) {
    ruda__cmd *cmd = cmds[i];
    for (uint32_t k = 0; k < cmd->npins; k++) ruda__handles_unpin(sch->handles, ruda__pin_slot(cmd->pins[k]), wstate);
    ruda__cmd_free(cmd);
  }
}

int ruda__capture_record(ruda__stream *s, ruda__cmd *cmd) {
  ruda__capture *c = atomic_load_explicit(&s->cap, memory_order_acquire);
  if (c == NULL) return 1;
  pthread_mutex_lock(&c->lock);
  if (!c->open) {
    pthread_mutex_unlock(&c->lock);
    return 1;
  }
  if (c->n == c->cap) {
    uint32_t cap = c->cap ? 2 * c->cap : 16;
    ruda__cmd **grown = realloc(c->cmds, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&c->lock);
      return ruda__fail(RUDA_ENOMEM, "recording a command of %s: out of host memory",
                        RUDA__SNAME(s->id));
    }
    c->cmds = grown;
    c->cap = cap;
  }
  cmd->stream = s;
  cmd->seq = c->n + 1; /* its place in the graph, quoted if a replay fails */
  if (cmd->kind == RUDA__CMD_LAUNCH) {
    cmd->u.launch.stream = s->id;
    cmd->u.launch.seq = cmd->seq;
  }
  c->cmds[c->n++] = cmd;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

static void graph_free(ruda_graph *g, void *wstate) {
  struct ruda__sched *sch = g->sch;
  if (g->exec != NULL && sch->ops->graph_release != NULL) sch->ops->graph_release(sch->bstate, g->exec);
  ruda__capture_discard(sch, g->cmds, g->n, wstate);
  free(g->cmds);
  free(g->slots);
  pthread_mutex_destroy(&g->exec_lock);
  pthread_mutex_destroy(&g->issue_lock);
  free(g);
}

void ruda__graph_unref(ruda_graph *g, void *wstate) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) graph_free(g, wstate);
}

/* Runs the recorded commands through the backend, in order. */
typedef struct replay_ctx {
  ruda__worker *w;
  ruda_graph *g;
  uint32_t failed; /* the command that failed, from 1 */
} replay_ctx;

static int run_recorded(void *arg, ruda_error **err) {
  replay_ctx *r = arg;
  const ruda__backend_ops *ops = r->w->sch->ops;
  void *ws = r->w->wstate;
  for (uint32_t i = 0; i < r->g->n; i++) {
    ruda__cmd *cmd = r->g->cmds[i];
    int rc = 0;
    switch (cmd->kind) {
      case RUDA__CMD_LAUNCH: rc = ops->launch(ws, &cmd->u.launch, err); break;
      case RUDA__CMD_COPY: rc = ops->copy(ws, cmd->u.copy.dst, cmd->u.copy.src, cmd->u.copy.size, err); break;
      case RUDA__CMD_WRITE: /* from the caller's staging block, every replay */
        rc = ops->upload(ws, cmd->u.write.dst, cmd->u.write.staged, cmd->u.write.layout.bytes, err);
        break;
      case RUDA__CMD_READ:
        rc = ops->download(ws, cmd->u.read.dst, cmd->u.read.src, cmd->u.read.layout.bytes, err);
        break;
      case RUDA__CMD_CALL: /* a backend with graph_replay calls this while capturing */
        rc = ruda__libcall_run(r->w, cmd, ops->graph_replay != NULL, err);
        break;
      default: break;
    }
    if (rc != 0) {
      r->failed = i + 1;
      return rc;
    }
  }
  return 0;
}

int ruda__graph_execute(ruda__worker *w, ruda__cmd *cmd, ruda_error **err) {
  ruda_graph *g = cmd->u.graph.g;
  const ruda__backend_ops *ops = w->sch->ops;
  replay_ctx r = {w, g, 0};
  int rc;
  if (ops->graph_replay == NULL) {
    rc = run_recorded(&r, err);
  } else {
    /* Replays of one graph on several workers take turns: the first one
     * captures, and one executable graph runs one launch at a time. */
    pthread_mutex_lock(&g->exec_lock);
    rc = ops->graph_replay(w->wstate, &g->exec, run_recorded, &r, err);
    pthread_mutex_unlock(&g->exec_lock);
  }
  if (rc != 0 && r.failed && *err != NULL) {
    ruda__cmd *bad = g->cmds[r.failed - 1];
    char msg[RUDA__MSG_MAX];
    const char *what = bad->kind == RUDA__CMD_LAUNCH  ? "launch of "
                       : bad->kind == RUDA__CMD_WRITE ? "upload"
                       : bad->kind == RUDA__CMD_READ  ? "download"
                       : bad->kind == RUDA__CMD_CALL  ? "call "
                                                      : "copy";
    const char *name = bad->kind == RUDA__CMD_LAUNCH ? bad->u.launch.kernel->name
                       : bad->kind == RUDA__CMD_CALL ? bad->u.call.name
                                                     : "";
    snprintf(msg, sizeof msg, "graph of %u commands captured on %s, command %u (%s%.64s): %.300s", g->n,
             RUDA__SNAME(g->stream), r.failed, what, name, (*err)->msg);
    memcpy((*err)->msg, msg, sizeof msg);
  }
  return rc;
}

typedef struct close_arg {
  struct ruda__sched *sch;
} close_arg;

static void close_capture(ruda__stream *s, void *arg) {
  close_arg *a = arg;
  ruda__capture *c = atomic_load(&s->cap);
  if (c == NULL) return;
  ruda__capture_discard(a->sch, c->cmds, c->n, NULL);
  free(c->cmds);
  c->cmds = NULL;
  c->n = c->cap = 0;
  c->open = 0;
}

void ruda__graphs_close(struct ruda__sched *sch) {
  close_arg a = {sch};
  ruda__streams_each(&sch->streams, close_capture, &a);
  /* The workers stopped: only the owners' references are left. */
  while (sch->graphs != NULL) {
    ruda_graph *g = sch->graphs;
    sch->graphs = g->next;
    ruda__graph_unref(g, NULL);
  }
}
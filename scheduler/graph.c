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
  /* A graph outlives the stream it was captured on (an exited thread's
   * record is freed by the reaper): recorded commands keep its id, in the
   * graph and in the kinds that quote it (launch, call), and no pointer. */
  cmd->stream = NULL;
  cmd->seq = c->n + 1; /* its place in the graph, quoted if a replay fails */
  if (cmd->kind == RUDA__CMD_LAUNCH) {
    cmd->u.launch.stream = s->id;
    cmd->u.launch.seq = cmd->seq;
  } else if (cmd->kind == RUDA__CMD_CALL) {
    cmd->u.call.stream = s->id;
  }
  c->cmds[c->n++] = cmd;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

ruda_graph *ruda__graph_new(struct ruda__sched *sch, ruda_stream_id stream) {
  ruda_graph *g = calloc(1, sizeof *g);
  if (g == NULL) return NULL;
  g->sch = sch;
  g->stream = stream;
  atomic_init(&g->refs, 1);
  pthread_mutex_init(&g->exec_lock, NULL);
  pthread_mutex_init(&g->issue_lock, NULL);
  return g;
}

void ruda__graph_free(ruda_graph *g, void *wstate) {
  if (g == NULL) return;
  struct ruda__sched *sch = g->sch;
  if (g->exec != NULL && sch->backend.ops->graph_release != NULL) sch->backend.ops->graph_release(sch->backend.state, g->exec);
  ruda__capture_discard(sch, g->cmds, g->n, wstate);
  free(g->cmds);
  free(g->slots);
  free(g->pin_base);
  free(g->pin_slot);
  free(g->slot_uses);
  pthread_mutex_destroy(&g->exec_lock);
  pthread_mutex_destroy(&g->issue_lock);
  free(g);
}

void ruda__graph_unref(ruda_graph *g, void *wstate) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) ruda__graph_free(g, wstate);
}

/* A replay in progress: the graph, this replay's patches, and the
 * command that failed. */
typedef struct replay_ctx {
  const ruda__backend_ops *ops;
  void *ws;        /* the state issuing: a worker's, or the builder's */
  ruda__lane *ln; /* the replaying lane, NULL on the builder (which has no calls) */
  ruda_graph *g;
  const ruda__graph_fix *fix; /* sorted by command */
  uint32_t nfix;
  uint32_t failed; /* the command that failed, from 1 */
  int capturing;   /* issued into the backend's graph, not run */
} replay_ctx;

/* Where r's patches of command i start (nfix when past them all; fix may
 * be NULL then). */
static uint32_t first_fix(const replay_ctx *r, uint32_t i) {
  uint32_t lo = 0, hi = r->nfix;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (r->fix[mid].cmd < i) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Whether r patches command i. */
static int patched(const replay_ctx *r, uint32_t i) {
  uint32_t k = first_fix(r, i);
  return k < r->nfix && r->fix[k].cmd == i;
}

/* Issues recorded command i through the backend, with the replay's
 * patches of it applied in order. */
static int issue(void *arg, uint32_t i, ruda_error **err) {
  replay_ctx *r = arg;
  const ruda__backend_ops *ops = r->ops;
  void *ws = r->ws;
  const ruda__cmd *cmd = r->g->cmds[i];
  const uint32_t k0 = first_fix(r, i);
  uint32_t k1 = k0; /* the patches of command i: fix[k0..k1) */
  while (k1 < r->nfix && r->fix[k1].cmd == i) k1++;
  int rc = 0;
  switch (cmd->kind) {
    case RUDA__CMD_LAUNCH:
      if (k0 == k1) {
        rc = ops->launch(ws, &cmd->u.launch, err);
      } else {
        ruda__launch_cmd l = cmd->u.launch;
        ruda__karg args[RUDA_MAX_ARGS];
        if (l.nargs > 0) memcpy(args, l.args, l.nargs * sizeof *args);
        for (uint32_t k = k0; k < k1; k++) {
          const ruda__graph_fix *f = &r->fix[k];
          if (f->kind == RUDA_GRAPH_PATCH_GRID) l.grid = f->grid;
          else if (args[f->index].kind == RUDA_ARG_SCALAR) args[f->index].bytes = f->bytes;
          else args[f->index].addr = f->addr;
        }
        l.args = args;
        rc = ops->launch(ws, &l, err);
      }
      break;
    case RUDA__CMD_COPY: {
      uint64_t dst = cmd->u.copy.dst, src = cmd->u.copy.src;
      for (uint32_t k = k0; k < k1; k++) *(r->fix[k].kind == RUDA_GRAPH_PATCH_DST ? &dst : &src) = r->fix[k].addr;
      rc = ops->copy(ws, dst, src, cmd->u.copy.size, err);
      break;
    }
    case RUDA__CMD_WRITE: { /* from the caller's staging block, every replay */
      uint64_t dst = cmd->u.write.dst;
      const void *src = cmd->u.write.staged;
      for (uint32_t k = k0; k < k1; k++) {
        if (r->fix[k].kind == RUDA_GRAPH_PATCH_DST) dst = r->fix[k].addr;
        else src = r->fix[k].host;
      }
      rc = ops->upload(ws, dst, src, cmd->u.write.layout.bytes, err);
      break;
    }
    case RUDA__CMD_READ: {
      uint64_t src = cmd->u.read.src;
      void *dst = cmd->u.read.dst;
      for (uint32_t k = k0; k < k1; k++) {
        if (r->fix[k].kind == RUDA_GRAPH_PATCH_SRC) src = r->fix[k].addr;
        else dst = r->fix[k].host;
      }
      rc = ops->download(ws, dst, src, cmd->u.read.layout.bytes, err);
      break;
    }
    case RUDA__CMD_CALL: /* never patched; a backend with graph_replay calls this while capturing */
      if (r->ln == NULL) { /* templates hold no calls: never on the builder */
        *err = ruda__error_new(RUDA_EINVAL, 0, "a library call in an automatic graph");
        rc = RUDA_EINVAL;
        break;
      }
      rc = ruda__libcall_run(r->ln, cmd, r->capturing, err);
      break;
    default: break;
  }
  if (rc != 0) r->failed = i + 1;
  return rc;
}

/* Whether patch f of graph g sets a scalar argument (its bytes). */
static int scalar_fix(const ruda_graph *g, const ruda__graph_fix *f) {
  return f->kind == RUDA_GRAPH_PATCH_ARG && g->cmds[f->cmd]->u.launch.args[f->index].kind == RUDA_ARG_SCALAR;
}

/* Whether g holds command c patched exactly as the replay's fix[k0..k1)
 * would patch it (held[h0..h1): what it holds of c). */
static int holds_same(const ruda_graph *g, uint32_t h0, uint32_t h1, const ruda__graph_fix *fix, uint32_t k0,
                      uint32_t k1) {
  if (h1 - h0 != k1 - k0) return 0;
  for (uint32_t i = 0; i < k1 - k0; i++) {
    const ruda__graph_held *a = &g->held[h0 + i];
    const ruda__graph_fix *b = &fix[k0 + i];
    if (a->fix.kind != b->kind || a->fix.index != b->index) return 0;
    if (b->kind == RUDA_GRAPH_PATCH_GRID) {
      if (a->fix.grid.x != b->grid.x || a->fix.grid.y != b->grid.y || a->fix.grid.z != b->grid.z) return 0;
    } else if (scalar_fix(g, b)) {
      if (!a->kept || a->fix.size != b->size || memcmp(a->bytes, b->bytes, b->size) != 0) return 0;
    } else if (a->fix.addr != b->addr || a->fix.host != b->host) {
      return 0;
    }
  }
  return 1;
}

/* changed = the commands whose patches differ from what the graph holds:
 * patched now and not held so, or held patched and not patched now (put
 * back), sorted, once each; the count. Both lists are sorted by command. */
static uint32_t changed_list(const ruda_graph *g, const replay_ctx *r, uint32_t *changed) {
  uint32_t n = 0, k = 0, h = 0;
  while (k < r->nfix || h < g->nheld) {
    const uint32_t c = h == g->nheld || (k < r->nfix && r->fix[k].cmd < g->held[h].fix.cmd) ? r->fix[k].cmd
                                                                                          : g->held[h].fix.cmd;
    const uint32_t k0 = k, h0 = h;
    while (k < r->nfix && r->fix[k].cmd == c) k++;
    while (h < g->nheld && g->held[h].fix.cmd == c) h++;
    if (!holds_same(g, h0, h, r->fix, k0, k)) changed[n++] = c;
  }
  return n;
}

/* What g holds after a replay that applied r's patches. */
static void hold(ruda_graph *g, const replay_ctx *r) {
  g->nheld = 0;
  for (uint32_t k = 0; k < r->nfix; k++) {
    ruda__graph_held *h = &g->held[g->nheld++];
    h->fix = r->fix[k];
    h->fix.bytes = NULL; /* the replay command's, gone after it */
    h->kept = scalar_fix(g, &r->fix[k]) && r->fix[k].size <= sizeof h->bytes;
    if (h->kept) memcpy(h->bytes, r->fix[k].bytes, r->fix[k].size);
  }
}

int ruda__graph_run(ruda__lane *ln, ruda_graph *g, const ruda__graph_fix *fix, uint32_t nfix, uint32_t *failed,
                    ruda_error **err) {
  struct ruda__sched *sch = ln->worker->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  /* RUDA_LAUNCH_BLOCKING: one command at a time, each waited for, so a
   * fault is the recorded command's that caused it. */
  const int blocking = sch->cfg.launch_blocking;
  replay_ctx r = {.ops = ops, .ws = ln->wstate, .ln = ln, .g = g, .fix = fix, .nfix = nfix,
                  .capturing = ops->graph_replay != NULL && !blocking};
  int rc = 0;
  if (!r.capturing) {
    for (uint32_t i = 0; i < g->n && rc == 0; i++)
      if ((rc = issue(&r, i, err)) == 0 && blocking && (rc = ruda__wait_device(ln, err)) != 0) r.failed = i + 1;
  } else {
    /* Replays of one graph on several workers take turns: the first one
     * captures, and one executable graph is patched and launched by one
     * worker at a time (the driver's launches already queued keep the
     * arguments they were launched with). */
    uint32_t changed[2 * RUDA_GRAPH_MAX_PATCHES];
    pthread_mutex_lock(&g->exec_lock);
    uint32_t nchanged = g->exec != NULL ? changed_list(g, &r, changed) : 0;
    /* The first replay captures the calls' work: their libraries' states
     * on this worker are made before, since making one allocates, which
     * a capture forbids. */
    for (uint32_t i = 0; g->exec == NULL && i < g->n && rc == 0; i++)
      if ((rc = ruda__libcall_prepare(ln, g->cmds[i], err)) != 0) r.failed = i + 1;
    if (rc == 0) rc = ops->graph_replay(ln->wstate, &g->exec, g->n, issue, changed, nchanged, &r, err);
    /* What the backend's graph holds patched now: this replay's patches
     * (a graph released on failure holds nothing). */
    if (g->exec != NULL) hold(g, &r);
    else g->nheld = 0;
    pthread_mutex_unlock(&g->exec_lock);
  }
  *failed = r.failed;
  return rc;
}

int ruda__graph_execute(ruda__cmd *cmd, ruda_error **err) {
  ruda_graph *g = cmd->u.graph.g;
  replay_ctx r = {.ln = cmd->stream->lane, .g = g, .fix = cmd->u.graph.fix, .nfix = cmd->u.graph.nfix};
  int rc = ruda__graph_run(r.ln, g, r.fix, r.nfix, &r.failed, err);
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
    snprintf(msg, sizeof msg, "graph of %u commands captured on %s, command %u (%s%.64s%s): %.300s", g->n,
             RUDA__SNAME(g->stream), r.failed, what, name, patched(&r, r.failed - 1) ? ", patched" : "",
             (*err)->msg);
    memcpy((*err)->msg, msg, sizeof msg);
  }
  return rc;
}

int ruda__graph_build(struct ruda__sched *sch, void *ws, ruda_graph *g, ruda_error **err) {
  const ruda__backend_ops *ops = sch->backend.ops;
  replay_ctx r = {.ops = ops, .ws = ws, .g = g, .capturing = 1};
  pthread_mutex_lock(&g->exec_lock);
  const int rc = g->exec != NULL ? 0 : ops->graph_build(ws, &g->exec, g->n, issue, &r, err);
  pthread_mutex_unlock(&g->exec_lock);
  return rc;
}

void ruda__capture_close(ruda__stream *s, void *sch) {
  ruda__capture *c = atomic_load(&s->cap);
  if (c == NULL) return;
  ruda__capture_discard(sch, c->cmds, c->n, NULL);
  free(c->cmds);
  c->cmds = NULL;
  c->n = c->cap = 0;
  c->open = 0;
}

void ruda__graphs_close(struct ruda__sched *sch) {
  /* The workers stopped: only the owners' references are left. */
  while (sch->graphs != NULL) {
    ruda_graph *g = sch->graphs;
    sch->graphs = g->next;
    ruda__graph_unref(g, NULL);
  }
}

/* graph.c - the public graph calls (ruda/graph.h): prepare, capture,
 * replay, destroy. Recording and replaying are the scheduler's
 * (scheduler/graph.c). */
#include <stdlib.h>
#include <string.h>

#include "scheduler/graph.h"
#include "scheduler/order.h"
#include "scheduler/submit.h"
#include "src/api.h"

/* The persistent mode ruda_graph_prepare pushed ends with the capture.
 * stream: the caller's id, which names s; s->id may be a thread's own,
 * which the public calls refuse as reserved. */
static void unprepare(ruda_device *dev, ruda__stream *s, ruda_stream_id stream) {
  if (atomic_exchange_explicit(&s->graph_prepared, 0, memory_order_acq_rel))
    ruda_memory_mode_pop(dev, stream);
}

/* Takes what the stream recorded and closes its capture (and the prepared
 * allocation mode). RUDA_EGRAPHSTATE when it was not capturing. */
static int take(ruda_device *dev, ruda_stream_id stream, const char *fn, ruda__stream **sp, ruda__cmd ***cmds,
                uint32_t *n) {
  *cmds = NULL;
  *n = 0;
  int rc = 0;
  ruda__stream *s = *sp = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  ruda__capture *c = atomic_load_explicit(&s->cap, memory_order_acquire);
  int open = 0;
  if (c != NULL) {
    pthread_mutex_lock(&c->lock);
    open = c->open;
    if (open) {
      *cmds = c->cmds;
      *n = c->n;
      c->cmds = NULL;
      c->n = c->cap = 0;
      c->open = 0;
      atomic_store_explicit(&s->capturing, 0, memory_order_release);
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (!open)
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is not capturing (call ruda_graph_begin_capture first)",
                      fn, RUDA__SNAME(s->id));
  unprepare(dev, s, stream);
  return 0;
}

int ruda_graph_prepare(ruda_device *dev, ruda_stream_id stream) {
  static const char fn[] = "ruda_graph_prepare";
  RUDA__CHECK_DEV(dev, fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if (atomic_load_explicit(&s->capturing, memory_order_acquire))
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing already", fn, RUDA__SNAME(s->id));
  if (atomic_exchange_explicit(&s->graph_prepared, 1, memory_order_acq_rel))
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is prepared already", fn, RUDA__SNAME(s->id));
  if ((rc = ruda_memory_mode_push(dev, stream, RUDA_ALLOC_PERSISTENT)) != 0) /* not s->id: see unprepare */
    atomic_store_explicit(&s->graph_prepared, 0, memory_order_release);
  return rc;
}

int ruda_graph_begin_capture(ruda_device *dev, ruda_stream_id stream) {
  static const char fn[] = "ruda_graph_begin_capture";
  RUDA__CHECK_DEV(dev, fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  uint32_t nerr = atomic_load_explicit(&s->nerr, memory_order_acquire);
  if (nerr > 0 || atomic_load_explicit(&dev->sched.faulted, memory_order_acquire))
    return ruda__fail(RUDA_EUNHEALTHY,
                      "%s: %s holds %u unreported error(s)%s; drain them with ruda_flush first", fn,
                      RUDA__SNAME(s->id), nerr,
                      atomic_load(&dev->sched.faulted) ? " and the device is faulted" : "");
  ruda__capture *c = ruda__capture_get(s);
  if (c == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  pthread_mutex_lock(&c->lock);
  if (c->open) {
    pthread_mutex_unlock(&c->lock);
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing already", fn, RUDA__SNAME(s->id));
  }
  c->open = 1;
  atomic_store_explicit(&s->capturing, 1, memory_order_release);
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* Pins by slot, the read flag aside. */
static int cmp_pin(const void *a, const void *b) {
  uint32_t x = ruda__pin_slot(*(const uint32_t *)a), y = ruda__pin_slot(*(const uint32_t *)b);
  return x < y ? -1 : x > y;
}

int ruda_graph_end_capture(ruda_device *dev, ruda_stream_id stream, ruda_graph **out) {
  static const char fn[] = "ruda_graph_end_capture";
  if (out != NULL) *out = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  ruda__stream *s;
  ruda__cmd **cmds;
  uint32_t n;
  int rc = take(dev, stream, fn, &s, &cmds, &n);
  if (rc != 0) return rc;
  ruda_graph *g = calloc(1, sizeof *g);
  uint32_t npins = 0;
  for (uint32_t i = 0; i < n; i++) npins += cmds[i]->npins;
  uint32_t *slots = npins ? malloc(npins * sizeof *slots) : NULL;
  if (g == NULL || (npins && slots == NULL)) {
    free(g);
    free(slots);
    ruda__capture_discard(&dev->sched, cmds, n, NULL);
    free(cmds);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory; the capture is discarded", fn);
  }
  /* The buffers, once each: a replay orders and counts users by buffer.
   * A buffer stays a read (RUDA__PIN_READ) only if every command reads it. */
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t j = 0; j < cmds[i]->npins; j++) slots[k++] = cmds[i]->pins[j];
  if (k > 1) qsort(slots, k, sizeof *slots, cmp_pin);
  uint32_t u = 0;
  for (uint32_t i = 0; i < k; i++) {
    if (u > 0 && ruda__pin_slot(slots[u - 1]) == ruda__pin_slot(slots[i])) slots[u - 1] &= slots[i] | ~RUDA__PIN_READ;
    else slots[u++] = slots[i];
  }
  g->sch = &dev->sched;
  g->cmds = cmds;
  g->n = n;
  g->slots = slots;
  g->nslots = u;
  g->stream = s->id;
  for (uint32_t i = 0; i < n && !g->calls; i++) g->calls = cmds[i]->kind == RUDA__CMD_CALL;
  atomic_init(&g->refs, 1);
  pthread_mutex_init(&g->exec_lock, NULL);
  pthread_mutex_init(&g->issue_lock, NULL);
  pthread_mutex_lock(&dev->sched.graph_lock);
  g->next = dev->sched.graphs;
  if (g->next) g->next->prev = g;
  dev->sched.graphs = g;
  pthread_mutex_unlock(&dev->sched.graph_lock);
  *out = g;
  return 0;
}

int ruda_graph_abort_capture(ruda_device *dev, ruda_stream_id stream) {
  static const char fn[] = "ruda_graph_abort_capture";
  RUDA__CHECK_DEV(dev, fn);
  ruda__stream *s;
  ruda__cmd **cmds;
  uint32_t n;
  int rc = take(dev, stream, fn, &s, &cmds, &n);
  if (rc != 0) return rc;
  ruda__capture_discard(&dev->sched, cmds, n, NULL);
  free(cmds);
  return 0;
}

static int check_graph(ruda_device *dev, const ruda_graph *g, const char *fn) {
  if (g == NULL) return ruda__fail(RUDA_EINVAL, "%s: graph is NULL", fn);
  if (g->sch != &dev->sched) return ruda__fail(RUDA_EINVAL, "%s: the graph belongs to another device", fn);
  return 0;
}

int ruda_graph_destroy(ruda_device *dev, ruda_graph *g) {
  static const char fn[] = "ruda_graph_destroy";
  RUDA__CHECK_DEV(dev, fn);
  int rc = check_graph(dev, g, fn);
  if (rc != 0) return rc;
  pthread_mutex_lock(&dev->sched.graph_lock);
  if (g->prev) g->prev->next = g->next;
  else dev->sched.graphs = g->next;
  if (g->next) g->next->prev = g->prev;
  pthread_mutex_unlock(&dev->sched.graph_lock);
  ruda__graph_unref(g, NULL);
  return 0;
}

uint32_t ruda_graph_length(const ruda_graph *g) { return g ? g->n : 0; }

/* in_place: the caller waits for the replay next (ruda_graph_run), so it
 * may run it itself when the worker is idle (scheduler/inline.c). */
static int replay(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, ruda_future **fut, int in_place,
                  const char *fn) {
  int rc = check_graph(dev, g, fn);
  if (rc != 0) return rc;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if (atomic_load_explicit(&s->capturing, memory_order_acquire))
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing; graphs are not recorded into graphs", fn,
                      RUDA__SNAME(s->id));
  ruda__worker *w = s->worker;
  ruda__handles *h = &dev->handles;
  /* Like a launch that uses every buffer of the graph: this worker becomes
   * a user of each (a free then waits for it), and the replay is ordered
   * after other workers' earlier uses. The graph's pins keep the slots. */
  const uint32_t per = RUDA__MAX_PINS;
  /* The buffers in groups of at most per, then the graph's own record. */
  uint32_t ngroups = (g->nslots + per - 1) / per + 1;
  ruda__order two[2], *o = ngroups <= 2 ? two : malloc(ngroups * sizeof *o);
  if (o == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  uint32_t ngiven = 0;
  int claimed = 0;
  ruda__exec_guard guard;
  pthread_mutex_lock(&g->issue_lock);
  /* The graph's slots are sorted, so the groups lock in one key order. */
  for (uint32_t gi = 0; gi < ngroups; gi++) {
    ruda__order_init(&o[gi]);
    for (uint32_t i = gi * per; i < g->nslots && i < (gi + 1) * per; i++) {
      uint32_t slot = ruda__pin_slot(g->slots[i]);
      ruda__handles_add_user(h, slot, w->index);
      ruda__order_note(&o[gi], ruda__handles_last(h, slot), slot, ruda__handles_gen(h, slot), w,
                       (g->slots[i] & RUDA__PIN_READ) ? RUDA__USE_READ : RUDA__USE_WRITE);
    }
    if (gi == ngroups - 1) ruda__order_note(&o[gi], g->replays, UINT32_MAX, 0, w, RUDA__USE_WRITE);
  }
  ruda__cmd *cmd = ruda__cmd_alloc(0);
  if (cmd == NULL) {
    rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    goto out;
  }
  cmd->kind = RUDA__CMD_GRAPH;
  cmd->stream = s;
  cmd->seq = atomic_fetch_add_explicit(&s->seq, 1, memory_order_relaxed) + 1;
  cmd->u.graph.g = g;
  if (fut != NULL && (cmd->future = ruda__future_new(&dev->sched, s, 1)) == NULL) {
    ruda__cmd_free(cmd);
    rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    goto out;
  }
  /* Taken now: once pushed, the command is the worker's and may be gone. */
  ruda_future *f = cmd->future;
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  if ((rc = ruda__queue_admit(w, s->id)) == 0) {
    for (uint32_t gi = 0; gi < ngroups; gi++) ruda__order_lock(&o[gi], w);
    for (uint32_t gi = 0; gi < ngroups && rc == 0; gi++)
      if (ruda__order_needed(&o[gi])) rc = ruda__order_prepare(&dev->sched, &o[gi], s, cmd->seq);
    /* In place: the ticket is claimed where a push would be, before the
     * publish below; the replay runs once every lock here is released, so
     * its kernels may replay this graph or use its buffers (inline.c). A
     * WAIT just pushed runs first either way: in place needs the worker
     * to have run everything queued. */
    if (rc == 0) {
      claimed = in_place && ruda__inline_claim(w, cmd, &guard);
      if (!claimed) ruda__queue_push_admitted(w, cmd);
    } else {
      ruda__queue_unadmit(w); /* WAITs already pushed only order this stream more */
    }
  }
  if (rc != 0) {
    atomic_fetch_sub_explicit(&g->refs, 1, memory_order_relaxed);
    free(f);
    ruda__cmd_free(cmd);
    goto out;
  }
  if (fut != NULL) *fut = f;
  ngiven = ngroups; /* pushed: no reader bit goes back */
  for (uint32_t gi = 0; gi < ngroups; gi++) ruda__order_publish(&o[gi], w);
out:
  /* Released in reverse lock order (abandon unlocks). */
  for (uint32_t gi = ngroups; gi-- > ngiven;) ruda__order_abandon(&o[gi]);
  pthread_mutex_unlock(&g->issue_lock);
  if (o != two) free(o);
  if (claimed) ruda__inline_finish(w, cmd, &guard);
  return rc;
}

int ruda_graph_replay(ruda_device *dev, ruda_stream_id stream, ruda_graph *g) {
  static const char fn[] = "ruda_graph_replay";
  RUDA__CHECK_DEV(dev, fn);
  return replay(dev, stream, g, NULL, 0, fn);
}

int ruda_graph_replay_async(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, ruda_future **fut) {
  static const char fn[] = "ruda_graph_replay_async";
  if (fut != NULL) *fut = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (fut == NULL) return ruda__fail(RUDA_EINVAL, "%s: fut is NULL", fn);
  int rc = replay(dev, stream, g, fut, 0, fn);
  if (rc == 0) ruda__future_hand_out(*fut);
  return rc;
}

int ruda_graph_run(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, ruda_error **err) {
  static const char fn[] = "ruda_graph_run";
  if (err != NULL) *err = NULL;
  RUDA__CHECK_DEV(dev, fn);
  ruda_future *f = NULL;
  int rc = replay(dev, stream, g, &f, 1, fn);
  if (rc != 0) return rc;
  rc = ruda_future_wait(f, err);
  ruda_future_free(f);
  return rc;
}

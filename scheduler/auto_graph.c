/* auto_graph.c - automatic request graphs: a worker's recorded runs of
 * launches and copies, replayed as one graph with what changed patched in
 * (auto_graph.h has the rules).
 *
 * A small fully associative cache per lane, by a signature of the run's
 * shape and its stream: signatures hash kernel addresses, so in a direct-mapped cache
 * whether two shapes of one workload collide would change from process to
 * process. When a new shape needs a way, an empty one goes first, then the
 * least recently used shape that has no template yet, then the least
 * recently used template: shapes seen once do not push out the ones that
 * replay. Each stream keeps its own template of a shape, so streams
 * sharing a lane do not patch one executable graph back and forth between
 * their buffers; a stream whose shape has no way left replays another
 * stream's template of it, patched, rather than push one out.
 * The first sighting of a shape only notes it (the run goes one by
 * one); the second records a template, a copy of that run's commands
 * without pins, and replays it (where the backend builds graphs apart,
 * graph_build, the device's builder captures and instantiates it while
 * the run goes one by one, and replays wait until it is READY:
 * scheduler/builder.h); later ones are compared with the template
 * field by field (a signature clash replays nothing) and replay it with
 * fixes for each buffer address and scalar that differs. The template's
 * own addresses are never used for work: every replay patches each
 * argument to the one its command carries, and the executable graph on
 * cuda is patched back or forth accordingly (graph.c's held patches: a
 * node the last replay patched to the same values is left alone). */
#include <stdlib.h>
#include <string.h>

#include "scheduler/auto_graph.h"
#include "scheduler/builder.h"
#include "scheduler/sched.h"
#include "scheduler/graph.h"

#define WAYS 16u

typedef struct entry {
  uint64_t sig; /* 0: empty */
  uint64_t used; /* the cache's clock at the last sighting */
  ruda_stream_id stream;
  uint32_t n;
  ruda_graph *g; /* the template, NULL until the second sighting */
} entry;

struct ruda__auto {
  entry e[WAYS];
  uint64_t clock;
};

/* The way of (sig, n) for stream, or NULL. */
static entry *find(struct ruda__auto *a, uint64_t sig, uint32_t n, ruda_stream_id stream) {
  for (uint32_t i = 0; i < WAYS; i++)
    if (a->e[i].sig == sig && a->e[i].n == n && a->e[i].stream == stream) return &a->e[i];
  return NULL;
}

/* The most recently used template of (sig, n) of any stream, or NULL. */
static entry *find_shared(struct ruda__auto *a, uint64_t sig, uint32_t n) {
  entry *best = NULL;
  for (uint32_t i = 0; i < WAYS; i++) {
    entry *e = &a->e[i];
    if (e->sig == sig && e->n == n && e->g != NULL && (best == NULL || e->used > best->used)) best = e;
  }
  return best;
}

static entry *empty_way(struct ruda__auto *a) {
  for (uint32_t i = 0; i < WAYS; i++)
    if (a->e[i].sig == 0) return &a->e[i];
  return NULL;
}

/* The way a new shape takes (see the top of the file). */
static entry *victim(struct ruda__auto *a) {
  entry *noted = NULL, *any = NULL;
  for (uint32_t i = 0; i < WAYS; i++) {
    entry *e = &a->e[i];
    if (e->sig == 0) return e;
    if (e->g == NULL && (noted == NULL || e->used < noted->used)) noted = e;
    if (any == NULL || e->used < any->used) any = e;
  }
  return noted != NULL ? noted : any;
}

/* Empties way e; its template goes with the last reference (the builder
 * may hold one). */
static void forget(entry *e) {
  if (e->g != NULL) ruda__graph_unref(e->g, NULL); /* a template pins nothing */
  *e = (entry){0, 0, 0, 0, NULL};
}

/* FNV-1a over the fields that make two runs replayable by one graph. */
static uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}

/* What makes two commands replayable by one node of a graph, but for
 * their arguments (arg_shape): exact words, so equal shapes are the same
 * shape and the signature hashes what same_shape compares. */
typedef struct shape {
  uint64_t w[6];
} shape;

static shape shape_of(const ruda__cmd *c) {
  if (c->kind == RUDA__CMD_COPY) return (shape){{c->kind, c->u.copy.size}};
  if (c->kind == RUDA__CMD_WRITE) return (shape){{c->kind, c->u.write.layout.bytes}};
  const ruda__launch_cmd *l = &c->u.launch;
  return (shape){{c->kind, (uint64_t)(uintptr_t)l->kernel, (uint64_t)l->grid.x << 32 | l->grid.y,
                  (uint64_t)l->grid.z << 32 | l->block.x, (uint64_t)l->block.y << 32 | l->block.z,
                  (uint64_t)l->shared_mem << 32 | l->nargs}};
}

static uint32_t nargs_of(const ruda__cmd *c) { return c->kind == RUDA__CMD_LAUNCH ? c->u.launch.nargs : 0; }

static uint64_t arg_shape(const ruda__cmd *c, uint32_t j) {
  return (uint64_t)c->u.launch.args[j].kind << 32 | c->u.launch.args[j].size;
}

static uint64_t signature(ruda__cmd *const *run, uint32_t n) {
  uint64_t h = mix(0xcbf29ce484222325ull, n);
  for (uint32_t i = 0; i < n; i++) {
    const shape sh = shape_of(run[i]);
    for (size_t k = 0; k < sizeof sh.w / sizeof sh.w[0]; k++) h = mix(h, sh.w[k]);
    for (uint32_t j = 0; j < nargs_of(run[i]); j++) h = mix(h, arg_shape(run[i], j));
  }
  return h ? h : 1;
}

/* Same shape as the template's command t. */
static int same_shape(const ruda__cmd *c, const ruda__cmd *t) {
  const shape a = shape_of(c), b = shape_of(t);
  if (memcmp(&a, &b, sizeof a) != 0) return 0;
  for (uint32_t j = 0; j < nargs_of(c); j++)
    if (arg_shape(c, j) != arg_shape(t, j)) return 0;
  return 1;
}

/* A copy of c without pins: its arguments and scalar bytes in its own
 * trailing bytes. */
static ruda__cmd *template_cmd(const ruda__cmd *c) {
  size_t extra = 0;
  if (c->kind == RUDA__CMD_LAUNCH) {
    extra = c->u.launch.nargs * sizeof(ruda__karg);
    for (uint32_t j = 0; j < c->u.launch.nargs; j++)
      if (c->u.launch.args[j].kind == RUDA_ARG_SCALAR) extra += (c->u.launch.args[j].size + 7u) & ~7u;
  }
  ruda__cmd *t = ruda__cmd_alloc(extra);
  if (t == NULL) return NULL;
  t->kind = c->kind;
  t->stream = NULL; /* a template outlives the run's stream record: nothing reads it */
  t->seq = c->seq;
  t->u = c->u;
  if (c->kind == RUDA__CMD_LAUNCH) {
    ruda__karg *args = (ruda__karg *)ruda__cmd_extra(t);
    unsigned char *bytes = (unsigned char *)(args + c->u.launch.nargs);
    for (uint32_t j = 0; j < c->u.launch.nargs; j++) {
      args[j] = c->u.launch.args[j];
      if (args[j].kind == RUDA_ARG_SCALAR) {
        memcpy(bytes, args[j].bytes, args[j].size);
        args[j].bytes = bytes;
        bytes += (args[j].size + 7u) & ~7u;
      }
    }
    t->u.launch.args = args;
  }
  return t;
}

static ruda_graph *template_new(struct ruda__sched *sch, ruda__cmd *const *run, uint32_t n) {
  ruda_graph *g = ruda__graph_new(sch, run[0]->stream->id);
  if (g == NULL) return NULL;
  if ((g->cmds = calloc(n, sizeof *g->cmds)) == NULL) {
    ruda__graph_free(g, NULL);
    return NULL;
  }
  for (; g->n < n; g->n++)
    if ((g->cmds[g->n] = template_cmd(run[g->n])) == NULL) {
      ruda__graph_free(g, NULL);
      return NULL;
    }
  return g;
}

/* The fixes that turn the template into run; the count, or UINT32_MAX
 * when more than fit. */
static uint32_t fixes(const ruda_graph *g, ruda__cmd *const *run, uint32_t n, ruda__graph_fix *fix) {
  uint32_t nf = 0;
  for (uint32_t i = 0; i < n; i++) {
    const ruda__cmd *c = run[i], *t = g->cmds[i];
    if (c->kind == RUDA__CMD_WRITE) { /* a new staged block each time, as a rule */
      if (c->u.write.staged != t->u.write.staged) {
        if (nf == RUDA_GRAPH_MAX_PATCHES) return UINT32_MAX;
        fix[nf++] = (ruda__graph_fix){.cmd = i, .kind = RUDA_GRAPH_PATCH_SRC, .host = c->u.write.staged};
      }
      if (c->u.write.dst != t->u.write.dst) {
        if (nf == RUDA_GRAPH_MAX_PATCHES) return UINT32_MAX;
        fix[nf++] = (ruda__graph_fix){.cmd = i, .kind = RUDA_GRAPH_PATCH_DST, .addr = c->u.write.dst};
      }
      continue;
    }
    if (c->kind == RUDA__CMD_COPY) {
      if (c->u.copy.src != t->u.copy.src) {
        if (nf == RUDA_GRAPH_MAX_PATCHES) return UINT32_MAX;
        fix[nf++] = (ruda__graph_fix){.cmd = i, .kind = RUDA_GRAPH_PATCH_SRC, .addr = c->u.copy.src};
      }
      if (c->u.copy.dst != t->u.copy.dst) {
        if (nf == RUDA_GRAPH_MAX_PATCHES) return UINT32_MAX;
        fix[nf++] = (ruda__graph_fix){.cmd = i, .kind = RUDA_GRAPH_PATCH_DST, .addr = c->u.copy.dst};
      }
      continue;
    }
    for (uint32_t j = 0; j < c->u.launch.nargs; j++) {
      const ruda__karg *a = &c->u.launch.args[j], *b = &t->u.launch.args[j];
      const int differs = a->kind == RUDA_ARG_SCALAR ? memcmp(a->bytes, b->bytes, a->size) != 0 : a->addr != b->addr;
      if (!differs) continue;
      if (nf == RUDA_GRAPH_MAX_PATCHES) return UINT32_MAX;
      fix[nf++] = (ruda__graph_fix){.cmd = i, .kind = RUDA_GRAPH_PATCH_ARG, .index = j, .size = a->size,
                                    .addr = a->addr, .bytes = a->bytes};
    }
  }
  return nf;
}

uint32_t ruda__auto_run(ruda__worker *w, ruda__cmd *const *run, uint32_t n, int *rc, ruda_error **err) {
  struct ruda__sched *sch = w->sch;
  /* Templates per lane: launches of one executable graph are ordered
   * after each other by the driver, whatever their streams, so lanes
   * sharing one would run their requests in turn. */
  ruda__lane *ln = run[0]->stream->lane;
  *rc = 0;
  *err = NULL;
  if (ln->autog == NULL && (ln->autog = calloc(1, sizeof *ln->autog)) == NULL) return 0;
  const uint64_t sig = signature(run, n);
  const uint64_t now = ++ln->autog->clock;
  const ruda_stream_id stream = run[0]->stream->id;
  entry *e = find(ln->autog, sig, n, stream);
  if (e == NULL) { /* the stream's first sighting: noted */
    entry *shared = find_shared(ln->autog, sig, n), *way = empty_way(ln->autog);
    if (way == NULL && shared == NULL) {
      way = victim(ln->autog);
      atomic_fetch_add_explicit(&w->auto_replaced, 1, memory_order_relaxed);
      forget(way);
    }
    if (way != NULL) *way = (entry){sig, now, stream, n, NULL};
    if (shared == NULL) return 0; /* run one by one */
    e = shared; /* meanwhile (or with no way left) another stream's template, patched */
  }
  e->used = now;
  ruda__graph_fix fix[RUDA_GRAPH_MAX_PATCHES];
  uint32_t nf = 0;
  if (e->g == NULL) {
    if ((e->g = template_new(sch, run, n)) == NULL) return 0;
    atomic_fetch_add_explicit(&w->auto_templates, 1, memory_order_relaxed);
    /* Where the backend builds graphs apart, the builder captures and
     * instantiates it (builder.h); this run goes one by one. */
    if (sch->backend.ops->graph_build != NULL) {
      if (ruda__builder_submit(sch, e->g) != 0) forget(e);
      return 0;
    }
  } else {
    const int b = atomic_load_explicit(&e->g->build, memory_order_acquire);
    if (b == RUDA__BUILD_QUEUED) return 0; /* not built yet: one by one */
    if (b == RUDA__BUILD_FAILED) {
      forget(e);
      return 0;
    }
    for (uint32_t i = 0; i < n; i++)
      if (!same_shape(run[i], e->g->cmds[i])) return 0; /* another shape under this signature */
    if ((nf = fixes(e->g, run, n, fix)) == UINT32_MAX) return 0;
  }
  uint32_t failed = 0;
  *rc = ruda__graph_run(ln, e->g, fix, nf, &failed, err);
  if (*rc == 0) {
    atomic_fetch_add_explicit(&w->auto_cmds, n, memory_order_relaxed);
    return n;
  }
  if (sch->backend.ops->graph_replay == NULL && failed > 0) {
    /* Run in order up to the failure, which is run[failed - 1]'s own. */
    atomic_fetch_add_explicit(&w->auto_cmds, failed, memory_order_relaxed);
    return failed - 1;
  }
  /* A backend graph that failed launched nothing: the commands go one by
   * one, reporting whatever fails as they always do; the shape is
   * forgotten rather than captured again. */
  ruda_error_free(*err);
  *err = NULL;
  *rc = 0;
  forget(e);
  return 0;
}

void ruda__auto_free(ruda__worker *w) {
  for (uint32_t k = 0; k < w->nlanes; k++) {
    ruda__lane *ln = &w->lanes[k];
    if (ln->autog == NULL) continue;
    for (uint32_t i = 0; i < WAYS; i++) forget(&ln->autog->e[i]);
    free(ln->autog);
    ln->autog = NULL;
  }
}

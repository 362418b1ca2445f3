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
  ruda_graph *g = ruda__graph_new(&dev->sched, s->id);
  uint32_t npins = 0;
  for (uint32_t i = 0; i < n; i++) npins += cmds[i]->npins;
  uint32_t *slots = npins ? malloc(npins * sizeof *slots) : NULL;
  if (g == NULL || (npins && slots == NULL)) {
    ruda__graph_free(g, NULL);
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
  /* Where each command's pins are among the buffers, for replays that
   * patch some of them. */
  g->pin_base = malloc((n + 1) * sizeof *g->pin_base);
  g->pin_slot = npins ? malloc(npins * sizeof *g->pin_slot) : NULL;
  g->slot_uses = u ? calloc(u, sizeof *g->slot_uses) : NULL;
  if (g->pin_base == NULL || (npins && g->pin_slot == NULL) || (u && g->slot_uses == NULL)) {
    ruda__graph_free(g, NULL); /* its tables; no commands yet */
    free(slots);
    ruda__capture_discard(&dev->sched, cmds, n, NULL);
    free(cmds);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory; the capture is discarded", fn);
  }
  k = 0;
  for (uint32_t i = 0; i < n; i++) {
    g->pin_base[i] = k;
    for (uint32_t j = 0; j < cmds[i]->npins; j++, k++) {
      uint32_t want = ruda__pin_slot(cmds[i]->pins[j]), lo = 0, hi = u;
      while (ruda__pin_slot(slots[lo + (hi - lo) / 2]) != want) {
        if (ruda__pin_slot(slots[lo + (hi - lo) / 2]) < want) lo = lo + (hi - lo) / 2 + 1;
        else hi = lo + (hi - lo) / 2;
      }
      g->pin_slot[k] = lo + (hi - lo) / 2;
      g->slot_uses[g->pin_slot[k]]++;
    }
  }
  g->pin_base[n] = k;
  g->cmds = cmds;
  g->n = n;
  g->slots = slots;
  g->nslots = u;
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

/* A buffer a replay uses, for ordering: slot, generation, write. */
typedef struct use {
  uint32_t slot, gen, write;
} use;

static const char *cmd_what(const ruda__cmd *c) {
  switch (c->kind) {
    case RUDA__CMD_LAUNCH: return "a launch";
    case RUDA__CMD_COPY: return "a copy";
    case RUDA__CMD_WRITE: return "an upload";
    case RUDA__CMD_CALL: return "a library call";
    default: return "a download";
  }
}

/* Checks what can be checked of patch k without pinning (ruda/graph.h);
 * adds its scalar bytes to *scalar_bytes and counts a buffer in *nbuf. */
static int check_patch(ruda_device *dev, const ruda_graph *g, const ruda_graph_patch *p, uint32_t k,
                       size_t *scalar_bytes, uint32_t *nbuf, const char *fn) {
  if (p->command >= g->n)
    return ruda__fail(RUDA_EINVAL, "%s: patch %u names command %u, the graph has %u (counted from 0)", fn, k,
                      p->command, g->n);
  const ruda__cmd *c = g->cmds[p->command];
  const int launch = c->kind == RUDA__CMD_LAUNCH;
  if (c->kind == RUDA__CMD_CALL) /* its buffers are the function's: nothing to patch them in */
    return ruda__fail(RUDA_EINVAL, "%s: patch %u names command %u, a library call (\"%.64s\"), which cannot be patched",
                      fn, k, p->command, c->u.call.name);
  switch (p->kind) {
    case RUDA_GRAPH_PATCH_ARG:
    case RUDA_GRAPH_PATCH_GRID:
      if (!launch)
        return ruda__fail(RUDA_EINVAL, "%s: patch %u changes a launch's %s, and command %u is %s", fn, k,
                          p->kind == RUDA_GRAPH_PATCH_ARG ? "argument" : "grid", p->command, cmd_what(c));
      break;
    case RUDA_GRAPH_PATCH_DST:
    case RUDA_GRAPH_PATCH_SRC:
      if (launch)
        return ruda__fail(RUDA_EINVAL, "%s: patch %u changes a copy's %s, and command %u is a launch of \"%s\"",
                          fn, k, p->kind == RUDA_GRAPH_PATCH_DST ? "destination" : "source", p->command,
                          c->u.launch.kernel->name);
      break;
    default: return ruda__fail(RUDA_EINVAL, "%s: patch %u has unknown kind %d", fn, k, (int)p->kind);
  }
  if (p->reserved[0] || p->reserved[1])
    return ruda__fail(RUDA_EINVAL, "%s: patch %u: reserved fields must be zero", fn, k);
  if (p->kind == RUDA_GRAPH_PATCH_GRID) {
    const ruda__limits *lim = &dev->limits;
    const ruda_dim3 gr = p->grid;
    if (gr.x == 0 || gr.y == 0 || gr.z == 0)
      return ruda__fail(RUDA_EINVAL, "%s: patch %u: grid (%u,%u,%u) for command %u (\"%s\") has a zero dimension",
                        fn, k, gr.x, gr.y, gr.z, p->command, c->u.launch.kernel->name);
    if (gr.x > lim->max_grid[0] || gr.y > lim->max_grid[1] || gr.z > lim->max_grid[2])
      return ruda__fail(RUDA_EGRIDDIM,
                        "%s: patch %u: grid (%u,%u,%u) for command %u (\"%s\") exceeds maximum (%u,%u,%u)", fn,
                        k, gr.x, gr.y, gr.z, p->command, c->u.launch.kernel->name, lim->max_grid[0],
                        lim->max_grid[1], lim->max_grid[2]);
    return 0;
  }
  if (p->kind == RUDA_GRAPH_PATCH_ARG) {
    const ruda__launch_cmd *l = &c->u.launch;
    if (p->index >= l->nargs)
      return ruda__fail(RUDA_EINVAL, "%s: patch %u names argument %u of command %u (\"%s\"), which takes %u", fn, k,
                        p->index, p->command, l->kernel->name, l->nargs);
    const ruda__karg *was = &l->args[p->index];
    const ruda_arg *a = &p->arg;
    const int is_buf = a->kind == RUDA_ARG_BUFFER || a->kind == RUDA_ARG_BUFFER_IN || a->kind == RUDA_ARG_BUFFER_OUT;
    if (!is_buf && a->kind != RUDA_ARG_SCALAR)
      return ruda__fail(RUDA_EINVAL, "%s: patch %u: argument has unknown kind %d", fn, k, (int)a->kind);
    if (is_buf != (was->kind != RUDA_ARG_SCALAR))
      return ruda__fail(RUDA_EINVAL, "%s: patch %u gives %s for argument %u of command %u (\"%s\"), recorded as %s",
                        fn, k, is_buf ? "a buffer" : "a scalar", p->index, p->command, l->kernel->name,
                        is_buf ? "a scalar" : "a buffer");
    if (is_buf) {
      (*nbuf)++;
      return 0;
    }
    if (a->data == NULL || a->size != was->size)
      return ruda__fail(RUDA_EINVAL,
                        "%s: patch %u: scalar argument %u of command %u (\"%s\") has %s %u bytes, recorded with %u",
                        fn, k, p->index, p->command, l->kernel->name, a->data == NULL ? "NULL data for" : "size",
                        a->size, was->size);
    *scalar_bytes += (a->size + 7u) & ~7u;
    return 0;
  }
  /* The host side of an upload (its source) or a download (its
   * destination); the rest are buffers. */
  const int host = (c->kind == RUDA__CMD_WRITE && p->kind == RUDA_GRAPH_PATCH_SRC) ||
                   (c->kind == RUDA__CMD_READ && p->kind == RUDA_GRAPH_PATCH_DST);
  /* The other side's field set and this one's empty: say which side the
   * field takes and which helper builds it, rather than "no live buffer"
   * for a zero handle. */
  const int given_host = p->host != NULL, given_buffer = p->binding.handle.slot != 0 || p->binding.handle.gen != 0;
  if (given_host != given_buffer && given_host != host)
    return ruda__fail(RUDA_EINVAL,
                      "%s: patch %u: the %s of command %u (%s) is on the %s: %s, from ruda_graph_patch_%s (the "
                      "patch gives %s)",
                      fn, k, p->kind == RUDA_GRAPH_PATCH_DST ? "destination" : "source", p->command, cmd_what(c),
                      host ? "host" : "device", host ? "a staging block" : "a buffer binding",
                      host ? "host" : "buffer", host ? "a buffer binding" : "a host block");
  if (!host) {
    (*nbuf)++;
    return 0;
  }
  uint64_t bytes = c->kind == RUDA__CMD_WRITE ? c->u.write.layout.bytes : c->u.read.layout.bytes;
  if (p->host == NULL || dev->sched.backend.ops->stage_owns == NULL || !dev->sched.backend.ops->stage_owns(dev->sched.backend.state, p->host, (size_t)bytes))
    return ruda__fail(RUDA_EINVAL,
                      "%s: patch %u: the host block of command %u (%s of %llu bytes) must lie inside one block from "
                      "ruda_staging_alloc, and %p does not",
                      fn, k, p->command, cmd_what(c), (unsigned long long)bytes, p->host);
  return 0;
}

/* Pins patch k's buffer (check_patch passed) for s, checks that it holds
 * what the recorded one did, and fills its fix; *pin the command's pin,
 * *rep the graph's pin it replaces. */
static int pin_patch(ruda_device *dev, ruda__stream *s, const ruda_graph *g, const ruda_graph_patch *p, uint32_t k,
                     ruda__order *po, ruda__graph_fix *f, uint32_t *pin, uint32_t *rep, const char *fn) {
  const ruda__cmd *c = g->cmds[p->command];
  uint32_t pi;   /* the recorded pin replaced, among c's */
  uint64_t need; /* bytes the command may touch */
  int read;
  ruda_binding b = p->binding;
  if (c->kind == RUDA__CMD_LAUNCH) {
    const ruda__launch_cmd *l = &c->u.launch;
    pi = 0;
    for (uint32_t j = 0; j < p->index; j++) pi += l->args[j].kind != RUDA_ARG_SCALAR;
    need = l->args[p->index].len;
    read = (c->pins[pi] & RUDA__PIN_READ) && p->arg.kind == RUDA_ARG_BUFFER_IN;
    b = p->arg.binding;
  } else if (c->kind == RUDA__CMD_COPY) {
    pi = p->kind == RUDA_GRAPH_PATCH_SRC ? 0 : 1;
    need = c->u.copy.size;
    read = p->kind == RUDA_GRAPH_PATCH_SRC;
  } else {
    pi = 0;
    need = c->kind == RUDA__CMD_WRITE ? c->u.write.layout.bytes : c->u.read.layout.bytes;
    read = c->kind == RUDA__CMD_READ;
  }
  uint64_t addr, len;
  int rc = ruda__pin_binding(&dev->sched, s, b, fn, "patch", (int)k, &addr, &len, po, 0,
                             read ? RUDA__USE_READ : RUDA__USE_WRITE);
  if (rc != 0) return rc;
  if (len < need) {
    ruda__handles_unpin(&dev->handles, b.handle.slot, NULL);
    return ruda__fail(RUDA_ERANGE, "%s: patch %u: a binding of %llu bytes for command %u (%s), which uses %llu", fn,
                      k, (unsigned long long)len, p->command, cmd_what(c), (unsigned long long)need);
  }
  f->addr = addr;
  *pin = b.handle.slot | (read ? RUDA__PIN_READ : 0);
  *rep = g->pin_base[p->command] + pi;
  return 0;
}

static int cmp_use(const void *a, const void *b) {
  uint32_t x = ((const use *)a)->slot, y = ((const use *)b)->slot;
  return x < y ? -1 : x > y;
}

/* in_place: the caller waits for the replay next (ruda_graph_run), so it
 * may run it itself when the worker is idle (scheduler/inline.c). */
static int replay(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, const ruda_graph_patch *patches,
                  uint32_t np, ruda_future **fut, int in_place, const char *fn) {
  int rc = check_graph(dev, g, fn);
  if (rc != 0) return rc;
  if (np > RUDA_GRAPH_MAX_PATCHES)
    return ruda__fail(RUDA_EINVAL, "%s: %u patches, at most %d", fn, np, RUDA_GRAPH_MAX_PATCHES);
  if (np > 0 && patches == NULL) return ruda__fail(RUDA_EINVAL, "%s: patches is NULL with n %u", fn, np);
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if (atomic_load_explicit(&s->capturing, memory_order_acquire))
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing; graphs are not recorded into graphs", fn,
                      RUDA__SNAME(s->id));
  size_t scalar_bytes = 0;
  uint32_t nbuf = 0;
  for (uint32_t k = 0; k < np; k++)
    if ((rc = check_patch(dev, g, &patches[k], k, &scalar_bytes, &nbuf, fn)) != 0) return rc;
  ruda__lane *w = s->lane;
  ruda__handles *h = &dev->handles;
  /* One allocation: the patches' pins, their fixes, scalar bytes. */
  size_t fix_off = (nbuf * sizeof(uint32_t) + 7) & ~(size_t)7;
  size_t bytes_off = fix_off + np * sizeof(ruda__graph_fix);
  ruda__cmd *cmd = ruda__cmd_alloc(np ? bytes_off + scalar_bytes : 0);
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  cmd->kind = RUDA__CMD_GRAPH;
  cmd->u.graph.g = g;
  cmd->u.graph.fix = NULL;
  cmd->u.graph.nfix = 0;
  cmd->u.graph.ran = NULL;
  ruda__stage_hold *hold = NULL;
  /* The patches' buffers, pinned (po settles them once queued); which of
   * the graph's pins they replace, and the graph's buffers no command
   * uses any more in this replay. */
  ruda__order po;
  ruda__order_init(&po);
  uint32_t rep[RUDA_GRAPH_MAX_PATCHES], nrep = 0;
  use pu[RUDA_GRAPH_MAX_PATCHES];
  if (np > 0) {
    unsigned char *extra = ruda__cmd_extra(cmd);
    cmd->pins = (uint32_t *)extra;
    ruda__graph_fix *fix = (ruda__graph_fix *)(extra + fix_off);
    unsigned char *bytes = extra + bytes_off;
    for (uint32_t k = 0; k < np; k++) {
      const ruda_graph_patch *p = &patches[k];
      const ruda__cmd *c = g->cmds[p->command];
      ruda__graph_fix *f = &fix[k];
      *f = (ruda__graph_fix){.cmd = p->command, .kind = p->kind, .index = p->index, .grid = p->grid, .host = p->host};
      const int buffer = (p->kind == RUDA_GRAPH_PATCH_ARG && p->arg.kind != RUDA_ARG_SCALAR) ||
                         (c->kind == RUDA__CMD_COPY) ||
                         (c->kind == RUDA__CMD_WRITE && p->kind == RUDA_GRAPH_PATCH_DST) ||
                         (c->kind == RUDA__CMD_READ && p->kind == RUDA_GRAPH_PATCH_SRC);
      if (p->kind == RUDA_GRAPH_PATCH_ARG && !buffer) {
        memcpy(bytes, p->arg.data, p->arg.size);
        f->bytes = bytes;
        f->size = p->arg.size;
        bytes += (p->arg.size + 7u) & ~7u;
      } else if (buffer) {
        uint32_t pin = 0, r = 0;
        if ((rc = pin_patch(dev, s, g, p, k, &po, f, &pin, &r, fn)) != 0) goto fail;
        pu[cmd->npins] = (use){ruda__pin_slot(pin), p->kind == RUDA_GRAPH_PATCH_ARG ? p->arg.binding.handle.gen
                                                                                      : p->binding.handle.gen,
                               !(pin & RUDA__PIN_READ)};
        cmd->pins[cmd->npins++] = pin;
        uint32_t i = 0;
        while (i < nrep && rep[i] != r) i++;
        if (i == nrep) rep[nrep++] = r;
      }
    }
    /* By command, the order of the call kept among one command's. */
    for (uint32_t i = 1; i < np; i++)
      for (uint32_t j = i; j > 0 && fix[j - 1].cmd > fix[j].cmd; j--) {
        ruda__graph_fix t = fix[j];
        fix[j] = fix[j - 1];
        fix[j - 1] = t;
      }
    cmd->u.graph.fix = fix;
    cmd->u.graph.nfix = np;
  }
  /* The host blocks it reads or fills are kept from ruda_staging_free
   * until it ran (src/stage_hold.h). */
  if ((rc = ruda__stage_hold_new(dev, g, cmd->u.graph.fix, np, &hold)) != 0) goto fail;
  if (hold != NULL) {
    cmd->u.graph.ran = ruda__stage_hold_ran;
    cmd->u.graph.ran_arg = hold;
  }
  /* A graph buffer every use of which a patch replaced is not used. */
  uint32_t gone[RUDA_GRAPH_MAX_PATCHES], ngone = 0;
  {
    uint32_t slot_of[RUDA_GRAPH_MAX_PATCHES], count[RUDA_GRAPH_MAX_PATCHES], nc = 0;
    for (uint32_t i = 0; i < nrep; i++) {
      uint32_t u = g->pin_slot[rep[i]], j = 0;
      while (j < nc && slot_of[j] != u) j++;
      if (j == nc) {
        slot_of[nc] = u;
        count[nc++] = 0;
      }
      if (++count[j] == g->slot_uses[u]) gone[ngone++] = u;
    }
  }
  /* The buffers this replay uses, sorted by slot, once each: the graph's
   * still used, then the patches' merged in. */
  uint32_t nuse_max = g->nslots + cmd->npins, nuse = 0;
  use few[2 * RUDA__MAX_PINS], *uses = nuse_max <= 2 * RUDA__MAX_PINS ? few : malloc(nuse_max * sizeof *uses);
  if (uses == NULL) {
    rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    goto fail;
  }
  for (uint32_t i = 0; i < g->nslots; i++) {
    uint32_t j = 0;
    while (j < ngone && gone[j] != i) j++;
    if (j < ngone) continue;
    uint32_t slot = ruda__pin_slot(g->slots[i]);
    uses[nuse++] = (use){slot, ruda__handles_gen(h, slot), !(g->slots[i] & RUDA__PIN_READ)};
  }
  if (cmd->npins > 0) {
    memcpy(uses + nuse, pu, cmd->npins * sizeof *uses);
    nuse += cmd->npins;
    qsort(uses, nuse, sizeof *uses, cmp_use);
    uint32_t u = 0;
    for (uint32_t i = 0; i < nuse; i++) {
      if (u > 0 && uses[u - 1].slot == uses[i].slot) uses[u - 1].write |= uses[i].write;
      else uses[u++] = uses[i];
    }
    nuse = u;
  }
  /* Like a launch that uses those buffers: this worker becomes a user of
   * each (a free then waits for it), and the replay is ordered after
   * other workers' earlier uses. The graph's pins keep its slots, the
   * command's the patches'. The buffers in groups of at most per, then
   * the graph's own record. */
  const uint32_t per = RUDA__MAX_PINS;
  uint32_t ngroups = (nuse + per - 1) / per + 1;
  ruda__order two[2], *o = ngroups <= 2 ? two : malloc(ngroups * sizeof *o);
  if (o == NULL) {
    if (uses != few) free(uses);
    rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    goto fail;
  }
  /* The future first: a command that may be queued is the worker's. */
  if (fut != NULL && (cmd->future = ruda__future_new(&dev->sched, s, 1)) == NULL) {
    if (uses != few) free(uses);
    if (o != two) free(o);
    rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    goto fail;
  }
  ruda_future *f = cmd->future;
  cmd->u.graph.call = fn;
  pthread_mutex_lock(&g->issue_lock); /* ruda__submit_orders unlocks it */
  /* Sorted, so the groups lock in one key order. */
  for (uint32_t gi = 0; gi < ngroups; gi++) {
    ruda__order_init(&o[gi]);
    for (uint32_t i = gi * per; i < nuse && i < (gi + 1) * per; i++) {
      ruda__handles_add_user(h, uses[i].slot, w->index);
      ruda__order_note(&o[gi], ruda__handles_last(h, uses[i].slot), uses[i].slot, uses[i].gen, w,
                       uses[i].write ? RUDA__USE_WRITE : RUDA__USE_READ);
    }
    if (gi == ngroups - 1) ruda__order_note(&o[gi], g->replays, UINT32_MAX, 0, w, RUDA__USE_WRITE);
  }
  if (uses != few) free(uses);
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed); /* the queued replay's */
  rc = ruda__submit_orders(&dev->sched, s, cmd, o, ngroups, &g->issue_lock, in_place);
  if (o != two) free(o);
  if (rc == 0) {
    if (fut != NULL) *fut = f;
    ruda__order_abandon(&po); /* queued: the patches' pins are the command's, settled */
    return 0;
  }
  atomic_fetch_sub_explicit(&g->refs, 1, memory_order_relaxed);
  free(f);
  cmd->future = NULL;
fail:
  ruda__stage_hold_drop(dev, hold);
  ruda__order_abandon(&po);
  for (uint32_t i = 0; i < cmd->npins; i++) ruda__handles_unpin(h, ruda__pin_slot(cmd->pins[i]), NULL);
  ruda__cmd_free(cmd);
  return rc;
}

int ruda_graph_replay(ruda_device *dev, ruda_stream_id stream, ruda_graph *g) {
  static const char fn[] = "ruda_graph_replay";
  RUDA__CHECK_DEV(dev, fn);
  return replay(dev, stream, g, NULL, 0, NULL, 0, fn);
}

int ruda_graph_replay_async(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, ruda_future **fut) {
  static const char fn[] = "ruda_graph_replay_async";
  if (fut != NULL) *fut = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (fut == NULL) return ruda__fail(RUDA_EINVAL, "%s: fut is NULL", fn);
  int rc = replay(dev, stream, g, NULL, 0, fut, 0, fn);
  if (rc == 0) ruda__future_hand_out(*fut);
  return rc;
}

int ruda_graph_run(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, ruda_error **err) {
  static const char fn[] = "ruda_graph_run";
  if (err != NULL) *err = NULL;
  RUDA__CHECK_DEV(dev, fn);
  ruda_future *f = NULL;
  int rc = replay(dev, stream, g, NULL, 0, &f, 1, fn);
  if (rc != 0) return rc;
  rc = ruda_future_wait(f, err);
  ruda_future_free(f);
  return rc;
}

int ruda_graph_replay_with(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, const ruda_graph_patch *patches,
                           uint32_t n, ruda_future **fut) {
  static const char fn[] = "ruda_graph_replay_with";
  if (fut != NULL) *fut = NULL;
  RUDA__CHECK_DEV(dev, fn);
  int rc = replay(dev, stream, g, patches, n, fut, 0, fn);
  if (rc == 0 && fut != NULL) ruda__future_hand_out(*fut);
  return rc;
}

int ruda_graph_run_with(ruda_device *dev, ruda_stream_id stream, ruda_graph *g, const ruda_graph_patch *patches,
                        uint32_t n, ruda_error **err) {
  static const char fn[] = "ruda_graph_run_with";
  if (err != NULL) *err = NULL;
  RUDA__CHECK_DEV(dev, fn);
  ruda_future *f = NULL;
  int rc = replay(dev, stream, g, patches, n, &f, 1, fn);
  if (rc != 0) return rc;
  rc = ruda_future_wait(f, err);
  ruda_future_free(f);
  return rc;
}

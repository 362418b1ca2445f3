/* libcall.c - running a library call (ruda/call.h) on a worker, and the
 * libraries' state per device stream (a lane, scheduler.h;
 * ruda_library_register).
 *
 * Worker (or the thread running a command in place or replaying a graph,
 * which holds the worker's exec word): the command's buffers are pinned
 * and ordered like a launch's, so all that is left is to hand the caller's
 * function its lane's native stream, the buffers' addresses and the lane's
 * state of the call's library, made here before its first call there.
 * ruda holds none of its locks here: a command run in place runs after
 * the client released its issue locks (scheduler/inline.c), and the worker
 * takes none around a command. On cuda the worker's thread has the
 * device's context current since it started (cu_worker_start), a client
 * in place since exec_enter.
 *
 * The registry: entries are written once, under `lock`, before `n` is
 * raised (release); a call names an id only after its registration
 * returned, so whoever runs the call reads a complete entry. Each lane's
 * row of `states` is touched only while holding its worker's exec word,
 * and at the worker's end by its own thread: no lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "scheduler/libcall.h"

typedef struct ruda__lib_state {
  void *state;
  int made;
} ruda__lib_state;

struct ruda__libraries {
  pthread_mutex_t lock; /* registration */
  _Atomic uint32_t n;   /* registered entries */
  struct {
    ruda_library_desc d;
    char name[RUDA_CALL_NAME_MAX];
  } lib[RUDA_LIBRARY_MAX];
  ruda__lib_state *states; /* lane l, library id: states[l * RUDA_LIBRARY_MAX + id - 1] */
};

static struct ruda__libraries *libs_of(struct ruda__sched *sch) {
  struct ruda__libraries *l = atomic_load_explicit(&sch->libs, memory_order_acquire);
  if (l != NULL) return l;
  l = calloc(1, sizeof *l);
  ruda__lib_state *st = calloc((size_t)sch->lanes_total * RUDA_LIBRARY_MAX, sizeof *st);
  if (l == NULL || st == NULL) {
    free(l);
    free(st);
    return NULL;
  }
  pthread_mutex_init(&l->lock, NULL);
  l->states = st;
  struct ruda__libraries *none = NULL;
  if (atomic_compare_exchange_strong_explicit(&sch->libs, &none, l, memory_order_acq_rel, memory_order_acquire))
    return l;
  pthread_mutex_destroy(&l->lock); /* another registration made it first */
  free(st);
  free(l);
  return none;
}

int ruda__library_add(struct ruda__sched *sch, const ruda_library_desc *d, uint32_t *id) {
  struct ruda__libraries *l = libs_of(sch);
  if (l == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_library_register: out of host memory");
  pthread_mutex_lock(&l->lock);
  const uint32_t n = atomic_load_explicit(&l->n, memory_order_relaxed);
  if (n == RUDA_LIBRARY_MAX) {
    pthread_mutex_unlock(&l->lock);
    return ruda__fail(RUDA_EINVAL, "ruda_library_register: %d libraries registered already, at most %d",
                      RUDA_LIBRARY_MAX, RUDA_LIBRARY_MAX);
  }
  l->lib[n].d = *d;
  const char *name = d->name != NULL ? d->name : "library";
  size_t len = strnlen(name, RUDA_CALL_NAME_MAX - 1);
  memcpy(l->lib[n].name, name, len);
  l->lib[n].name[len] = '\0';
  l->lib[n].d.name = l->lib[n].name;
  atomic_store_explicit(&l->n, n + 1, memory_order_release);
  pthread_mutex_unlock(&l->lock);
  /* A library server: streams made from now on take every lane. */
  if (sch->lanes_auto) atomic_store_explicit(&sch->lanes_spread, sch->nlanes, memory_order_relaxed);
  *id = n + 1;
  return 0;
}

int ruda__library_known(struct ruda__sched *sch, uint32_t id) {
  struct ruda__libraries *l = atomic_load_explicit(&sch->libs, memory_order_acquire);
  return l != NULL && id >= 1 && id <= atomic_load_explicit(&l->n, memory_order_acquire);
}

static ruda_call_ctx ctx_of(ruda__lane *ln, const ruda__cmd *cmd) {
  struct ruda__sched *sch = ln->worker->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  return (ruda_call_ctx){
      .dev = sch->handle,
      .stream = cmd != NULL ? cmd->u.call.stream : 0,
      .seq = cmd != NULL ? cmd->seq : 0,
      .worker = ln->worker->index,
      .cu_stream = ops->native_stream != NULL ? ops->native_stream(ln->wstate) : NULL,
      .cu_context = ops->native_context != NULL ? ops->native_context(sch->backend.state) : NULL,
  };
}

/* ln's state of library id, made now if ln has none. 0, or RUDA_ECALL. */
static int state_of(ruda__lane *ln, const ruda__cmd *cmd, uint32_t id, void **out, ruda_error **err) {
  struct ruda__libraries *l = atomic_load_explicit(&ln->worker->sch->libs, memory_order_acquire);
  ruda__lib_state *st = &l->states[(size_t)ln->index * RUDA_LIBRARY_MAX + id - 1];
  if (__builtin_expect(st->made, 1)) {
    *out = st->state;
    return 0;
  }
  const ruda_library_desc *d = &l->lib[id - 1].d;
  char msg[RUDA_CALL_MSG_MAX];
  msg[0] = '\0';
  ruda_call_ctx ctx = ctx_of(ln, cmd);
  ctx.msg = msg;
  void *state = NULL;
  const int status = d->create(&ctx, d->user, &state);
  if (status != 0) {
    msg[sizeof msg - 1] = '\0';
    *err = ruda__error_new(RUDA_ECALL, status, "library \"%s\": create returned %d on worker %u, device stream %u%s%s",
                           d->name, status, ln->worker->index, ln->index, msg[0] ? ": " : "", msg);
    return RUDA_ECALL;
  }
  st->state = state;
  st->made = 1;
  *out = state;
  return 0;
}

int ruda__libcall_prepare(ruda__lane *ln, const ruda__cmd *cmd, ruda_error **err) {
  if (cmd->kind != RUDA__CMD_CALL || cmd->u.call.library == 0) return 0;
  void *state;
  return state_of(ln, cmd, cmd->u.call.library, &state, err);
}

int ruda__libcall_run(ruda__lane *ln, const ruda__cmd *cmd, int capturing, ruda_error **err) {
  struct ruda__sched *sch = ln->worker->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  const ruda__libcall_cmd *c = &cmd->u.call;
  void *lib = NULL;
  if (c->library != 0) {
    int rc = state_of(ln, cmd, c->library, &lib, err);
    if (rc != 0) return rc;
  }
  char msg[RUDA_CALL_MSG_MAX];
  msg[0] = '\0';
  ruda_call_ctx ctx = {
      .dev = sch->handle,
      .stream = c->stream,
      .seq = cmd->seq,
      .worker = ln->worker->index,
      .nbuffers = c->nbuf,
      .addr = c->addr,
      .size = c->size,
      .cu_stream = ops->native_stream != NULL ? ops->native_stream(ln->wstate) : NULL,
      .cu_context = ops->native_context != NULL ? ops->native_context(sch->backend.state) : NULL,
      .data = c->data,
      .data_size = c->data_size,
      .capturing = capturing,
      .msg = msg,
      .library = lib,
  };
  if (ops->call_begin != NULL) ops->call_begin(ln->wstate, ctx.stream, ctx.seq);
  const int status = c->fn(&ctx, c->user);
  if (status == 0) return 0;
  msg[sizeof msg - 1] = '\0'; /* the function may have filled it to the end */
  *err = ruda__error_new(RUDA_ECALL, status, "the function returned %d%s%s", status, msg[0] ? ": " : "", msg);
  return RUDA_ECALL;
}

void ruda__libcall_worker_end(ruda__worker *w) {
  struct ruda__libraries *l = atomic_load_explicit(&w->sch->libs, memory_order_acquire);
  if (l == NULL) return;
  for (uint32_t id = atomic_load_explicit(&l->n, memory_order_acquire); id >= 1; id--)
    for (uint32_t k = 0; k < w->nlanes; k++) {
      ruda__lane *ln = &w->lanes[k];
      ruda__lib_state *st = &l->states[(size_t)ln->index * RUDA_LIBRARY_MAX + id - 1];
      const ruda_library_desc *d = &l->lib[id - 1].d;
      if (!st->made) continue;
      st->made = 0;
      if (d->destroy == NULL) continue;
      char msg[RUDA_CALL_MSG_MAX];
      msg[0] = '\0';
      ruda_call_ctx ctx = ctx_of(ln, NULL);
      ctx.msg = msg;
      d->destroy(&ctx, d->user, st->state);
    }
}

void ruda__libraries_free(struct ruda__sched *sch) {
  struct ruda__libraries *l = atomic_exchange_explicit(&sch->libs, NULL, memory_order_acq_rel);
  if (l == NULL) return;
  pthread_mutex_destroy(&l->lock);
  free(l->states);
  free(l);
}

/* builder.c - the graph builder (builder.h): a queue of templates and the
 * thread that builds them, each with the backend's graph_build on the
 * builder's own worker state. */
#include <pthread.h>
#include <stdlib.h>

#include "scheduler/builder.h"
#include "scheduler/sched.h"

/* The builder's worker state, named so in the backend's messages. */
#define BUILDER_INDEX 0xffffu

struct ruda__builder {
  struct ruda__sched *sch;
  pthread_t thread;
  pthread_mutex_t lock; /* the queue and stop */
  pthread_cond_t cond;
  ruda_graph *head, *tail;
  int stop;
};

static void *builder_main(void *arg) {
  struct ruda__builder *b = arg;
  struct ruda__sched *sch = b->sch;
  const ruda__backend_ops *ops = sch->backend.ops;
  pthread_setname_np(pthread_self(), "ruda-graphs");
  void *ws = NULL;
  const int ready = ops->worker_start == NULL || ops->worker_start(sch->backend.state, BUILDER_INDEX, &ws) == 0;
  pthread_mutex_lock(&b->lock);
  for (;;) {
    while (b->head == NULL && !b->stop) pthread_cond_wait(&b->cond, &b->lock);
    ruda_graph *g = b->head;
    if (g == NULL) break; /* stopped, nothing left */
    b->head = g->build_next;
    if (b->head == NULL) b->tail = NULL;
    const int stop = b->stop;
    pthread_mutex_unlock(&b->lock);
    int state = RUDA__BUILD_FAILED;
    if (ready && !stop) {
      ruda_error *err = NULL;
      if (ruda__graph_build(sch, ws, g, &err) == 0) {
        state = RUDA__BUILD_READY;
        atomic_fetch_add_explicit(&sch->auto_built, 1, memory_order_relaxed);
      }
      ruda_error_free(err); /* the run goes one by one, where a real failure shows */
    }
    atomic_store_explicit(&g->build, state, memory_order_release);
    ruda__graph_unref(g, NULL); /* a template pins nothing */
    pthread_mutex_lock(&b->lock);
  }
  pthread_mutex_unlock(&b->lock);
  if (ws != NULL && ops->worker_stop != NULL) ops->worker_stop(sch->backend.state, ws);
  return NULL;
}

int ruda__builder_submit(struct ruda__sched *sch, ruda_graph *g) {
  pthread_mutex_lock(&sch->builder_lock);
  struct ruda__builder *b = sch->builder;
  if (b == NULL && (b = calloc(1, sizeof *b)) != NULL) {
    b->sch = sch;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    if (pthread_create(&b->thread, NULL, builder_main, b) != 0) {
      pthread_cond_destroy(&b->cond);
      pthread_mutex_destroy(&b->lock);
      free(b);
      b = NULL;
    }
    sch->builder = b;
  }
  pthread_mutex_unlock(&sch->builder_lock);
  if (b == NULL) {
    atomic_store_explicit(&g->build, RUDA__BUILD_FAILED, memory_order_release);
    return RUDA_ENOMEM;
  }
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  atomic_store_explicit(&g->build, RUDA__BUILD_QUEUED, memory_order_relaxed);
  g->build_next = NULL;
  pthread_mutex_lock(&b->lock);
  if (b->tail != NULL) b->tail->build_next = g;
  else b->head = g;
  b->tail = g;
  pthread_cond_signal(&b->cond);
  pthread_mutex_unlock(&b->lock);
  return 0;
}

void ruda__builder_stop(struct ruda__sched *sch) {
  struct ruda__builder *b = sch->builder;
  if (b == NULL) return;
  pthread_mutex_lock(&b->lock);
  b->stop = 1;
  pthread_cond_signal(&b->cond);
  pthread_mutex_unlock(&b->lock);
  pthread_join(b->thread, NULL);
  pthread_cond_destroy(&b->cond);
  pthread_mutex_destroy(&b->lock);
  free(b);
  sch->builder = NULL;
}

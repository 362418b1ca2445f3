/* fence.c - memory's fences: per worker, the points memory asked the
 * scheduler to pass (base/progress.h) and how far each worker got.
 *
 * A fence is a token of the progress table: issued after everything
 * pushed to a worker so far, polled until it completed on the device.
 * A few are in flight per worker and returns share them; nothing here
 * ever waits for the device.
 */
#include <stdlib.h>

#include "base/error.h"
#include "memory/fence.h"
#include "memory/memory.h"

/* Fences a worker may have in flight for returned pages. */
#define FENCES_IN_FLIGHT 4

/* Whether everything pushed to w is known complete without a fence. */
static int worker_idle(ruda__memory *mem, uint32_t w) {
  return mem->progress.ops->idle(mem->progress.ctx, w);
}

static void fence_issue(ruda__memory *mem, ruda__wfence *f, uint32_t w) {
  const ruda__progress *pr = &mem->progress;
  if (pr->ops->closing(pr->ctx)) {
    /* Closing: workers drain everything queued before they stop, and
     * nothing is reused after; count the fence as passed. */
    atomic_store_explicit(&f->passed, ++f->created, memory_order_release);
    return;
  }
  ruda__fence *node = malloc(sizeof *node);
  void *token = node ? pr->ops->fence_issue(pr->ctx, w) : NULL;
  if (token == NULL) { /* no host memory: a later poll tries again */
    free(node);
    return;
  }
  node->seq = ++f->created;
  f->nflight++;
  node->token = token;
  node->next = NULL;
  if (f->tail) f->tail->next = node;
  else f->head = node;
  f->tail = node;
}

static void fence_poll(ruda__memory *mem, ruda__wfence *f, uint32_t w) {
  const ruda__progress *pr = &mem->progress;
  while (f->head != NULL && pr->ops->fence_done(pr->ctx, f->head->token)) {
    ruda__fence *node = f->head;
    /* A fence that failed to record was still passed by its worker, which
     * is what reuse needs on the host; a CUDA context that cannot record
     * events is faulted. */
    atomic_store_explicit(&f->passed, node->seq, memory_order_release);
    f->head = node->next;
    f->nflight--;
    if (f->head == NULL) f->tail = NULL;
    pr->ops->fence_free(pr->ctx, node->token);
    free(node);
  }
  if (f->nflight < FENCES_IN_FLIGHT && f->wanted > f->created) fence_issue(mem, f, w);
}

uint64_t ruda__fence_need(ruda__memory *mem, uint32_t w, int executed) {
  ruda__memory *m = mem;
  /* Number 0 has always passed. */
  if (mem->backend->ops->event_query == NULL && (executed || worker_idle(mem, w))) return 0;
  pthread_mutex_lock(&m->fence_lock);
  ruda__wfence *f = &m->fences[w];
  /* When every use already ran on w, a fence w has not run yet comes
   * after them: join it. */
  if (executed && f->tail != NULL && !mem->progress.ops->fence_reached(mem->progress.ctx, f->tail->token)) {
    uint64_t seq = f->tail->seq;
    pthread_mutex_unlock(&m->fence_lock);
    return seq;
  }
  uint64_t need = f->created + 1;
  if (f->wanted < need) f->wanted = need;
  /* Returned pages share a few fences in flight per worker, which bounds
   * the sync commands a burst of returns costs while a page still waits
   * one round trip, not two, when streams trade pages quickly; retired
   * buffers get theirs at once, so usage figures settle as soon as the
   * workers pass them. */
  if (executed || f->nflight < FENCES_IN_FLIGHT) fence_issue(mem, f, w);
  else fence_poll(mem, f, w);
  pthread_mutex_unlock(&m->fence_lock);
  return need;
}

int ruda__fence_passed(ruda__memory *mem, uint32_t w, uint64_t need) {
  ruda__memory *m = mem;
  if (need == 0) return 1;
  ruda__wfence *f = &m->fences[w];
  if (atomic_load_explicit(&f->passed, memory_order_acquire) >= need || worker_idle(mem, w)) return 1;
  pthread_mutex_lock(&m->fence_lock);
  if (f->passed < need) fence_poll(mem, f, w);
  int r = f->passed >= need;
  pthread_mutex_unlock(&m->fence_lock);
  return r;
}

void ruda__fence_poll_all(ruda__memory *mem) {
  ruda__memory *m = mem;
  pthread_mutex_lock(&m->fence_lock);
  for (uint32_t w = 0; w < m->nworkers; w++) fence_poll(mem, &m->fences[w], w);
  pthread_mutex_unlock(&m->fence_lock);
}

/* Whether worker w is known to have passed fence need, without polling or
 * taking fence_lock. */
int ruda__fence_seen(ruda__memory *mem, uint32_t w, uint64_t need) {
  return need == 0 || atomic_load_explicit(&mem->fences[w].passed, memory_order_acquire) >= need ||
         worker_idle(mem, w);
}

int ruda__fence_table_init(ruda__memory *mem) {
  pthread_mutex_init(&mem->fence_lock, NULL);
  mem->fences = calloc(mem->nworkers, sizeof *mem->fences);
  if (mem->fences == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  return 0;
}

void ruda__fence_table_destroy(ruda__memory *mem) {
  for (uint32_t w = 0; mem->fences != NULL && w < mem->nworkers; w++) {
    ruda__wfence *f = &mem->fences[w];
    while (f->head) {
      ruda__fence *n = f->head;
      f->head = n->next;
      mem->progress.ops->fence_free(mem->progress.ctx, n->token);
      free(n);
    }
  }
  free(mem->fences);
  mem->fences = NULL;
  pthread_mutex_destroy(&mem->fence_lock);
}

/* stage_hold.c - host staging blocks kept for the replays that use them
 * (stage_hold.h has the rules).
 *
 * One list of holds per device, each a replay's host ranges, and a list
 * of blocks whose free was deferred. A hold is queued until its replay
 * ran; then, on a backend whose copies complete on the device later
 * (cuda: event_query), it waits for a fence after what its worker ran;
 * fences are asked for in batches (BATCH holds, or at once when a
 * deferred block needs one), so a serving loop pays one per batch. The
 * lists are short: about the replays in flight. Lock order: the list's
 * lock, then memory's fence_lock (taken inside the fence calls), which
 * never waits for the device. */
#include <stdlib.h>

#include "memory/fence.h"
#include "scheduler/graph.h"
#include "src/device.h"
#include "src/stage_hold.h"

/* Holds that ran before their fences are asked for together. */
#define BATCH 32u

enum { QUEUED, RAN, FENCED };

typedef struct range {
  const unsigned char *lo;
  size_t bytes;
} range;

struct ruda__stage_hold {
  struct ruda__stage_hold *next, *prev;
  ruda_device *dev;
  int state;
  uint32_t worker;
  uint64_t need; /* FENCED: the fence on worker that follows the replay */
  uint32_t n;
  range r[];
};

struct ruda__stage_pending {
  struct ruda__stage_pending *next;
  unsigned char *p;
  size_t size;
};

void ruda__stage_holds_init(ruda__stage_holds *t) {
  pthread_mutex_init(&t->lock, NULL);
  t->head = NULL;
  t->freed = NULL;
  t->ran = 0;
}

void ruda__stage_holds_destroy(ruda__stage_holds *t) {
  while (t->head != NULL) {
    struct ruda__stage_hold *h = t->head;
    t->head = h->next;
    free(h);
  }
  while (t->freed != NULL) {
    struct ruda__stage_pending *d = t->freed;
    t->freed = d->next;
    free(d);
  }
  pthread_mutex_destroy(&t->lock);
}

/* Whether the graph's command c is an upload or a download, and its host
 * side. */
static const void *host_of(const ruda__cmd *c, size_t *bytes) {
  if (c->kind == RUDA__CMD_WRITE) {
    *bytes = (size_t)c->u.write.layout.bytes;
    return c->u.write.staged;
  }
  if (c->kind == RUDA__CMD_READ) {
    *bytes = (size_t)c->u.read.layout.bytes;
    return c->u.read.dst;
  }
  return NULL;
}

int ruda__stage_hold_new(ruda_device *dev, const ruda_graph *g, const ruda__graph_fix *fix, uint32_t nfix,
                         struct ruda__stage_hold **out) {
  *out = NULL;
  uint32_t n = 0;
  size_t bytes;
  for (uint32_t i = 0; i < g->n; i++) n += host_of(g->cmds[i], &bytes) != NULL;
  if (n == 0) return 0;
  struct ruda__stage_hold *h = malloc(sizeof *h + n * sizeof(range));
  if (h == NULL) return ruda__fail(RUDA_ENOMEM, "replaying a graph: out of host memory");
  h->dev = dev;
  h->state = QUEUED;
  h->worker = 0;
  h->need = 0;
  h->n = 0;
  uint32_t k = 0; /* fix is sorted by command, in the call's order within one */
  for (uint32_t i = 0; i < g->n; i++) {
    const ruda__cmd *c = g->cmds[i];
    const void *host = host_of(c, &bytes);
    if (host == NULL) continue;
    for (; k < nfix && fix[k].cmd <= i; k++) {
      const int host_side = (c->kind == RUDA__CMD_WRITE && fix[k].kind == RUDA_GRAPH_PATCH_SRC) ||
                            (c->kind == RUDA__CMD_READ && fix[k].kind == RUDA_GRAPH_PATCH_DST);
      if (fix[k].cmd == i && host_side) host = fix[k].host;
    }
    h->r[h->n++] = (range){host, bytes};
  }
  ruda__stage_holds *t = &dev->holds;
  pthread_mutex_lock(&t->lock);
  h->prev = NULL;
  h->next = t->head;
  if (t->head != NULL) t->head->prev = h;
  t->head = h;
  pthread_mutex_unlock(&t->lock);
  *out = h;
  return 0;
}

static int overlaps(const struct ruda__stage_hold *h, const unsigned char *p, size_t size) {
  for (uint32_t i = 0; i < h->n; i++)
    if (h->r[i].lo < p + size && p < h->r[i].lo + (h->r[i].bytes ? h->r[i].bytes : 1)) return 1;
  return 0;
}

static void unlink_hold(ruda__stage_holds *t, struct ruda__stage_hold *h) {
  if (h->prev != NULL) h->prev->next = h->next;
  else t->head = h->next;
  if (h->next != NULL) h->next->prev = h->prev;
  if (h->state == RAN) t->ran--;
  free(h);
}

/* Under t->lock: a fence for hold h, which ran (0 on a backend whose work
 * is done once its worker ran it). */
static void fence(ruda_device *dev, struct ruda__stage_hold *h) {
  h->need = ruda__fence_need(&dev->memory, h->worker, 1);
  h->state = FENCED;
  dev->holds.ran--;
}

/* Under t->lock: drops the holds that are over, asks for fences when a
 * batch is due (all: force), and frees the deferred blocks no hold names
 * any more. */
static void settle(ruda_device *dev, int force) {
  ruda__stage_holds *t = &dev->holds;
  const int batch = force || t->ran >= BATCH || t->freed != NULL;
  for (struct ruda__stage_hold *h = t->head, *next; h != NULL; h = next) {
    next = h->next;
    if (h->state == RAN && batch) fence(dev, h);
    if (h->state == FENCED && ruda__fence_passed(&dev->memory, h->worker, h->need)) unlink_hold(t, h);
  }
  for (struct ruda__stage_pending **pp = &t->freed; *pp != NULL;) {
    struct ruda__stage_pending *d = *pp;
    int named = 0;
    for (const struct ruda__stage_hold *h = t->head; h != NULL && !named; h = h->next)
      named = overlaps(h, d->p, d->size);
    if (named) {
      pp = &d->next;
      continue;
    }
    *pp = d->next;
    dev->sched.backend.ops->stage_free(dev->sched.backend.state, d->p);
    free(d);
  }
}

void ruda__stage_hold_ran(void *arg, uint32_t worker) {
  struct ruda__stage_hold *h = arg;
  ruda_device *dev = h->dev;
  ruda__stage_holds *t = &dev->holds;
  pthread_mutex_lock(&t->lock);
  h->state = RAN;
  h->worker = worker;
  t->ran++;
  /* A backend without events: the copies are done, the hold with them. */
  if (dev->sched.backend.ops->event_query == NULL) unlink_hold(t, h);
  if (t->freed != NULL || t->ran >= BATCH) settle(dev, 0);
  pthread_mutex_unlock(&t->lock);
}

void ruda__stage_hold_drop(ruda_device *dev, struct ruda__stage_hold *h) {
  if (h == NULL) return;
  ruda__stage_holds *t = &dev->holds;
  pthread_mutex_lock(&t->lock);
  unlink_hold(t, h);
  if (t->freed != NULL) settle(dev, 0);
  pthread_mutex_unlock(&t->lock);
}

int ruda__stage_free(ruda_device *dev, void *p) {
  ruda__stage_holds *t = &dev->holds;
  pthread_mutex_lock(&t->lock);
  if (t->head != NULL) {
    const size_t size = dev->sched.backend.ops->stage_size != NULL ? dev->sched.backend.ops->stage_size(dev->sched.backend.state, p) : SIZE_MAX / 2;
    for (const struct ruda__stage_hold *h = t->head; h != NULL; h = h->next) {
      if (!overlaps(h, p, size)) continue;
      struct ruda__stage_pending *d = malloc(sizeof *d);
      if (d != NULL) {
        *d = (struct ruda__stage_pending){t->freed, p, size};
        t->freed = d;
        settle(dev, 1);
      }
      pthread_mutex_unlock(&t->lock);
      return d != NULL ? 0
                       : ruda__fail(RUDA_ENOMEM, "ruda_staging_free: a queued graph replay uses block %p, and no host "
                                                 "memory is left to defer its free (the block stays yours)", p);
    }
  }
  pthread_mutex_unlock(&t->lock);
  dev->sched.backend.ops->stage_free(dev->sched.backend.state, p);
  return 0;
}

uint32_t ruda__stage_deferred(ruda_device *dev) {
  ruda__stage_holds *t = &dev->holds;
  pthread_mutex_lock(&t->lock);
  if (t->freed != NULL) settle(dev, 1);
  uint32_t n = 0;
  for (const struct ruda__stage_pending *d = t->freed; d != NULL; d = d->next) n++;
  pthread_mutex_unlock(&t->lock);
  return n;
}

/* stage_hold.h - host staging blocks kept for the graph replays that use
 * them (src/stage_hold.c).
 *
 * A replay reads an upload's source block and fills a download's
 * destination block when its worker runs it, and on cuda the copy lands
 * once the device ran it. A ruda_staging_free of a block such a replay
 * still names (a recorded block or a patch's) is deferred: it returns at
 * once and the block goes back to the backend once every replay naming it
 * ran and, on a backend with events, once the device passed it (a fence,
 * memory/fence.h). Every function may run on any thread, workers
 * included; one mutex inside, held briefly, never around a wait. */
#ifndef RUDA_SRC_STAGE_HOLD_H
#define RUDA_SRC_STAGE_HOLD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct ruda_device;
struct ruda_graph;
struct ruda__graph_fix;
typedef struct ruda__stage_hold ruda__stage_hold;
struct ruda__stage_pending;

typedef struct ruda__stage_holds {
  pthread_mutex_t lock;
  struct ruda__stage_hold *head;     /* replays' host ranges */
  struct ruda__stage_pending *freed; /* blocks freed while a hold named them */
  uint32_t ran;                      /* holds whose replay ran and that wait for no fence yet */
} ruda__stage_holds;

void ruda__stage_holds_init(ruda__stage_holds *t);
/* Close, after the workers stopped (every replay ran): forgets the holds
 * and deferred frees; the blocks go with the backend's close. */
void ruda__stage_holds_destroy(ruda__stage_holds *t);

/* Client, building a replay of g with fix[0..nfix): a hold on every host
 * block the replay uses (recorded or patched), in *out (NULL when it uses
 * none). 0 or RUDA_ENOMEM. */
int ruda__stage_hold_new(struct ruda_device *dev, const struct ruda_graph *g, const struct ruda__graph_fix *fix,
                         uint32_t nfix, struct ruda__stage_hold **out);
/* The worker (or the client running it in place), once the replay ran:
 * the command's `ran` hook (scheduler.h); arg is the hold. */
void ruda__stage_hold_ran(void *arg, uint32_t worker);
/* A replay that was not queued: drops its hold at once. NULL is a no-op. */
void ruda__stage_hold_drop(struct ruda_device *dev, struct ruda__stage_hold *h);

/* ruda_staging_free's work: frees block p now, or once the holds naming
 * it are gone. 0, or RUDA_ENOMEM when a deferral found no host memory
 * (the block stays the caller's). */
int ruda__stage_free(struct ruda_device *dev, void *p);
/* Blocks whose free was deferred and that are not yet back (for tests). */
uint32_t ruda__stage_deferred(struct ruda_device *dev);

#endif /* RUDA_SRC_STAGE_HOLD_H */

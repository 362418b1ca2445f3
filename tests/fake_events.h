/* fake_events.h - completion events for unit tests that copy the host
 * backend's table: the worker's record() makes an event that completes
 * only when the test (or its own event_wait hook) says so, as a GPU's
 * would. Events are kept on one list until free_events(), so completing
 * one never races its release. Include once per test program. */
#ifndef RUDA_TEST_FAKE_EVENTS_H
#define RUDA_TEST_FAKE_EVENTS_H

#include <stdatomic.h>
#include <stdlib.h>

#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

typedef struct fake_event {
  _Atomic int done;
  struct fake_event *next;
} fake_event;

static fake_event *_Atomic events; /* every event recorded, newest first */
static _Atomic int nevents;

static int fake_record(void *ws, ruda__completion *c, ruda_error **err) {
  (void)ws;
  (void)err;
  fake_event *e = calloc(1, sizeof *e);
  if (e == NULL) return RUDA_ENOMEM;
  e->next = atomic_load(&events);
  while (!atomic_compare_exchange_weak(&events, &e->next, e)) {
  }
  atomic_fetch_add(&nevents, 1);
  c->event = e;
  return 0;
}

static int fake_event_query(void *state, void *ev) {
  (void)state;
  return atomic_load(&((fake_event *)ev)->done);
}

/* Released at free_events(), not here (see above). */
static void fake_event_release(void *state, void *ev) {
  (void)state;
  (void)ev;
}

static inline void complete_all(void) {
  for (fake_event *e = atomic_load(&events); e != NULL; e = e->next) atomic_store(&e->done, 1);
}

static inline void free_events(void) {
  fake_event *e = atomic_exchange(&events, NULL);
  while (e != NULL) {
    fake_event *n = e->next;
    free(e);
    e = n;
  }
}

#endif /* RUDA_TEST_FAKE_EVENTS_H */

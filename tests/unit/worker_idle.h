/* worker_idle.h - unit tests: wait until a stream's worker gave its state
 * back (scheduler/inline.c's exec word). A caller back from a sync may
 * still find it held: the worker completes the future, then finishes its
 * batch. Include after common.h and src/device.h. */
#ifndef RUDA_TESTS_WORKER_IDLE_H
#define RUDA_TESTS_WORKER_IDLE_H

#include <sched.h>

static inline void test_worker_idle(ruda_device *dev, ruda_stream_id s) {
  ruda__worker *w = ruda__stream_get(&dev->sched, s)->worker;
  for (int i = 0; atomic_load(&w->exec) != 0; i++) {
    assert_true(i < 1000000);
    sched_yield();
  }
}

#endif

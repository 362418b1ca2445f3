/* backend_faults.c - the scheduler against a backend whose completions and
 * failures the test controls.
 *
 * The host backend finishes everything it submits, so on it flush and sync
 * look alike. Here the host table is copied and its record/event hooks
 * replaced by events that complete only when the test says, which is what
 * a GPU does: flush must return at submission, sync only at completion.
 * Other hooks inject failures, as STYLE.md's "swap a function to inject a
 * fault" suggests. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

typedef struct fake_event {
  _Atomic int done;
  _Atomic int waiting; /* callers inside fake_event_wait on it */
  int fail_code;       /* set before done */
} fake_event;

#define MAX_EVENTS 64
static fake_event *_Atomic events[MAX_EVENTS];
static _Atomic int nevents;
static _Atomic int write_fail_code;
static ruda__backend_ops fake;

static int fake_record(void *ws, ruda__completion *c, ruda_error **err) {
  (void)ws;
  (void)err;
  fake_event *e = calloc(1, sizeof *e);
  if (e == NULL) return RUDA_ENOMEM;
  c->event = e;
  atomic_store(&events[atomic_fetch_add(&nevents, 1) % MAX_EVENTS], e);
  return 0;
}

static int fake_event_query(void *state, void *ev) {
  (void)state;
  return atomic_load(&((fake_event *)ev)->done);
}

static int fake_event_wait(void *state, void *ev, ruda_error **err) {
  (void)state;
  fake_event *e = ev;
  atomic_fetch_add(&e->waiting, 1);
  while (!atomic_load(&e->done)) usleep(100);
  if (e->fail_code != 0) {
    if (err) *err = ruda__error_new(e->fail_code, 700, "injected device fault");
    return e->fail_code;
  }
  return 0;
}

static void fake_event_release(void *state, void *ev) {
  (void)state;
  free(ev);
}

static int fake_write(void *ws, uint64_t dst, const ruda__layout *l, void *staged, ruda_error **err) {
  int code = atomic_load(&write_fail_code);
  if (code != 0) {
    ruda__host_backend.stage_free(ws, staged); /* the backend owns the staged bytes */
    *err = ruda__error_new(code, 42, "injected write failure");
    return code;
  }
  return ruda__host_backend.write(ws, dst, l, staged, err);
}

static _Atomic uint64_t incs;

static int inc_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&incs, 1);
  return 0;
}

static ruda_device *open_fake(uint32_t streams) {
  ruda_device *dev = test_open(streams, 1024, RUDA_BACKPRESSURE_BLOCK);
  for (int i = 0; i < MAX_EVENTS; i++) atomic_store(&events[i], NULL);
  atomic_store(&nevents, 0);
  atomic_store(&write_fail_code, 0);
  atomic_store(&incs, 0);
  fake = ruda__host_backend;
  fake.record = fake_record;
  fake.event_query = fake_event_query;
  fake.event_wait = fake_event_wait;
  fake.event_release = fake_event_release;
  fake.write = fake_write;
  /* Registered first: host kernels are refused on any other backend. */
  assert_ok(ruda_host_kernel_register(dev, "inc", inc_kernel));
  /* Idle workers read the table too, so swap it with them stopped; the
   * join and the thread creation order the swap for them. */
  ruda__workers_stop(&dev->sched);
  dev->sched.backend.ops = &fake; /* every layer reads this one field */
  assert_ok(ruda__workers_start(&dev->sched));
  return dev;
}

static void wait_events(int n) {
  for (int i = 0; atomic_load(&nevents) < n; i++) {
    assert_true(i < 10000 * (int)test_patience());
    usleep(1000);
  }
}

static void complete(int i, int fail_code) {
  fake_event *e = atomic_load(&events[i]);
  assert_non_null(e);
  e->fail_code = fail_code;
  atomic_store(&e->done, 1);
}

typedef struct syncer {
  ruda_device *dev;
  _Atomic int done;
  int rc;
} syncer;

static void *sync_thread(void *p) {
  syncer *s = p;
  s->rc = ruda_sync(s->dev, 0, NULL);
  atomic_store(&s->done, 1);
  return NULL;
}

static void flush_at_submission_sync_at_completion(void **state) {
  (void)state;
  ruda_device *dev = open_fake(1);
  for (int i = 0; i < 10; i++) assert_ok(test_launch(dev, 0, "inc", NULL, 0));
  ruda_future *f = NULL;
  assert_ok(ruda_sync_async(dev, 0, &f));
  /* flush: the worker submitted everything, the device has not finished. */
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), 10);
  assert_int_equal(atomic_load(&nevents), 1);
  assert_int_equal(ruda_future_poll(f), 0);

  syncer s = {.dev = dev};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sync_thread, &s), 0);
  wait_events(2);
  /* The sync waits on the device's completion of its own event. */
  test_wait_count(&atomic_load(&events[1])->waiting, 1);
  assert_int_equal(atomic_load(&s.done), 0);

  /* The first completion releases the first future only: the sync still
   * waits on the second event, which nothing completed. */
  complete(0, 0);
  assert_int_equal(ruda_future_poll(f), 1);
  assert_rc(ruda_future_wait(f, NULL), 0);
  ruda_future_free(f);
  assert_int_equal(atomic_load(&s.done), 0);
  assert_int_equal(atomic_load(&atomic_load(&events[1])->waiting), 1);
  complete(1, 0);
  pthread_join(t, NULL);
  assert_int_equal(s.rc, 0);
  test_close(dev);
}

static void device_fault_surfaces_on_sync(void **state) {
  (void)state;
  ruda_device *dev = open_fake(2);
  assert_ok(test_launch(dev, 1, "inc", NULL, 0));
  ruda_future *f = NULL, *g = NULL;
  assert_ok(ruda_sync_async(dev, 1, &f));
  assert_ok(ruda_sync_async(dev, 0, &g));
  wait_events(2);
  /* A flush before completion cannot know of the fault yet. */
  assert_ok(ruda_flush(dev, 1, NULL));
  for (int i = 0; i < 2; i++) {
    fake_event *e = atomic_load(&events[i]);
    e->fail_code = RUDA_ECUDA; /* both fail; only stream 1's wait asks */
    atomic_store(&e->done, 1);
  }
  ruda_error *err = NULL;
  assert_int_equal(ruda_future_wait(f, &err), RUDA_EUNHEALTHY);
  const ruda_error *cause = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(cause), RUDA_ECUDA);
  assert_int_equal(ruda_error_backend_code(cause), 700);
  assert_int_equal(ruda_error_stream(cause), 1);
  assert_contains(ruda_error_message(cause), "injected device fault");
  ruda_error_free(err);
  ruda_future_free(f);
  /* Stream 0's own sync reports its own completion failure, not 1's. */
  assert_int_equal(ruda_future_wait(g, &err), RUDA_EUNHEALTHY);
  assert_int_equal(ruda_error_stream(ruda_error_cause(err)), 0);
  assert_null(ruda_error_next(ruda_error_cause(err)));
  ruda_error_free(err);
  ruda_future_free(g);
  assert_ok(ruda_flush(dev, 1, NULL));
  test_close(dev);
}

static void write_failure_is_reported_with_context(void **state) {
  (void)state;
  ruda_device *dev = open_fake(1);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 16, &h));
  atomic_store(&write_fail_code, RUDA_EIO);
  test_write(dev, 3, ruda_bind(h), "0123456789abcdef", 16);
  ruda_error *err = NULL;
  assert_int_equal(ruda_flush(dev, 3, &err), RUDA_EUNHEALTHY);
  const ruda_error *cause = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(cause), RUDA_EIO);
  assert_int_equal(ruda_error_backend_code(cause), 42);
  assert_contains(ruda_error_message(cause), "ruda_write (stream 3, command #1)");
  assert_contains(ruda_error_message(cause), "injected write failure");
  ruda_error_free(err);
  atomic_store(&write_fail_code, 0);
  assert_ok(ruda_buffer_free(dev, 3, h));
  test_close(dev);
}

static void lost_errors_are_counted(void **state) {
  (void)state;
  /* An error that could not be allocated still makes the stream
   * unhealthy, and the drain says how many were lost. */
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda__stream *s = ruda__stream_get(&dev->sched, 5);
  assert_non_null(s);
  ruda__stream_push_error(s, NULL);
  ruda__stream_push_error(s, ruda__error_new(RUDA_EGENERIC, 0, "a recorded one"));
  ruda__stream_push_error(s, NULL);
  ruda_error *err = NULL;
  assert_int_equal(ruda_flush(dev, 5, &err), RUDA_EUNHEALTHY);
  assert_contains(ruda_error_message(err), "3 errors");
  const ruda_error *first = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(first), RUDA_ENOMEM);
  assert_contains(ruda_error_message(first), "2 further errors on stream 5 could not be recorded");
  assert_int_equal(ruda_error_code(ruda_error_next(first)), RUDA_EGENERIC);
  ruda_error_free(err);
  assert_ok(ruda_flush(dev, 5, NULL));
  test_close(dev);
}

static void device_fault_is_sticky_on_every_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda__sched_fault(&dev->sched, ruda__error_new(RUDA_EFAULTED, 700, "illegal address (injected)"));
  ruda__sched_fault(&dev->sched, ruda__error_new(RUDA_EFAULTED, 701, "second fault")); /* first wins */
  for (ruda_stream_id s = 0; s < 3; s++)
    for (int round = 0; round < 2; round++) { /* draining does not clear it */
      ruda_error *err = NULL;
      assert_int_equal(ruda_sync(dev, s, &err), RUDA_EUNHEALTHY);
      assert_contains(ruda_error_message(err), "device is faulted");
      assert_contains(ruda_error_message(err), "illegal address (injected)");
      ruda_error_free(err);
    }
  ruda_error *errs = NULL;
  assert_int_equal(ruda_device_close(dev, &errs), RUDA_EUNHEALTHY);
  assert_non_null(errs);
  ruda_error_free(errs);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flush_at_submission_sync_at_completion),
      cmocka_unit_test(device_fault_surfaces_on_sync),
      cmocka_unit_test(write_failure_is_reported_with_context),
      cmocka_unit_test(lost_errors_are_counted),
      cmocka_unit_test(device_fault_is_sticky_on_every_stream),
  };
  return test_main("unit_backend_faults", tests, sizeof tests / sizeof tests[0], argc, argv);
}

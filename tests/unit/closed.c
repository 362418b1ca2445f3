/* closed.c - every call on a closed device fails with RUDA_ECLOSED.
 *
 * Through the public API a closed device is already freed, so the state
 * "closed but still allocated" (what a call racing with close would see)
 * is made here by setting the flag ruda_device_close sets first. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

static int noop(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static void calls_after_close(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "noop", noop));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  char buf[64] = {0};
  ruda_future *f = NULL;
  uint64_t size;
  ruda_error *err = (ruda_error *)&err;

  atomic_store(&dev->closed, 1);
  assert_rc(ruda_buffer_create(dev, 0, 64, &h), RUDA_ECLOSED);
  assert_last_error_contains("ruda_buffer_create: device is closed");
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_ECLOSED);
  assert_rc(ruda_buffer_size(dev, h, &size), RUDA_ECLOSED);
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ECLOSED);
  assert_last_error_contains("ruda_write");
  assert_rc(ruda_read(dev, 0, &d, buf, 64, &f), RUDA_ECLOSED);
  assert_null(f);
  assert_rc(ruda_copy(dev, 0, ruda_bind(h), ruda_bind(h)), RUDA_ECLOSED);
  assert_rc(test_launch(dev, 0, "noop", NULL, 0), RUDA_ECLOSED);
  assert_last_error_contains("ruda_launch");
  assert_rc(ruda_flush(dev, 0, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_rc(ruda_sync(dev, 0, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_rc(ruda_sync_async(dev, 0, &f), RUDA_ECLOSED);
  assert_null(f);
  assert_rc(ruda_host_kernel_register(dev, "other", noop), RUDA_ECLOSED);
  assert_rc(ruda_kernel_source(dev, "other", "src", NULL), RUDA_ECLOSED);
  /* A second close is refused and frees nothing. */
  assert_rc(ruda_device_close(dev, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_last_error_contains("ruda_device_close: device is closed");

  /* Nothing above reached the worker, and the buffer is intact. */
  atomic_store(&dev->closed, 0);
  assert_ok(ruda_buffer_size(dev, h, &size));
  assert_int_equal(size, 64);
  assert_ok(ruda_sync(dev, 0, NULL));
  test_close(dev);
}

/* A worker running a command may push onto another worker's queue (the
 * pools do, for fences of retired buffers). A close must run such a push
 * too: no worker may have stopped while another still runs queued work. */
static ruda_device *push_dev;
static struct ruda_future *pushed;

static int push_to_worker0(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  /* Push only once the close has begun (a bounded wait for its flag): the
   * push must land while workers are being stopped. */
  for (int i = 0; !atomic_load(&push_dev->closed); i++) {
    if (i == 10000000) return RUDA_ETIMEDOUT;
    sched_yield();
  }
  ruda__cmd *cmd = ruda__cmd_alloc(0);
  pushed = ruda__future_new(&push_dev->sched, NULL, 0);
  if (cmd == NULL || pushed == NULL) return RUDA_ENOMEM; /* no cmocka off the main thread */
  cmd->kind = RUDA__CMD_FENCE;
  cmd->stream = NULL;
  cmd->seq = 0;
  cmd->future = pushed;
  ruda__queue_push_unbounded(&push_dev->sched.workers[0], cmd);
  return 0;
}

static void close_runs_pushes_between_workers(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
  push_dev = dev;
  pushed = NULL;
  assert_ok(ruda_host_kernel_register(dev, "push", push_to_worker0));
  assert_ok(test_launch(dev, 1, "push", NULL, 0)); /* on worker 1 */
  test_close(dev);
  assert_non_null(pushed);
  /* Worker 0 ran the FENCE pushed to it while the device closed. */
  assert_int_equal(atomic_load(&pushed->state), RUDA__FUT_SUBMITTED);
  ruda_future_free(pushed);
}

/* ---- a call racing close ----
 * The call enters its slot just after close waited for the slots (so it
 * must fail with RUDA_ECLOSED) and is held there, by the test points of
 * src/api.h, until close either waits for it or returns. Close must wait:
 * the call's leaving its slot would otherwise write freed memory (ASan:
 * heap-use-after-free; TSan: a race with the free). */
static atomic_int race_armed, race_go, race_entered, race_freeing, race_waited, race_closed;

/* These run on the racing threads, where a cmocka assertion cannot fail
 * cleanly: a wait that never ends fails the whole test binary. */
static void await_gone(const char *what) {
  fprintf(stderr, "closed: gave up waiting for %s\n", what);
  _exit(1);
}

static void await_flag(atomic_int *f) {
  for (unsigned i = 0; !atomic_load(f); i++) {
    if (i >= 100000000u) await_gone("a flag");
    sched_yield();
  }
}

static void await_either(atomic_int *f, atomic_int *g) {
  for (unsigned i = 0; !atomic_load(f) && !atomic_load(g); i++) {
    if (i >= 100000000u) await_gone("either flag");
    sched_yield();
  }
}

/* Reads racing close (below): close frees the device only once every
 * reader saw RUDA_ECLOSED and stopped calling. */
static atomic_int readers_armed, readers_running;

void ruda__test_hook(int point, ruda_device *dev) {
  (void)dev;
  if (point == RUDA__HOOK_CLOSE_FREE && atomic_load(&readers_armed))
    for (unsigned i = 0; atomic_load(&readers_running) != 0; i++) {
      if (i >= 100000000u) await_gone("the readers");
      sched_yield();
    }
  if (!atomic_load(&race_armed)) return;
  switch (point) {
  case RUDA__HOOK_CLOSE_WAITED: /* the closer: let the racing call in, once it is counted go on */
    atomic_store(&race_go, 1);
    await_flag(&race_entered);
    break;
  case RUDA__HOOK_CALL_CLOSED: /* the racing call, counted, found the device closing */
    atomic_store(&race_entered, 1);
    await_either(&race_waited, &race_closed);
    break;
  case RUDA__HOOK_CLOSE_WAITING:
    if (atomic_load(&race_freeing)) atomic_store(&race_waited, 1);
    break;
  case RUDA__HOOK_CLOSE_FREE:
    atomic_store(&race_freeing, 1);
    break;
  }
}

typedef struct racer {
  ruda_device *dev;
  ruda_handle h;
  int second_close; /* the racing call is a second close */
  int rc;
  char msg[128];
} racer;

static void *race_call(void *p) {
  racer *r = p;
  await_flag(&race_go);
  uint64_t size = 0;
  r->rc = r->second_close ? ruda_device_close(r->dev, NULL) : ruda_buffer_size(r->dev, r->h, &size);
  snprintf(r->msg, sizeof r->msg, "%s", ruda_error_message(ruda_last_error()));
  return NULL;
}

static void *close_it(void *p) {
  ruda_device *dev = p;
  intptr_t rc = ruda_device_close(dev, NULL);
  atomic_store(&race_closed, 1); /* the device is freed now */
  return (void *)rc;
}

static void race_close(int second_close) {
  /* Each case starts from no flag set (the cases may share a process). */
  atomic_int *flags[] = {&race_go, &race_entered, &race_freeing, &race_waited, &race_closed};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) atomic_store(flags[i], 0);
  ruda_device *dev = test_open_default();
  racer r = {dev, {0, 0}, second_close, 1, ""};
  assert_ok(ruda_buffer_create(dev, 0, 64, &r.h));
  atomic_store(&race_armed, 1);
  pthread_t caller, closer;
  assert_int_equal(pthread_create(&caller, NULL, race_call, &r), 0);
  assert_int_equal(pthread_create(&closer, NULL, close_it, dev), 0);
  void *closed_rc = NULL;
  pthread_join(closer, &closed_rc);
  pthread_join(caller, NULL);
  atomic_store(&race_armed, 0);
  assert_int_equal((intptr_t)closed_rc, 0);
  assert_true(atomic_load(&race_waited)); /* close waited for the racing call */
  assert_int_equal(r.rc, RUDA_ECLOSED);
  assert_contains(r.msg, second_close ? "ruda_device_close: device is closed" : "ruda_buffer_size: device is closed");
}

static void a_call_racing_close_is_waited_for(void **state) {
  (void)state;
  race_close(0);
}

static void a_second_close_racing_close_is_waited_for(void **state) {
  (void)state;
  race_close(1);
}

typedef struct reader {
  ruda_device *dev;
  ruda_handle h;
  int bad, reads, closed_futures;
} reader;

/* Reads until a read is refused: each read is refused with RUDA_ECLOSED,
 * or gives a future that completes (0) or that close completed
 * (RUDA_ECLOSED); never a hang or another code. Every other future is
 * held a moment before its wait, so some outlive the close unwaited. */
static void *read_until_closed(void *arg) {
  reader *r = arg;
  for (;;) {
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(r->h));
    uint64_t got = 0;
    ruda_future *f = NULL;
    int rc = ruda_read(r->dev, RUDA_STREAM_CURRENT, &d, &got, sizeof got, &f);
    if (rc != 0) {
      r->bad += rc != RUDA_ECLOSED;
      break;
    }
    if (r->reads & 1) usleep(100);
    rc = ruda_future_wait(f, NULL);
    if (rc != 0 && rc != RUDA_ECLOSED) r->bad++;
    r->closed_futures += rc == RUDA_ECLOSED;
    ruda_future_free(f);
    r->reads++;
  }
  atomic_fetch_sub(&readers_running, 1);
  return NULL;
}

/* Calls racing close that hand out futures: close never refuses for them
 * and nothing they hold dangles (ASan, TSan). */
static void reads_racing_close_leave_valid_futures(void **state) {
  (void)state;
  enum { THREADS = 4 };
  ruda_device *dev = test_open_default();
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, sizeof(uint64_t), &h));
  reader r[THREADS];
  pthread_t t[THREADS];
  atomic_store(&readers_running, THREADS);
  atomic_store(&readers_armed, 1);
  for (int i = 0; i < THREADS; i++) {
    r[i] = (reader){dev, h, 0, 0, 0};
    assert_int_equal(pthread_create(&t[i], NULL, read_until_closed, &r[i]), 0);
  }
  usleep(20000);
  assert_ok(ruda_device_close(dev, NULL));
  atomic_store(&readers_armed, 0);
  int reads = 0;
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(r[i].bad, 0);
    reads += r[i].reads;
  }
  assert_true(reads > 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(calls_after_close),
      cmocka_unit_test(close_runs_pushes_between_workers),
      cmocka_unit_test(a_call_racing_close_is_waited_for),
      cmocka_unit_test(a_second_close_racing_close_is_waited_for),
      cmocka_unit_test(reads_racing_close_leave_valid_futures),
  };
  return test_main("unit_closed", tests, sizeof tests / sizeof tests[0], argc, argv);
}

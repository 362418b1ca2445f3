/* isolation.c - an error belongs to the stream that caused it: it surfaces
 * on that stream's flush, sync or read, once, in order, and never on
 * another stream, even one served by the same worker. */
#include <pthread.h>
#include <stdatomic.h>

#include <execinfo.h>

#include "common.h"

static _Atomic uint64_t ok_runs;

/* Returns the code it is given; counts the launches that succeed. */
static int fail_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  int code = *(const int *)args[0];
  if (code == 0) atomic_fetch_add(&ok_runs, 1);
  return code;
}

static ruda_device *open_with_kernel(uint32_t streams) {
  ruda_device *dev = test_open(streams, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&ok_runs, 0);
  assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
  return dev;
}

static void launch_code(ruda_device *dev, ruda_stream_id s, int code) {
  ruda_arg a = ruda_arg_scalar(&code, sizeof code);
  assert_ok(test_launch(dev, s, "fail", &a, 1));
}

/* err is the RUDA_EUNHEALTHY summary of stream s holding one error of
 * code, raised by the kernel "fail". */
static void check_single(const ruda_error *err, ruda_stream_id s, int code) {
  char want[128];
  assert_non_null(err);
  assert_int_equal(ruda_error_code(err), RUDA_EUNHEALTHY);
  assert_int_equal(ruda_error_stream(err), s);
  /* Messages name a thread's own stream "thread stream #n". */
  char name[48];
  if (s <= RUDA_STREAM_EXPLICIT_MAX) snprintf(name, sizeof name, "stream %llu", (unsigned long long)s);
  else snprintf(name, sizeof name, "thread stream #%llu", (unsigned long long)(s - (UINT64_C(1) << 63)));
  snprintf(want, sizeof want, "%s is unhealthy: 1 error", name);
  assert_contains(ruda_error_message(err), want);
  const ruda_error *cause = ruda_error_cause(err);
  assert_non_null(cause);
  assert_int_equal(ruda_error_code(cause), code);
  assert_int_equal(ruda_error_stream(cause), s);
  assert_contains(ruda_error_message(cause), "ruda_launch \"fail\"");
  snprintf(want, sizeof want, "(%s, command #", name);
  assert_contains(ruda_error_message(cause), want);
  assert_contains(ruda_error_message(cause), ruda_err_name(code));
  assert_null(ruda_error_next(cause));
  size_t frames = 0;
  ruda_error_backtrace(cause, &frames);
  assert_true(frames > 0);
}

static void error_surfaces_on_its_flush(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(4);
  const ruda_stream_id a = 1, b = 2;
  launch_code(dev, a, RUDA_EVALIDATION);
  launch_code(dev, b, 0);
  launch_code(dev, a, 0); /* an unhealthy stream still runs its work */

  ruda_error *err = (ruda_error *)&err;
  assert_rc(ruda_flush(dev, b, &err), 0);
  assert_null(err);
  assert_rc(ruda_sync(dev, b, &err), 0);
  assert_null(err);

  assert_int_equal(ruda_flush(dev, a, &err), RUDA_EUNHEALTHY);
  check_single(err, a, RUDA_EVALIDATION);
  ruda_error_free(err);
  assert_int_equal(atomic_load(&ok_runs), 2);

  /* Drained once: the next flush and sync find nothing. */
  assert_rc(ruda_flush(dev, a, &err), 0);
  assert_null(err);
  assert_rc(ruda_sync(dev, a, &err), 0);
  assert_null(err);
  test_close(dev);
}

static void error_surfaces_on_its_sync(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(4);
  const ruda_stream_id a = 5, b = 6;
  launch_code(dev, a, RUDA_EGENERIC);
  launch_code(dev, b, 0);
  ruda_error *err = NULL;
  assert_rc(ruda_sync(dev, b, &err), 0);
  assert_null(err);
  assert_int_equal(ruda_sync(dev, a, &err), RUDA_EUNHEALTHY);
  check_single(err, a, RUDA_EGENERIC);
  ruda_error_free(err);
  assert_rc(ruda_flush(dev, a, &err), 0);
  assert_null(err);
  /* A caller that does not want the list still learns the stream was
   * unhealthy, and the errors are drained all the same. */
  launch_code(dev, a, RUDA_EGENERIC);
  assert_int_equal(ruda_sync(dev, a, NULL), RUDA_EUNHEALTHY);
  assert_rc(ruda_sync(dev, a, NULL), 0);
  test_close(dev);
}

static void shared_worker_keeps_errors_apart(void **state) {
  (void)state;
  /* One worker serves both streams: attribution is by stream, not by
   * worker. */
  ruda_device *dev = open_with_kernel(1);
  const ruda_stream_id a = 10, b = 11;
  for (int i = 0; i < 100; i++) {
    launch_code(dev, b, 0);
    if (i == 50) launch_code(dev, a, RUDA_ELAUNCH);
  }
  ruda_error *err = NULL;
  assert_rc(ruda_flush(dev, b, &err), 0);
  assert_rc(ruda_sync(dev, b, &err), 0);
  assert_null(err);
  assert_int_equal(atomic_load(&ok_runs), 100);
  assert_int_equal(ruda_sync(dev, a, &err), RUDA_EUNHEALTHY);
  check_single(err, a, RUDA_ELAUNCH);
  ruda_error_free(err);
  test_close(dev);
}

static void errors_keep_their_order(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(2);
  const ruda_stream_id a = 3;
  const int codes[] = {RUDA_EVALIDATION, RUDA_EGENERIC, RUDA_ELAUNCH, RUDA_EIO, RUDA_EVALIDATION};
  const int n = (int)(sizeof codes / sizeof codes[0]);
  for (int i = 0; i < n; i++) {
    launch_code(dev, a, 0);
    launch_code(dev, a, codes[i]);
  }
  ruda_error *err = NULL;
  assert_int_equal(ruda_flush(dev, a, &err), RUDA_EUNHEALTHY);
  assert_contains(ruda_error_message(err), "5 errors");
  int i = 0;
  unsigned long long prev_cmd = 0;
  for (const ruda_error *e = ruda_error_cause(err); e != NULL; e = ruda_error_next(e), i++) {
    assert_true(i < n);
    assert_int_equal(ruda_error_code(e), codes[i]);
    assert_int_equal(ruda_error_stream(e), a);
    /* The command numbers quoted by the messages increase: the failing
     * launches were the 2nd, 4th, ... commands of the stream. */
    const char *m = strstr(ruda_error_message(e), "command #");
    assert_non_null(m);
    unsigned long long cmd = strtoull(m + strlen("command #"), NULL, 10);
    assert_true(cmd > prev_cmd);
    prev_cmd = cmd;
  }
  assert_int_equal(i, n);
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  ruda_error_print(err, out, 0);
  fclose(out);
  assert_contains(text, "RUDA_EUNHEALTHY");
  assert_contains(text, "caused by RUDA_EIO");
  free(text);
  ruda_error_free(err);
  assert_int_equal(atomic_load(&ok_runs), n);
  test_close(dev);
}

typedef struct thread_result {
  ruda_device *dev;
  int fail;
  int flush_rc, cause_code;
  ruda_stream_id current;
} thread_result;

static void *use_current_stream(void *p) {
  thread_result *r = p;
  int code = r->fail ? RUDA_EVALIDATION : 0;
  ruda_arg a = ruda_arg_scalar(&code, sizeof code);
  r->current = ruda_stream_current();
  if (test_launch(r->dev, RUDA_STREAM_CURRENT, "fail", &a, 1) != 0) {
    r->flush_rc = 1;
    return NULL;
  }
  ruda_error *err = NULL;
  r->flush_rc = ruda_flush(r->dev, RUDA_STREAM_CURRENT, &err);
  r->cause_code = ruda_error_code(ruda_error_cause(err));
  ruda_error_free(err);
  return NULL;
}

static void thread_streams_are_isolated(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(2);
  thread_result r[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    r[i] = (thread_result){.dev = dev, .fail = i % 2};
    assert_int_equal(pthread_create(&t[i], NULL, use_current_stream, &r[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    assert_true(r[i].current > RUDA_STREAM_EXPLICIT_MAX);
    assert_true(r[i].current != RUDA_STREAM_CURRENT);
    for (int j = 0; j < i; j++) assert_true(r[i].current != r[j].current);
    if (r[i].fail) {
      assert_int_equal(r[i].flush_rc, RUDA_EUNHEALTHY);
      assert_int_equal(r[i].cause_code, RUDA_EVALIDATION);
    } else {
      assert_int_equal(r[i].flush_rc, 0);
      assert_int_equal(r[i].cause_code, 0);
    }
  }
  /* The calling thread's own stream is a fifth one, and healthy. */
  assert_rc(ruda_flush(dev, RUDA_STREAM_CURRENT, NULL), 0);
  assert_true(ruda_stream_current() == ruda_stream_current());
  test_close(dev);
}

static void read_future_reports_stream_errors(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(2);
  const ruda_stream_id a = 0, b = 1;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, a, 16, &h));
  test_write(dev, a, ruda_bind(h), "0123456789abcdef", 16);
  assert_ok(ruda_sync(dev, a, NULL));
  launch_code(dev, a, RUDA_EGENERIC);
  char out[16] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *fb = NULL, *fa = NULL;
  /* The same buffer read on a healthy stream: no error. */
  assert_ok(ruda_read(dev, b, &d, out, 16, &fb));
  ruda_error *err = NULL;
  assert_rc(ruda_future_wait(fb, &err), 0);
  assert_null(err);
  assert_memory_equal(out, "0123456789abcdef", 16);
  ruda_future_free(fb);

  assert_ok(ruda_read(dev, a, &d, out, 16, &fa));
  assert_int_equal(ruda_future_wait(fa, &err), RUDA_EUNHEALTHY);
  check_single(err, a, RUDA_EGENERIC);
  ruda_error_free(err);
  /* Waiting again gives the same code; the error was handed over once. */
  err = (ruda_error *)&err;
  assert_int_equal(ruda_future_wait(fa, &err), RUDA_EUNHEALTHY);
  assert_null(err);
  ruda_future_free(fa);
  assert_rc(ruda_flush(dev, a, NULL), 0);
  assert_ok(ruda_buffer_free(dev, a, h));
  test_close(dev);
}

static int fail_at_one_thread(const ruda_host_ctx *c, void *const *args) {
  (void)args;
  if (c->block_idx.x == 2 && c->thread_idx.x == 5) return RUDA_EVALIDATION;
  return 0;
}

static void kernel_error_names_the_thread(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(1);
  assert_ok(ruda_host_kernel_register(dev, "picky", fail_at_one_thread));
  ruda_launch_desc l = {.kernel = "picky", .grid = {4, 1, 1}, .block = {8, 1, 1}};
  assert_ok(ruda_launch(dev, 7, &l));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, 7, &err), RUDA_EUNHEALTHY);
  const ruda_error *cause = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(cause), RUDA_EVALIDATION);
  assert_contains(ruda_error_message(cause), "\"picky\"");
  assert_contains(ruda_error_message(cause), "block (2,0,0) thread (5,0,0)");
  ruda_error_free(err);
  test_close(dev);
}

/* A thread fails a launch on its own stream and exits without draining. */
typedef struct leaver {
  ruda_device *dev;
  int code;
  ruda_stream_id id;
  int rc; /* the launch's return */
} leaver;

/* The launch's own code goes back to the main thread (as l->rc), which
 * asserts on it: no cmocka off the main thread. */
static void *fail_and_leave(void *p) {
  leaver *l = p;
  ruda_arg a = ruda_arg_scalar(&l->code, sizeof l->code);
  l->rc = test_launch(l->dev, RUDA_STREAM_CURRENT, "fail", &a, 1);
  l->id = ruda_stream_current();
  return NULL;
}

/* Errors left on an exited thread's stream are drained by the id
 * ruda_stream_ids lists; memory figures meanwhile keep working. */
static void exited_threads_errors_drain_by_id(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(2);
  leaver l = {.dev = dev, .code = RUDA_ELAUNCH};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fail_and_leave, &l), 0);
  pthread_join(t, NULL);
  assert_ok(l.rc);
  ruda_stream_id ids[8];
  size_t n = ruda_stream_ids(dev, ids, 8);
  int listed = 0;
  for (size_t i = 0; i < n && i < 8; i++) listed |= ids[i] == l.id;
  assert_true(listed);
  ruda_memory_stats u;
  assert_ok(ruda_memory_device_usage(dev, &u));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, l.id, &err), RUDA_EUNHEALTHY);
  check_single(err, l.id, RUDA_ELAUNCH);
  ruda_error_free(err);
  assert_ok(ruda_sync(dev, l.id, NULL)); /* drained */
  test_close(dev);
}

/* ruda_device_sync hands back every stream's errors: explicit streams and
 * the streams of threads that exited. */
static void device_sync_collects_every_stream(void **state) {
  (void)state;
  ruda_device *dev = open_with_kernel(3);
  leaver l[3] = {{.dev = dev, .code = RUDA_ELAUNCH}, {.dev = dev, .code = RUDA_EINVAL}, {.dev = dev, .code = RUDA_ENOMEM}};
  pthread_t t[3];
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&t[i], NULL, fail_and_leave, &l[i]), 0);
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    assert_ok(l[i].rc);
  }
  launch_code(dev, 5, RUDA_ERANGE);
  launch_code(dev, 6, 0);
  ruda_error *err = NULL;
  assert_int_equal(ruda_device_sync(dev, &err), RUDA_EUNHEALTHY);
  int seen[4] = {0, 0, 0, 0};
  size_t summaries = 0;
  for (const ruda_error *e = err; e != NULL; e = ruda_error_next(e)) {
    summaries++;
    const ruda_error *c = ruda_error_cause(e);
    assert_non_null(c);
    for (int i = 0; i < 3; i++)
      if (ruda_error_stream(e) == l[i].id) seen[i] = ruda_error_code(c) == l[i].code;
    if (ruda_error_stream(e) == 5) seen[3] = ruda_error_code(c) == RUDA_ERANGE;
  }
  assert_int_equal(summaries, 4);
  for (int i = 0; i < 4; i++) assert_true(seen[i]);
  ruda_error_free(err);
  assert_int_equal(atomic_load(&ok_runs), 1);
  assert_ok(ruda_device_sync(dev, NULL)); /* all drained */
  test_close(dev);
}

/* How many of the caller frames of here[] the error's backtrace shares. */
static int shared_frames(const ruda_error *e, void *const *here, int nhere) {
  size_t nf = 0;
  void *const *frames = ruda_error_backtrace(e, &nf);
  int shared = 0;
  for (size_t i = 0; i < nf; i++)
    for (int j = 1; j < nhere; j++) shared += frames[i] == here[j];
  return shared;
}

/* A host device of two workers with RUDA_LAUNCH_BLOCKING on or off and
 * the kernel "fail". */
static ruda_device *open_blocking(int blocking) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  cfg.log_level = RUDA_LOG_ERROR;
  cfg.launch_blocking = blocking;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&cfg, &dev));
  assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
  return dev;
}

/* RUDA_LAUNCH_BLOCKING: a failure's backtrace is the enqueuing call's
 * (it shares the caller's frames); otherwise it is the worker's. */
static void blocking_mode_keeps_the_enqueue_backtrace(void **state) {
  (void)state;
  for (int blocking = 0; blocking < 2; blocking++) {
    ruda_device *dev = open_blocking(blocking);
    void *here[24];
    int nhere = backtrace(here, 24);
    launch_code(dev, 3, RUDA_ELAUNCH);
    ruda_error *err = NULL;
    assert_int_equal(ruda_sync(dev, 3, &err), RUDA_EUNHEALTHY);
    const ruda_error *cause = ruda_error_cause(err);
    assert_contains(ruda_error_message(cause), "ruda_launch \"fail\" (stream 3, command #1)");
    if (blocking) assert_true(shared_frames(cause, here, nhere) >= 1);
    else assert_int_equal(shared_frames(cause, here, nhere), 0);
    ruda_error_free(err);
    test_close(dev);
  }
}

/* A replay is submitted like a launch: under RUDA_LAUNCH_BLOCKING the
 * failure of a recorded command carries the replaying call's backtrace,
 * and names the call and the command in the graph; failures of patched
 * replays are named by their call. */
static void blocking_mode_names_the_replay_and_its_command(void **state) {
  (void)state;
  for (int blocking = 0; blocking < 2; blocking++) {
    ruda_device *dev = open_blocking(blocking);
    ruda_graph *g = NULL;
    assert_ok(ruda_graph_begin_capture(dev, 3));
    launch_code(dev, 3, 0);
    launch_code(dev, 3, RUDA_ELAUNCH);
    assert_ok(ruda_graph_end_capture(dev, 3, &g));
    void *here[24];
    int nhere = backtrace(here, 24);
    assert_ok(ruda_graph_replay(dev, 3, g));
    ruda_error *err = NULL;
    assert_int_equal(ruda_sync(dev, 3, &err), RUDA_EUNHEALTHY);
    const ruda_error *cause = ruda_error_cause(err);
    assert_contains(ruda_error_message(cause), "ruda_graph_replay (stream 3, command #1)");
    assert_contains(ruda_error_message(cause), "command 2 (launch of fail)");
    if (blocking) assert_true(shared_frames(cause, here, nhere) >= 1);
    else assert_int_equal(shared_frames(cause, here, nhere), 0);
    ruda_error_free(err);
    /* Patched: the call's own name. */
    const int ok = 0;
    ruda_graph_patch p = ruda_graph_patch_arg(0, 0, ruda_arg_scalar(&ok, sizeof ok));
    ruda_future *f = NULL;
    assert_ok(ruda_graph_replay_with(dev, 3, g, &p, 1, &f));
    assert_int_equal(ruda_future_wait(f, &err), RUDA_EUNHEALTHY);
    ruda_future_free(f);
    assert_contains(ruda_error_message(ruda_error_cause(err)), "ruda_graph_replay_with (stream 3, command #");
    ruda_error_free(err);
    assert_ok(ruda_graph_destroy(dev, g));
    test_close(dev);
  }
}

typedef struct failer {
  ruda_device *dev;
  ruda_stream_id stream;
  int count;
  _Atomic int done;
  int rc;
} failer;

static void *launch_failures(void *p) {
  failer *f = p;
  int code = RUDA_EVALIDATION;
  ruda_arg a = ruda_arg_scalar(&code, sizeof code);
  for (int i = 0; i < f->count && f->rc == 0; i++) f->rc = test_launch(f->dev, f->stream, "fail", &a, 1);
  atomic_store(&f->done, 1);
  return NULL;
}

/* Adds up one drained list; each summary must say how many it holds. */
static int drained(const ruda_error *err) {
  int n = 0;
  for (const ruda_error *e = ruda_error_cause(err); e != NULL; e = ruda_error_next(e)) {
    if (ruda_error_code(e) != RUDA_EVALIDATION) fail_msg("unexpected %s", ruda_error_message(e));
    n++;
  }
  char want[128];
  snprintf(want, sizeof want, ": %d error%s", n, n == 1 ? "" : "s");
  if (n == 0 || strstr(ruda_error_message(err), want) == NULL)
    fail_msg("summary \"%s\" but %d errors in its list", ruda_error_message(err), n);
  return n;
}

typedef struct drainer {
  ruda_device *dev;
  failer *f;
  int total;
  char failure[256];
} drainer;

/* Flushes until the failures are all enqueued; checks each list as
 * drained() does, but records instead of asserting (not the main thread). */
static void *drain_loop(void *p) {
  drainer *d = p;
  while (!atomic_load(&d->f->done) && !d->failure[0]) {
    ruda_error *err = NULL;
    int rc = ruda_flush(d->dev, d->f->stream, &err);
    if (rc == RUDA_EUNHEALTHY) {
      int n = 0;
      for (const ruda_error *e = ruda_error_cause(err); e != NULL; e = ruda_error_next(e)) n++;
      char want[128];
      snprintf(want, sizeof want, ": %d error%s", n, n == 1 ? "" : "s");
      if (n == 0 || strstr(ruda_error_message(err), want) == NULL)
        snprintf(d->failure, sizeof d->failure, "summary \"%.150s\" but %d errors in its list",
                 ruda_error_message(err), n);
      d->total += n;
    } else if (rc != 0) {
      snprintf(d->failure, sizeof d->failure, "flush returned %s", ruda_err_name(rc));
    }
    ruda_error_free(err);
  }
  return NULL;
}

static void flushes_racing_failures_lose_nothing(void **state) {
  (void)state;
  /* Errors are queued by the worker while several threads drain the same
   * stream: every one must come out exactly once, in a summary that counts
   * it, and none may be lost or leaked. */
  enum { DRAINERS = 3 };
  ruda_device *dev = open_with_kernel(1);
  failer f = {.dev = dev, .stream = 9, .count = 20000};
  drainer d[DRAINERS];
  pthread_t t, td[DRAINERS];
  assert_int_equal(pthread_create(&t, NULL, launch_failures, &f), 0);
  for (int i = 0; i < DRAINERS; i++) {
    d[i] = (drainer){.dev = dev, .f = &f};
    assert_int_equal(pthread_create(&td[i], NULL, drain_loop, &d[i]), 0);
  }
  pthread_join(t, NULL);
  int total = 0;
  for (int i = 0; i < DRAINERS; i++) {
    pthread_join(td[i], NULL);
    if (d[i].failure[0]) fail_msg("drainer %d: %s", i, d[i].failure);
    total += d[i].total;
  }
  assert_int_equal(f.rc, 0);
  ruda_error *err = NULL;
  int rc = ruda_sync(dev, 9, &err);
  if (rc == RUDA_EUNHEALTHY) total += drained(err);
  ruda_error_free(err);
  assert_int_equal(total, f.count);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(error_surfaces_on_its_flush),
      cmocka_unit_test(error_surfaces_on_its_sync),
      cmocka_unit_test(shared_worker_keeps_errors_apart),
      cmocka_unit_test(errors_keep_their_order),
      cmocka_unit_test(thread_streams_are_isolated),
      cmocka_unit_test(read_future_reports_stream_errors),
      cmocka_unit_test(kernel_error_names_the_thread),
      cmocka_unit_test(flushes_racing_failures_lose_nothing),
      cmocka_unit_test(exited_threads_errors_drain_by_id),
      cmocka_unit_test(blocking_mode_keeps_the_enqueue_backtrace),
      cmocka_unit_test(blocking_mode_names_the_replay_and_its_command),
      cmocka_unit_test(device_sync_collects_every_stream),
  };
  return test_main("integration_isolation", tests, sizeof tests / sizeof tests[0], argc, argv);
}

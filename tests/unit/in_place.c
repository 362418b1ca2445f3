/* in_place.c - streams whose commands the caller issues itself while the
 * worker is idle (ruda_stream_set_in_place, scheduler/inline.c): where
 * commands run, that a busy worker still queues them, that they are
 * ordered after other streams' writers and reported as ever, and many
 * threads at once on streams sharing workers (TSan). With automatic
 * graphs on, launches in place are held for the stream's wait point:
 * issued with it as one graph, before anything after them (another
 * stream's command, a free, close), and by the worker when no wait
 * comes. Cases that check where a command ran inside its own call turn
 * automatic graphs off; the rest run both ways (RUDA_AUTO_GRAPHS). */
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "common.h"
#include "src/device.h"
#include "worker_idle.h"

#define N 32

/* note(x): x[i] += 1, and notes the thread it ran on (read by the test
 * after a sync or read ordered it). */
static pthread_t ran_on;
static int k_note(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  for (int i = 0; i < N; i++) x[i] += 1;
  ran_on = pthread_self();
  return 0;
}

/* scale(y, x, k): y[i] = x[i] * k. */
static int k_scale(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *y = args[0];
  const uint64_t *x = args[1], k = *(const uint64_t *)args[2];
  for (int i = 0; i < N; i++) y[i] = x[i] * k;
  return 0;
}

/* add1(x): x[i] += 1 (note without the note: clients race). */
static int k_add1(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  for (int i = 0; i < N; i++) x[i] += 1;
  return 0;
}

static int k_fail(const ruda_host_ctx *c, void *const *args) {
  (void)c, (void)args;
  return RUDA_EGENERIC;
}

/* auto_graphs: cfg.auto_graphs (-1: as RUDA_AUTO_GRAPHS says). */
static ruda_device *open_in_place_as(uint32_t workers, int auto_graphs) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = workers;
  cfg.lanes = test_lanes(workers);
  cfg.queue_bound = 4096;
  cfg.backpressure = RUDA_BACKPRESSURE_BLOCK;
  cfg.log_level = RUDA_LOG_ERROR;
  if (auto_graphs >= 0) cfg.auto_graphs = auto_graphs;
  ruda_device *dev = NULL;
  if (ruda_device_open(&cfg, &dev) != 0)
    fail_msg("ruda_device_open: %s", ruda_error_message(ruda_last_error()));
  assert_ok(ruda_host_kernel_register(dev, "note", k_note));
  assert_ok(ruda_host_kernel_register(dev, "scale", k_scale));
  assert_ok(ruda_host_kernel_register(dev, "fail", k_fail));
  assert_ok(ruda_host_kernel_register(dev, "add1", k_add1));
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  atomic_store(&test_gate_open, 1);
  return dev;
}

static ruda_device *open_in_place(uint32_t workers) { return open_in_place_as(workers, -1); }

static ruda_handle zeroed(ruda_device *dev, ruda_stream_id s) {
  ruda_handle x;
  uint64_t z[N] = {0};
  assert_ok(ruda_buffer_create(dev, s, sizeof z, &x));
  test_write(dev, s, ruda_bind(x), z, sizeof z);
  assert_ok(ruda_sync(dev, s, NULL));
  return x;
}

static void expect_all(ruda_device *dev, ruda_stream_id s, ruda_handle x, uint64_t want) {
  uint64_t got[N];
  test_read(dev, s, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++)
    if (got[i] != want) fail_msg("element %d: %llu, expected %llu", i, (unsigned long long)got[i], (unsigned long long)want);
}

static void commands_run_on_the_caller_while_the_worker_is_idle(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(2, 0); /* nothing held: each launch runs in its call */
  ruda_handle x = zeroed(dev, 0);
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_rc(ruda_stream_set_in_place(NULL, 0, 1), RUDA_EINVAL);
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  for (int r = 0; r < 5; r++) {
    test_worker_idle(dev, 0);
    assert_ok(test_launch(dev, 0, "note", &a, 1));
    /* On the host the kernel ran inside the call. */
    assert_true(pthread_equal(ran_on, pthread_self()));
  }
  expect_all(dev, 0, x, 5);
  /* Off again: the worker runs it. */
  assert_ok(ruda_stream_set_in_place(dev, 0, 0));
  assert_ok(test_launch(dev, 0, "note", &a, 1));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_false(pthread_equal(ran_on, pthread_self()));
  expect_all(dev, 0, x, 6);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* One worker, held by a gate on another stream: the in-place stream's
 * launch queues behind it, the call returns at once, and it runs on the
 * worker after the gate. */
static void a_busy_worker_still_queues(void **state) {
  (void)state;
  ruda_device *dev = open_in_place(1);
  ruda_handle x = zeroed(dev, 0);
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  assert_ok(test_launch(dev, 1, "gate", NULL, 0));
  test_wait_count(&test_gate_entered, 1); /* the worker is inside the gate */
  ran_on = pthread_self();
  assert_ok(test_launch(dev, 0, "note", &a, 1));
  assert_true(pthread_equal(ran_on, pthread_self())); /* not run yet: still ours */
  atomic_store(&test_gate_open, 1);
  expect_all(dev, 0, x, 1);
  assert_false(pthread_equal(ran_on, pthread_self()));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* A writer on another worker, held by a gate: the in-place reader on
 * stream 0 is ordered after it (its WAIT is queued, so it queues too). */
static void ordered_after_another_streams_writer(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(2, 0);
  ruda_handle x = zeroed(dev, 1), y = zeroed(dev, 0);
  ruda_arg w = ruda_arg_buffer(ruda_bind(x));
  const uint64_t three = 3;
  ruda_arg sc[3] = {ruda_arg_out(ruda_bind(y)), ruda_arg_in(ruda_bind(x)), ruda_arg_scalar(&three, sizeof three)};
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  assert_ok(test_launch(dev, 1, "gate", NULL, 0));
  assert_ok(test_launch(dev, 1, "note", &w, 1)); /* x = 1, after the gate */
  test_wait_count(&test_gate_entered, 1); /* worker 1 is held: x is still 0 */
  assert_ok(test_launch(dev, 0, "scale", sc, 3)); /* y = 3 x: must see x = 1 */
  atomic_store(&test_gate_open, 1);
  expect_all(dev, 0, y, 3);
  /* And the other way: stream 1 reads what stream 0 wrote in place. */
  test_worker_idle(dev, 0);
  assert_ok(test_launch(dev, 0, "note", &w, 1)); /* x = 2, in place on worker 0 */
  assert_true(pthread_equal(ran_on, pthread_self()));
  expect_all(dev, 1, x, 2);
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_ok(ruda_buffer_free(dev, 1, x));
  test_close(dev);
}

/* A failure in place lands on the stream as the worker's would. */
static void failures_reach_the_stream(void **state) {
  (void)state;
  ruda_device *dev = open_in_place(2);
  assert_ok(ruda_stream_set_in_place(dev, 3, 1));
  test_worker_idle(dev, 3);
  assert_ok(test_launch(dev, 3, "fail", NULL, 0));
  ruda_error *errs = NULL;
  assert_rc(ruda_flush(dev, 3, &errs), RUDA_EUNHEALTHY);
  const ruda_error *e = ruda_error_cause(errs);
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_EGENERIC);
  assert_contains(ruda_error_message(e), "ruda_launch \"fail\" (stream 3, command #1)");
  assert_int_equal(ruda_error_stream(e), 3);
  ruda_error_free(errs);
  assert_ok(ruda_flush(dev, 3, NULL));
  test_close(dev);
}

typedef struct client {
  ruda_device *dev;
  ruda_stream_id s;
  ruda_handle shared;
  int in_place, bad;
} client;

/* Each request: write its own x, y = shared * k on its stream, read y. */
static void *serve(void *p) {
  client *c = p;
  ruda_handle x, y;
  if (ruda_stream_set_in_place(c->dev, c->s, c->in_place) != 0 ||
      ruda_buffer_create(c->dev, c->s, N * 8, &x) != 0 || ruda_buffer_create(c->dev, c->s, N * 8, &y) != 0) {
    c->bad = 1;
    return NULL;
  }
  for (uint64_t r = 1; r <= 200 && !c->bad; r++) {
    uint64_t in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = r + (uint64_t)i;
    ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(x)), dy = ruda_copy_contiguous(ruda_bind(y));
    ruda_arg sc[3] = {ruda_arg_out(ruda_bind(y)), ruda_arg_in(ruda_bind(c->shared)), ruda_arg_scalar(&r, 8)};
    ruda_arg add = ruda_arg_buffer(ruda_bind(x));
    ruda_future *f = NULL;
    if (ruda_write(c->dev, c->s, &dx, in, sizeof in) != 0 || test_launch(c->dev, c->s, "add1", &add, 1) != 0 ||
        test_launch(c->dev, c->s, "scale", sc, 3) != 0 || ruda_read(c->dev, c->s, &dy, out, sizeof out, &f) != 0 ||
        ruda_future_wait(f, NULL) != 0) {
      c->bad = 1;
    } else {
      for (int i = 0; i < N; i++)
        if (out[i] != r * 7) c->bad = 1;
    }
    ruda_future_free(f);
    ruda_future *g = NULL;
    if (!c->bad && ruda_read(c->dev, c->s, &dx, out, sizeof out, &g) == 0 && ruda_future_wait(g, NULL) == 0) {
      for (int i = 0; i < N; i++)
        if (out[i] != r + (uint64_t)i + 1) c->bad = 1;
    } else {
      c->bad = 1;
    }
    ruda_future_free(g);
  }
  ruda_buffer_free(c->dev, c->s, x);
  ruda_buffer_free(c->dev, c->s, y);
  return NULL;
}

/* Six clients on streams sharing two workers, four in place, all reading
 * one shared buffer: every result right. */
static void many_clients_share_workers(void **state) {
  (void)state;
  ruda_device *dev = open_in_place(2);
  ruda_handle shared;
  uint64_t seven[N];
  for (int i = 0; i < N; i++) seven[i] = 7;
  assert_ok(ruda_buffer_create(dev, 0, sizeof seven, &shared));
  test_write(dev, 0, ruda_bind(shared), seven, sizeof seven);
  assert_ok(ruda_sync(dev, 0, NULL));
  client c[6];
  pthread_t t[6];
  for (int i = 0; i < 6; i++) {
    c[i] = (client){dev, (ruda_stream_id)(10 + i), shared, i % 3 != 2, 0};
    assert_int_equal(pthread_create(&t[i], NULL, serve, &c[i]), 0);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    if (c[i].bad) fail_msg("client %d (%s) saw a wrong result or a failure", i, c[i].in_place ? "in place" : "queued");
  }
  assert_ok(ruda_buffer_free(dev, 0, shared));
  test_close(dev);
}

/* ---- user code run in place calls ruda again ----
 * A kernel may issue non-waiting calls (ruda.h), including on the buffers
 * its own command uses and replays of its own graph. Run in place, it runs
 * on the caller's thread: no issue lock of its buffers and no graph issue
 * lock may still be held then, or the nested call waits for its own
 * thread for ever (the ctest timeout reports the hang). */
static ruda_device *nest_dev;
static ruda_handle nest_x;
static ruda_graph *nest_graph;
static atomic_int nest_left;
static int nest_rc[2];

/* x[i] = 10 x[i] + 1, after issuing add1(x) on streams 0 and 1 once: both
 * are ordered after this command, so they see its result. */
static int k_reenter(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  if (atomic_exchange(&nest_left, 0)) {
    ruda_arg a = ruda_arg_buffer(ruda_bind(nest_x));
    nest_rc[0] = test_launch(nest_dev, 0, "add1", &a, 1);
    nest_rc[1] = test_launch(nest_dev, 1, "add1", &a, 1);
  }
  for (int i = 0; i < N; i++) x[i] = x[i] * 10 + 1;
  ran_on = pthread_self();
  return 0;
}

/* x[i] += 1; the first run replays the graph it belongs to on streams 0
 * and 1. */
static int k_replay_self(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  for (int i = 0; i < N; i++) x[i] += 1;
  if (atomic_exchange(&nest_left, 0)) {
    ran_on = pthread_self();
    nest_rc[0] = ruda_graph_replay(nest_dev, 0, nest_graph);
    nest_rc[1] = ruda_graph_replay(nest_dev, 1, nest_graph);
  }
  return 0;
}

static void a_kernel_in_place_launches_on_its_own_buffer(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(2, 0);
  assert_ok(ruda_host_kernel_register(dev, "reenter", k_reenter));
  ruda_handle x = zeroed(dev, 0);
  nest_dev = dev;
  nest_x = x;
  nest_rc[0] = nest_rc[1] = 1;
  atomic_store(&nest_left, 1);
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  test_worker_idle(dev, 0);
  assert_ok(test_launch(dev, 0, "reenter", &a, 1));
  assert_true(pthread_equal(ran_on, pthread_self())); /* it did run in place */
  assert_ok(nest_rc[0]);
  assert_ok(nest_rc[1]);
  /* 0 -> 1 (the kernel) -> 2 -> 3 (the two it issued, after it). */
  assert_ok(ruda_sync(dev, 1, NULL));
  expect_all(dev, 0, x, 3);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void a_graph_run_in_place_replays_its_own_graph(void **state) {
  (void)state;
  ruda_device *dev = open_in_place(2);
  assert_ok(ruda_host_kernel_register(dev, "replay_self", k_replay_self));
  ruda_handle x = zeroed(dev, 0);
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(test_launch(dev, 0, "replay_self", &a, 1));
  assert_ok(ruda_graph_end_capture(dev, 0, &nest_graph));
  nest_dev = dev;
  nest_rc[0] = nest_rc[1] = 1;
  atomic_store(&nest_left, 1);
  test_worker_idle(dev, 0);
  ruda_error *err = NULL;
  assert_ok(ruda_graph_run(dev, 0, nest_graph, &err));
  assert_null(err);
  assert_true(pthread_equal(ran_on, pthread_self()));
  assert_ok(nest_rc[0]);
  assert_ok(nest_rc[1]);
  /* The run and the two replays it issued, one after another. */
  assert_ok(ruda_sync(dev, 1, NULL));
  expect_all(dev, 0, x, 3);
  assert_ok(ruda_graph_destroy(dev, nest_graph));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}


/* ---- held runs (automatic graphs on) ---- */

static uint64_t replayed(ruda_device *dev) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < dev->sched.nworkers; i++) n += atomic_load(&dev->sched.workers[i].auto_cmds);
  return n;
}

/* Requests of two launches and a read, in place: the launches wait for
 * the read and go with it as one automatic graph (counted replayed), each
 * result exact. */
static void a_held_request_replays_as_one_graph(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(2, 1);
  ruda_handle x = zeroed(dev, 0), y = zeroed(dev, 0);
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  const uint64_t two = 2;
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  ruda_arg sc[3] = {ruda_arg_out(ruda_bind(y)), ruda_arg_in(ruda_bind(x)), ruda_arg_scalar(&two, sizeof two)};
  const uint64_t before = replayed(dev);
  for (uint64_t r = 1; r <= 200; r++) {
    assert_ok(test_launch(dev, 0, "add1", &a, 1));
    assert_ok(test_launch(dev, 0, "scale", sc, 3)); /* y = 2 x */
    expect_all(dev, 0, y, 2 * r);
  }
  /* The first sighting is noted, the second records, later ones replay.
   * A run the worker had to issue (this thread descheduled past the hold
   * time, as under a sanitizer) goes one by one and pauses holding on the
   * stream for a while: some requests replay, not all. */
  assert_true(replayed(dev) - before >= 2);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

/* flag(): sets hold_flag and notes its thread; no buffers. */
static atomic_int hold_flag;
static pthread_t flag_on;
static int k_flag(const ruda_host_ctx *c, void *const *args) {
  (void)c, (void)args;
  flag_on = pthread_self();
  atomic_store(&hold_flag, 1);
  return 0;
}

static void wait_flag(void) {
  for (int i = 0; !atomic_load(&hold_flag); i++) {
    assert_true(i < 5000000);
    sched_yield();
  }
}

/* A launch held in place that no wait follows still runs: the worker
 * issues it; the stream's next launches then go at once, in their call. */
static void a_held_launch_without_a_wait_still_runs(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(1, 1);
  assert_ok(ruda_host_kernel_register(dev, "flag", k_flag));
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  ruda__worker *w = &dev->sched.workers[0];
  atomic_store(&hold_flag, 0);
  test_worker_idle(dev, 0);
  assert_ok(test_launch(dev, 0, "flag", NULL, 0));
  /* Held (no wait came) or, had the worker taken exec, queued: either way
   * not run by this thread, and it runs without any call of ours. */
  wait_flag();
  assert_false(pthread_equal(flag_on, pthread_self()));
  /* The miss: launches are no longer held, they run in their call once
   * the worker stopped watching (it then leaves exec alone). */
  for (int i = 0; atomic_load(&w->holding) != 0; i++) {
    assert_true(i < 5000000);
    sched_yield();
  }
  atomic_store(&hold_flag, 0);
  test_worker_idle(dev, 0);
  assert_ok(test_launch(dev, 0, "flag", NULL, 0));
  assert_int_equal(atomic_load(&hold_flag), 1);
  assert_true(pthread_equal(flag_on, pthread_self()));
  assert_ok(ruda_sync(dev, 0, NULL));
  test_close(dev);
}

/* A held run goes before what follows it on its worker: another stream's
 * command queued there, and another worker's command ordered after it. */
static void a_held_run_goes_first(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(2, 1);
  ruda_handle x = zeroed(dev, 0), y = zeroed(dev, 2), z = zeroed(dev, 1);
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  const uint64_t three = 3;
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  for (uint64_t r = 1; r <= 50; r++) {
    test_worker_idle(dev, 0);
    assert_ok(test_launch(dev, 0, "add1", &a, 1)); /* x = r, held */
    assert_ok(test_launch(dev, 0, "add1", &a, 1)); /* x = r + 1... */
    /* Stream 2 shares worker 0 (queued: not in place); stream 1 is on
     * worker 1. Both read x after the held launches. */
    ruda_arg s2[3] = {ruda_arg_out(ruda_bind(y)), ruda_arg_in(ruda_bind(x)), ruda_arg_scalar(&three, sizeof three)};
    assert_ok(test_launch(dev, 2, "scale", s2, 3));
    ruda_arg s1[3] = {ruda_arg_out(ruda_bind(z)), ruda_arg_in(ruda_bind(x)), ruda_arg_scalar(&three, sizeof three)};
    assert_ok(test_launch(dev, 1, "scale", s1, 3));
    expect_all(dev, 2, y, 3 * 2 * r);
    expect_all(dev, 1, z, 3 * 2 * r);
  }
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 2, y));
  assert_ok(ruda_buffer_free(dev, 1, z));
  test_close(dev);
}

/* A buffer freed right after a held launch on it is released only after
 * the launch ran (ASan sees a use after free otherwise), and close issues
 * a run still held. */
static void frees_and_close_wait_for_held_runs(void **state) {
  (void)state;
  ruda_device *dev = open_in_place_as(1, 1);
  assert_ok(ruda_host_kernel_register(dev, "flag", k_flag));
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  for (int r = 0; r < 20; r++) {
    ruda_handle x = zeroed(dev, 0);
    ruda_arg a = ruda_arg_buffer(ruda_bind(x));
    test_worker_idle(dev, 0);
    assert_ok(test_launch(dev, 0, "add1", &a, 1));
    assert_ok(ruda_buffer_free(dev, 0, x));
  }
  atomic_store(&hold_flag, 0);
  test_worker_idle(dev, 0);
  assert_ok(test_launch(dev, 0, "flag", NULL, 0));
  test_close(dev);
  assert_int_equal(atomic_load(&hold_flag), 1);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(commands_run_on_the_caller_while_the_worker_is_idle),
      cmocka_unit_test(a_busy_worker_still_queues),
      cmocka_unit_test(ordered_after_another_streams_writer),
      cmocka_unit_test(failures_reach_the_stream),
      cmocka_unit_test(many_clients_share_workers),
      cmocka_unit_test(a_kernel_in_place_launches_on_its_own_buffer),
      cmocka_unit_test(a_graph_run_in_place_replays_its_own_graph),
      cmocka_unit_test(a_held_request_replays_as_one_graph),
      cmocka_unit_test(a_held_launch_without_a_wait_still_runs),
      cmocka_unit_test(a_held_run_goes_first),
      cmocka_unit_test(frees_and_close_wait_for_held_runs),
  };
  return test_main("unit_in_place", tests, sizeof tests / sizeof tests[0], argc, argv);
}

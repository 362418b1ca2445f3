/* graph.c - graph capture and replay on the host backend: replays rerun
 * what was recorded and nothing runs at capture, replays on other streams
 * are ordered, a graph keeps its buffers' memory, what cannot be recorded
 * is refused, failures name the command, destroy and close with replays
 * and captures in flight. */
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"
#include "u64_kernels.h"
#include "worker_idle.h"

#define N TEST_U64_N

/* add, twice: u64_kernels.h;  set(x, v): x[i] = v */
static int k_set(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0], v = *(const uint64_t *)args[1];
  for (int i = 0; i < N; i++) x[i] = v;
  return 0;
}

static int k_fail(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EGENERIC;
}


static ruda_device *open_graphs(uint32_t streams) {
  ruda_device *dev = test_open(streams, 4096, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "add", test_k_add));
  assert_ok(ruda_host_kernel_register(dev, "twice", test_k_twice));
  assert_ok(ruda_host_kernel_register(dev, "set", k_set));
  assert_ok(ruda_host_kernel_register(dev, "fail", k_fail));
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  atomic_store(&test_gate_open, 1);
  return dev;
}

static int launch1(ruda_device *dev, ruda_stream_id s, const char *k, ruda_handle x, const uint64_t *scalar) {
  ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(scalar, sizeof *scalar)};
  return test_launch(dev, s, k, a, scalar ? 2 : 1);
}

/* A graph of one launch on s: x[i] += 1. */
static ruda_graph *capture_add_one(ruda_device *dev, ruda_stream_id s, ruda_handle x) {
  static const uint64_t one = 1;
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, s));
  assert_ok(launch1(dev, s, "add", x, &one));
  assert_ok(ruda_graph_end_capture(dev, s, &g));
  return g;
}

static void replays_rerun_the_recorded_sequence(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_handle x = test_u64_buffer(dev, 0, 10);
  assert_ok(ruda_sync(dev, 0, NULL));
  const uint64_t three = 3, one = 1;
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "add", x, &three));
  assert_ok(launch1(dev, 0, "twice", x, NULL));
  assert_ok(launch1(dev, 0, "add", x, &one));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 3);
  uint64_t got[N];
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 10 + (uint64_t)i); /* nothing ran */
  for (int r = 0; r < 5; r++) assert_ok(ruda_graph_replay(dev, 0, g));
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) {
    uint64_t v = 10 + (uint64_t)i;
    for (int r = 0; r < 5; r++) v = (v + 3) * 2 + 1;
    assert_int_equal(got[i], v);
  }
  /* Launches after the capture run as usual. */
  assert_ok(launch1(dev, 0, "twice", x, NULL));
  uint64_t again[N];
  test_read(dev, 0, ruda_bind(x), again, sizeof again);
  for (int i = 0; i < N; i++) assert_int_equal(again[i], got[i] * 2);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void replay_on_another_stream_is_ordered(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(4); /* streams 0..3 on workers 0..3 */
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  const uint64_t hundred = 100;
  ruda_graph *g = capture_add_one(dev, 0, x);
  /* Stream 2 will set x, but only once the gate opens... */
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  assert_ok(test_launch(dev, 2, "gate", NULL, 0));
  assert_ok(launch1(dev, 2, "set", x, &hundred));
  /* ...and the replay on stream 3 must follow that set. */
  assert_ok(ruda_graph_replay(dev, 3, g));
  test_wait_count(&test_gate_entered, 1); /* stream 2 is held: x is not set yet */
  atomic_store(&test_gate_open, 1);
  uint64_t got[N];
  test_read(dev, 3, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 101);
  /* And a later use on stream 1 follows the replay. */
  assert_ok(ruda_graph_replay(dev, 3, g));
  assert_ok(launch1(dev, 1, "twice", x, NULL));
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 204);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void graph_keeps_freed_buffers(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  const uint64_t addr_x = ruda__handles_slot(&dev->handles, x.slot)->addr;
  const uint64_t seven = 7;
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "set", x, &seven));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  /* Freed: the handle is dead at once, the memory stays with the graph. */
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_rc(launch1(dev, 0, "set", x, &seven), RUDA_ENOTFOUND);
  ruda_handle y[8];
  const uint64_t zero[N] = {0};
  for (int i = 0; i < 8; i++) {
    assert_ok(ruda_buffer_create(dev, 0, sizeof zero, &y[i]));
    assert_true(ruda__handles_slot(&dev->handles, y[i].slot)->addr != addr_x);
    test_write(dev, 0, ruda_bind(y[i]), zero, sizeof zero);
  }
  assert_ok(ruda_graph_replay(dev, 0, g));
  uint64_t got[N];
  for (int i = 0; i < 8; i++) {
    test_read(dev, 0, ruda_bind(y[i]), got, sizeof got);
    assert_memory_equal(got, zero, sizeof zero);
  }
  ruda_memory_stats u;
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_int_equal(u.nallocs, 9); /* x is still there */
  /* Destroyed: once its replays ran, x's memory is free again. */
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_int_equal(u.nallocs, 8);
  for (int i = 0; i < 8; i++) assert_ok(ruda_buffer_free(dev, 0, y[i]));
  test_close(dev);
}

static void capture_refuses_what_it_cannot_record(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  const uint64_t one = 1;
  ruda_graph *other, *g;
  assert_ok(ruda_graph_begin_capture(dev, 1));
  assert_ok(ruda_graph_end_capture(dev, 1, &other));
  assert_int_equal(ruda_graph_length(other), 0);

  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_rc(ruda_graph_begin_capture(dev, 0), RUDA_EGRAPHSTATE);
  assert_rc(ruda_graph_prepare(dev, 0), RUDA_EGRAPHSTATE);
  uint64_t buf[N] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
  assert_rc(ruda_write(dev, 0, &d, buf, sizeof buf), RUDA_EGRAPHSTATE);
  assert_last_error_contains("capturing");
  ruda_future *f = NULL;
  /* A read is recorded only into staging memory (buf is the stack). */
  assert_rc(ruda_read(dev, 0, &d, buf, sizeof buf, &f), RUDA_EINVAL);
  assert_last_error_contains("ruda_staging_alloc");
  assert_null(f);
  assert_rc(ruda_write_staged(dev, 0, &d, buf, sizeof buf), RUDA_EINVAL);
  assert_rc(ruda_sync(dev, 0, NULL), RUDA_EGRAPHSTATE);
  assert_rc(ruda_sync_async(dev, 0, &f), RUDA_EGRAPHSTATE);
  assert_rc(ruda_graph_replay(dev, 0, other), RUDA_EGRAPHSTATE);
  ruda_handle grid;
  assert_ok(ruda_buffer_create(dev, 0, 12, &grid));
  ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&one, sizeof one)};
  ruda_launch_desc l = {.kernel = "add", .block = {1, 1, 1}, .args = a, .nargs = 2,
                        .flags = RUDA_LAUNCH_INDIRECT, .indirect_grid = ruda_bind(grid)};
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EGRAPHSTATE);
  /* Still capturing: flush works, a dry run is checked and not recorded,
   * other streams run as usual. */
  assert_ok(ruda_flush(dev, 0, NULL));
  l.flags = RUDA_LAUNCH_DRY_RUN;
  l.grid = (ruda_dim3){1, 1, 1};
  assert_ok(ruda_launch(dev, 0, &l));
  assert_ok(launch1(dev, 0, "add", x, &one));
  assert_ok(launch1(dev, 1, "add", x, &one)); /* runs now, on stream 1 */
  uint64_t got[N];
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 1);
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 1);
  ruda_graph *none = (ruda_graph *)&one;
  assert_rc(ruda_graph_end_capture(dev, 0, &none), RUDA_EGRAPHSTATE);
  assert_null(none);
  assert_rc(ruda_graph_abort_capture(dev, 0), RUDA_EGRAPHSTATE);
  assert_rc(ruda_graph_replay(dev, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_graph_destroy(dev, NULL), RUDA_EINVAL);
  assert_rc(ruda_graph_end_capture(dev, 0, NULL), RUDA_EINVAL);

  ruda_device *dev2 = open_graphs(1);
  assert_rc(ruda_graph_replay(dev2, 0, other), RUDA_EINVAL);
  assert_rc(ruda_graph_destroy(dev2, other), RUDA_EINVAL);
  test_close(dev2);

  /* Aborted: what was recorded never runs. */
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "add", x, &one));
  assert_ok(ruda_graph_abort_capture(dev, 0));
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 1);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_graph_destroy(dev, other));
  assert_ok(ruda_buffer_free(dev, 0, grid));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* A request as one graph: upload from a staging block, a kernel, download
 * into another; each replay moves the blocks' current contents. */
static void request_graph_uploads_and_downloads_each_replay(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  uint64_t *in, *out;
  assert_ok(ruda_staging_alloc(dev, N * sizeof *in, (void **)&in));
  assert_ok(ruda_staging_alloc(dev, N * sizeof *out, (void **)&out));
  for (int i = 0; i < N; i++) in[i] = out[i] = 7;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
  ruda_graph *g;
  ruda_future *f = (ruda_future *)&d;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  /* Past the block's end, or a block that is not staging memory: refused,
   * the capture stays open. */
  assert_rc(ruda_write_staged(dev, 0, &d, in + 1, N * sizeof *in), RUDA_EINVAL);
  assert_ok(ruda_write_staged(dev, 0, &d, in, N * sizeof *in));
  assert_ok(launch1(dev, 0, "twice", x, NULL));
  assert_ok(ruda_read(dev, 0, &d, out, N * sizeof *out, &f));
  assert_null(f);
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 3);
  /* Nothing ran at capture. */
  assert_int_equal(out[0], 7);
  assert_rc(ruda_graph_replay_async(dev, 0, g, NULL), RUDA_EINVAL);
  for (uint64_t r = 0; r < 20; r++) {
    for (int i = 0; i < N; i++) in[i] = r * 100 + (uint64_t)i;
    assert_ok(ruda_graph_replay_async(dev, r % 2, g, &f)); /* either stream */
    assert_non_null(f);
    assert_ok(ruda_future_wait(f, NULL));
    ruda_future_free(f);
    for (int i = 0; i < N; i++) assert_int_equal(out[i], 2 * (r * 100 + (uint64_t)i));
  }
  /* The buffer holds the last replay's result; ordinary calls see it. */
  uint64_t got[N];
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * (1900 + (uint64_t)i));
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_staging_free(dev, in));
  assert_ok(ruda_staging_free(dev, out));
  test_close(dev);
}

/* A replay's future carries the stream's errors, as a sync's does. */
static void replay_future_reports_a_failure(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "twice", x, NULL));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  ruda_future *f = NULL;
  assert_ok(ruda_graph_replay_async(dev, 0, g, &f));
  ruda_error *err = NULL;
  assert_rc(ruda_future_wait(f, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  const ruda_error *e = ruda_error_cause(err);
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_EGENERIC);
  assert_contains(ruda_error_message(e), "command 2 (launch of fail)");
  ruda_error_free(err);
  ruda_future_free(f);
  assert_ok(ruda_flush(dev, 0, NULL)); /* handed over by the wait */
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void begin_refuses_an_unhealthy_stream(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  ruda_future *f;
  assert_ok(ruda_sync_async(dev, 0, &f));
  for (int i = 0; ruda_future_poll(f) != 1; i++) {
    assert_true(i < 100000 * (int)test_patience());
    usleep(100);
  }
  ruda_future_free(f);
  assert_rc(ruda_graph_begin_capture(dev, 0), RUDA_EUNHEALTHY);
  ruda_error *errs = NULL;
  assert_rc(ruda_flush(dev, 0, &errs), RUDA_EUNHEALTHY);
  ruda_error_free(errs);
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_graph_abort_capture(dev, 0));
  test_close(dev);
}

static void replay_failure_names_the_command(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  const uint64_t one = 1;
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "add", x, &one));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  assert_ok(launch1(dev, 0, "add", x, &one));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_ok(ruda_graph_replay(dev, 0, g)); /* fire-and-forget */
  ruda_error *errs = NULL;
  assert_rc(ruda_flush(dev, 0, &errs), RUDA_EUNHEALTHY);
  assert_non_null(errs);
  const ruda_error *e = ruda_error_cause(errs); /* errs sums up the stream's list */
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_EGENERIC);
  assert_contains(ruda_error_message(e), "ruda_graph_replay");
  assert_contains(ruda_error_message(e), "command 2 (launch of fail)");
  assert_null(ruda_error_next(e));
  assert_last_error_contains("ruda_graph_replay");
  ruda_error_free(errs);
  /* The replay stopped at the failure: the first add ran, not the last. */
  uint64_t got[N];
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 1);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void destroy_with_replays_queued(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  ruda_graph *g = capture_add_one(dev, 0, x);
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  for (int r = 0; r < 3; r++) assert_ok(ruda_graph_replay(dev, 0, g));
  assert_ok(ruda_graph_destroy(dev, g)); /* the queued replays keep it */
  assert_ok(ruda_buffer_free(dev, 0, x));
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_memory_stats u;
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_int_equal(u.nallocs, 0);
  test_close(dev);
}

static void close_frees_captures_and_graphs(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  const uint64_t one = 1;
  ruda_graph *g = capture_add_one(dev, 1, x); /* never destroyed */
  assert_ok(ruda_graph_replay(dev, 0, g));
  assert_ok(ruda_graph_prepare(dev, 0));
  assert_ok(ruda_graph_begin_capture(dev, 0)); /* left open */
  assert_ok(launch1(dev, 0, "add", x, &one));
  test_close(dev); /* ASan: nothing leaks */
}

typedef struct racer {
  ruda_device *dev;
  ruda_graph *shared, *own;
  ruda_stream_id s;
} racer;

static void *replay_many(void *p) {
  racer *r = p;
  for (int i = 0; i < 200; i++) {
    if (ruda_graph_replay(r->dev, 0, r->shared) != 0) return (void *)1;
    if (ruda_graph_replay(r->dev, r->s, r->own) != 0) return (void *)1;
  }
  return NULL;
}

/* Four threads replay one shared graph on one shared stream (its queue
 * orders them: no increment lost) and each its own graph on its own
 * stream, all at once: references, recordings and replays are safe to
 * share between threads. */
/* Four threads on dev, even ones running even(), odd ones odd(), each
 * with its racer (the shared graph on stream 0, its own on stream i + 1):
 * every increment counted once. */
static void race(ruda_device *dev, void *(*even)(void *), void *(*odd)(void *)) {
  ruda_handle x = test_u64_buffer(dev, 0, 0), y[4];
  ruda_graph *g = capture_add_one(dev, 0, x), *own[4];
  for (int i = 0; i < 4; i++) {
    ruda_stream_id s = (ruda_stream_id)i + 1;
    y[i] = test_u64_buffer(dev, s, 0);
    own[i] = capture_add_one(dev, s, y[i]);
  }
  pthread_t t[4];
  racer r[4];
  for (int i = 0; i < 4; i++) {
    r[i] = (racer){dev, g, own[i], (ruda_stream_id)i + 1};
    pthread_create(&t[i], NULL, i % 2 ? odd : even, &r[i]);
  }
  for (int i = 0; i < 4; i++) {
    void *rc;
    pthread_join(t[i], &rc);
    assert_null(rc);
  }
  uint64_t got[N];
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 800);
  for (int k = 0; k < 4; k++) {
    test_read(dev, (ruda_stream_id)k + 1, ruda_bind(y[k]), got, sizeof got);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 200);
    assert_ok(ruda_graph_destroy(dev, own[k]));
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)k + 1, y[k]));
  }
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
}

static void replays_race_from_threads(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(5);
  race(dev, replay_many, replay_many);
  test_close(dev);
}

/* A kernel that bumps a counter outside any buffer, not atomically: two
 * runs at once lose an update. */
static uint64_t bumps;
static int k_bump(const ruda_host_ctx *c, void *const *args) {
  (void)c, (void)args;
  uint64_t v = bumps;
  usleep(20);
  bumps = v + 1;
  return 0;
}

typedef struct bumper {
  ruda_device *dev;
  ruda_graph *g;
  ruda_stream_id s;
} bumper;

static void *replay_bumps(void *p) {
  bumper *b = p;
  for (int i = 0; i < 100; i++)
    if (ruda_graph_replay(b->dev, b->s, b->g) != 0) return (void *)1;
  return NULL;
}

/* Replays of one graph run one after another, whatever streams they are
 * issued on, even when nothing they touch orders them (the graph only
 * reads its buffer). */
static void replays_of_one_graph_never_overlap(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(3);
  assert_ok(ruda_host_kernel_register(dev, "bump", k_bump));
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  ruda_arg a = ruda_arg_in(ruda_bind(x));
  assert_ok(test_launch(dev, 0, "bump", &a, 1));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  bumps = 0;
  pthread_t t[2];
  bumper b[2] = {{dev, g, 1}, {dev, g, 2}};
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, replay_bumps, &b[i]);
  for (int i = 0; i < 2; i++) {
    void *rc;
    pthread_join(t[i], &rc);
    assert_null(rc);
  }
  for (ruda_stream_id s = 0; s < 3; s++) assert_ok(ruda_sync(dev, s, NULL));
  assert_int_equal(bumps, 200);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* ---- ruda_graph_run ---- */

/* where(x): x[i] += 1, and notes the thread it ran on. Read by the test
 * after the run returned (the run's completion orders it). */
static pthread_t ran_on;
static int k_where(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  for (int i = 0; i < N; i++) x[i] += 1;
  ran_on = pthread_self();
  return 0;
}

static ruda_graph *capture_where(ruda_device *dev, ruda_stream_id s, ruda_handle x) {
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, s));
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(test_launch(dev, s, "where", &a, 1));
  assert_ok(ruda_graph_end_capture(dev, s, &g));
  return g;
}

typedef struct runner {
  ruda_device *dev;
  ruda_graph *g;
  ruda_stream_id s;
  int rc;
  pthread_t self;
  atomic_int done;
  _Atomic pid_t tid;
} runner;

static void *run_once(void *p) {
  runner *r = p;
  atomic_store(&r->tid, test_tid());
  r->self = pthread_self();
  r->rc = ruda_graph_run(r->dev, r->s, r->g, NULL);
  atomic_store(&r->done, 1);
  return NULL;
}

/* With the worker idle the caller issues the replay itself; with the
 * worker busy the replay queues behind what it runs, and runs there. */
static void run_issues_in_place_only_when_the_worker_is_idle(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  assert_ok(ruda_host_kernel_register(dev, "where", k_where));
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_graph *g = capture_where(dev, 0, x);
  test_worker_idle(dev, 0);
  for (int r = 0; r < 10; r++) {
    ruda_error *err = (ruda_error *)1;
    assert_ok(ruda_graph_run(dev, 0, g, &err));
    assert_null(err);
    assert_true(pthread_equal(ran_on, pthread_self()));
  }
  /* The worker is held by a closed gate: the run waits for it. */
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  runner rn = {.dev = dev, .g = g, .s = 0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_once, &rn), 0);
  while (atomic_load(&rn.tid) == 0) sched_yield();
  test_wait_blocked(atomic_load(&rn.tid)); /* the run waits, as it must */
  assert_int_equal(atomic_load(&rn.done), 0);
  atomic_store(&test_gate_open, 1);
  pthread_join(t, NULL);
  assert_ok(rn.rc);
  assert_false(pthread_equal(ran_on, rn.self));
  assert_false(pthread_equal(ran_on, pthread_self()));
  uint64_t got[N];
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 11);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* Bad input is refused at the call; a failure in place is reported as the
 * worker would have: the run's code, the stream's errors handed back. */
static void run_reports_failures_and_refuses_bad_input(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(2);
  ruda_error *err = (ruda_error *)1;
  assert_rc(ruda_graph_run(dev, 0, NULL, &err), RUDA_EINVAL);
  assert_null(err);
  assert_rc(ruda_graph_run(NULL, 0, NULL, NULL), RUDA_EINVAL);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(launch1(dev, 0, "twice", x, NULL));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_ok(ruda_sync(dev, 0, NULL));
  test_worker_idle(dev, 0);
  assert_rc(ruda_graph_run(dev, 0, g, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  const ruda_error *e = ruda_error_cause(err);
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_EGENERIC);
  assert_contains(ruda_error_message(e), "command 2 (launch of fail)");
  ruda_error_free(err);
  assert_ok(ruda_flush(dev, 0, NULL)); /* handed over by the run */
  assert_ok(ruda_graph_begin_capture(dev, 1));
  assert_rc(ruda_graph_run(dev, 1, g, NULL), RUDA_EGRAPHSTATE);
  assert_ok(ruda_graph_abort_capture(dev, 1));
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* A run after a writer on another worker waits for it (it does not run in
 * place over the writer), and later uses follow the run. */
static void run_follows_a_writer_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(4);
  assert_ok(ruda_host_kernel_register(dev, "where", k_where));
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_graph *g = capture_where(dev, 0, x);
  const uint64_t hundred = 100;
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 2, "gate", NULL, 0));
  assert_ok(launch1(dev, 2, "set", x, &hundred));
  runner rn = {.dev = dev, .g = g, .s = 3};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_once, &rn), 0);
  while (atomic_load(&rn.tid) == 0) sched_yield();
  test_wait_blocked(atomic_load(&rn.tid)); /* the run waits, as it must */
  assert_int_equal(atomic_load(&rn.done), 0);
  atomic_store(&test_gate_open, 1);
  pthread_join(t, NULL);
  assert_ok(rn.rc);
  assert_ok(launch1(dev, 1, "twice", x, NULL));
  uint64_t got[N];
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 202);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static void *run_many(void *p) {
  racer *r = p;
  for (int i = 0; i < 200; i++) {
    if (ruda_graph_run(r->dev, 0, r->shared, NULL) != 0) return (void *)1;
    if (ruda_graph_run(r->dev, r->s, r->own, NULL) != 0) return (void *)1;
  }
  return NULL;
}

/* Runs in place and replays through the queue, from four threads at once
 * on a shared stream and on streams sharing workers: every increment is
 * counted once, whoever ran it. */
static void runs_and_replays_race_from_threads(void **state) {
  (void)state;
  ruda_device *dev = test_open(3, 4096, RUDA_BACKPRESSURE_BLOCK); /* five streams on three workers */
  assert_ok(ruda_host_kernel_register(dev, "add", test_k_add));
  race(dev, replay_many, run_many);
  test_close(dev);
}

static void prepare_routes_to_the_persistent_pool(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  ruda_handle a, b;
  assert_ok(ruda_graph_prepare(dev, 0));
  assert_rc(ruda_graph_prepare(dev, 0), RUDA_EGRAPHSTATE);
  assert_ok(ruda_buffer_create(dev, 0, 1000, &a)); /* persistent */
  assert_ok(ruda_graph_begin_capture(dev, 0));
  ruda_graph *g;
  assert_ok(ruda_graph_end_capture(dev, 0, &g)); /* the mode ends here */
  assert_ok(ruda_buffer_create(dev, 0, 1000, &b)); /* pooled */
  ruda_pool_report rep[RUDA_MEMORY_MAX_POOLS + 1];
  uint32_t n = 0;
  assert_ok(ruda_memory_report(dev, 0, rep, RUDA_MEMORY_MAX_POOLS + 1, &n));
  uint64_t persistent = 0, pooled = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (rep[i].kind == RUDA_POOL_PERSISTENT) persistent += rep[i].nallocs;
    else pooled += rep[i].nallocs;
  }
  assert_int_equal(persistent, 1);
  assert_int_equal(pooled, 1);
  assert_rc(ruda_memory_mode_pop(dev, 0), RUDA_EINVAL); /* nothing left pushed */
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, a));
  assert_ok(ruda_buffer_free(dev, 0, b));
  test_close(dev);
}

/* The thread's own stream (RUDA_STREAM_CURRENT, the README's way) can be
 * prepared too: its id is a reserved one, never to be passed on as is. */
static void prepare_on_the_current_stream(void **state) {
  (void)state;
  ruda_device *dev = open_graphs(1);
  const ruda_stream_id cur = RUDA_STREAM_CURRENT;
  ruda_handle a;
  assert_ok(ruda_graph_prepare(dev, cur));
  assert_ok(ruda_buffer_create(dev, cur, 1000, &a)); /* persistent */
  assert_ok(ruda_graph_begin_capture(dev, cur));
  ruda_graph *g;
  assert_ok(ruda_graph_end_capture(dev, cur, &g)); /* the mode ends here */
  ruda_pool_report rep[RUDA_MEMORY_MAX_POOLS + 1];
  uint32_t n = 0;
  assert_ok(ruda_memory_report(dev, cur, rep, RUDA_MEMORY_MAX_POOLS + 1, &n));
  uint64_t persistent = 0;
  for (uint32_t i = 0; i < n; i++)
    if (rep[i].kind == RUDA_POOL_PERSISTENT) persistent += rep[i].nallocs;
  assert_int_equal(persistent, 1);
  assert_rc(ruda_memory_mode_pop(dev, cur), RUDA_EINVAL); /* nothing left pushed */
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, cur, a));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(replays_rerun_the_recorded_sequence),
      cmocka_unit_test(replay_on_another_stream_is_ordered),
      cmocka_unit_test(graph_keeps_freed_buffers),
      cmocka_unit_test(capture_refuses_what_it_cannot_record),
      cmocka_unit_test(request_graph_uploads_and_downloads_each_replay),
      cmocka_unit_test(replay_future_reports_a_failure),
      cmocka_unit_test(begin_refuses_an_unhealthy_stream),
      cmocka_unit_test(replay_failure_names_the_command),
      cmocka_unit_test(destroy_with_replays_queued),
      cmocka_unit_test(close_frees_captures_and_graphs),
      cmocka_unit_test(replays_race_from_threads),
      cmocka_unit_test(replays_of_one_graph_never_overlap),
      cmocka_unit_test(run_issues_in_place_only_when_the_worker_is_idle),
      cmocka_unit_test(run_reports_failures_and_refuses_bad_input),
      cmocka_unit_test(run_follows_a_writer_on_another_stream),
      cmocka_unit_test(runs_and_replays_race_from_threads),
      cmocka_unit_test(prepare_routes_to_the_persistent_pool),
      cmocka_unit_test(prepare_on_the_current_stream),
  };
  return test_main("unit_graph", tests, sizeof tests / sizeof tests[0], argc, argv);
}

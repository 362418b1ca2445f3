/* auto_graph.c - automatic request graphs on the host backend
 * (cfg.auto_graphs, scheduler/auto_graph.c): runs of one stream's
 * launches and copies queued behind a busy worker are replayed as graphs
 * with what changed patched in, and give the same results, the same
 * errors (messages included) and the same cross-stream order as with the
 * feature off; observed workers and RUDA_LAUNCH_BLOCKING keep it off. */
#include <unistd.h>

#include "common.h"
#include "scheduler/auto_graph.h"
#include "src/device.h"

#define N 16

static int k_addk(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0], k = *(const uint64_t *)args[1];
  for (int i = 0; i < N; i++) x[i] = x[i] * 3 + k;
  return 0;
}

/* Fails when its scalar is odd. */
static int k_check(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  return (*(const uint64_t *)args[1] & 1) ? RUDA_EGENERIC : 0;
}

static int k_nap(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  usleep(20000);
  return 0;
}

static ruda_device *open_auto(int on, uint32_t streams) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = streams;
  cfg.lanes = test_lanes(streams);
  cfg.log_level = RUDA_LOG_OFF;
  cfg.auto_graphs = on;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&cfg, &dev));
  const ruda_host_param bk[2] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 8}};
  assert_ok(ruda_host_kernel_register_typed(dev, "addk", k_addk, bk, 2));
  assert_ok(ruda_host_kernel_register_typed(dev, "check", k_check, bk, 2));
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "nap", k_nap));
  return dev;
}

static uint64_t auto_cmds(ruda_device *dev) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < dev->sched.nworkers; i++) n += atomic_load(&dev->sched.workers[i].auto_cmds);
  return n;
}

static void addk(ruda_device *dev, ruda_stream_id s, ruda_handle x, uint64_t k) {
  ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&k, sizeof k)};
  assert_ok(test_launch(dev, s, "addk", a, 2));
}

/* One script, the same on both devices: behind a gate on the worker,
 * requests on rotating buffer sets (every other one writes x first; addk
 * x, addk x, copy y <- x, addk y, check y, then a read of y), a failing
 * check now and then, a stream
 * that writes a buffer the others then use. Returns every byte read and
 * every error message, in order, into out (NUL-separated), the bytes
 * and the messages apart. */
/* What a run saw: the bytes of every read, and each stream's errors in
 * the order they came back (which wait hands an error back depends on
 * timing; the errors of a stream and their order do not). */
typedef struct trail {
  char data[1 << 17], errs[3][1 << 15];
  size_t ndata, nerrs[3];
} trail;

static void note_error(trail *t, const ruda_error *e) {
  const char *m = ruda_error_message(e);
  uint64_t s = ruda_error_stream(e);
  assert_true(s < 3);
  assert_true(t->nerrs[s] + strlen(m) + 16 < sizeof t->errs[s]);
  t->nerrs[s] += (size_t)snprintf(t->errs[s] + t->nerrs[s], sizeof t->errs[s] - t->nerrs[s], "%d %s",
                                  ruda_error_code(e), m) + 1;
}

static void script(int on, trail *t, uint64_t *replayed) {
  ruda_device *dev = open_auto(on, 2); /* streams 0, 2 share worker 0; 1 is worker 1 */
  ruda_handle x[3], y[3];
  const uint64_t zero[N] = {0};
  for (int i = 0; i < 3; i++) {
    assert_ok(ruda_buffer_create(dev, 0, sizeof zero, &x[i]));
    assert_ok(ruda_buffer_create(dev, 0, sizeof zero, &y[i]));
    test_write(dev, 0, ruda_bind(x[i]), zero, sizeof zero);
    test_write(dev, 0, ruda_bind(y[i]), zero, sizeof zero);
  }
  assert_ok(ruda_sync(dev, 0, NULL));
  memset(t->nerrs, 0, sizeof t->nerrs);
  t->ndata = 0;
  unsigned seed = 7;
  for (int round = 0; round < 6; round++) {
    /* Stream 1 writes x[2] first: the requests using it wait for that. */
    atomic_store(&test_gate_open, 0);
    assert_ok(test_launch(dev, 1, "gate", NULL, 0));
    addk(dev, 1, x[2], 1000 + (uint64_t)round);
    assert_ok(test_launch(dev, 0, "gate", NULL, 0));
    ruda_future *f[8];
    uint64_t got[8][N];
    for (int r = 0; r < 8; r++) {
      const int j = (int)(rand_r(&seed) % 3);
      const ruda_stream_id s = (r % 3 == 2) ? 2 : 0;
      if (r % 2 == 0) { /* a write in the run: its staged block moves by a fix */
        uint64_t in[N];
        for (int i = 0; i < N; i++) in[i] = (uint64_t)(round * 100 + r + i);
        test_write(dev, s, ruda_bind(x[j]), in, sizeof in);
      }
      addk(dev, s, x[j], (uint64_t)rand_r(&seed) % 50);
      addk(dev, s, x[j], 7);
      assert_ok(ruda_copy(dev, s, ruda_bind(y[j]), ruda_bind(x[j])));
      addk(dev, s, y[j], (uint64_t)r);
      uint64_t v = (rand_r(&seed) % 5 == 0) ? 1 : 2; /* odd: fails */
      ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(y[j])), ruda_arg_scalar(&v, sizeof v)};
      assert_ok(test_launch(dev, s, "check", a, 2));
      ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(y[j]));
      assert_ok(ruda_read(dev, s, &d, got[r], sizeof got[r], &f[r]));
    }
    atomic_store(&test_gate_open, 1);
    for (int r = 0; r < 8; r++) {
      ruda_error *err = NULL;
      int rc = ruda_future_wait(f[r], &err);
      ruda_future_free(f[r]);
      assert_true(t->ndata + sizeof got[r] <= sizeof t->data);
      memcpy(t->data + t->ndata, got[r], sizeof got[r]);
      t->ndata += sizeof got[r];
      /* Which wait hands an error back depends on timing; the errors and
       * their order do not. */
      assert_true(rc == 0 || rc == RUDA_EUNHEALTHY);
      for (const ruda_error *e = ruda_error_cause(err); e != NULL; e = ruda_error_next(e)) note_error(t, e);
      ruda_error_free(err);
    }
  }
  ruda_error *rest = NULL;
  (void)ruda_device_sync(dev, &rest);
  for (const ruda_error *e = rest; e != NULL; e = ruda_error_next(e))
    for (const ruda_error *c = ruda_error_cause(e); c != NULL; c = ruda_error_next(c)) note_error(t, c);
  ruda_error_free(rest);
  *replayed = auto_cmds(dev);
  for (int i = 0; i < 3; i++) {
    assert_ok(ruda_buffer_free(dev, 0, x[i]));
    assert_ok(ruda_buffer_free(dev, 0, y[i]));
  }
  test_close(dev);
}

static void same_results_errors_and_order_as_one_by_one(void **state) {
  (void)state;
  static trail off, on;
  uint64_t r_off = 0, r_on = 0;
  script(0, &off, &r_off);
  script(1, &on, &r_on);
  assert_int_equal(r_off, 0);
  assert_true(r_on > 100); /* most runs went as graphs */
  assert_int_equal(on.ndata, off.ndata);
  assert_memory_equal(on.data, off.data, off.ndata);
  for (int st = 0; st < 3; st++) {
    assert_int_equal(on.nerrs[st], off.nerrs[st]);
    assert_memory_equal(on.errs[st], off.errs[st], off.nerrs[st]);
  }
  /* The failures are there, named as the command that failed. */
  assert_non_null(memmem(on.errs[0], on.nerrs[0], "ruda_launch \"check\" (stream 0, command #", 40));
  assert_non_null(memmem(on.errs[2], on.nerrs[2], "ruda_launch \"check\" (stream 2, command #", 40));
}

/* Observed workers and RUDA_LAUNCH_BLOCKING issue each command alone. */
static void observed_or_blocking_workers_keep_each_command(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    if (mode == 0) setenv("RUDA_WORKER_STATS", "1", 1);
    ruda_config cfg;
    ruda_config_init(&cfg);
    cfg.backend = RUDA_BACKEND_HOST;
    cfg.num_streams = 1;
    cfg.log_level = RUDA_LOG_OFF;
    cfg.auto_graphs = 1;
    cfg.launch_blocking = mode == 1;
    ruda_device *dev = NULL;
    assert_ok(ruda_device_open(&cfg, &dev)); /* workers read RUDA_WORKER_STATS as they start */
    const ruda_host_param bk[2] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 8}};
    assert_ok(ruda_host_kernel_register_typed(dev, "addk", k_addk, bk, 2));
    assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
    ruda_handle x;
    assert_ok(ruda_buffer_create(dev, 0, N * 8, &x));
    atomic_store(&test_gate_open, 0);
    assert_ok(test_launch(dev, 0, "gate", NULL, 0));
    for (int r = 0; r < 10; r++) {
      addk(dev, 0, x, 1);
      addk(dev, 0, x, 2);
      ruda_future *f = NULL; /* a wait point between the runs */
      assert_ok(ruda_sync_async(dev, 0, &f));
      ruda_future_free(f);
    }
    atomic_store(&test_gate_open, 1);
    assert_ok(ruda_sync(dev, 0, NULL));
    assert_int_equal(auto_cmds(dev), 0);
    assert_ok(ruda_buffer_free(dev, 0, x));
    test_close(dev);
    unsetenv("RUDA_WORKER_STATS");
  }
}

/* The switch: RUDA_AUTO_GRAPHS, off by default. */
static void the_environment_turns_it_on(void **state) {
  (void)state;
  ruda_config cfg;
  unsetenv("RUDA_AUTO_GRAPHS");
  ruda_config_init(&cfg);
  assert_int_equal(cfg.auto_graphs, -1); /* the backend's choice */
  setenv("RUDA_AUTO_GRAPHS", "1", 1);
  ruda_config_init(&cfg);
  assert_int_equal(cfg.auto_graphs, 1);
  setenv("RUDA_AUTO_GRAPHS", "0", 1);
  ruda_config_init(&cfg);
  assert_int_equal(cfg.auto_graphs, 0);
  unsetenv("RUDA_AUTO_GRAPHS");
}

/* One request queued whole behind a nap on stream 1 (which shares worker 0,
 * so the worker takes the run in one batch): x zeroed, len launches of
 * addk with k = i + add, a read; the bytes read are checked. No gate: a
 * gate's flag would order the pushes for TSan. */
static void queued_request_on(ruda_device *dev, ruda_stream_id s, ruda_handle x, uint32_t len, uint64_t add) {
  uint64_t want[N] = {0};
  test_write(dev, s, ruda_bind(x), want, sizeof want);
  assert_ok(test_launch(dev, 1, "nap", NULL, 0));
  for (uint32_t i = 0; i < len; i++) {
    addk(dev, s, x, i + add);
    for (int j = 0; j < N; j++) want[j] = want[j] * 3 + i + add;
  }
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
  uint64_t got[N];
  ruda_future *f;
  assert_ok(ruda_read(dev, s, &d, got, sizeof got, &f));
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  for (int j = 0; j < N; j++) assert_int_equal(got[j], want[j]);
}

static void queued_request(ruda_device *dev, ruda_handle x, uint32_t len, uint64_t add) {
  queued_request_on(dev, 0, x, len, add);
}

/* Runs of 15, 16 and 17 launches, each ended by a read: a run stops at
 * RUDA__AUTO_MAX commands, and the command after it (the 17th, a launch or
 * the read) is looked at like the others, after the client that pushed it
 * (TSan sees each node published before it is read). Results match the
 * arithmetic; the second and later sightings replay. */
static void runs_at_the_length_limit(void **state) {
  (void)state;
  ruda_device *dev = open_auto(1, 1);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, N * sizeof(uint64_t), &x));
  for (uint32_t len = RUDA__AUTO_MAX - 1; len <= RUDA__AUTO_MAX + 1; len++) {
    for (int round = 0; round < 4; round++) queued_request(dev, x, len, (uint64_t)round);
  }
  assert_true(auto_cmds(dev) > 0);
  /* Replays come from templates, one per shape (three lengths here), each
   * made at a shape's second sighting. */
  uint64_t templates = 0;
  for (uint32_t i = 0; i < dev->sched.nworkers; i++) templates += atomic_load(&dev->sched.workers[i].auto_templates);
  assert_true(templates >= 1 && templates <= 3);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static uint64_t worker_sum(ruda_device *dev, size_t off) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < dev->sched.nworkers; i++)
    n += atomic_load((_Atomic uint64_t *)((char *)&dev->sched.workers[i] + off));
  return n;
}

/* Seven shapes (runs of 2..8 launches) taking turns on one worker keep a
 * template each: none pushes another out, whatever their signatures hash
 * to (the direct-mapped cache this replaced lost templates to clashes in
 * most processes), and each replays from its second sighting on. */
static void shapes_taking_turns_keep_their_templates(void **state) {
  (void)state;
  ruda_device *dev = open_auto(1, 1);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, N * sizeof(uint64_t), &x));
  for (int round = 0; round < 5; round++) {
    for (uint32_t len = 2; len <= 8; len++) queued_request(dev, x, len, 0);
  }
  const uint64_t templates = worker_sum(dev, offsetof(ruda__worker, auto_templates));
  const uint64_t replaced = worker_sum(dev, offsetof(ruda__worker, auto_replaced));
  /* A batch cut by a late nap can add a stray shape: the eighth way. */
  assert_int_equal(replaced, 0);
  assert_true(templates >= 7 && templates <= 8);
  assert_true(auto_cmds(dev) >= 4 * (2 + 3 + 4 + 5 + 6 + 7 + 8) - 8 * 5);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}


/* Streams sharing a lane (ids 0, 16, 32, ... of one worker of 16 lanes)
 * keep a template each of one shape, rather than patch one graph back and
 * forth between their buffers; past the cache's ways, the streams left
 * over replay another stream's template instead of pushing one out. */
static void streams_sharing_a_lane_keep_their_own_templates(void **state) {
  (void)state;
  ruda_device *dev = open_auto(1, 1);
  enum { S = 20 };
  ruda_handle x[S];
  for (int k = 0; k < S; k++) assert_ok(ruda_buffer_create(dev, 0, N * sizeof(uint64_t), &x[k]));
  for (int round = 0; round < 4; round++)
    for (int k = 0; k < 2; k++) queued_request_on(dev, (ruda_stream_id)(16 * k), x[k], 3, (uint64_t)round);
  uint64_t templates = worker_sum(dev, offsetof(ruda__worker, auto_templates));
  assert_true(templates >= 2 && templates <= 3); /* a batch cut by a late nap: one stray */
  assert_true(auto_cmds(dev) > 0);
  const uint64_t replayed = auto_cmds(dev);
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < S; k++) queued_request_on(dev, (ruda_stream_id)(16 * k), x[k], 3, (uint64_t)round);
  templates = worker_sum(dev, offsetof(ruda__worker, auto_templates));
  assert_true(templates >= 3 && templates <= 16);
  assert_int_equal(worker_sum(dev, offsetof(ruda__worker, auto_replaced)), 0);
  /* Every stream's requests after its first replayed (4 commands each):
   * the leftover ones from the first, on a shared template. */
  assert_true(auto_cmds(dev) - replayed >= (uint64_t)(S * 2 - 4) * 4);
  for (int k = 0; k < S; k++) assert_ok(ruda_buffer_free(dev, 0, x[k]));
  test_close(dev);
}

/* The tail of a request a batch boundary split (its first launch run
 * alone, the rest queued behind a gate) is no run: it never makes a
 * template (its capture would cost what a whole request's does, for a
 * shape that seldom comes back). The same request queued whole replays. */
static void split_requests_make_no_templates(void **state) {
  (void)state;
  ruda_device *dev = open_auto(1, 1);
  ruda__worker *w = &dev->sched.workers[0];
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, N * sizeof(uint64_t), &x));
  uint64_t want[N] = {0};
  test_write(dev, 0, ruda_bind(x), want, sizeof want);
  assert_ok(ruda_sync(dev, 0, NULL));
  for (int r = 0; r < 6; r++) {
    addk(dev, 0, x, 1); /* run alone: the worker is idle */
    for (int i = 0; atomic_load(&w->done) != atomic_load(&w->tickets); i++) {
      assert_true(i < 5000000);
      sched_yield();
    }
    atomic_store(&test_gate_open, 0);
    atomic_store(&test_gate_entered, 0);
    assert_ok(test_launch(dev, 1, "gate", NULL, 0)); /* stream 1 shares worker 0 */
    test_wait_count(&test_gate_entered, 1);
    addk(dev, 0, x, 2);
    addk(dev, 0, x, 3);
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
    uint64_t got[N];
    ruda_future *f;
    assert_ok(ruda_read(dev, 0, &d, got, sizeof got, &f));
    atomic_store(&test_gate_open, 1);
    assert_ok(ruda_future_wait(f, NULL));
    ruda_future_free(f);
    for (int j = 0; j < N; j++) want[j] = ((want[j] * 3 + 1) * 3 + 2) * 3 + 3;
    for (int j = 0; j < N; j++) assert_int_equal(got[j], want[j]);
  }
  assert_int_equal(worker_sum(dev, offsetof(ruda__worker, auto_templates)), 0);
  assert_int_equal(auto_cmds(dev), 0);
  /* Whole, behind a nap: replayed from the second sighting on. */
  for (int r = 0; r < 4; r++) queued_request(dev, x, 3, 0);
  assert_true(auto_cmds(dev) > 0);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(same_results_errors_and_order_as_one_by_one),
    cmocka_unit_test(observed_or_blocking_workers_keep_each_command),
    cmocka_unit_test(the_environment_turns_it_on),
    cmocka_unit_test(runs_at_the_length_limit),
    cmocka_unit_test(shapes_taking_turns_keep_their_templates),
    cmocka_unit_test(streams_sharing_a_lane_keep_their_own_templates),
    cmocka_unit_test(split_requests_make_no_templates),
};

TEST_MAIN("auto_graph", tests)

/* config.c - configuration from defaults, RUDA_* variables and the caller;
 * invalid settings refused; stream ids and their workers. */
#include <pthread.h>

#include "common.h"

static const char *const vars[] = {"RUDA_BACKEND",   "RUDA_DEVICE", "RUDA_STREAMS",      "RUDA_QUEUE_BOUND",
                                   "RUDA_BACKPRESSURE", "RUDA_LOG", "RUDA_BOUNDS_CHECK", "RUDA_CACHE_DIR",
                                   "RUDA_SPIN_US", "RUDA_AUTO_GRAPHS", "RUDA_LAUNCH_BLOCKING"};

static int clear_env(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  return 0;
}

static void defaults(void **state) {
  (void)state;
  ruda_config cfg;
  memset(&cfg, 0xff, sizeof cfg);
  ruda_config_init(&cfg);
  assert_int_equal(cfg.size, sizeof cfg);
  assert_int_equal(cfg.backend, RUDA_BACKEND_AUTO);
  assert_int_equal(cfg.device_ordinal, 0);
  assert_int_equal(cfg.num_streams, 8);
  assert_int_equal(cfg.queue_bound, 65536);
  assert_int_equal(cfg.backpressure, RUDA_BACKPRESSURE_BLOCK);
  assert_int_equal(cfg.log_level, RUDA_LOG_WARN);
  assert_int_equal(cfg.bounds_checked, 0);
  assert_null(cfg.cache_dir);
  ruda_config_init(NULL); /* harmless */
  assert_string_equal(ruda_version(), RUDA_VERSION_STRING);
  assert_int_equal(ruda_version_number(), RUDA_VERSION_NUMBER);
  assert_int_equal(RUDA_VERSION_NUMBER, RUDA_VERSION_MAJOR * 10000 + RUDA_VERSION_MINOR * 100 + RUDA_VERSION_PATCH);
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", RUDA_VERSION_MAJOR, RUDA_VERSION_MINOR, RUDA_VERSION_PATCH);
  assert_string_equal(ruda_version(), v);
  assert_string_equal(ruda_version_string(), v); /* 0.1.0's name for it */
}

static void environment_applies(void **state) {
  (void)state;
  setenv("RUDA_BACKEND", "HOST", 1); /* case does not matter */
  setenv("RUDA_DEVICE", "2", 1);
  setenv("RUDA_STREAMS", "3", 1);
  setenv("RUDA_QUEUE_BOUND", "17", 1);
  setenv("RUDA_BACKPRESSURE", "error", 1);
  setenv("RUDA_LOG", "debug", 1);
  setenv("RUDA_BOUNDS_CHECK", "1", 1);
  setenv("RUDA_CACHE_DIR", "/tmp/ruda-test-cache", 1);
  ruda_config cfg;
  ruda_config_init(&cfg);
  assert_int_equal(cfg.backend, RUDA_BACKEND_HOST);
  assert_int_equal(cfg.device_ordinal, 2);
  assert_int_equal(cfg.num_streams, 3);
  assert_int_equal(cfg.queue_bound, 17);
  assert_int_equal(cfg.backpressure, RUDA_BACKPRESSURE_ERROR);
  assert_int_equal(cfg.log_level, RUDA_LOG_DEBUG);
  assert_int_equal(cfg.bounds_checked, 1);
  assert_string_equal(cfg.cache_dir, "/tmp/ruda-test-cache");

  setenv("RUDA_BACKEND", "cuda", 1);
  setenv("RUDA_BACKPRESSURE", "BLOCK", 1);
  setenv("RUDA_LOG", "off", 1);
  setenv("RUDA_BOUNDS_CHECK", "0", 1);
  setenv("RUDA_CACHE_DIR", "", 1); /* "" disables the disk cache */
  ruda_config_init(&cfg);
  assert_int_equal(cfg.backend, RUDA_BACKEND_CUDA);
  assert_int_equal(cfg.backpressure, RUDA_BACKPRESSURE_BLOCK);
  assert_int_equal(cfg.log_level, RUDA_LOG_OFF);
  assert_int_equal(cfg.bounds_checked, 0);
  assert_string_equal(cfg.cache_dir, "");
  /* Fields set after init win over the environment. */
  cfg.num_streams = 2;
  cfg.backend = RUDA_BACKEND_HOST;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&cfg, &dev));
  assert_int_equal(ruda_device_num_streams(dev), 2);
  assert_string_equal(ruda_device_backend(dev), "host");
  test_close(dev);
}

static void malformed_environment_is_ignored(void **state) {
  (void)state;
  setenv("RUDA_BACKEND", "gpu", 1);
  setenv("RUDA_STREAMS", "three", 1);
  setenv("RUDA_QUEUE_BOUND", "-5", 1);
  setenv("RUDA_BACKPRESSURE", "drop", 1);
  setenv("RUDA_LOG", "verbose", 1);
  setenv("RUDA_DEVICE", "1x", 1);
  ruda_config cfg;
  ruda_config_init(&cfg);
  assert_int_equal(cfg.backend, RUDA_BACKEND_AUTO);
  assert_int_equal(cfg.num_streams, 8);
  assert_int_equal(cfg.queue_bound, 65536);
  assert_int_equal(cfg.backpressure, RUDA_BACKPRESSURE_BLOCK);
  assert_int_equal(cfg.log_level, RUDA_LOG_WARN);
  assert_int_equal(cfg.device_ordinal, 0);
  setenv("RUDA_STREAMS", "99999999999", 1); /* past 32 bits */
  ruda_config_init(&cfg);
  assert_int_equal(cfg.num_streams, 8);
}

/* What ruda_config_init says on stderr. */
static void init_capturing_stderr(ruda_config *cfg, char *out, size_t len) {
  fflush(stderr);
  int saved = dup(2);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  dup2(fileno(tmp), 2);
  ruda_config_init(cfg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(out, 1, len - 1, tmp);
  out[n] = '\0';
  fclose(tmp);
}

/* Every malformed variable is reported, RUDA_DEVICE too. */
static void malformed_device_is_reported(void **state) {
  (void)state;
  const char *bad[] = {"-5", "zz", "99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("RUDA_DEVICE", bad[i], 1);
    ruda_config cfg;
    char said[512];
    init_capturing_stderr(&cfg, said, sizeof said);
    assert_int_equal(cfg.device_ordinal, 0);
    assert_contains(said, "ignoring malformed RUDA_DEVICE");
  }
  setenv("RUDA_SPIN_US", "fast", 1);
  ruda_config cfg;
  char said[512];
  init_capturing_stderr(&cfg, said, sizeof said);
  assert_contains(said, "RUDA_SPIN_US");
  assert_int_equal(cfg.spin_us, 50);
}

/* The switches take the usual boolean words, in any case, and report
 * anything else (keeping the default: off, or for RUDA_AUTO_GRAPHS the
 * backend's choice, -1). */
static void boolean_switches_take_the_usual_words(void **state) {
  (void)state;
  static const struct {
    const char *v;
    int want; /* 1, 0, or -1: malformed, reported */
  } values[] = {{"1", 1},     {"true", 1},  {"YES", 1}, {"On", 1},      {"TRUE", 1},  {"0", 0},   {"false", 0},
                {"No", 0},    {"OFF", 0},   {"1x", -1}, {"-1", -1},     {"2", -1},    {"enable", -1}, {"tru", -1}};
  static const char *const names[] = {"RUDA_AUTO_GRAPHS", "RUDA_LAUNCH_BLOCKING", "RUDA_BOUNDS_CHECK"};
  for (size_t n = 0; n < 3; n++) {
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
      setenv(names[n], values[i].v, 1);
      ruda_config cfg;
      char said[512];
      init_capturing_stderr(&cfg, said, sizeof said);
      int got = n == 0 ? cfg.auto_graphs : n == 1 ? cfg.launch_blocking : cfg.bounds_checked;
      const int want = values[i].want >= 0 ? values[i].want : n == 0 ? -1 : 0;
      if (got != want) fail_msg("%s=%s gave %d, not %d", names[n], values[i].v, got, want);
      if (values[i].want >= 0) {
        assert_string_equal(said, "");
      } else {
        assert_contains(said, names[n]);
        assert_contains(said, values[i].v);
        assert_contains(said, "1|0|true|false|yes|no|on|off");
      }
    }
    unsetenv(names[n]);
  }
}

static void open_uses_the_environment(void **state) {
  (void)state;
  setenv("RUDA_BACKEND", "host", 1);
  setenv("RUDA_STREAMS", "3", 1);
  setenv("RUDA_LOG", "error", 1);
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(NULL, &dev));
  assert_int_equal(ruda_device_num_streams(dev), 3);
  assert_string_equal(ruda_device_backend(dev), "host");
  test_close(dev);
  /* Well-formed but out of range: refused at open, not ignored. */
  setenv("RUDA_STREAMS", "0", 1);
  dev = (ruda_device *)&dev;
  assert_rc(ruda_device_open(NULL, &dev), RUDA_EINVAL);
  assert_null(dev);
  assert_last_error_contains("num_streams 0");
}

static int open_with(ruda_config cfg) {
  ruda_device *dev = NULL;
  int rc = ruda_device_open(&cfg, &dev);
  if (rc == 0) test_close(dev);
  else assert_null(dev);
  return rc;
}

static void invalid_values_are_refused(void **state) {
  (void)state;
  ruda_config base;
  ruda_config_init(&base);
  base.backend = RUDA_BACKEND_HOST;
  base.log_level = RUDA_LOG_ERROR;
  ruda_config c;

  /* A config not from ruda_config_init (or from other headers). */
  c = base, c.size = 0;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("ruda_config_init");
  c = base, c.size = (uint32_t)sizeof c + 8;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("cfg->size");
  c = base, c.num_streams = 0;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("num_streams 0");
  c = base, c.num_streams = 1025;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("1025");
  c = base, c.queue_bound = 0;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("queue_bound 0");
  c = base, c.queue_bound = (1u << 30) + 1;
  assert_rc(open_with(c), RUDA_EINVAL);
  c = base, c.backend = (ruda_backend_kind)3;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("backend 3");
  c = base, c.backpressure = (ruda_backpressure)2;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("backpressure 2");
  c = base, c.backpressure = (ruda_backpressure)-1;
  assert_rc(open_with(c), RUDA_EINVAL);
  c = base, c.log_level = (ruda_log_level)5;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("log level 5");
  c = base, c.log_level = (ruda_log_level)-1;
  assert_rc(open_with(c), RUDA_EINVAL);
  /* Reserved words: zero from ruda_config_init, and any other value (a
   * setting of newer headers) is refused naming the word. */
  for (size_t i = 0; i < sizeof base.reserved / sizeof base.reserved[0]; i++)
    assert_int_equal(base.reserved[i], i == 0 ? base.lanes : 0);
  c = base, c.reserved[1] = 1;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("cfg->reserved[1] is 0x1, not zero");
  /* lanes took reserved[0]'s low half; the high half is still reserved. */
  c = base, c.reserved[0] = UINT64_C(1) << 32;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("cfg->reserved[0] is 0x100000000, not zero above lanes");
  c = base, c.lanes = 33;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("lanes 33 outside 1..32");
  c = base, c.num_streams = 33, c.lanes = 32;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("33 workers of 32 lanes: more than 1024 device streams");
  c = base, c.reserved[7] = UINT64_C(1) << 63;
  assert_rc(open_with(c), RUDA_EINVAL);
  assert_last_error_contains("cfg->reserved[7] is 0x8000000000000000");

  /* The limits themselves are accepted. */
  c = base, c.num_streams = 1, c.queue_bound = 1;
  assert_ok(open_with(c));
  c = base, c.queue_bound = 1u << 30;
  assert_ok(open_with(c));
  c = base, c.num_streams = 64;
  assert_ok(open_with(c));
  /* Lanes: by default two per worker up to 32 workers (the second used
   * once a library is registered, tests/integration/call.c), one from 33;
   * any count from 1 to 32 is taken as given. */
  const struct {
    uint32_t workers, lanes, total;
  } lanes[] = {{8, 0, 16}, {1, 0, 2}, {32, 0, 64}, {33, 0, 33}, {3, 16, 48}, {64, 0, 64}, {100, 1, 100}, {2, 32, 64}, {4, 16, 64}};
  for (size_t i = 0; i < sizeof lanes / sizeof lanes[0]; i++) {
    ruda_device *dev = NULL;
    c = base, c.num_streams = lanes[i].workers, c.lanes = lanes[i].lanes;
    assert_ok(ruda_device_open(&c, &dev));
    assert_int_equal(ruda_device_num_streams(dev), lanes[i].workers);
    assert_int_equal(ruda_device_num_lanes(dev), lanes[i].total);
    test_close(dev);
  }
  assert_int_equal(ruda_device_num_lanes(NULL), 0);
}

static int noop_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static void backend_choice(void **state) {
  (void)state;
  ruda_config c;
  ruda_config_init(&c);
  c.log_level = RUDA_LOG_OFF;
  /* auto always opens something. */
  c.backend = RUDA_BACKEND_AUTO;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&c, &dev));
  const char *name = ruda_device_backend(dev);
  assert_true(strcmp(name, "host") == 0 || strcmp(name, "cuda") == 0);
  int auto_is_cuda = strcmp(name, "cuda") == 0;
  /* A fallback says why cuda was not used; none, when it was. */
  const char *why = ruda_device_fallback_reason(dev);
  if (auto_is_cuda) assert_null(why);
  else if (getenv("RUDA_CUDA_DRIVER") == NULL) assert_true(why != NULL && strlen(why) > 10);
  test_close(dev);
  /* Host asked for is no fallback. */
  c.backend = RUDA_BACKEND_HOST;
  assert_ok(ruda_device_open(&c, &dev));
  assert_null(ruda_device_fallback_reason(dev));
  test_close(dev);
  assert_null(ruda_device_fallback_reason(NULL));
  c.backend = RUDA_BACKEND_AUTO;
  /* cuda, where auto did not find it usable, fails with a clear code. */
  c.backend = RUDA_BACKEND_CUDA;
  dev = NULL;
  int rc = ruda_device_open(&c, &dev);
  if (auto_is_cuda) {
    assert_int_equal(rc, 0);
    assert_string_equal(ruda_device_backend(dev), "cuda");
    /* Host kernels need the host backend. */
    assert_rc(ruda_host_kernel_register(dev, "k", noop_kernel), RUDA_ENOBACKEND);
    test_close(dev);
  } else {
    assert_true(rc == RUDA_ENOBACKEND || rc == RUDA_ENODRIVER);
    assert_null(dev);
    assert_int_equal(ruda_error_code(ruda_last_error()), rc);
  }
}

/* Records which thread ran stream i's launch. */
static pthread_t ran_on[16];

static int where_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  ran_on[*(const uint32_t *)args[0]] = pthread_self();
  return 0;
}

static void explicit_ids_map_to_workers(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "where", where_kernel));
  for (uint32_t i = 0; i < 12; i++) {
    ruda_arg a = ruda_arg_scalar(&i, sizeof i);
    assert_ok(test_launch(dev, i, "where", &a, 1));
  }
  for (ruda_stream_id s = 0; s < 12; s++) assert_ok(ruda_sync(dev, s, NULL));
  /* Stream i runs on worker i % 4: ids 0..3 have a worker each. */
  for (int i = 0; i < 12; i++) {
    assert_false(pthread_equal(ran_on[i], pthread_self()));
    assert_true(pthread_equal(ran_on[i], ran_on[i % 4]));
    for (int j = 0; j < 4; j++)
      if (j != i % 4) assert_false(pthread_equal(ran_on[i], ran_on[j]));
  }
  test_close(dev);
}

static int contains(const ruda_stream_id *ids, size_t n, ruda_stream_id id) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == id) return 1;
  return 0;
}

static void stream_ids_lists_streams_used(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 7, 16, &h));
  assert_ok(ruda_flush(dev, 3, NULL));
  assert_ok(ruda_flush(dev, RUDA_STREAM_CURRENT, NULL));
  assert_ok(ruda_flush(dev, RUDA_STREAM_EXPLICIT_MAX, NULL));
  ruda_stream_id ids[8];
  for (int i = 0; i < 8; i++) ids[i] = 12345;
  assert_int_equal(ruda_stream_ids(dev, ids, 8), 4);
  assert_true(contains(ids, 4, 7));
  assert_true(contains(ids, 4, 3));
  assert_true(contains(ids, 4, ruda_stream_current()));
  assert_true(contains(ids, 4, RUDA_STREAM_EXPLICIT_MAX));
  assert_int_equal(ids[4], 12345);
  /* A short array gets what fits; the count is still the total. */
  for (int i = 0; i < 8; i++) ids[i] = 12345;
  assert_int_equal(ruda_stream_ids(dev, ids, 1), 4);
  assert_true(ids[0] != 12345);
  assert_int_equal(ids[1], 12345);
  /* Many streams: the table grows and keeps every id. */
  for (ruda_stream_id s = 1000; s < 1300; s++) assert_ok(ruda_flush(dev, s, NULL));
  ruda_stream_id *all = calloc(400, sizeof *all);
  assert_int_equal(ruda_stream_ids(dev, all, 400), 304);
  for (ruda_stream_id s = 1000; s < 1300; s++) assert_true(contains(all, 304, s));
  assert_true(contains(all, 304, 7));
  free(all);
  assert_ok(ruda_buffer_free(dev, 7, h));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(malformed_device_is_reported, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(boolean_switches_take_the_usual_words, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(defaults, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(environment_applies, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(malformed_environment_is_ignored, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(open_uses_the_environment, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(invalid_values_are_refused, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(backend_choice, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(explicit_ids_map_to_workers, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(stream_ids_lists_streams_used, clear_env, clear_env),
  };
  return test_main("integration_config", tests, sizeof tests / sizeof tests[0], argc, argv);
}

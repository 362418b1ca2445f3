/* profile.c - profiling on the host backend: the time between two points
 * of a stream covers the work in between, profiles nest and overlap,
 * tokens are checked, failures in between are handed back, and what a
 * capture or an unhealthy stream cannot do is refused. */
#include <time.h>
#include <unistd.h>

#include "common.h"

#define MS (UINT64_C(1000000))

static int k_sleep(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t ms = *(const uint32_t *)args[0];
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  return 0;
}

static int k_fail(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EGENERIC;
}

static ruda_device *open_profiled(void) {
  ruda_device *dev = test_open(2, 4096, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "sleep", k_sleep));
  assert_ok(ruda_host_kernel_register(dev, "fail", k_fail));
  return dev;
}

static void sleep_on(ruda_device *dev, ruda_stream_id s, uint32_t ms) {
  ruda_arg a = ruda_arg_scalar(&ms, sizeof ms);
  assert_ok(test_launch(dev, s, "sleep", &a, 1));
}

/* At least lo: the work in between counts; the slack is wide because CI
 * runs tests in parallel under sanitizers and a worker may wait for a core. */
static void assert_between(uint64_t ns, uint64_t lo, uint64_t slack) {
  if (ns < lo || ns > lo + slack)
    fail_msg("profiled %llu ns, expected %llu..%llu", (unsigned long long)ns, (unsigned long long)lo,
             (unsigned long long)(lo + slack));
}

static void measures_the_work_in_between(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  sleep_on(dev, 0, 30); /* before the point: not counted */
  ruda_profile_token t;
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_true(t.id != 0);
  sleep_on(dev, 0, 60);
  uint64_t ns = 0;
  assert_ok(ruda_profile_end(dev, 0, t, &ns, NULL));
  assert_between(ns, 60 * MS, 2000 * MS);
  /* Nothing in between: less than that work. */
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_ok(ruda_profile_end(dev, 0, t, &ns, NULL));
  assert_true(ns < 60 * MS);
  test_close(dev);
}

static void profiles_nest_and_overlap(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  ruda_profile_token outer, inner;
  uint64_t a = 0, b = 0;
  assert_ok(ruda_profile_begin(dev, 0, &outer));
  sleep_on(dev, 0, 30);
  assert_ok(ruda_profile_begin(dev, 0, &inner));
  assert_true(inner.id != outer.id);
  sleep_on(dev, 0, 30);
  assert_ok(ruda_profile_end(dev, 0, outer, &a, NULL)); /* overlapping: outer ends first */
  sleep_on(dev, 0, 30);
  assert_ok(ruda_profile_end(dev, 0, inner, &b, NULL));
  assert_between(a, 60 * MS, 2000 * MS);
  assert_between(b, 60 * MS, 2000 * MS);
  test_close(dev);
}

static void tokens_are_checked(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  uint64_t ns = 1;
  assert_rc(ruda_profile_end(dev, 0, (ruda_profile_token){0}, &ns, NULL), RUDA_EPROFILETOKEN);
  assert_int_equal(ns, 0);
  ruda_profile_token t;
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_rc(ruda_profile_end(dev, 1, t, &ns, NULL), RUDA_EPROFILETOKEN); /* another stream's */
  assert_last_error_contains("was not handed out by stream 1");
  assert_rc(ruda_profile_end(dev, 0, t, NULL, NULL), RUDA_EINVAL);
  assert_ok(ruda_profile_end(dev, 0, t, &ns, NULL)); /* still open on its own stream */
  assert_rc(ruda_profile_end(dev, 0, t, &ns, NULL), RUDA_EPROFILETOKEN); /* ended already */
  assert_rc(ruda_profile_begin(dev, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_profile_begin(NULL, 0, &t), RUDA_EINVAL);
  test_close(dev);
}

static void failures_in_between_are_handed_back(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  ruda_profile_token t;
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  uint64_t ns = 1;
  ruda_error *errs = NULL;
  assert_rc(ruda_profile_end(dev, 0, t, &ns, &errs), RUDA_EPROFILE);
  assert_int_equal(ns, 0);
  assert_non_null(errs);
  assert_non_null(ruda_error_cause(errs));
  assert_int_equal(ruda_error_code(ruda_error_cause(errs)), RUDA_EGENERIC);
  ruda_error_free(errs);
  /* The token is gone and the stream is healthy again. */
  assert_rc(ruda_profile_end(dev, 0, t, &ns, NULL), RUDA_EPROFILETOKEN);
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_ok(ruda_profile_end(dev, 0, t, &ns, NULL));
  test_close(dev);
}

static void refused_while_unhealthy_or_capturing(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  ruda_profile_token t, open;
  assert_ok(ruda_profile_begin(dev, 0, &open));
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_rc(ruda_profile_begin(dev, 0, &t), RUDA_EGRAPHSTATE);
  uint64_t ns;
  assert_rc(ruda_profile_end(dev, 0, open, &ns, NULL), RUDA_EGRAPHSTATE);
  assert_ok(ruda_graph_abort_capture(dev, 0));
  assert_ok(ruda_profile_end(dev, 0, open, &ns, NULL));
  assert_ok(test_launch(dev, 1, "fail", NULL, 0));
  ruda_future *f;
  assert_ok(ruda_sync_async(dev, 1, &f));
  for (int i = 0; ruda_future_poll(f) != 1; i++) {
    assert_true(i < 100000 * (int)test_patience());
    usleep(100);
  }
  ruda_future_free(f);
  assert_rc(ruda_profile_begin(dev, 1, &t), RUDA_EUNHEALTHY);
  ruda_error *errs = NULL;
  assert_rc(ruda_flush(dev, 1, &errs), RUDA_EUNHEALTHY);
  ruda_error_free(errs);
  test_close(dev);
}

static void close_with_open_profiles(void **state) {
  (void)state;
  ruda_device *dev = open_profiled();
  ruda_profile_token t;
  assert_ok(ruda_profile_begin(dev, 0, &t));
  sleep_on(dev, 0, 1);
  assert_ok(ruda_profile_begin(dev, 1, &t));
  test_close(dev); /* ASan: the open profiles' futures are freed */
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(measures_the_work_in_between),
      cmocka_unit_test(profiles_nest_and_overlap),
      cmocka_unit_test(tokens_are_checked),
      cmocka_unit_test(failures_in_between_are_handed_back),
      cmocka_unit_test(refused_while_unhealthy_or_capturing),
      cmocka_unit_test(close_with_open_profiles),
  };
  return test_main("unit_profile", tests, sizeof tests / sizeof tests[0], argc, argv);
}

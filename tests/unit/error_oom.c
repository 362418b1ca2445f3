/* error_oom.c - errors that cannot be allocated are counted, and the count
 * survives a drain that itself runs out of memory.
 *
 * Host memory exhaustion is injected by a malloc defined here, which the
 * statically linked library calls instead of glibc's: armed, it fails every
 * call on the arming thread. Sanitizer runtimes own malloc, so under them
 * the tests skip (exit 77, counted as skipped). */
#include <pthread.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define INJECT 0
#else
#define INJECT 1
extern void *__libc_malloc(size_t);
static __thread int fail_mallocs;
void *malloc(size_t n) {
  if (fail_mallocs) return NULL;
  return __libc_malloc(n);
}
#endif

static int lost_count(const ruda_error *sum) {
  for (const ruda_error *e = ruda_error_cause(sum); e != NULL; e = ruda_error_next(e))
    if (ruda_error_code(e) == RUDA_ENOMEM && strstr(ruda_error_message(e), "could not be recorded"))
      return atoi(ruda_error_message(e));
  return 0;
}

static void lost_errors_survive_a_drain_without_memory(void **state) {
  (void)state;
  if (!INJECT) test_skip("the sanitizer runtime owns malloc: no failures can be injected");
#if INJECT
  ruda_device *dev = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda__stream *s = ruda__stream_get(&dev->sched, 5);
  assert_non_null(s);
  /* Three failures whose errors could not be allocated, one that could. */
  for (int i = 0; i < 3; i++) ruda__stream_push_error(s, NULL);
  ruda__stream_push_error(s, ruda__error_new(RUDA_EINVAL, 0, "a recorded failure"));
  /* A drain with no memory for its summary hands back the list ... */
  ruda_error *out = NULL;
  fail_mallocs = 1;
  int rc = ruda__stream_drain(&dev->sched, s, &out);
  fail_mallocs = 0;
  assert_int_equal(rc, RUDA_EUNHEALTHY);
  assert_non_null(out);
  assert_int_equal(ruda_error_code(out), RUDA_EINVAL);
  assert_null(ruda_error_next(out));
  ruda_error_free(out);
  /* ... and the three losses are still counted for the next one. */
  rc = ruda_flush(dev, 5, &out);
  assert_int_equal(rc, RUDA_EUNHEALTHY);
  assert_int_equal(lost_count(out), 3);
  ruda_error_free(out);
  assert_ok(ruda_flush(dev, 5, NULL));
  test_close(dev);
#endif
}

static int fail_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EINVAL;
}

/* The worker's error allocations fail for a batch of failing launches:
 * each failure is still counted. The kernels arm and disarm the injection
 * on the worker thread itself, in stream order. */
static int arm_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
#if INJECT
  fail_mallocs = 1; /* the worker's error for this failure cannot be made */
#endif
  return RUDA_EINVAL;
}

static int disarm_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
#if INJECT
  fail_mallocs = 0;
#endif
  return 0;
}

static void worker_errors_counted_when_unallocatable(void **state) {
  (void)state;
  if (!INJECT) test_skip("the sanitizer runtime owns malloc: no failures can be injected");
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "arm", arm_kernel));
  assert_ok(ruda_host_kernel_register(dev, "disarm", disarm_kernel));
  assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
  for (int i = 0; i < 5; i++) assert_ok(test_launch(dev, 0, "arm", NULL, 0));
  assert_ok(test_launch(dev, 0, "disarm", NULL, 0));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  ruda_error *out = NULL;
  assert_int_equal(ruda_flush(dev, 0, &out), RUDA_EUNHEALTHY);
  int recorded = 0;
  for (const ruda_error *e = ruda_error_cause(out); e != NULL; e = ruda_error_next(e))
    recorded += ruda_error_code(e) == RUDA_EINVAL;
  assert_int_equal(recorded, 1);
  assert_int_equal(lost_count(out), 5);
  ruda_error_free(out);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(lost_errors_survive_a_drain_without_memory),
      cmocka_unit_test(worker_errors_counted_when_unallocatable),
  };
  return test_main("unit_error_oom", tests, sizeof tests / sizeof tests[0], argc, argv);
}

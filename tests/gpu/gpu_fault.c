/* gpu_fault.c - a planted illegal address: reported on the stream that
 * ran it, naming the launch in flight, and the device marked faulted so
 * every other stream reports it too. A fault poisons the process's
 * primary context, so this binary holds only this case. */
#include <cuda.h>

#include "gpu_common.h"

static int list_contains(const ruda_error *e, const char *text, uint64_t *stream) {
  for (const ruda_error *x = ruda_error_cause(e); x != NULL; x = ruda_error_next(x))
    if (strstr(ruda_error_message(x), text)) {
      if (stream) *stream = ruda_error_stream(x);
      return 1;
    }
  return 0;
}

/* How often text appears in e and its causes, and whether every message
 * ends whole (the driver's error, in parentheses, or a full sentence). */
static int count_in(const ruda_error *e, const char *text, int *cut) {
  int n = 0;
  for (const ruda_error *x = e; x != NULL; x = x == e ? ruda_error_cause(e) : ruda_error_next(x)) {
    const char *m = ruda_error_message(x);
    for (const char *p = strstr(m, text); p != NULL; p = strstr(p + 1, text)) n++;
    size_t len = strlen(m);
    if (len > 0 && m[len - 1] != ')' && m[len - 1] != '.') *cut = 1;
  }
  return n;
}

static void illegal_address_reported_on_its_stream(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "planted_fault", SRC_FAULT, NULL));
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const ruda_stream_id A = 0, B = 1;
  /* Healthy work on B first, finished before the fault. */
  const unsigned n = 1024, k = 0;
  unsigned zeros[1024] = {0};
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, B, sizeof zeros, &h));
  test_write(dev, B, ruda_bind(h), zeros, sizeof zeros);
  ruda_arg sargs[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  ruda_launch_desc sl;
  memset(&sl, 0, sizeof sl);
  sl.kernel = "step";
  sl.grid = (ruda_dim3){4, 1, 1};
  sl.block = (ruda_dim3){256, 1, 1};
  sl.args = sargs;
  sl.nargs = 3;
  assert_ok(ruda_launch(dev, B, &sl));
  gpu_sync_ok(dev, B);

  /* The planted launch: a write through address 8. */
  const uint64_t bad = 8;
  ruda_arg fa = ruda_arg_scalar(&bad, 8);
  ruda_launch_desc fl;
  memset(&fl, 0, sizeof fl);
  fl.kernel = "planted_fault";
  fl.grid = fl.block = (ruda_dim3){1, 1, 1};
  fl.args = &fa;
  fl.nargs = 1;
  assert_ok(ruda_launch(dev, A, &fl)); /* enqueued fine: the fault is asynchronous */

  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, A, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  ruda_error_print(err, stderr, 0);
  uint64_t where = UINT64_MAX;
  if (!list_contains(err, "kernel \"planted_fault\" (stream 0, command #", &where))
    fail_msg("stream A's errors do not name the planted launch");
  assert_int_equal(where, A);
  /* The launches in flight are listed once, in the first report, and no
   * message is cut short. */
  int cut = 0;
  assert_int_equal(count_in(err, "the latest launch of each device stream", &cut), 1);
  assert_false(cut);
  const ruda_error *first = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(first), RUDA_EFAULTED);
  assert_int_equal(ruda_error_backend_code(first), CUDA_ERROR_ILLEGAL_ADDRESS);
  ruda_error_free(err);

  /* Every other stream now reports the faulted device. */
  err = NULL;
  assert_int_equal(ruda_sync(dev, B, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  assert_contains(ruda_error_message(err), "device is faulted");
  assert_contains(ruda_error_message(err), "planted_fault");
  ruda_error_free(err);
  err = NULL;
  assert_int_equal(ruda_flush(dev, 7, &err), RUDA_EUNHEALTHY);
  ruda_error_free(err);
  ruda_device_close(dev, NULL);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(illegal_address_reported_on_its_stream),
  };
  return gpu_main("gpu_fault", tests, sizeof tests / sizeof tests[0], argc, argv);
}

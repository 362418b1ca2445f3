/* gpu_trace.c - RUDA_TRACE with RUDA_TRACE_DEVICE=1 on the cuda backend:
 * besides the workers' host spans, each command that runs on the device
 * has a device span (timing
 * events around it), in the process "device"; kernels of two streams that
 * run at once overlap there. Under the mock driver its streams run on
 * threads of their own, so they overlap too. */
#include <stdio.h>
#include <unistd.h>

#include "gpu_common.h"

#define SPIN 4000000LL /* ~2 ms on the H200; the mock sleeps spin / 2000 us */


static void device_spans_of_two_streams_overlap(void **state) {
  (void)state;
  char path[] = "/tmp/ruda-gpu-trace-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  setenv("RUDA_TRACE", path, 1);
  setenv("RUDA_TRACE_DEVICE", "1", 1);
  ruda_device *dev = gpu_open();
  unsetenv("RUDA_TRACE");
  unsetenv("RUDA_TRACE_DEVICE");
  assert_ok(ruda_kernel_source(dev, "order_add", SRC_ORDER, NULL));
  const unsigned n = 1u << 12;
  unsigned one = 1;
  long long spin = SPIN;
  ruda_handle x[2], y[2];
  for (int s = 0; s < 2; s++) {
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)s, (uint64_t)n * 4, &x[s]));
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)s, (uint64_t)n * 4, &y[s]));
  }
  for (int s = 0; s < 2; s++) gpu_sync_ok(dev, (ruda_stream_id)s);
  for (int s = 0; s < 2; s++) {
    ruda_arg a[5] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(x[s])), ruda_arg_buffer(ruda_bind(y[s])),
                     ruda_arg_scalar(&one, 4), ruda_arg_scalar(&spin, 8)};
    ruda_launch_desc l;
    memset(&l, 0, sizeof l);
    l.kernel = "order_add";
    l.grid = (ruda_dim3){1, 1, 1};
    l.block = (ruda_dim3){32, 1, 1};
    l.args = a;
    l.nargs = 5;
    assert_ok(ruda_launch(dev, (ruda_stream_id)s, &l));
  }
  for (int s = 0; s < 2; s++) gpu_sync_ok(dev, (ruda_stream_id)s);
  for (int s = 0; s < 2; s++) {
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)s, x[s]));
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)s, y[s]));
  }
  test_close(dev);

  char *text = test_slurp(path);
  assert_non_null(strstr(text, "\"name\":\"device\""));
  /* The two kernels' device spans, one per stream. */
  double t0[2] = {-1, -1}, t1[2] = {-1, -1};
  for (const char *p = text; (p = strstr(p, "{\"name\":\"order_add\",\"cat\":\"device\"")) != NULL; p++) {
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    int s = strstr(p, "\"stream\":\"stream 1\"") != NULL && strstr(p, "\"stream\":\"stream 1\"") < end;
    t0[s] = test_json_number(p, "ts");
    t1[s] = t0[s] + test_json_number(p, "dur");
    assert_true(test_json_number(p, "dur") > 100.0); /* the spin, in us */
  }
  assert_true(t0[0] >= 0 && t0[1] >= 0);
  /* Each started before the other ended. */
  assert_true(t0[0] < t1[1] && t0[1] < t1[0]);
  free(text);
  unlink(path);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_spans_of_two_streams_overlap),
  };
  return gpu_main("gpu_trace", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* gpu_trace.c - RUDA_TRACE with RUDA_TRACE_DEVICE=1 on the cuda backend:
 * besides the workers' host spans, each command that runs on the device
 * has a device span (timing events around it), in the process "device";
 * kernels of two streams that run at once overlap there. That they ran at
 * once is not left to timing: the two kernels (access_meet, readers of one
 * counter) wait for each other on the device, so each reports whether the
 * other arrived. Under the mock driver its streams run on threads of
 * their own and the kernels meet there. */
#include <stdio.h>
#include <unistd.h>

#include "gpu_common.h"

/* The meeting's bound, in clock64 cycles (~10 s at 2 GHz; the mock waits
 * timeout / 2000 us): only a kernel the other never joins waits it out. */
#define MEET_TIMEOUT 20000000000LL


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
  assert_ok(ruda_kernel_source(dev, "access_meet", SRC_ACCESS, NULL));
  int zero = 0, want = 2;
  long long timeout = MEET_TIMEOUT;
  ruda_handle counter, met[2];
  assert_ok(ruda_buffer_create(dev, 0, sizeof zero, &counter));
  test_write(dev, 0, ruda_bind(counter), &zero, sizeof zero);
  for (int s = 0; s < 2; s++) {
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)s, sizeof zero, &met[s]));
    test_write(dev, (ruda_stream_id)s, ruda_bind(met[s]), &zero, sizeof zero);
  }
  for (int s = 0; s < 2; s++) gpu_sync_ok(dev, (ruda_stream_id)s);
  for (int s = 0; s < 2; s++) {
    /* The counter as a read (IN): the two uses may overlap. */
    ruda_arg a[4] = {ruda_arg_in(ruda_bind(counter)), ruda_arg_scalar(&want, sizeof want),
                     ruda_arg_scalar(&timeout, sizeof timeout), ruda_arg_out(ruda_bind(met[s]))};
    ruda_launch_desc l;
    memset(&l, 0, sizeof l);
    l.kernel = "access_meet";
    l.grid = (ruda_dim3){1, 1, 1};
    l.block = (ruda_dim3){32, 1, 1};
    l.args = a;
    l.nargs = 4;
    assert_ok(ruda_launch(dev, (ruda_stream_id)s, &l));
  }
  for (int s = 0; s < 2; s++) {
    int m = -1;
    test_read(dev, (ruda_stream_id)s, ruda_bind(met[s]), &m, sizeof m);
    if (m != 1) fail_msg("stream %d's kernel never met the other's: they did not run at once", s);
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)s, met[s]));
  }
  assert_ok(ruda_buffer_free(dev, 0, counter));
  test_close(dev);

  char *text = test_slurp(path);
  assert_non_null(strstr(text, "\"name\":\"device\""));
  /* The two kernels' device spans, one per stream. */
  double t0[2] = {-1, -1}, t1[2] = {-1, -1};
  for (const char *p = text; (p = strstr(p, "{\"name\":\"access_meet\",\"cat\":\"device\"")) != NULL; p++) {
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    int s = strstr(p, "\"stream\":\"stream 1\"") != NULL && strstr(p, "\"stream\":\"stream 1\"") < end;
    t0[s] = test_json_number(p, "ts");
    t1[s] = t0[s] + test_json_number(p, "dur");
  }
  assert_true(t0[0] >= 0 && t0[1] >= 0);
  /* They met on the device, so each span opened before the other closed
   * (a span brackets its kernel; equal at the timer's resolution). */
  if (!(t0[0] <= t1[1] && t0[1] <= t1[0]))
    fail_msg("device spans [%.3f, %.3f] and [%.3f, %.3f] us do not overlap", t0[0], t1[0], t0[1], t1[1]);
  free(text);
  unlink(path);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_spans_of_two_streams_overlap),
  };
  return gpu_main("gpu_trace", tests, sizeof tests / sizeof tests[0], argc, argv);
}

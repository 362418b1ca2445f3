/* gpu_trace.c - RUDA_TRACE with RUDA_TRACE_DEVICE=1 on the cuda backend:
 * besides the workers' host spans, the device work has spans (timing
 * events around each batch a worker issues), in the process "device";
 * kernels of two streams that run at once overlap there, and every command
 * that puts work on the device is in exactly one span. That they ran at
 * once is not left to timing: the two kernels (access_meet, readers of one
 * counter) wait for each other on the device, so each reports whether the
 * other arrived. Under the mock driver its streams run on threads of
 * their own and the kernels meet there. */
#include <stdio.h>
#include <unistd.h>

#include "gpu_common.h"
#include "scheduler/trace.h"

/* The meeting's bound, in clock64 cycles (~10 s at 2 GHz; the mock waits
 * timeout / 2000 us): only a kernel the other never joins waits it out. */
#define MEET_TIMEOUT 20000000000LL


/* A cuda device tracing into a fresh file at path (its template
 * "/tmp/ruda-gpu-trace-XXXXXX"), with device spans; auto_graphs "0" turns
 * automatic graphs off for it, NULL leaves the default. */
static ruda_device *open_traced(char *path, const char *auto_graphs) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  setenv("RUDA_TRACE", path, 1);
  setenv("RUDA_TRACE_DEVICE", "1", 1);
  if (auto_graphs != NULL) setenv("RUDA_AUTO_GRAPHS", auto_graphs, 1);
  ruda_device *dev = gpu_open();
  unsetenv("RUDA_TRACE");
  unsetenv("RUDA_TRACE_DEVICE");
  unsetenv("RUDA_AUTO_GRAPHS");
  return dev;
}

static void device_spans_of_two_streams_overlap(void **state) {
  (void)state;
  char path[] = "/tmp/ruda-gpu-trace-XXXXXX";
  ruda_device *dev = open_traced(path, NULL);
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
  for (const char *p = text; (p = strstr(p, "{\"name\":\"access_meet")) != NULL; p++) {
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    const char *dev = strstr(p, "\"cat\":\"device\"");
    if (dev == NULL || dev > end) continue; /* the host span */
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

/* Many commands queued back to back: the worker issues them in batches,
 * each batch one device span (at most RUDA__TRACE_SPAN_MAX commands, its
 * name the first command's and how many follow). Each write, launch and
 * read is in exactly one span, and the work itself is right. */
static void device_spans_cover_every_command_once(void **state) {
  (void)state;
  char path[] = "/tmp/ruda-gpu-trace-XXXXXX";
  ruda_device *dev = open_traced(path, "0"); /* each command its own record */
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  enum { N = 256, STEPS = 100 };
  unsigned host[N] = {0};
  ruda_handle b;
  assert_ok(ruda_buffer_create(dev, 0, sizeof host, &b));
  test_write(dev, 0, ruda_bind(b), host, sizeof host);
  for (unsigned k = 0; k < STEPS; k++) {
    unsigned n = N;
    ruda_arg a[3] = {ruda_arg_scalar(&n, sizeof n), ruda_arg_buffer(ruda_bind(b)), ruda_arg_scalar(&k, sizeof k)};
    ruda_launch_desc l = {.kernel = "step", .grid = {1, 1, 1}, .block = {N, 1, 1}, .args = a, .nargs = 3};
    assert_ok(ruda_launch(dev, 0, &l));
  }
  test_read(dev, 0, ruda_bind(b), host, sizeof host);
  for (int i = 0; i < N; i++) assert_int_equal(host[i], STEPS);
  assert_ok(ruda_buffer_free(dev, 0, b));
  test_close(dev);

  char *text = test_slurp(path);
  long host_cmds = 0, covered = 0, spans = 0;
  for (const char *p = text; (p = strstr(p, "{\"name\":")) != NULL; p++) {
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    const char *cat = strstr(p, "\"cat\":\"");
    if (cat == NULL || cat > end) continue;
    cat += 7;
    if (strncmp(cat, "device\"", 7) == 0) {
      const long c = (long)test_json_number(p, "commands");
      assert_true(c >= 1 && c <= RUDA__TRACE_SPAN_MAX);
      covered += c;
      spans++;
    } else if (strncmp(cat, "write\"", 6) == 0 || strncmp(cat, "launch\"", 7) == 0 ||
               strncmp(cat, "read\"", 5) == 0) {
      host_cmds++;
    }
  }
  assert_int_equal(host_cmds, STEPS + 2);
  assert_int_equal(covered, host_cmds);
  assert_true(spans >= (STEPS + 2 + RUDA__TRACE_SPAN_MAX - 1) / RUDA__TRACE_SPAN_MAX);
  free(text);
  unlink(path);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_spans_of_two_streams_overlap),
      cmocka_unit_test(device_spans_cover_every_command_once),
  };
  return gpu_main("gpu_trace", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* trace.c - RUDA_TRACE writes a Chrome trace-event file at close: one lane
 * per worker, a span per command named after its kernel, copies with their
 * bytes, failures as instant events, names escaped; kernels of several
 * streams overlap in time. */
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

/* 30 ms of work: the span's length, not a way to order anything. */
static int nap_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  usleep(30000);
  return 0;
}

/* The three naps of the overlap test meet before napping: each counts
 * itself in and waits (10 s times test_patience() at most, else it
 * fails) for the others, so all three spans are open at once however the
 * workers are scheduled. */
static _Atomic int naps_in;

static int meeting_nap_kernel(const ruda_host_ctx *c, void *const *args) {
  atomic_fetch_add(&naps_in, 1);
  for (int waited_ms = 0; atomic_load(&naps_in) < 3; waited_ms++) {
    if (waited_ms == 10000 * (int)test_patience()) return RUDA_ETIMEDOUT;
    usleep(1000);
  }
  return nap_kernel(c, args);
}

static int failing_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EINVAL;
}

/* A host device with `streams` workers tracing to a new file at path (a
 * mkstemp template, filled in). */
static ruda_device *open_traced(char *path, uint32_t streams) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  setenv("RUDA_TRACE", path, 1);
  ruda_device *dev = test_open(streams, 1024, RUDA_BACKPRESSURE_BLOCK);
  unsetenv("RUDA_TRACE");
  return dev;
}

static void trace_file_shows_streams_overlapping(void **state) {
  (void)state;
  char path[] = "/tmp/ruda-trace-XXXXXX";
  ruda_device *dev = open_traced(path, 3);
  atomic_store(&naps_in, 0);
  assert_ok(ruda_host_kernel_register(dev, "nap", meeting_nap_kernel));
  assert_ok(ruda_host_kernel_register(dev, "fails", failing_kernel));
  assert_ok(ruda_host_kernel_register(dev, "we\"ird\\name", nap_kernel));
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 4096, &x));
  unsigned char bytes[4096] = {1}, back[4096];
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
  assert_ok(ruda_write(dev, 0, &d, bytes, sizeof bytes));
  for (ruda_stream_id s = 0; s < 3; s++) assert_ok(test_launch(dev, s, "nap", NULL, 0));
  assert_ok(test_launch(dev, 1, "fails", NULL, 0));
  assert_ok(test_launch(dev, 2, "we\"ird\\name", NULL, 0));
  ruda_future *fut;
  assert_ok(ruda_read(dev, 0, &d, back, sizeof back, &fut));
  assert_ok(ruda_future_wait(fut, NULL));
  ruda_future_free(fut);
  ruda_error *errs = NULL;
  assert_rc(ruda_device_close(dev, &errs), RUDA_EUNHEALTHY); /* the failed kernel */
  ruda_error_free(errs);

  char *s = test_slurp(path);
  assert_true(strncmp(s, "{\"traceEvents\":[\n", 17) == 0);
  assert_non_null(strstr(s, "],\"displayTimeUnit\":\"ns\"}\n"));
  /* Three naps on three lanes, running at once. */
  double start_max = 0, end_min = 1e30;
  int naps = 0, lanes = 0;
  for (const char *ev = strstr(s, "{\"name\":\"nap\""); ev; ev = strstr(ev + 1, "{\"name\":\"nap\"")) {
    naps++;
    lanes |= 1 << (int)test_json_number(ev, "tid");
    double ts = test_json_number(ev, "ts"), dur = test_json_number(ev, "dur");
    assert_true(dur >= 25000.0); /* microseconds: the 30 ms nap */
    if (ts > start_max) start_max = ts;
    if (ts + dur < end_min) end_min = ts + dur;
  }
  assert_int_equal(naps, 3);
  assert_int_equal(lanes, 7);
  assert_true(start_max < end_min);
  assert_non_null(strstr(s, "\"cat\":\"write\""));
  assert_non_null(strstr(s, "\"cat\":\"read\""));
  assert_non_null(strstr(s, "\"bytes\":4096"));
  /* "fails" was queued behind stream 1's 30 ms nap: its wait shows. */
  const char *fails = strstr(s, "{\"name\":\"fails\"");
  assert_non_null(fails);
  assert_true(test_json_number(fails, "queued_us") >= 20000.0);
  /* Memory over time: the 4 KiB buffer's pool holds at least a page. */
  const char *mem = strstr(s, "{\"name\":\"device memory held\",\"ph\":\"C\"");
  assert_non_null(mem);
  assert_true(test_json_number(mem, "MiB") > 0.0);
  const char *err = strstr(s, "{\"name\":\"error: RUDA_EINVAL\"");
  assert_non_null(err);
  assert_non_null(strstr(err, "\"stream\":\"stream 1\""));
  assert_non_null(strstr(s, "{\"name\":\"we\\\"ird\\\\name\""));
  assert_non_null(strstr(s, "\"args\":{\"name\":\"ruda-w2\"}"));
  /* A JSON parser accepts it, where one is at hand. */
  if (system("command -v python3 >/dev/null 2>&1") == 0) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s", path);
    assert_int_equal(system(cmd), 0);
  }
  free(s);
  unlink(path);
}

/* A replay is submitted like a launch: its span carries the time it sat
 * queued behind a gate held shut for 30 ms after the replay was issued,
 * from the stamp its submit took. */
static void a_replay_has_its_submit_stamp(void **state) {
  (void)state;
  char path[] = "/tmp/ruda-trace-XXXXXX";
  ruda_device *dev = open_traced(path, 1);
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "recorded", failing_kernel));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(test_launch(dev, 0, "recorded", NULL, 0));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  test_wait_count(&test_gate_entered, 1);
  assert_ok(ruda_graph_replay(dev, 0, g));
  usleep(30000);
  atomic_store(&test_gate_open, 1);
  ruda_error *errs = NULL;
  assert_rc(ruda_flush(dev, 0, &errs), RUDA_EUNHEALTHY); /* the recorded kernel fails */
  ruda_error_free(errs);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_device_close(dev, NULL));
  char *s = test_slurp(path);
  char *span = strstr(s, "{\"name\":\"graph\"");
  assert_non_null(span);
  char *eol = strchr(span, '\n'); /* one event a line: its own fields only */
  if (eol != NULL) *eol = '\0';
  assert_non_null(strstr(span, "\"queued_us\":"));
  assert_true(test_json_number(span, "queued_us") >= 29000.0);
  free(s);
  unlink(path);
}

/* Entries of dir other than . and .. */
static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

/* Without RUDA_TRACE the device is not tracing and writes no file: run
 * in an empty directory, which stays empty. */
static void no_trace_without_the_variable(void **state) {
  (void)state;
  unsetenv("RUDA_TRACE");
  char dir[] = "/tmp/ruda-notrace-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char here[4096];
  assert_non_null(getcwd(here, sizeof here));
  assert_int_equal(chdir(dir), 0);
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "nap", nap_kernel));
  assert_ok(test_launch(dev, 0, "nap", NULL, 0));
  assert_rc(ruda_trace_stop(dev), RUDA_EINVAL); /* not tracing */
  test_close(dev);
  assert_int_equal(chdir(here), 0);
  assert_int_equal(dir_entries(dir), 0);
  assert_int_equal(rmdir(dir), 0);
}

/* A path that cannot be opened: the device opens and runs untraced, and
 * says why on stderr at warn level. */
static void unwritable_path_is_a_warning(void **state) {
  (void)state;
  char log[] = "/tmp/ruda-trace-log-XXXXXX";
  int lfd = mkstemp(log);
  assert_true(lfd >= 0);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_int_equal(dup2(lfd, 2), 2);
  setenv("RUDA_TRACE", "/nonexistent-dir/trace.json", 1);
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 1;
  cfg.log_level = RUDA_LOG_WARN;
  ruda_device *dev = NULL;
  int rc = ruda_device_open(&cfg, &dev);
  unsetenv("RUDA_TRACE");
  fflush(stderr);
  assert_int_equal(dup2(saved, 2), 2);
  close(saved);
  close(lfd);
  assert_ok(rc);
  char *said = test_slurp(log);
  unlink(log);
  fprintf(stderr, "%s", said);
  assert_contains(said, "ruda warn: ");
  assert_contains(said, "/nonexistent-dir/trace.json");
  assert_contains(said, "not tracing");
  free(said);
  assert_rc(ruda_trace_stop(dev), RUDA_EINVAL); /* not tracing */
  assert_ok(ruda_host_kernel_register(dev, "nap", nap_kernel));
  assert_ok(test_launch(dev, 0, "nap", NULL, 0));
  assert_rc(ruda_device_close(dev, NULL), 0);
}

/* ruda_trace_start / stop: a window of the run, on a device opened
 * without RUDA_TRACE; misuse refused with its code. */
static void start_and_stop_trace_a_window(void **state) {
  (void)state;
  unsetenv("RUDA_TRACE");
  char path[] = "/tmp/ruda-trace-window-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "before", nap_kernel));
  assert_ok(ruda_host_kernel_register(dev, "inside", nap_kernel));
  assert_ok(ruda_host_kernel_register(dev, "after", nap_kernel));
  assert_rc(ruda_trace_stop(dev), RUDA_EINVAL); /* not tracing */
  assert_rc(ruda_trace_start(dev, NULL), RUDA_EINVAL);
  assert_rc(ruda_trace_start(dev, "/nonexistent-dir/trace.json"), RUDA_EIO);
  assert_last_error_contains("/nonexistent-dir/trace.json");
  assert_ok(test_launch(dev, 0, "before", NULL, 0));
  assert_ok(ruda_trace_start(dev, path));
  assert_rc(ruda_trace_start(dev, path), RUDA_EBUSY);
  assert_ok(test_launch(dev, 0, "inside", NULL, 0));
  assert_ok(test_launch(dev, 1, "inside", NULL, 0));
  assert_ok(ruda_trace_stop(dev)); /* waits for both insides */
  assert_ok(test_launch(dev, 1, "after", NULL, 0));
  char *s = test_slurp(path);
  assert_null(strstr(s, "{\"name\":\"before\""));
  assert_null(strstr(s, "{\"name\":\"after\""));
  const char *in = strstr(s, "{\"name\":\"inside\"");
  assert_non_null(in);
  assert_non_null(strstr(in + 1, "{\"name\":\"inside\"")); /* both streams */
  free(s);
  /* Again, after a stop. */
  assert_ok(ruda_trace_start(dev, path));
  assert_ok(test_launch(dev, 0, "after", NULL, 0));
  assert_ok(ruda_trace_stop(dev));
  s = test_slurp(path);
  assert_non_null(strstr(s, "{\"name\":\"after\""));
  free(s);
  /* Still tracing at close: close writes it, as for RUDA_TRACE. */
  assert_ok(ruda_trace_start(dev, path));
  assert_ok(test_launch(dev, 1, "before", NULL, 0));
  test_close(dev);
  s = test_slurp(path);
  assert_non_null(strstr(s, "{\"name\":\"before\""));
  free(s);
  unlink(path);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(trace_file_shows_streams_overlapping),
      cmocka_unit_test(no_trace_without_the_variable),
      cmocka_unit_test(unwritable_path_is_a_warning),
      cmocka_unit_test(start_and_stop_trace_a_window),
      cmocka_unit_test(a_replay_has_its_submit_stamp),
  };
  return test_main("integration_trace", tests, sizeof tests / sizeof tests[0], argc, argv);
}

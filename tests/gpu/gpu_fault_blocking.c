/* gpu_fault_blocking.c - RUDA_LAUNCH_BLOCKING: the worker waits for the
 * device after every command, so a planted illegal address is reported
 * as the error of the launch that caused it, with the backtrace of the
 * call that enqueued it; in a replayed graph, as the error of the replay
 * naming the recorded launch. A fault poisons the process's primary
 * context, so each case runs in a process of its own (one ctest each). */
#include <cuda.h>
#include <execinfo.h>

#include "gpu_common.h"

static void blocking_mode_names_the_faulting_launch(void **state) {
  (void)state;
  setenv("RUDA_LAUNCH_BLOCKING", "1", 1);
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "planted_fault", SRC_FAULT, NULL));
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned n = 1024, k = 0;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 1, n * 4, &h));
  ruda_arg sargs[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  ruda_launch_desc sl = {.kernel = "step", .grid = {4, 1, 1}, .block = {256, 1, 1}, .args = sargs, .nargs = 3};
  assert_ok(ruda_launch(dev, 1, &sl)); /* healthy work on another stream */
  gpu_sync_ok(dev, 1);
  const uint64_t bad = 8;
  ruda_arg fa = ruda_arg_scalar(&bad, 8);
  ruda_launch_desc fl = {.kernel = "planted_fault", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &fa, .nargs = 1};
  void *here[24];
  int nhere = backtrace(here, 24);
  assert_ok(ruda_launch(dev, 0, &fl));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, 0, &err), RUDA_EUNHEALTHY);
  ruda_error_print(err, stderr, 1);
  const ruda_error *first = ruda_error_cause(err);
  /* The headline is the faulting launch itself, not a later wait. */
  assert_contains(ruda_error_message(first), "ruda_launch \"planted_fault\" (stream 0, command #");
  assert_int_equal(ruda_error_code(first), RUDA_EFAULTED);
  /* Its backtrace is the enqueuing call's: it shares our callers. */
  size_t nf = 0;
  void *const *frames = ruda_error_backtrace(first, &nf);
  int shared = 0;
  for (size_t i = 0; i < nf; i++)
    for (int j = 1; j < nhere; j++) shared += frames[i] == here[j];
  assert_true(shared >= 1);
  ruda_error_free(err);
  unsetenv("RUDA_LAUNCH_BLOCKING");
  ruda_device_close(dev, NULL);
}

/* The replay runs its commands one by one, each waited for: the fault
 * names the replay's call, its backtrace, and the recorded launch that
 * caused it (its index in the graph, from 1), not a later command. */
static void blocking_mode_names_the_faulting_replayed_launch(void **state) {
  (void)state;
  setenv("RUDA_LAUNCH_BLOCKING", "1", 1);
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "planted_fault", SRC_FAULT, NULL));
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned n = 1024, k = 0;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, n * 4, &h));
  ruda_arg sargs[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  ruda_launch_desc sl = {.kernel = "step", .grid = {4, 1, 1}, .block = {256, 1, 1}, .args = sargs, .nargs = 3};
  const uint64_t bad = 8;
  ruda_arg fa = ruda_arg_scalar(&bad, 8);
  ruda_launch_desc fl = {.kernel = "planted_fault", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &fa, .nargs = 1};
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_launch(dev, 0, &sl));
  assert_ok(ruda_launch(dev, 0, &fl));
  assert_ok(ruda_launch(dev, 0, &sl));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  void *here[24];
  int nhere = backtrace(here, 24);
  assert_ok(ruda_graph_replay(dev, 0, g));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, 0, &err), RUDA_EUNHEALTHY);
  ruda_error_print(err, stderr, 1);
  const ruda_error *first = ruda_error_cause(err);
  assert_contains(ruda_error_message(first), "ruda_graph_replay (stream 0, command #");
  assert_contains(ruda_error_message(first), "command 2 (launch of planted_fault)");
  assert_int_equal(ruda_error_code(first), RUDA_EFAULTED);
  size_t nf = 0;
  void *const *frames = ruda_error_backtrace(first, &nf);
  int shared = 0;
  for (size_t i = 0; i < nf; i++)
    for (int j = 1; j < nhere; j++) shared += frames[i] == here[j];
  assert_true(shared >= 1);
  ruda_error_free(err);
  unsetenv("RUDA_LAUNCH_BLOCKING");
  ruda_device_close(dev, NULL);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(blocking_mode_names_the_faulting_launch),
      cmocka_unit_test(blocking_mode_names_the_faulting_replayed_launch),
  };
  return gpu_main("gpu_fault_blocking", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* gpu_fault_blocking.c - RUDA_LAUNCH_BLOCKING: the worker waits for the
 * device after every command, so a planted illegal address is reported
 * as the error of the launch that caused it, with the backtrace of the
 * call that enqueued it; in a replayed graph, as the error of the replay
 * naming the recorded launch. A fault poisons the process's primary
 * context, so each case runs in a process of its own (one ctest each). */
#include <cuda.h>
#include <execinfo.h>

#include "gpu_common.h"

/* A device in blocking mode with a healthy kernel ("step", over one
 * buffer made on stream `home`) and the planted fault, ready to launch. */
typedef struct blocking_case {
  ruda_device *dev;
  unsigned n, k;
  uint64_t bad;
  ruda_handle h;
  ruda_arg sargs[3], fa;
  ruda_launch_desc step, fault;
} blocking_case;

static void blocking_open(blocking_case *c, ruda_stream_id home) {
  setenv("RUDA_LAUNCH_BLOCKING", "1", 1);
  c->dev = gpu_open();
  assert_ok(ruda_kernel_source(c->dev, "planted_fault", SRC_FAULT, NULL));
  assert_ok(ruda_kernel_source(c->dev, "step", SRC_STEP, NULL));
  c->n = 1024, c->k = 0, c->bad = 8;
  assert_ok(ruda_buffer_create(c->dev, home, c->n * 4, &c->h));
  c->sargs[0] = ruda_arg_scalar(&c->n, 4);
  c->sargs[1] = ruda_arg_buffer(ruda_bind(c->h));
  c->sargs[2] = ruda_arg_scalar(&c->k, 4);
  c->step = (ruda_launch_desc){.kernel = "step", .grid = {4, 1, 1}, .block = {256, 1, 1}, .args = c->sargs, .nargs = 3};
  c->fa = ruda_arg_scalar(&c->bad, 8);
  c->fault = (ruda_launch_desc){.kernel = "planted_fault", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &c->fa, .nargs = 1};
}

/* Stream 0's sync reports the fault first, its message holding `names`
 * and `command` (when not NULL), with the backtrace of the enqueuing
 * call (here: its callers'); then the device is closed. */
static void blocking_check(blocking_case *c, void *const *here, int nhere, const char *names, const char *command) {
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(c->dev, 0, &err), RUDA_EUNHEALTHY);
  ruda_error_print(err, stderr, 1);
  const ruda_error *first = ruda_error_cause(err);
  /* The headline is the faulting command itself, not a later wait. */
  assert_contains(ruda_error_message(first), names);
  if (command != NULL) assert_contains(ruda_error_message(first), command);
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
  ruda_device_close(c->dev, NULL);
}

static void blocking_mode_names_the_faulting_launch(void **state) {
  (void)state;
  blocking_case c;
  blocking_open(&c, 1);
  assert_ok(ruda_launch(c.dev, 1, &c.step)); /* healthy work on another stream */
  gpu_sync_ok(c.dev, 1);
  void *here[24];
  int nhere = backtrace(here, 24);
  assert_ok(ruda_launch(c.dev, 0, &c.fault));
  blocking_check(&c, here, nhere, "ruda_launch \"planted_fault\" (stream 0, command #", NULL);
}

/* The replay runs its commands one by one, each waited for: the fault
 * names the replay's call, its backtrace, and the recorded launch that
 * caused it (its index in the graph, from 1), not a later command. */
static void blocking_mode_names_the_faulting_replayed_launch(void **state) {
  (void)state;
  blocking_case c;
  blocking_open(&c, 0);
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_begin_capture(c.dev, 0));
  assert_ok(ruda_launch(c.dev, 0, &c.step));
  assert_ok(ruda_launch(c.dev, 0, &c.fault));
  assert_ok(ruda_launch(c.dev, 0, &c.step));
  assert_ok(ruda_graph_end_capture(c.dev, 0, &g));
  void *here[24];
  int nhere = backtrace(here, 24);
  assert_ok(ruda_graph_replay(c.dev, 0, g));
  blocking_check(&c, here, nhere, "ruda_graph_replay (stream 0, command #", "command 2 (launch of planted_fault)");
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(blocking_mode_names_the_faulting_launch),
      cmocka_unit_test(blocking_mode_names_the_faulting_replayed_launch),
  };
  return gpu_main("gpu_fault_blocking", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* gpu_call_fault.c - a fault in work a library call issued: the report
 * names the call (stream and command number) among what was in flight, as
 * it names a kernel ruda launched. A fault poisons the process's primary
 * context, so this binary holds only this case. */
#include <cuda.h>

#include "gpu_common.h"
#include "backends/cuda/cuda_internal.h"
#include "src/api.h"

/* The "library": a raw launch of a kernel writing through address 8 on
 * the call's stream, as a buggy library kernel would. */
static int faulting_library(const ruda_call_ctx *c, void *user) {
  CUfunction f = user;
  uint64_t bad = 8;
  void *params[1] = {&bad};
  return (int)ruda__cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)c->cu_stream, params, NULL);
}

static void a_fault_in_a_calls_work_names_the_call(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "planted_fault", SRC_FAULT, NULL));
  CUfunction f = ((ruda__cu_kernel *)ruda__kernel_find(dev, "planted_fault")->impl)->fn;
  ruda_call_desc d = {.name = "buggy", .fn = faulting_library, .user = f};
  assert_ok(ruda_call(dev, 2, &d)); /* enqueued fine: the fault is asynchronous */
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, 2, &err), RUDA_EUNHEALTHY);
  ruda_error_print(err, stderr, 0);
  const ruda_error *first = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(first), RUDA_EFAULTED);
  assert_contains(ruda_error_message(first), "ruda_call (stream 2, command #1)");
  ruda_error_free(err);
  ruda_device_close(dev, NULL);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_fault_in_a_calls_work_names_the_call),
  };
  return gpu_main("gpu_call_fault", tests, sizeof tests / sizeof tests[0], argc, argv);
}

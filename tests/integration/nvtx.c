/* nvtx.c - NVTX ranges (scheduler/nvtx.h) seen by a tool: run with
 * NVTX_INJECTION64_PATH pointing at tests/nvtx_inject.c's library (ctest
 * does), which records what NVTX hands it. Each command is a range named
 * after its kernel or kind in the domain "ruda", on a worker thread named
 * "ruda worker N", with its stream as category ("stream N") and its
 * command number as payload; users' ranges land on their own thread. */
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

static int k_touch(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  ((uint32_t *)args[0])[0]++;
  return 0;
}

#define GET(lib, fn) ((__typeof__(&fn))dlsym(lib, #fn))
const char *nvtx_inject_domain(uint32_t i);
uint32_t nvtx_inject_count(const char *msg);
uint32_t nvtx_inject_pops(void);
int nvtx_inject_range(const char *msg, uint32_t i, uint32_t *category, uint64_t *payload, uint32_t *tid);
const char *nvtx_inject_category(uint32_t id);
const char *nvtx_inject_thread(uint32_t tid);

static void commands_are_ranges(void **state) {
  (void)state;
  const char *path = getenv("NVTX_INJECTION64_PATH");
  if (path == NULL || *path == '\0')
    test_skip("NVTX_INJECTION64_PATH does not name the test tool (ctest sets it to libruda_nvtx_inject)");
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "nvtx_touch", k_touch));
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 3, 64, &x));
  assert_ok(ruda_buffer_create(dev, 7, 64, &y));
  uint32_t zero[16] = {0}, got[16];
  test_write(dev, 3, ruda_bind(x), zero, sizeof zero); /* stream 3: command 1 */
  ruda_arg ax = ruda_arg_buffer(ruda_bind(x)), ay = ruda_arg_buffer(ruda_bind(y));
  assert_ok(test_launch(dev, 3, "nvtx_touch", &ax, 1)); /* 2 */
  assert_ok(test_launch(dev, 3, "nvtx_touch", &ax, 1)); /* 3 */
  assert_ok(test_launch(dev, 7, "nvtx_touch", &ay, 1));
  test_read(dev, 3, ruda_bind(x), got, sizeof got);
  assert_int_equal(got[0], 2);
  assert_ok(ruda_range_push("user range"));
  assert_rc(ruda_range_push(NULL), RUDA_EINVAL);
  ruda_range_pop();
  assert_ok(ruda_buffer_free(dev, 3, x));
  assert_ok(ruda_buffer_free(dev, 7, y));
  test_close(dev);

  void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib); /* NVTX loaded it */
  assert_string_equal(GET(lib, nvtx_inject_domain)(0), "ruda");
  assert_int_equal(GET(lib, nvtx_inject_count)("nvtx_touch"), 3);
  assert_true(GET(lib, nvtx_inject_count)("write") >= 1);
  assert_true(GET(lib, nvtx_inject_count)("read") >= 1);
  /* Every range was closed, the user's too. */
  assert_int_equal(GET(lib, nvtx_inject_pops)(), GET(lib, nvtx_inject_count)(NULL));
  uint32_t cat, tid;
  uint64_t payload;
  assert_true(GET(lib, nvtx_inject_range)("nvtx_touch", 1, &cat, &payload, &tid));
  assert_int_equal(cat, 3);
  assert_int_equal(payload, 3); /* stream 3's third command */
  const char *tname = GET(lib, nvtx_inject_thread)(tid);
  assert_non_null(tname);
  assert_contains(tname, "ruda worker ");
  assert_string_equal(GET(lib, nvtx_inject_category)(3), "stream 3");
  assert_string_equal(GET(lib, nvtx_inject_category)(7), "stream 7");
  assert_true(GET(lib, nvtx_inject_range)("user range", 0, &cat, &payload, &tid));
  assert_int_equal(tid, (uint32_t)syscall(SYS_gettid));
  dlclose(lib);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(commands_are_ranges),
  };
  return test_main("integration_nvtx", tests, sizeof tests / sizeof tests[0], argc, argv);
}

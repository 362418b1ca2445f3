/* gpu_profile.c - profiling on the cuda backend: the time between two
 * points is the device time of the work in between (timing events and
 * cuEventElapsedTime), not the caller's. Under the mock driver its events
 * keep the time its streams reach them. */
#include "gpu_common.h"

#define MS 1000000ull
#define SPIN 40000000LL /* ~20 ms at the H200's clock; the mock sleeps spin / 2000 us */

static void spin(ruda_device *dev, ruda_stream_id s, ruda_handle h) {
  unsigned n = 1024, v = 1;
  long long sp = SPIN;
  ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&v, 4),
                   ruda_arg_scalar(&sp, 8)};
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "order_fill";
  l.grid = (ruda_dim3){1, 1, 1};
  l.block = (ruda_dim3){32, 1, 1};
  l.args = a;
  l.nargs = 4;
  assert_ok(ruda_launch(dev, s, &l));
}

static void device_time_of_the_work_in_between(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "order_fill", SRC_ORDER, NULL));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 4096, &h));
  ruda_profile_token t;
  uint64_t ns = 0, empty = 0;
  /* Three spins of ~20 ms each: at least 45 ms of device time. */
  assert_ok(ruda_profile_begin(dev, 0, &t));
  for (int i = 0; i < 3; i++) spin(dev, 0, h);
  assert_ok(ruda_profile_end(dev, 0, t, &ns, NULL));
  if (ns < 45 * MS || ns > 2000 * MS) fail_msg("three ~20 ms kernels profiled at %llu ns", (unsigned long long)ns);
  /* The same span with nothing in it. */
  assert_ok(ruda_profile_begin(dev, 0, &t));
  assert_ok(ruda_profile_end(dev, 0, t, &empty, NULL));
  if (empty >= 15 * MS) fail_msg("an empty profile took %llu ns", (unsigned long long)empty);
  /* Nested, on another stream, around work begun before it. */
  ruda_profile_token outer, inner;
  uint64_t a = 0, b = 0;
  assert_ok(ruda_profile_begin(dev, 1, &outer));
  spin(dev, 1, h);
  assert_ok(ruda_profile_begin(dev, 1, &inner));
  spin(dev, 1, h);
  assert_ok(ruda_profile_end(dev, 1, inner, &b, NULL));
  assert_ok(ruda_profile_end(dev, 1, outer, &a, NULL));
  if (b < 15 * MS || a < b + 15 * MS)
    fail_msg("nested profiles: outer %llu ns, inner %llu ns", (unsigned long long)a, (unsigned long long)b);
  assert_ok(ruda_buffer_free(dev, 0, h));
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_time_of_the_work_in_between),
  };
  return gpu_main("gpu_profile", tests, sizeof tests / sizeof tests[0], argc, argv);
}

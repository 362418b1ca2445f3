/* gpu_pool.c - the pools on a real GPU, where device work finishes long
 * after the worker submitted it: memory freed on one stream while a kernel
 * still writes it must not reach another stream, and a buffer another
 * stream still reads must not be reused by its home stream.
 *
 * The kernels spin for tens of milliseconds before touching memory, so a
 * reuse that came too early is overwritten (or read) after the fact and
 * shows in the results. The mock driver does not run these kernels. */
#include "gpu_common.h"

#define MiB (UINT64_C(1) << 20)

static const char *const SRC_SLOW =
    "extern \"C\" __global__ void slow_fill(unsigned n, unsigned *buf, unsigned v, long long spin) {\n"
    "  long long t0 = clock64();\n"
    "  while (clock64() - t0 < spin) {}\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "    buf[i] = v;\n"
    "}\n"
    "extern \"C\" __global__ void slow_copy(unsigned n, const unsigned *src, unsigned *dst, long long spin) {\n"
    "  long long t0 = clock64();\n"
    "  while (clock64() - t0 < spin) {}\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "    dst[i] = src[i];\n"
    "}\n";

/* About 50 ms at the H200's ~2 GHz. */
#define SPIN 100000000LL

static ruda_device *open_pool_gpu(void) {
  ruda_device *dev = gpu_open();
  if (gpu_is_mock(dev)) {
    test_close(dev);
    gpu_skip("the mock driver does not run these kernels");
  }
  assert_ok(ruda_kernel_source(dev, "slow_fill", SRC_SLOW, NULL));
  assert_ok(ruda_kernel_source(dev, "slow_copy", SRC_SLOW, NULL));
  return dev;
}

static int launch(ruda_device *dev, ruda_stream_id s, const char *k, const ruda_arg *a, uint32_t n) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = k;
  l.grid = (ruda_dim3){264, 1, 1};
  l.block = (ruda_dim3){256, 1, 1};
  l.args = a;
  l.nargs = n;
  return ruda_launch(dev, s, &l);
}

static uint64_t ptr(ruda_device *dev, ruda_handle h) {
  uint64_t p;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(h), &p));
  return p;
}

static void fill(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned v, long long spin) {
  ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&v, 4),
                   ruda_arg_scalar(&spin, 8)};
  assert_ok(launch(dev, s, "slow_fill", a, 4));
}

static void expect_all(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned v) {
  unsigned *got = malloc(n * sizeof *got);
  test_read(dev, s, ruda_bind_range(h, 0, (uint64_t)n * 4), got, (size_t)n * 4);
  for (unsigned i = 0; i < n; i++)
    if (got[i] != v) fail_msg("element %u is %#x, expected %#x", i, got[i], v);
  free(got);
}

static void free_then_reuse_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_pool_gpu();
  const uint64_t bytes = 8 * MiB;
  const unsigned n = (unsigned)(bytes / 4);
  for (int round = 0; round < 3; round++) {
    ruda_handle x, y;
    assert_ok(ruda_buffer_create(dev, 0, bytes, &x));
    uint64_t px = ptr(dev, x);
    /* A kernel that writes x only after ~50 ms; x is freed at once and
     * its page handed to the arena while the kernel still runs. */
    fill(dev, 0, x, n, 0xdead0000u + (unsigned)round, SPIN);
    assert_ok(ruda_buffer_free(dev, 0, x));
    assert_ok(ruda_memory_cleanup(dev, 0));
    assert_ok(ruda_buffer_create(dev, 1, bytes, &y));
    assert_true(ptr(dev, y) != px); /* stream 0's fence has not passed */
    fill(dev, 1, y, n, 0x1234u + (unsigned)round, 0);
    gpu_sync_ok(dev, 1);
    gpu_sync_ok(dev, 0); /* the late writes have landed wherever they go */
    expect_all(dev, 1, y, n, 0x1234u + (unsigned)round);
    assert_ok(ruda_buffer_free(dev, 1, y));
  }
  test_close(dev);
}

static void reader_on_another_stream_keeps_the_buffer(void **state) {
  (void)state;
  ruda_device *dev = open_pool_gpu();
  const uint64_t sizes[] = {4096, 200 << 10, 8 * MiB}; /* sliced, exclusive, exclusive */
  for (int k = 0; k < 3; k++) {
    const unsigned n = (unsigned)(sizes[k] / 4);
    ruda_handle x, z, x2;
    assert_ok(ruda_buffer_create(dev, 0, sizes[k], &x));
    assert_ok(ruda_buffer_create(dev, 1, sizes[k], &z));
    uint64_t px = ptr(dev, x);
    /* Written on its home stream; ruda orders frees across streams, the
     * caller orders data (here with a sync). */
    fill(dev, 0, x, n, 0xabc00000u + (unsigned)k, 0);
    gpu_sync_ok(dev, 0);
    /* Stream 1 reads x only after ~50 ms. x is freed on stream 0 right
     * away: its memory must wait for stream 1, not go to x2. */
    long long spin = SPIN;
    ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(x)), ruda_arg_buffer(ruda_bind(z)),
                     ruda_arg_scalar(&spin, 8)};
    assert_ok(launch(dev, 1, "slow_copy", a, 4));
    assert_ok(ruda_flush(dev, 1, NULL)); /* submitted: the worker dropped its pin */
    assert_ok(ruda_buffer_free(dev, 0, x));
    assert_ok(ruda_buffer_create(dev, 0, sizes[k], &x2));
    assert_true(ptr(dev, x2) != px);
    fill(dev, 0, x2, n, 0x5a5a5a5au, 0);
    gpu_sync_ok(dev, 0);
    gpu_sync_ok(dev, 1);
    expect_all(dev, 1, z, n, 0xabc00000u + (unsigned)k);
    assert_ok(ruda_buffer_free(dev, 0, x2));
    assert_ok(ruda_buffer_free(dev, 1, z));
  }
  /* Once stream 1 is done, x's memory is back for stream 0. */
  ruda_memory_stats u;
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_int_equal(u.nallocs, 0);
  test_close(dev);
}

static void oom_is_retried_then_reported(void **state) {
  (void)state;
  ruda_device *dev = open_pool_gpu();
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  /* A third of the device, freed: cached. Two more thirds and a bit only
   * fit once the cached one is given back. */
  const uint64_t third = p.total_mem / 3;
  ruda_handle a, b, c;
  assert_ok(ruda_buffer_create(dev, 0, third, &a));
  assert_ok(ruda_buffer_free(dev, 0, a));
  assert_ok(ruda_buffer_create(dev, 0, third + 64 * MiB, &b));
  assert_ok(ruda_buffer_create(dev, 1, third + 64 * MiB, &c));
  ruda_handle d;
  assert_rc(ruda_buffer_create(dev, 1, third, &d), RUDA_EOUTOFMEMORY);
  assert_ok(ruda_buffer_free(dev, 0, b));
  assert_ok(ruda_buffer_free(dev, 1, c));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(free_then_reuse_on_another_stream),
      cmocka_unit_test(reader_on_another_stream_keeps_the_buffer),
      cmocka_unit_test(oom_is_retried_then_reported),
  };
  return gpu_main("gpu_pool", tests, sizeof tests / sizeof tests[0], argc, argv);
}

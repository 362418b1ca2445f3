/* gpu_fallback.c - what the CUDA facilities do where no driver exists
 * (RUDA_CUDA_DRIVER points at a missing file, so this runs the same on
 * machines with a GPU): backend=cuda fails clearly, auto falls back to
 * host, and the parts of ruda/cuda.h that work on every backend work on
 * the host one - properties, the launch-shape helpers, staging buffers,
 * chunked writes, device pointers. */
#include "common.h"

static ruda_device *open_backend(ruda_backend_kind kind, int *rc) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = kind;
  cfg.log_level = RUDA_LOG_OFF;
  ruda_device *dev = NULL;
  *rc = ruda_device_open(&cfg, &dev);
  return dev;
}

static void cuda_without_driver_is_clear(void **state) {
  (void)state;
  const char *drv = getenv("RUDA_CUDA_DRIVER");
  int rc;
  ruda_device *dev = open_backend(RUDA_BACKEND_CUDA, &rc);
  assert_null(dev);
#ifndef RUDA_TEST_HAVE_CUDA
  /* Built without the toolkit headers: no cuda backend at all. */
  assert_int_equal(rc, RUDA_ENOBACKEND);
  assert_last_error_contains("without CUDA support");
  return;
#endif
  assert_int_equal(rc, RUDA_ENODRIVER);
  assert_int_equal(ruda_error_code(ruda_last_error()), RUDA_ENODRIVER);
  assert_last_error_contains("no CUDA driver");
  assert_last_error_contains(drv);
  /* The answer is the same the second time (the load runs once). */
  dev = open_backend(RUDA_BACKEND_CUDA, &rc);
  assert_int_equal(rc, RUDA_ENODRIVER);
  assert_last_error_contains(drv);
}

/* One driver per process: a later device asking for another driver (a
 * test's stand-in after the real one, or the reverse) is refused, not
 * handed the first one's contexts. */
static void another_driver_later_is_refused(void **state) {
  (void)state;
#ifndef RUDA_TEST_HAVE_CUDA
  skip();
#endif
  char *drv = strdup(getenv("RUDA_CUDA_DRIVER"));
  int rc;
  assert_null(open_backend(RUDA_BACKEND_CUDA, &rc)); /* the process's one load */
  setenv("RUDA_CUDA_DRIVER", "/nonexistent/other/libcuda.so.1", 1);
  assert_null(open_backend(RUDA_BACKEND_CUDA, &rc));
  assert_int_equal(rc, RUDA_ENODRIVER);
  assert_last_error_contains("loaded once per process");
  assert_last_error_contains(drv);
  assert_last_error_contains("/nonexistent/other/libcuda.so.1");
  /* auto still falls back to host, with that reason. */
  ruda_device *dev = open_backend(RUDA_BACKEND_AUTO, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(ruda_device_backend(dev), "host");
  assert_non_null(strstr(ruda_device_fallback_reason(dev), "once per process"));
  ruda_device_close(dev, NULL);
  setenv("RUDA_CUDA_DRIVER", drv, 1);
  assert_null(open_backend(RUDA_BACKEND_CUDA, &rc));
  assert_last_error_contains("no CUDA driver");
  free(drv);
}

static void auto_falls_back_to_host(void **state) {
  (void)state;
  int rc;
  ruda_device *dev = open_backend(RUDA_BACKEND_AUTO, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(ruda_device_backend(dev), "host");
  /* Says why, and gives no advice to choose the host it is already on. */
  assert_non_null(ruda_device_fallback_reason(dev));
  assert_null(strstr(ruda_device_fallback_reason(dev), "backend=host"));
  void *p = NULL;
  assert_rc(ruda_cuda_stream(dev, 0, &p), RUDA_ENOBACKEND);
  assert_rc(ruda_cuda_context(dev, &p), RUDA_ENOBACKEND);
  ruda_staging_stats st;
  assert_rc(ruda_staging_usage(dev, &st), RUDA_ENOBACKEND);
  assert_rc(ruda_kernel_source(dev, "k", "extern \"C\" __global__ void k() {}", NULL), RUDA_ENOBACKEND);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 4096, &h));
  ruda_tensor_map_desc d;
  memset(&d, 0, sizeof d);
  d.rank = 1, d.data_type = 7, d.shape[0] = 16, d.strides[0] = 1, d.box[0] = 16;
  ruda_tensor_map m;
  assert_rc(ruda_tensor_map_encode(dev, ruda_bind(h), &d, &m), RUDA_ENOBACKEND);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void props_on_host(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  assert_string_equal(p.backend, "host");
  assert_string_equal(p.name, "host CPU");
  assert_int_equal(p.warp_size, 32);
  assert_int_equal(p.max_threads_per_block, 1024);
  assert_int_equal(p.max_block.z, 64);
  assert_int_equal(p.max_grid.y, 65535);
  assert_true(p.max_shared_per_block_optin >= p.max_shared_per_block);
  assert_rc(ruda_device_get_props(dev, NULL), RUDA_EINVAL);
  test_close(dev);
}

static void block_for_shapes(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  /* (warp, largest power of two <= min(8, units / warp), 1) */
  const struct {
    uint64_t units;
    uint32_t y;
  } cases[] = {{0, 1}, {1, 1}, {63, 1}, {64, 2}, {100, 2}, {128, 4}, {255, 4}, {256, 8}, {1u << 30, 8}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ruda_dim3 b = ruda_block_for(dev, cases[i].units);
    if (b.x != 32 || b.y != cases[i].y || b.z != 1)
      fail_msg("ruda_block_for(%llu) = (%u,%u,%u), expected (32,%u,1)", (unsigned long long)cases[i].units, b.x,
               b.y, b.z, cases[i].y);
  }
  ruda_dim3 b = ruda_block_for(NULL, 100);
  assert_int_equal(b.x * b.y * b.z, 1);
  test_close(dev);
}

static void grid_spread_shapes(void **state) {
  (void)state;
  ruda_dim3 g;
  uint64_t actual;
  /* Worked cases: x halves into y, then y into z. */
  assert_ok(ruda_grid_spread_max((ruda_dim3){32, 32, 32}, 2048, &g, &actual));
  assert_int_equal(g.x, 32), assert_int_equal(g.y, 32), assert_int_equal(g.z, 2);
  assert_int_equal(actual, 2048);
  assert_ok(ruda_grid_spread_max((ruda_dim3){48, 32, 16}, 3177, &g, &actual));
  assert_int_equal(g.x, 25), assert_int_equal(g.y, 32), assert_int_equal(g.z, 4);
  assert_int_equal(actual, 3200); /* approximate: 23 idle blocks */
  /* Fits as is. */
  assert_ok(ruda_grid_spread_max((ruda_dim3){100, 1, 1}, 100, &g, &actual));
  assert_int_equal(g.x, 100), assert_int_equal(g.y, 1), assert_int_equal(g.z, 1);
  /* Never fewer blocks than asked, always within the maxima. */
  for (uint32_t n = 1; n < 100000; n = n * 3 + 1) {
    assert_ok(ruda_grid_spread_max((ruda_dim3){7, 5, 4096}, n, &g, &actual));
    assert_true(actual >= n);
    assert_true(g.x <= 7 && g.y <= 5 && g.z <= 4096);
  }
  assert_rc(ruda_grid_spread_max((ruda_dim3){2, 2, 2}, 100, &g, &actual), RUDA_EGRIDDIM);
  assert_rc(ruda_grid_spread_max((ruda_dim3){2, 2, 2}, 0, &g, &actual), RUDA_EINVAL);
  ruda_device *dev = test_open_default();
  assert_ok(ruda_grid_spread(dev, 100000, &g, NULL));
  assert_int_equal(g.x, 100000);
  test_close(dev);
}

static void staging_and_chunked_writes_on_host(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  /* Chunked writes: pieces of 8 MiB staged in parallel. */
  const size_t n = (40u << 20) + 3;
  unsigned char *src = malloc(n), *want = malloc(n), *got = malloc(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
  memcpy(want, src, n);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, n, &h));
  test_write(dev, 0, ruda_bind(h), src, n);
  memset(src, 0, n); /* src is free for reuse once the call returned */
  test_read(dev, 0, ruda_bind(h), got, n);
  assert_memory_equal(got, want, n);
  /* Staging buffers handed over without a copy. */
  void *p = NULL;
  assert_rc(ruda_staging_alloc(dev, 0, &p), RUDA_EINVAL);
  assert_ok(ruda_staging_alloc(dev, 4096, &p));
  memset(p, 0xab, 4096);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, 100, 4096));
  assert_ok(ruda_write_staged(dev, 0, &d, p, 4096));
  memset(want + 100, 0xab, 4096);
  test_read(dev, 0, ruda_bind(h), got, n);
  assert_memory_equal(got, want, n);
  assert_ok(ruda_staging_alloc(dev, 10, &p));
  assert_ok(ruda_staging_free(dev, p));
  assert_ok(ruda_staging_free(dev, NULL));
  /* Device pointers of bindings: host addresses here. */
  uint64_t a0, a1;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(h), &a0));
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind_range(h, 10, 5), &a1));
  assert_int_equal(a1, a0 + 10);
  assert_int_equal(((unsigned char *)(uintptr_t)a0)[100], 0xab);
  assert_rc(ruda_binding_device_ptr(dev, ruda_bind_range(h, n, 1), &a1), RUDA_ERANGE);
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_rc(ruda_binding_device_ptr(dev, ruda_bind(h), &a1), RUDA_ENOTFOUND);
  test_close(dev);
  free(src), free(want), free(got);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cuda_without_driver_is_clear),
      cmocka_unit_test(another_driver_later_is_refused),
      cmocka_unit_test(auto_falls_back_to_host),
      cmocka_unit_test(props_on_host),
      cmocka_unit_test(block_for_shapes),
      cmocka_unit_test(grid_spread_shapes),
      cmocka_unit_test(staging_and_chunked_writes_on_host),
  };
  /* No driver, whatever the machine has:
   * the driver is loaded once per process, before any device opens. */
  setenv("RUDA_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  return test_main("gpu_fallback", tests, sizeof tests / sizeof tests[0], argc, argv);
}

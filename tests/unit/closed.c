/* closed.c - every call on a closed device fails with RUDA_ECLOSED.
 *
 * Through the public API a closed device is already freed, so the state
 * "closed but still allocated" (what a call racing with close would see)
 * is made here by setting the flag ruda_device_close sets first. */
#include "common.h"
#include "internal.h"

static int noop(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static void calls_after_close(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "noop", noop));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  char buf[64] = {0};
  ruda_future *f = NULL;
  uint64_t size;
  ruda_error *err = (ruda_error *)&err;

  atomic_store(&dev->closed, 1);
  assert_rc(ruda_buffer_create(dev, 0, 64, &h), RUDA_ECLOSED);
  assert_last_error_contains("ruda_buffer_create: device is closed");
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_ECLOSED);
  assert_rc(ruda_buffer_size(dev, h, &size), RUDA_ECLOSED);
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ECLOSED);
  assert_last_error_contains("ruda_write");
  assert_rc(ruda_read(dev, 0, &d, buf, 64, &f), RUDA_ECLOSED);
  assert_null(f);
  assert_rc(ruda_copy(dev, 0, ruda_bind(h), ruda_bind(h)), RUDA_ECLOSED);
  assert_rc(test_launch(dev, 0, "noop", NULL, 0), RUDA_ECLOSED);
  assert_last_error_contains("ruda_launch");
  assert_rc(ruda_flush(dev, 0, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_rc(ruda_sync(dev, 0, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_rc(ruda_sync_async(dev, 0, &f), RUDA_ECLOSED);
  assert_null(f);
  assert_rc(ruda_host_kernel_register(dev, "other", noop), RUDA_ECLOSED);
  assert_rc(ruda_kernel_source(dev, "other", "src", NULL), RUDA_ECLOSED);
  /* A second close is refused and frees nothing. */
  assert_rc(ruda_device_close(dev, &err), RUDA_ECLOSED);
  assert_null(err);
  assert_last_error_contains("already closed");

  /* Nothing above reached the worker, and the buffer is intact. */
  atomic_store(&dev->closed, 0);
  assert_ok(ruda_buffer_size(dev, h, &size));
  assert_int_equal(size, 64);
  assert_ok(ruda_sync(dev, 0, NULL));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(calls_after_close),
  };
  return test_main("unit_closed", tests, sizeof tests / sizeof tests[0], argc, argv);
}

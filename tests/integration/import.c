/* import.c - foreign memory adopted as buffers (ruda_buffer_import) on the
 * host backend: used like any buffer, refused when it cannot be one, and
 * handed back by its release callback exactly once, after its last use.
 * And the host side of ordering against foreign streams
 * (ruda_cuda_wait_buffer): it waits for the buffer's writers only. */
#include "common.h"

typedef struct released {
  _Atomic int calls;
  uint64_t addr, bytes;
  void *user;
} released;

static void on_release(void *user, uint64_t addr, uint64_t bytes) {
  released *r = user;
  r->addr = addr;
  r->bytes = bytes;
  r->user = user;
  atomic_fetch_add(&r->calls, 1);
}

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

static void import_is_a_buffer_on_every_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  enum { N = 4096 };
  unsigned char *mine = malloc(N), src[N], back[N];
  assert_non_null(mine);
  memset(mine, 0, N);
  for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 1);
  released r = {0};
  ruda_handle h;
  assert_ok(ruda_buffer_import(dev, 1, addr_of(mine), N, on_release, &r, &h));
  uint64_t size = 0, p = 0;
  assert_ok(ruda_buffer_size(dev, h, &size));
  assert_int_equal(size, N);
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(h), &p));
  assert_int_equal(p, addr_of(mine)); /* the caller's memory itself, no copy */
  /* Written on stream 1, copied on stream 2 into a ruda buffer, read on 3:
   * cross-stream order as for any buffer. */
  ruda_handle other;
  assert_ok(ruda_buffer_create(dev, 2, N, &other));
  test_write(dev, 1, ruda_bind(h), src, N);
  assert_ok(ruda_copy(dev, 2, ruda_bind(other), ruda_bind(h)));
  test_read(dev, 3, ruda_bind(other), back, N);
  assert_memory_equal(back, src, N);
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_memory_equal(mine, src, N); /* ruda's write landed in the caller's memory */
  assert_ok(ruda_buffer_free(dev, 2, h));
  assert_ok(ruda_sync(dev, 2, NULL));
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(r.addr, addr_of(mine));
  assert_int_equal(r.bytes, N);
  assert_ptr_equal(r.user, &r);
  assert_int_equal(ruda_buffer_free(dev, 2, h), RUDA_EFREE);
  assert_ok(ruda_buffer_free(dev, 2, other));
  test_close(dev);
  assert_int_equal(atomic_load(&r.calls), 1); /* never twice */
  free(mine);
}

static void import_refuses_what_cannot_be_a_buffer(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  static unsigned char mem[1024];
  released r = {0};
  ruda_handle h, h2;
  assert_int_equal(ruda_buffer_import(dev, 0, addr_of(mem), 0, on_release, &r, &h), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "bytes is 0"));
  assert_int_equal(ruda_buffer_import(dev, 0, 0, 16, on_release, &r, &h), RUDA_EINVAL);
  assert_int_equal(ruda_buffer_import(dev, 0, UINT64_C(1) << 63, 16, on_release, &r, &h), RUDA_EINVAL);
  assert_int_equal(ruda_buffer_import(dev, 0, UINT64_MAX - 4, 16, on_release, &r, &h), RUDA_EINVAL);
  assert_int_equal(ruda_buffer_import(dev, 0, addr_of(mem), 16, on_release, &r, NULL), RUDA_EINVAL);
  assert_ok(ruda_buffer_import(dev, 0, addr_of(mem) + 256, 512, on_release, &r, &h));
  /* Overlaps: inside, across either end, around; touching ends are fine. */
  const uint64_t a = addr_of(mem);
  const uint64_t bad[][2] = {{a + 300, 16}, {a + 200, 100}, {a + 700, 100}, {a, 1024}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ruda_buffer_import(dev, 0, bad[i][0], bad[i][1], on_release, &r, &h2), RUDA_EINVAL);
    assert_non_null(strstr(ruda_error_message(ruda_last_error()), "overlaps the import"));
  }
  assert_ok(ruda_buffer_import(dev, 0, a, 256, NULL, NULL, &h2));
  assert_ok(ruda_buffer_free(dev, 0, h2));
  assert_int_equal(atomic_load(&r.calls), 0); /* nothing refused was ever adopted */
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&r.calls), 1);
  /* Released: the range may be imported again. */
  assert_ok(ruda_buffer_import(dev, 0, a + 256, 512, on_release, &r, &h));
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
  assert_int_equal(atomic_load(&r.calls), 2);
}

static int add_one(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  unsigned char *p = args[0];
  for (int i = 0; i < 64; i++) p[i]++;
  return 0;
}

static void release_waits_for_the_last_use(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "add_one", add_one));
  unsigned char mine[64] = {0};
  released r = {0};
  ruda_handle h;
  assert_ok(ruda_buffer_import(dev, 0, addr_of(mine), sizeof mine, on_release, &r, &h));
  atomic_store(&test_gate_open, 0);
  int before = atomic_load(&test_gate_entered);
  assert_ok(test_launch(dev, 1, "gate", NULL, 0));
  ruda_arg arg = ruda_arg_buffer(ruda_bind(h));
  assert_ok(test_launch(dev, 1, "add_one", &arg, 1)); /* queued behind the gate */
  test_wait_count(&test_gate_entered, before + 1);
  assert_ok(ruda_buffer_free(dev, 2, h)); /* the handle dies, the use is still queued */
  assert_ok(ruda_sync(dev, 2, NULL));
  usleep(20000);
  assert_int_equal(atomic_load(&r.calls), 0);
  assert_int_equal(mine[0], 0);
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_int_equal(atomic_load(&r.calls), 1);
  for (int i = 0; i < 64; i++) assert_int_equal(mine[i], 1);
  test_close(dev);
  assert_int_equal(atomic_load(&r.calls), 1);
}

static void close_releases_what_was_never_freed(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  unsigned char a[32], b[32];
  released ra = {0}, rb = {0};
  ruda_handle ha, hb;
  assert_ok(ruda_buffer_import(dev, 0, addr_of(a), sizeof a, on_release, &ra, &ha));
  assert_ok(ruda_buffer_import(dev, 3, addr_of(b), sizeof b, on_release, &rb, &hb));
  test_write(dev, 3, ruda_bind(hb), "0123456789abcdef0123456789abcdef", 32);
  test_close(dev);
  assert_int_equal(atomic_load(&ra.calls), 1);
  assert_int_equal(atomic_load(&rb.calls), 1);
  assert_memory_equal(b, "0123456789abcdef0123456789abcdef", 32);
}

static int slow_fill(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  usleep(100000);
  memset(args[0], 0x5c, 256);
  return 0;
}

static void wait_buffer_waits_for_its_writers_not_other_streams(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "slow_fill", slow_fill));
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, 256, &x));
  assert_ok(ruda_buffer_create(dev, 0, 256, &y));
  /* A long kernel on stream 2, using another buffer, held by the gate. */
  atomic_store(&test_gate_open, 0);
  int before = atomic_load(&test_gate_entered);
  ruda_arg ya = ruda_arg_buffer(ruda_bind(y));
  assert_ok(test_launch(dev, 2, "gate", &ya, 1));
  test_wait_count(&test_gate_entered, before + 1);
  /* x's writer runs on stream 3; the wait is ordered on stream 1. */
  ruda_arg xa = ruda_arg_out(ruda_bind(x));
  assert_ok(test_launch(dev, 3, "slow_fill", &xa, 1));
  assert_ok(ruda_cuda_wait_buffer(dev, 1, ruda_bind(x), NULL, NULL));
  uint64_t p = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(x), &p));
  const unsigned char *bytes = (const unsigned char *)(uintptr_t)p;
  for (int i = 0; i < 256; i++) assert_int_equal(bytes[i], 0x5c); /* the writer ran */
  assert_int_equal(atomic_load(&test_gate_open), 0);                /* stream 2 still runs */
  void *foreign = (void *)(uintptr_t)1;
  assert_rc(ruda_cuda_wait_buffer(dev, 1, ruda_bind(x), foreign, NULL), RUDA_ENOBACKEND);
  assert_rc(ruda_buffer_wait_cuda(dev, 1, ruda_bind(x), foreign), RUDA_ENOBACKEND);
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(import_is_a_buffer_on_every_stream),
      cmocka_unit_test(import_refuses_what_cannot_be_a_buffer),
      cmocka_unit_test(release_waits_for_the_last_use),
      cmocka_unit_test(close_releases_what_was_never_freed),
      cmocka_unit_test(wait_buffer_waits_for_its_writers_not_other_streams),
  };
  return test_main("import", tests, sizeof tests / sizeof tests[0], argc, argv);
}

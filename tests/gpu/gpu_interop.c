/* gpu_interop.c - foreign device memory adopted as buffers
 * (ruda_buffer_import) on the cuda backend: the driver's pointer
 * attributes refuse what cannot be a buffer of this device, and the owner
 * gets the memory back once, after its last use. Runs against the real
 * driver and the mock (whose foreign-context hook it uses where present). */
#include <dlfcn.h>

#include "gpu_common.h"

typedef struct released {
  _Atomic int calls;
  uint64_t addr, bytes;
} released;

static void on_release(void *user, uint64_t addr, uint64_t bytes) {
  released *r = user;
  r->addr = addr;
  r->bytes = bytes;
  atomic_fetch_add(&r->calls, 1);
}

/* Runs with the device's context current on this thread. */
typedef struct ctx_guard {
  CUcontext prev;
} ctx_guard;

static ctx_guard ctx_enter(ruda_device *dev) {
  void *ctx = NULL;
  ctx_guard g = {NULL};
  assert_ok(ruda_cuda_context(dev, &ctx));
  ruda__cu.cuCtxGetCurrent(&g.prev);
  ruda__cu.cuCtxSetCurrent((CUcontext)ctx);
  return g;
}

static void ctx_leave(ctx_guard g) { ruda__cu.cuCtxSetCurrent(g.prev); }

static void import_device_memory_round_trip(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  enum { N = 1 << 16 };
  ctx_guard g = ctx_enter(dev);
  CUdeviceptr p = 0;
  assert_int_equal(ruda__cu.cuMemAlloc(&p, N), CUDA_SUCCESS);
  ctx_leave(g);
  released r = {0};
  ruda_handle h, other;
  assert_ok(ruda_buffer_import(dev, 1, (uint64_t)p, N, on_release, &r, &h));
  uint64_t addr = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(h), &addr));
  assert_int_equal(addr, (uint64_t)p);
  unsigned char *src = malloc(N), *back = malloc(N);
  for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 31 + 3);
  assert_ok(ruda_buffer_create(dev, 2, N, &other));
  test_write(dev, 1, ruda_bind(h), src, N);                     /* stream 1 writes the import */
  assert_ok(ruda_copy(dev, 2, ruda_bind(other), ruda_bind(h))); /* stream 2 reads it after */
  memset(back, 0, N);
  test_read(dev, 3, ruda_bind(other), back, N);
  assert_memory_equal(back, src, N);
  assert_ok(ruda_buffer_free(dev, 3, h));
  assert_ok(ruda_device_sync(dev, NULL));
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(r.addr, (uint64_t)p);
  assert_int_equal(r.bytes, N);
  assert_ok(ruda_buffer_free(dev, 2, other));
  g = ctx_enter(dev);
  assert_int_equal(ruda__cu.cuMemFree(p), CUDA_SUCCESS); /* the owner frees what it got back */
  ctx_leave(g);
  test_close(dev);
  assert_int_equal(atomic_load(&r.calls), 1);
  free(src);
  free(back);
}

static void import_refuses_foreign_and_host_pointers(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  released r = {0};
  ruda_handle h;
  ctx_guard g = ctx_enter(dev);
  CUdeviceptr p = 0;
  assert_int_equal(ruda__cu.cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  ctx_leave(g);
  /* Past the end of its allocation. */
  assert_rc(ruda_buffer_import(dev, 0, (uint64_t)p + 1024, 4096, on_release, &r, &h), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "runs past its allocation"));
  /* Pageable host memory: the driver does not know it. */
  void *plain = malloc(4096);
  assert_rc(ruda_buffer_import(dev, 0, (uint64_t)(uintptr_t)plain, 4096, on_release, &r, &h), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "no device memory the driver knows"));
  free(plain);
  /* Page-locked host memory (a staging block): host, not device. */
  void *pinned = NULL;
  assert_ok(ruda_staging_alloc(dev, 4096, &pinned));
  assert_rc(ruda_buffer_import(dev, 0, (uint64_t)(uintptr_t)pinned, 4096, on_release, &r, &h), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "not device memory"));
  assert_ok(ruda_staging_free(dev, pinned));
  /* Zero bytes; an overlap with a live import. */
  assert_rc(ruda_buffer_import(dev, 0, (uint64_t)p, 0, on_release, &r, &h), RUDA_EINVAL);
  assert_ok(ruda_buffer_import(dev, 0, (uint64_t)p, 2048, on_release, &r, &h));
  ruda_handle h2;
  assert_rc(ruda_buffer_import(dev, 0, (uint64_t)p + 1024, 2048, on_release, &r, &h2), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "overlaps the import"));
  assert_ok(ruda_buffer_import(dev, 0, (uint64_t)p + 2048, 2048, NULL, NULL, &h2));
  /* Another context's memory: the mock makes some; on a real device a
   * second device's allocation would (not every machine has two). */
  const char *path = getenv("RUDA_CUDA_DRIVER");
  void *lib = gpu_is_mock(dev) && path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *(*foreign_alloc)(size_t) = NULL;
  void (*foreign_free)(void *) = NULL;
  if (lib != NULL) {
    void *a = dlsym(lib, "ruda_mock_foreign_alloc"), *f = dlsym(lib, "ruda_mock_foreign_free");
    memcpy(&foreign_alloc, &a, sizeof a);
    memcpy(&foreign_free, &f, sizeof f);
  }
  if (foreign_alloc != NULL) {
    void *q = foreign_alloc(4096);
    ruda_handle h3;
    assert_rc(ruda_buffer_import(dev, 0, (uint64_t)(uintptr_t)q, 4096, on_release, &r, &h3), RUDA_EINVAL);
    assert_non_null(strstr(ruda_error_message(ruda_last_error()), "another context"));
    foreign_free(q);
  }
  assert_int_equal(atomic_load(&r.calls), 0); /* nothing refused was adopted */
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_ok(ruda_buffer_free(dev, 0, h2));
  assert_ok(ruda_device_sync(dev, NULL));
  assert_int_equal(atomic_load(&r.calls), 1);
  g = ctx_enter(dev);
  assert_int_equal(ruda__cu.cuMemFree(p), CUDA_SUCCESS);
  ctx_leave(g);
  test_close(dev);
}

/* The mock's hook that keeps every stream from starting work (NULL on a
 * real device): both sides' work is then issued before either runs, so a
 * missing link shows as a race on the data, not a lucky order. */
static void (*hold_streams)(int on);

static void hold(int on) {
  if (hold_streams != NULL) hold_streams(on);
}

static void find_hold(ruda_device *dev) {
  void *f = gpu_mock_hook(dev, "ruda_mock_hold_streams");
  memcpy(&hold_streams, &f, sizeof f);
}

/* Both directions against a stream ruda does not own: the foreign
 * stream's copy sees ruda's write, ruda's read sees the foreign memset,
 * with no host synchronization in between. */
static void foreign_stream_ordering_both_ways(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  find_hold(dev);
  enum { N = 1 << 20 };
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 1, N, &x));
  uint64_t xp = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(x), &xp));
  ctx_guard g = ctx_enter(dev);
  CUstream ext = NULL;
  assert_int_equal(ruda__cu.cuStreamCreate(&ext, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ctx_leave(g);
  unsigned char *src = malloc(N), *back = malloc(N);
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 13 + round);
    hold(1);
    test_write(dev, 1, ruda_bind(x), src, N);
    assert_ok(ruda_cuda_wait_buffer(dev, 2, ruda_bind(x), ext, NULL)); /* ordered on another stream */
    memset(back, 0, N);
    g = ctx_enter(dev);
    assert_int_equal(ruda__cu.cuMemcpyDtoHAsync(back, (CUdeviceptr)xp, N, ext), CUDA_SUCCESS);
    hold(0);
    assert_int_equal(ruda__cu.cuStreamSynchronize(ext), CUDA_SUCCESS);
    ctx_leave(g);
    assert_memory_equal(back, src, N);
    /* The other way: the foreign stream writes, ruda reads after it. */
    hold(1);
    g = ctx_enter(dev);
    assert_int_equal(ruda__cu.cuMemsetD8Async((CUdeviceptr)xp, (unsigned char)(0x70 + round), N, ext),
                     CUDA_SUCCESS);
    ctx_leave(g);
    assert_ok(ruda_buffer_wait_cuda(dev, 3, ruda_bind(x), ext));
    ruda_copy_desc rd = ruda_copy_contiguous(ruda_bind(x));
    ruda_future *f = NULL;
    assert_ok(ruda_read(dev, 0, &rd, back, N, &f));
    hold(0);
    assert_ok(ruda_future_wait(f, NULL));
    ruda_future_free(f);
    for (int i = 0; i < N; i++)
      if (back[i] != 0x70 + round) fail_msg("round %d: byte %d is 0x%x, not the foreign memset's", round, i, back[i]);
  }
  g = ctx_enter(dev);
  assert_int_equal(ruda__cu.cuStreamDestroy(ext), CUDA_SUCCESS);
  ctx_leave(g);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
  free(src);
  free(back);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(import_device_memory_round_trip),
      cmocka_unit_test(import_refuses_foreign_and_host_pointers),
      cmocka_unit_test(foreign_stream_ordering_both_ways),
  };
  return gpu_main("gpu_interop", tests, sizeof tests / sizeof tests[0], argc, argv);
}

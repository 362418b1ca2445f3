/* gpu_copies.c - copies on the cuda backend: contiguous and chunked
 * uploads, 2D/3D strided round trips against a CPU model, layouts that
 * cannot be expressed, device-to-device copies, staging buffers, a 1 GiB
 * upload verified by a checksum computed on the device, interop handles
 * and out-of-memory. */
#include "gpu_common.h"
#include "backends/cuda/cuda_internal.h"

static void fill_bytes(unsigned char *p, size_t n, uint64_t *seed) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t r = gpu_rand(seed);
    memcpy(p + i, &r, 8);
  }
  for (; i < n; i++) p[i] = (unsigned char)gpu_rand(seed);
}

static void contiguous_round_trips(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  /* The last two take the chunked path (pieces of 8 MiB). */
  const size_t sizes[] = {1, 3, 4096, (1u << 20) + 7, (8u << 20) + 1, (40u << 20) + 5};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    const size_t n = sizes[s];
    unsigned char *src = malloc(n), *want = malloc(n), *got = malloc(n);
    fill_bytes(src, n, &seed);
    memcpy(want, src, n);
    ruda_handle h;
    assert_ok(ruda_buffer_create(dev, 0, n, &h));
    test_write(dev, 0, ruda_bind(h), src, n);
    memset(src, 0x77, n); /* the caller may reuse src at once */
    test_read(dev, 0, ruda_bind(h), got, n);
    assert_memory_equal(got, want, n);
    /* A write at an offset lands there and nowhere else. */
    if (n >= 4096) {
      unsigned char patch[1000];
      fill_bytes(patch, sizeof patch, &seed);
      ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, n / 3, sizeof patch));
      assert_ok(ruda_write(dev, 0, &d, patch, sizeof patch));
      memcpy(want + n / 3, patch, sizeof patch);
      test_read(dev, 0, ruda_bind(h), got, n);
      assert_memory_equal(got, want, n);
    }
    assert_ok(ruda_buffer_free(dev, 0, h));
    free(src), free(want), free(got);
  }
  test_close(dev);
}

/* Offset in bytes of the k-th element (row-major) of a descriptor. */
static uint64_t offset_of(const ruda_copy_desc *d, uint64_t k) {
  uint64_t off = 0;
  for (int i = (int)d->rank - 1; i >= 0; i--) {
    off += (k % d->shape[i]) * d->strides[i];
    k /= d->shape[i];
  }
  return d->binding.offset + off * d->elem_size;
}

/* Writes random dense data through d, checks the whole buffer against a
 * model, then reads d back and checks it. */
static void strided_round_trip(ruda_device *dev, ruda_handle h, unsigned char *model, size_t size,
                               const ruda_copy_desc *d, uint64_t *seed) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < d->rank; i++) n *= d->shape[i];
  const size_t len = n * d->elem_size;
  unsigned char *src = malloc(len), *back = malloc(len), *all = malloc(size);
  fill_bytes(src, len, seed);
  assert_ok(ruda_write(dev, 1, d, src, len));
  for (uint64_t k = 0; k < n; k++) memcpy(model + offset_of(d, k), src + k * d->elem_size, d->elem_size);
  test_read(dev, 1, ruda_bind(h), all, size);
  assert_memory_equal(all, model, size);
  ruda_future *f;
  assert_ok(ruda_read(dev, 1, d, back, len, &f));
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  assert_memory_equal(back, src, len);
  free(src), free(back), free(all);
}

static ruda_copy_desc desc(ruda_handle h, uint64_t offset, uint32_t es, uint32_t rank, const uint64_t *shape,
                           const uint64_t *strides) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, offset, 0));
  d.rank = rank;
  d.elem_size = es;
  for (uint32_t i = 0; i < rank; i++) d.shape[i] = shape[i], d.strides[i] = strides[i];
  return d;
}

/* A read into page-locked memory from ruda_staging_alloc lands there
 * directly: the bytes are right once the future is waited, for a dense and
 * a strided source, and staging usage does not grow by a bounce block. */
static void read_into_staging_memory(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const size_t size = 256 << 10;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 1, size, &h));
  unsigned char *model = malloc(size);
  fill_bytes(model, size, &seed);
  test_write(dev, 1, ruda_bind(h), model, size);
  unsigned char *dst = NULL;
  assert_ok(ruda_staging_alloc(dev, size, (void **)&dst));
  memset(dst, 0xa5, size);
  test_read(dev, 1, ruda_bind(h), dst, size);
  assert_memory_equal(dst, model, size);
  /* Every other 64-byte row of the first 128 KiB. */
  const uint64_t shape[2] = {1024, 64}, strides[2] = {128, 1};
  ruda_copy_desc d = desc(h, 0, 1, 2, shape, strides);
  memset(dst, 0, size);
  ruda_future *f;
  assert_ok(ruda_read(dev, 1, &d, dst, 1024 * 64, &f));
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  for (size_t r = 0; r < 1024; r++) assert_memory_equal(dst + r * 64, model + r * 128, 64);
  assert_ok(ruda_staging_free(dev, dst));
  assert_ok(ruda_buffer_free(dev, 1, h));
  free(model);
  test_close(dev);
}

static void strided_2d_and_3d_round_trips(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const size_t size = 1 << 20;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 1, size, &h));
  unsigned char *model = malloc(size);
  fill_bytes(model, size, &seed);
  test_write(dev, 1, ruda_bind(h), model, size);

  /* 2D: 37 rows of 29 floats, row stride 41 elements, at an offset. */
  ruda_copy_desc d2 = desc(h, 100, 4, 2, (uint64_t[]){37, 29}, (uint64_t[]){41, 1});
  strided_round_trip(dev, h, model, size, &d2, &seed);
  /* 3D, slice stride a whole number of rows: one cuMemcpy3DAsync. */
  ruda_copy_desc d3 = desc(h, 64, 2, 3, (uint64_t[]){5, 7, 11}, (uint64_t[]){8 * 16, 16, 1});
  strided_round_trip(dev, h, model, size, &d3, &seed);
  /* 3D, slice stride not a multiple of the row stride: 2D per slice. */
  ruda_copy_desc d3l = desc(h, 8, 8, 3, (uint64_t[]){6, 4, 3}, (uint64_t[]){53, 13, 1});
  strided_round_trip(dev, h, model, size, &d3l, &seed);
  /* Rank 5 that merges down to 2D (inner dims contiguous, unit dims). */
  ruda_copy_desc d5 = desc(h, 0, 4, 5, (uint64_t[]){9, 1, 4, 5, 6}, (uint64_t[]){400, 7, 30, 6, 1});
  strided_round_trip(dev, h, model, size, &d5, &seed);
  /* A column: rows one element wide. */
  ruda_copy_desc col = desc(h, 4, 4, 2, (uint64_t[]){50, 1}, (uint64_t[]){7, 1});
  strided_round_trip(dev, h, model, size, &col, &seed);
  /* Random 2D shapes. */
  for (int i = 0; i < 20; i++) {
    uint64_t rows = 1 + gpu_rand(&seed) % 50, cols = 1 + gpu_rand(&seed) % 50;
    uint64_t pitch = cols + gpu_rand(&seed) % 20;
    uint32_t es = 1u << (gpu_rand(&seed) % 4);
    uint64_t off = (gpu_rand(&seed) % 64) * es;
    if (off + (rows * pitch) * es > size) continue;
    ruda_copy_desc d = desc(h, off, es, 2, (uint64_t[]){rows, cols}, (uint64_t[]){pitch, 1});
    strided_round_trip(dev, h, model, size, &d, &seed);
  }
  assert_ok(ruda_buffer_free(dev, 1, h));
  test_close(dev);
  free(model);
}

static void unsupported_strides_fail_at_the_call(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 1 << 16, &h));
  unsigned char buf[4096];
  memset(buf, 1, sizeof buf);
  ruda_future *f = NULL;
  /* Innermost stride 2: a gather no driver copy expresses. */
  ruda_copy_desc gather = desc(h, 0, 4, 2, (uint64_t[]){4, 8}, (uint64_t[]){32, 2});
  assert_rc(ruda_write(dev, 0, &gather, buf, 4 * 8 * 4), RUDA_EUNSUPPORTEDSTRIDES);
  assert_last_error_contains("innermost stride is 2");
  assert_rc(ruda_read(dev, 0, &gather, buf, 4 * 8 * 4, &f), RUDA_EUNSUPPORTEDSTRIDES);
  assert_null(f);
  /* Four dimensions that do not merge. */
  ruda_copy_desc four = desc(h, 0, 1, 4, (uint64_t[]){2, 3, 4, 5}, (uint64_t[]){1000, 200, 20, 1});
  assert_rc(ruda_write(dev, 0, &four, buf, 120), RUDA_EUNSUPPORTEDSTRIDES);
  assert_last_error_contains("ruda_write");
  /* Overlapping rows. */
  ruda_copy_desc overlap = desc(h, 0, 1, 2, (uint64_t[]){4, 10}, (uint64_t[]){5, 1});
  assert_rc(ruda_write(dev, 0, &overlap, buf, 40), RUDA_EUNSUPPORTEDSTRIDES);
  /* Nothing was enqueued by the refused calls. */
  gpu_sync_ok(dev, 0);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void device_to_device_copy(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const size_t n = 3 << 20;
  unsigned char *a = malloc(n), *got = malloc(n);
  fill_bytes(a, n, &seed);
  ruda_handle ha, hb;
  assert_ok(ruda_buffer_create(dev, 0, n, &ha));
  assert_ok(ruda_buffer_create(dev, 0, n, &hb));
  test_write(dev, 0, ruda_bind(ha), a, n);
  unsigned char *zero = calloc(n, 1);
  test_write(dev, 0, ruda_bind(hb), zero, n);
  assert_ok(ruda_copy(dev, 0, ruda_bind_range(hb, 4096, 1 << 20), ruda_bind_range(ha, 12345, 1 << 20)));
  test_read(dev, 0, ruda_bind(hb), got, n);
  memcpy(zero + 4096, a + 12345, 1 << 20);
  assert_memory_equal(got, zero, n);
  assert_ok(ruda_buffer_free(dev, 0, ha));
  assert_ok(ruda_buffer_free(dev, 0, hb));
  test_close(dev);
  free(a), free(got), free(zero);
}

/* Staging blocks come back once the worker sees their copies done; it
 * polls on a short timer, so wait a little. */
static void wait_staging_back(ruda_device *dev, uint64_t baseline) {
  ruda_staging_stats st;
  for (int i = 0; i < 2000; i++) {
    assert_ok(ruda_staging_usage(dev, &st));
    if (st.in_use_bytes <= baseline) return;
    usleep(1000);
  }
  fail_msg("staging in use stayed at %llu bytes (baseline %llu)", (unsigned long long)st.in_use_bytes,
           (unsigned long long)baseline);
}

static void staged_writes_and_usage(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  ruda_staging_stats st0, st;
  assert_ok(ruda_staging_usage(dev, &st0));
  assert_true(st0.limit_bytes > 0);
  assert_true(st0.chunk_bytes > 0);
  const size_t n = 256u << 20;
  void *p = NULL;
  assert_ok(ruda_staging_alloc(dev, n, &p));
  assert_ok(ruda_staging_usage(dev, &st));
  assert_true(st.in_use_bytes >= st0.in_use_bytes + n);
  assert_true(st.pinned_bytes >= n);
  assert_int_equal(st.fallback_count, 0);
  fill_bytes(p, n, &seed);
  unsigned char *want = malloc(n), *got = malloc(n);
  memcpy(want, p, n);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, n, &h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  assert_rc(ruda_write_staged(dev, 0, &d, p, n + 1), RUDA_EINVAL); /* caller keeps p */
  assert_ok(ruda_write_staged(dev, 0, &d, p, n));                  /* ruda owns p now */
  test_read(dev, 0, ruda_bind(h), got, n);
  assert_memory_equal(got, want, n);
  wait_staging_back(dev, st0.in_use_bytes);
  assert_ok(ruda_staging_usage(dev, &st));
  assert_true(st.peak_bytes >= n);
  /* A buffer taken and given back without use. */
  assert_ok(ruda_staging_alloc(dev, 1000, &p));
  assert_ok(ruda_staging_free(dev, p));
  assert_ok(ruda_staging_usage(dev, &st));
  assert_int_equal(st.in_use_bytes, st0.in_use_bytes);
  /* A read whose future is dropped unwaited still returns its staging. */
  ruda_future *f;
  assert_ok(ruda_read(dev, 0, &d, got, n, &f));
  ruda_future_free(f);
  gpu_sync_ok(dev, 0);
  wait_staging_back(dev, st0.in_use_bytes);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
  free(want), free(got);
}

static void upload_1gib_verified_by_checksum(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const uint64_t n = (1ull << 30) / 4;
  uint32_t *w = malloc(n * 4);
  assert_non_null(w);
  uint64_t want = 0;
  for (uint64_t i = 0; i < n; i += 2) {
    uint64_t r = gpu_rand(&seed);
    w[i] = (uint32_t)r;
    w[i + 1] = (uint32_t)(r >> 32);
    want += (uint64_t)w[i] * (2 * i + 1) + (uint64_t)w[i + 1] * (2 * i + 3);
  }
  assert_ok(ruda_kernel_source(dev, "checksum", SRC_CHECKSUM, NULL));
  ruda_handle h, hs;
  assert_ok(ruda_buffer_create(dev, 0, n * 4, &h));
  const uint64_t zero = 0;
  assert_ok(ruda_buffer_create(dev, 0, 8, &hs));
  test_write(dev, 0, ruda_bind(hs), &zero, 8);
  gpu_sync_ok(dev, 0);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  test_write(dev, 0, ruda_bind(h), w, n * 4);
  gpu_sync_ok(dev, 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  fprintf(stderr, "1 GiB pageable upload through staging: %.2f GB/s\n", (double)(n * 4) / s / 1e9);
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  ruda_arg args[] = {ruda_arg_scalar(&n, 8), ruda_arg_buffer(ruda_bind(h)), ruda_arg_buffer(ruda_bind(hs))};
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "checksum";
  l.grid = (ruda_dim3){8 * p.sm_count, 1, 1};
  l.block = (ruda_dim3){256, 1, 1};
  l.args = args;
  l.nargs = 3;
  assert_ok(ruda_launch(dev, 0, &l));
  uint64_t got = 0;
  test_read(dev, 0, ruda_bind(hs), &got, 8);
  assert_int_equal(got, want);
  ruda_staging_stats st;
  assert_ok(ruda_staging_usage(dev, &st));
  fprintf(stderr, "staging: pinned %llu MiB, peak %llu MiB, fallbacks %llu\n",
          (unsigned long long)(st.pinned_bytes >> 20), (unsigned long long)(st.peak_bytes >> 20),
          (unsigned long long)st.fallback_count);
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_ok(ruda_buffer_free(dev, 0, hs));
  test_close(dev);
  free(w);
}

static void interop_handles_and_ordering(void **state) {
  (void)state;
  ruda_device *dev = gpu_open(); /* 4 workers of 16 lanes: 64 CUstreams */
  void *s[6], *ctx = NULL;
  const ruda_stream_id ids[6] = {0, 1, 2, 3, 4, 64};
  for (int i = 0; i < 6; i++) {
    assert_ok(ruda_cuda_stream(dev, ids[i], &s[i]));
    assert_non_null(s[i]);
  }
  for (int i = 0; i < 5; i++)
    for (int j = i + 1; j < 5; j++) assert_ptr_not_equal(s[i], s[j]); /* 4: worker 0, its next lane */
  assert_ptr_equal(s[5], s[0]); /* explicit id 64 shares stream 0's lane */
  assert_ok(ruda_cuda_context(dev, &ctx));
  assert_non_null(ctx);

  const size_t n = 1 << 20;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, n, &h));
  uint64_t base, mid;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(h), &base));
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind_range(h, 4096, 100), &mid));
  assert_true(base != 0);
  assert_int_equal(mid, base + 4096);
  assert_rc(ruda_binding_device_ptr(dev, ruda_bind_range(h, n - 10, 11), &mid), RUDA_ERANGE);

  /* ruda write, flush, raw memset on the same CUstream, ruda read: the
   * documented order holds. */
  unsigned char *ones = malloc(n), *got = malloc(n);
  memset(ones, 1, n);
  test_write(dev, 0, ruda_bind(h), ones, n);
  assert_ok(ruda_flush(dev, 0, NULL));
  CUcontext prev = NULL;
  ruda__cu.cuCtxGetCurrent(&prev);
  ruda__cu.cuCtxSetCurrent((CUcontext)ctx);
  assert_int_equal(ruda__cu.cuMemsetD8Async((CUdeviceptr)(base + 1000), 0x5a, 2000, (CUstream)s[0]), CUDA_SUCCESS);
  ruda__cu.cuCtxSetCurrent(prev);
  test_read(dev, 0, ruda_bind(h), got, n);
  for (size_t i = 0; i < n; i++) assert_int_equal(got[i], i >= 1000 && i < 3000 ? 0x5a : 1);

  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_rc(ruda_binding_device_ptr(dev, ruda_bind(h), &mid), RUDA_ENOTFOUND);
  test_close(dev);
  free(ones), free(got);
}

static void out_of_memory_is_not_buffer_too_big(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  ruda_handle a, b;
  assert_rc(ruda_buffer_create(dev, 0, p.total_mem + 1, &a), RUDA_EBUFFERTOOBIG);
  /* Two halves and a bit cannot both fit: the second is out of memory. */
  const uint64_t half = p.total_mem / 2 + (1u << 20);
  assert_ok(ruda_buffer_create(dev, 0, half, &a));
  assert_rc(ruda_buffer_create(dev, 0, half, &b), RUDA_EOUTOFMEMORY);
  assert_last_error_contains("free");
  assert_int_equal(ruda_error_backend_code(ruda_last_error()), CUDA_ERROR_OUT_OF_MEMORY);
  assert_ok(ruda_buffer_free(dev, 0, a));
  gpu_sync_ok(dev, 0);
  /* Freed memory is usable again. */
  assert_ok(ruda_buffer_create(dev, 0, half, &b));
  assert_ok(ruda_buffer_free(dev, 0, b));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(contiguous_round_trips),
      cmocka_unit_test(strided_2d_and_3d_round_trips),
      cmocka_unit_test(read_into_staging_memory),
      cmocka_unit_test(unsupported_strides_fail_at_the_call),
      cmocka_unit_test(device_to_device_copy),
      cmocka_unit_test(staged_writes_and_usage),
      cmocka_unit_test(upload_1gib_verified_by_checksum),
      cmocka_unit_test(interop_handles_and_ordering),
      cmocka_unit_test(out_of_memory_is_not_buffer_too_big),
  };
  return gpu_main("gpu_copies", tests, sizeof tests / sizeof tests[0], argc, argv);
}

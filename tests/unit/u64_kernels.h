/* u64_kernels.h - unit tests: host kernels and buffers over TEST_U64_N
 * uint64_t values, as the graph tests record and replay them. Include
 * after common.h. */
#ifndef RUDA_TESTS_U64_KERNELS_H
#define RUDA_TESTS_U64_KERNELS_H

#define TEST_U64_N 16

/* add(x, k): x[i] += k (signature: buffer, 8-byte scalar). */
static inline int test_k_add(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0], k = *(const uint64_t *)args[1];
  for (int i = 0; i < TEST_U64_N; i++) x[i] += k;
  return 0;
}

/* twice(x): x[i] *= 2 (signature: buffer). */
static inline int test_k_twice(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  for (int i = 0; i < TEST_U64_N; i++) x[i] *= 2;
  return 0;
}

/* A new buffer on s holding v, v + 1, ..., v + TEST_U64_N - 1. */
static inline ruda_handle test_u64_buffer(ruda_device *dev, ruda_stream_id s, uint64_t v) {
  ruda_handle x;
  uint64_t init[TEST_U64_N];
  for (int i = 0; i < TEST_U64_N; i++) init[i] = v + (uint64_t)i;
  assert_ok(ruda_buffer_create(dev, s, sizeof init, &x));
  test_write(dev, s, ruda_bind(x), init, sizeof init);
  return x;
}

#endif

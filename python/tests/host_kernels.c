/* python/tests/host_kernels.c - host-backend kernels for the Python tests
 * and examples, loaded with Device.load_host_kernels. Each is one call per
 * thread; i is the thread's global x index. */
#include <ruda/ruda.h>

#include <stdint.h>

static uint32_t gid(const ruda_host_ctx *c) { return c->block_idx.x * c->block_dim.x + c->thread_idx.x; }

/* empty(): nothing (launch cost). */
int empty(const ruda_host_ctx *c, void *const *a) { return 0; }

/* fill_f32(P out, f value, I n): out[i] = value. */
int fill_f32(const ruda_host_ctx *c, void *const *a) {
  uint32_t i = gid(c), n = *(const uint32_t *)a[2];
  if (i < n) ((float *)a[0])[i] = *(const float *)a[1];
  return 0;
}

/* axpy(P x, P y, f alpha, I n): y[i] += alpha * x[i]. */
int axpy(const ruda_host_ctx *c, void *const *a) {
  uint32_t i = gid(c), n = *(const uint32_t *)a[3];
  if (i < n) ((float *)a[1])[i] += *(const float *)a[2] * ((const float *)a[0])[i];
  return 0;
}

/* inc_u32(P x, I n): x[i] += 1. */
int inc_u32(const ruda_host_ctx *c, void *const *a) {
  uint32_t i = gid(c), n = *(const uint32_t *)a[1];
  if (i < n) ((uint32_t *)a[0])[i] += 1;
  return 0;
}

/* fail(i code): returns code (a negative RUDA_E* code fails the launch). */
int fail(const ruda_host_ctx *c, void *const *a) { return *(const int32_t *)a[0]; }

/* dense(P x, P w, P b, P y, I nin, I nout): y[j] = relu(b[j] + sum_k
 * x[k] * w[k * nout + j]), one thread per output j. */
int dense(const ruda_host_ctx *c, void *const *a) {
  uint32_t j = gid(c), nin = *(const uint32_t *)a[4], nout = *(const uint32_t *)a[5];
  if (j >= nout) return 0;
  const float *x = a[0], *w = a[1], *b = a[2];
  float s = b[j];
  for (uint32_t k = 0; k < nin; k++) s += x[k] * w[(uint64_t)k * nout + j];
  ((float *)a[3])[j] = s > 0 ? s : 0;
  return 0;
}

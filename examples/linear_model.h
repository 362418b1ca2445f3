/* linear_model.h - the examples' model: y = x . w fitted by gradient
 * descent, as a CUDA module ("grad", "update") and as host kernels, so the
 * training examples run on either backend. Header-only, for the examples.
 */
#ifndef RUDA_EXAMPLES_LINEAR_MODEL_H
#define RUDA_EXAMPLES_LINEAR_MODEL_H

#include <stdint.h>
#include <string.h>

#include "ruda/ruda.h"

/* g[j] = 2/B sum_r (x_r . w - y_r) x_rj for j < d; g[d] = the batch's mean
 * squared error. One device thread per entry of g. */
static const char kernels_cuda[] =
    "extern \"C\" __global__ void grad(const float *x, const float *y, const float *w, float *g,\n"
    "                                  unsigned b, unsigned d) {\n"
    "  unsigned j = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (j > d) return;\n"
    "  float s = 0.0f;\n"
    "  for (unsigned r = 0; r < b; r++) {\n"
    "    float e = -y[r];\n"
    "    for (unsigned k = 0; k < d; k++) e += x[r * d + k] * w[k];\n"
    "    s += j < d ? 2.0f * e * x[r * d + j] : e * e;\n"
    "  }\n"
    "  g[j] = s / (float)b;\n"
    "}\n"
    "extern \"C\" __global__ void update(float *w, const float *g, float lr, unsigned d) {\n"
    "  unsigned j = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (j < d) w[j] -= lr * g[j];\n"
    "}\n";

static int grad_host(const ruda_host_ctx *c, void *const *a) {
  const float *x = a[0], *y = a[1], *w = a[2];
  float *g = a[3];
  uint32_t b = *(const uint32_t *)a[4], d = *(const uint32_t *)a[5];
  uint32_t j = c->block_idx.x * c->block_dim.x + c->thread_idx.x;
  if (j > d) return 0;
  float s = 0.0f;
  for (uint32_t r = 0; r < b; r++) {
    float e = -y[r];
    for (uint32_t k = 0; k < d; k++) e += x[r * d + k] * w[k];
    s += j < d ? 2.0f * e * x[r * d + j] : e * e;
  }
  g[j] = s / (float)b;
  return 0;
}

static int update_host(const ruda_host_ctx *c, void *const *a) {
  float *w = a[0];
  const float *g = a[1];
  float lr = *(const float *)a[2];
  uint32_t d = *(const uint32_t *)a[3];
  uint32_t j = c->block_idx.x * c->block_dim.x + c->thread_idx.x;
  if (j < d) w[j] -= lr * g[j];
  return 0;
}

static const ruda_host_param grad_params[] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0},
                                              {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4}};
static const ruda_host_param update_params[] = {
    {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4}};


/* Registers "grad" and "update" on dev: host kernels or the CUDA module. */
static inline int linear_model_register(ruda_device *dev) {
  if (strcmp(ruda_device_backend(dev), "host") == 0)
    return ruda_host_kernel_register_typed(dev, "grad", grad_host, grad_params, 6) |
           ruda_host_kernel_register_typed(dev, "update", update_host, update_params, 4);
  return ruda_module_source(dev, "train.cu", kernels_cuda, (const char *const[]){"grad", "update"}, 2, NULL);
}

#endif /* RUDA_EXAMPLES_LINEAR_MODEL_H */

/* props.c - device properties and the launch-shape helpers
 * (ruda_block_for, ruda_grid_spread), on every backend. */
#include <string.h>

#include "src/device.h"

int ruda_device_get_props(const ruda_device *dev, ruda_device_props *out) {
  if (dev == NULL || out == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_device_get_props: %s is NULL", dev ? "out" : "device");
  const ruda__limits *l = &dev->limits;
  memset(out, 0, sizeof *out);
  memcpy(out->name, l->name, sizeof out->name);
  out->name[sizeof out->name - 1] = '\0';
  out->backend = dev->sched.backend.ops->name;
  out->cc_major = l->cc_major;
  out->cc_minor = l->cc_minor;
  out->sm_count = l->sm_count;
  out->warp_size = l->warp_size;
  out->max_threads_per_block = l->max_threads_per_block;
  out->max_block = (ruda_dim3){l->max_block[0], l->max_block[1], l->max_block[2]};
  out->max_grid = (ruda_dim3){l->max_grid[0], l->max_grid[1], l->max_grid[2]};
  out->max_shared_per_block = l->max_shared;
  out->max_shared_per_block_optin = l->max_shared_optin;
  out->total_mem = l->total_mem;
  return 0;
}

ruda_dim3 ruda_block_for(const ruda_device *dev, uint64_t working_units) {
  if (dev == NULL) return (ruda_dim3){1, 1, 1};
  const uint32_t warp = dev->limits.warp_size ? dev->limits.warp_size : 1;
  /* A power of two number of warps, at most 8: enough to hide latency in
   * simple kernels without starving small problems of blocks. */
  uint64_t warps = working_units / warp;
  uint32_t block_warps = 1;
  while (block_warps < 8 && (uint64_t)block_warps * 2 <= warps) block_warps *= 2;
  uint32_t limit = dev->limits.max_threads_per_block / warp;
  if (block_warps > limit) block_warps = limit;
  if (block_warps == 0) block_warps = 1;
  return (ruda_dim3){warp, block_warps, 1};
}

int ruda_grid_spread_max(ruda_dim3 max, uint32_t num_blocks, ruda_dim3 *grid, uint64_t *actual) {
  if (grid == NULL) return ruda__fail(RUDA_EINVAL, "ruda_grid_spread: grid is NULL");
  if (num_blocks == 0) return ruda__fail(RUDA_EINVAL, "ruda_grid_spread: num_blocks is 0");
  if (max.x == 0 || max.y == 0 || max.z == 0)
    return ruda__fail(RUDA_EINVAL, "ruda_grid_spread: maximum (%u,%u,%u) has a zero dimension", max.x, max.y,
                      max.z);
  /* 64-bit counts: doubling y or z may pass 2^32 before the check. */
  uint64_t c[3] = {num_blocks, 1, 1};
  const uint64_t m[3] = {max.x, max.y, max.z};
  for (int i = 0; i < 2 && c[i] > m[i]; i++) {
    while (c[i] > m[i]) {
      c[i] = (c[i] + 1) / 2;
      c[i + 1] *= 2;
    }
  }
  if (c[2] > m[2])
    return ruda__fail(RUDA_EGRIDDIM, "ruda_grid_spread: %u blocks do not fit in a grid of at most (%u,%u,%u)",
                      num_blocks, max.x, max.y, max.z);
  *grid = (ruda_dim3){(uint32_t)c[0], (uint32_t)c[1], (uint32_t)c[2]};
  if (actual) *actual = c[0] * c[1] * c[2];
  return 0;
}

int ruda_grid_spread(const ruda_device *dev, uint32_t num_blocks, ruda_dim3 *grid, uint64_t *actual) {
  if (dev == NULL) return ruda__fail(RUDA_EINVAL, "ruda_grid_spread: device is NULL");
  const ruda__limits *l = &dev->limits;
  return ruda_grid_spread_max((ruda_dim3){l->max_grid[0], l->max_grid[1], l->max_grid[2]}, num_blocks, grid,
                              actual);
}

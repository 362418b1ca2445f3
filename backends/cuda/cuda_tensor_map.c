/* cuda_tensor_map.c - tensor maps for Hopper's bulk tensor copies.
 *
 * ruda's descriptor is row-major like ruda_copy_desc; the driver wants
 * the innermost dimension first and strides in bytes for dims 1..rank-1
 * (dim 0 is dense). Encoding happens on the client (src/tensor_map.c
 * resolves the binding): it needs only the buffer's address, which never
 * moves while the buffer lives, and the map then travels to the kernel as
 * a 128-byte scalar argument.
 */
#include <string.h>

#include "backends/cuda/cuda_internal.h"

/* Bytes per element of each CUtensorMapDataType up to TFLOAT32_FTZ; the
 * packed sub-byte types are not offered. */
static const uint32_t elem_bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};

int ruda__cu_tensor_map(void *state, const ruda_tensor_map_desc *d, uint64_t addr, uint64_t blen,
                        ruda_tensor_map *out) {
  static const char fn[] = "ruda_tensor_map_encode";
  const int im2col = d->format == RUDA_TENSOR_MAP_IM2COL;
  if (d->format != RUDA_TENSOR_MAP_TILED && !im2col)
    return ruda__fail(RUDA_EINVAL, "%s: format %d is neither tiled nor im2col", fn, (int)d->format);
  if (im2col ? ruda__cu.cuTensorMapEncodeIm2col == NULL : ruda__cu.cuTensorMapEncodeTiled == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: the CUDA driver (CUDA %d.%d) has no tensor maps", fn,
                      ruda__cu.driver_version / 1000, ruda__cu.driver_version % 1000 / 10);
  const uint32_t r = d->rank;
  if (r < (im2col ? 3u : 1u) || r > 5)
    return ruda__fail(RUDA_EINVAL, "%s: rank %u outside %u..5", fn, r, im2col ? 3u : 1u);
  if (d->data_type < 0 || d->data_type >= (int)(sizeof elem_bytes / sizeof *elem_bytes))
    return ruda__fail(RUDA_EINVAL, "%s: data type %d is not one ruda can size", fn, d->data_type);
  if (d->strides[r - 1] != 1)
    return ruda__fail(RUDA_EINVAL, "%s: the last dimension must be contiguous (stride %llu, not 1)", fn,
                      (unsigned long long)d->strides[r - 1]);
  const uint64_t es = elem_bytes[d->data_type];
  int rc;
  /* Bytes the tensor spans: the offset of its last element, plus one. */
  uint64_t span = 0;
  cuuint64_t dim[5], gstride[4];
  cuuint32_t box[5], estride[5];
  for (uint32_t i = 0; i < r; i++) {
    const uint32_t k = r - 1 - i; /* driver order: innermost first */
    if (d->shape[k] == 0) return ruda__fail(RUDA_EINVAL, "%s: shape[%u] is 0", fn, k);
    dim[i] = d->shape[k];
    box[i] = d->box[k];
    estride[i] = d->elem_strides[k] ? d->elem_strides[k] : 1;
    if (i > 0) gstride[i - 1] = d->strides[k] * es;
    span += (d->shape[k] - 1) * d->strides[k] * es;
  }
  span += es;
  if (span > blen)
    return ruda__fail(RUDA_ERANGE, "%s: the tensor spans %llu bytes but the binding holds %llu", fn,
                      (unsigned long long)span, (unsigned long long)blen);
  /* The driver checks the address against the current context, which a
   * client thread need not have. */
  ruda__cu_guard guard;
  if ((rc = ruda__cu_enter((ruda__cu_backend *)state, &guard)) != 0) return rc;
  CUresult res;
  CUtensorMap *m = (CUtensorMap *)(void *)out->opaque;
  if (!im2col) {
    res = ruda__cu.cuTensorMapEncodeTiled(m, (CUtensorMapDataType)d->data_type, r, (void *)(uintptr_t)addr, dim,
                                          gstride, box, estride, (CUtensorMapInterleave)d->interleave,
                                          (CUtensorMapSwizzle)d->swizzle, (CUtensorMapL2promotion)d->l2_promotion,
                                          (CUtensorMapFloatOOBfill)d->oob_fill);
  } else {
    /* Corners cover the spatial dims, which sit between channels
     * (innermost) and the batch (outermost); reversed like the rest. */
    int lo[3], hi[3];
    for (uint32_t i = 0; i < r - 2; i++) {
      lo[i] = d->lower_corner[r - 3 - i];
      hi[i] = d->upper_corner[r - 3 - i];
    }
    res = ruda__cu.cuTensorMapEncodeIm2col(m, (CUtensorMapDataType)d->data_type, r, (void *)(uintptr_t)addr, dim,
                                           gstride, lo, hi, d->channels_per_pixel, d->pixels_per_column, estride,
                                           (CUtensorMapInterleave)d->interleave, (CUtensorMapSwizzle)d->swizzle,
                                           (CUtensorMapL2promotion)d->l2_promotion,
                                           (CUtensorMapFloatOOBfill)d->oob_fill);
  }
  ruda__cu_leave(&guard);
  if (res != CUDA_SUCCESS)
    return ruda__cu_fail(res,
                         "%s: the driver refused a rank-%u %s map (address 0x%llx; it wants a 16-byte aligned "
                         "address, strides multiples of 16 bytes, boxes of 1..256 and inner boxes of 16-byte "
                         "multiples)",
                         fn, r, im2col ? "im2col" : "tiled", (unsigned long long)addr);
  return 0;
}

/* strided.c - strided <-> dense copies on the CPU.
 *
 * The innermost dimension is copied as one memcpy when its stride is 1;
 * outer dimensions are walked with an index odometer, so any rank up to
 * RUDA_MAX_RANK works without recursion.
 */
#include <string.h>

#include "base/backend.h"

static void walk(unsigned char *strided, const ruda__layout *l, unsigned char *dense, int to_strided) {
  if (l->rank == 0 || l->contiguous) {
    if (to_strided) memcpy(strided, dense, l->bytes);
    else memcpy(dense, strided, l->bytes);
    return;
  }
  const uint32_t r = l->rank, es = l->elem_size;
  const uint64_t inner = l->shape[r - 1];
  const int inner_dense = l->strides[r - 1] == 1;
  uint64_t idx[RUDA_MAX_RANK] = {0};
  for (;;) {
    uint64_t off = 0;
    for (uint32_t d = 0; d + 1 < r; d++) off += idx[d] * l->strides[d];
    unsigned char *row = strided + off * es;
    if (inner_dense) {
      if (to_strided) memcpy(row, dense, inner * es);
      else memcpy(dense, row, inner * es);
    } else {
      const uint64_t st = l->strides[r - 1] * es;
      for (uint64_t i = 0; i < inner; i++) {
        if (to_strided) memcpy(row + i * st, dense + i * es, es);
        else memcpy(dense + i * es, row + i * st, es);
      }
    }
    dense += inner * es;
    int d = (int)r - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < l->shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

void ruda__copy_to_strided(unsigned char *dst, const ruda__layout *l, const unsigned char *src) {
  walk(dst, l, (unsigned char *)src, 1);
}

void ruda__copy_from_strided(unsigned char *dst, const ruda__layout *l, const unsigned char *src) {
  walk((unsigned char *)src, l, dst, 0);
}

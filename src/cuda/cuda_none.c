/* cuda_none.c - linked when the CUDA toolkit headers were not found: the
 * library still builds and runs with the host backend alone. */
#include "../backend.h"

const ruda__backend_ops *const ruda__cuda_backend = NULL;

/* The CUDA-only calls of ruda/cuda.h. */
#include "../error_internal.h"

int ruda_tensor_map_encode(ruda_device *dev, ruda_binding b, const ruda_tensor_map_desc *d,
                           ruda_tensor_map *out) {
  (void)dev, (void)b, (void)d, (void)out;
  return ruda__fail(RUDA_ENOBACKEND, "ruda_tensor_map_encode: this libruda was built without CUDA support");
}

/* tensor_map.c - ruda_tensor_map_encode (ruda/cuda.h): resolves the
 * binding, then the backend encodes (backends/cuda/cuda_tensor_map.c). */
#include "src/device.h"

int ruda_tensor_map_encode(ruda_device *dev, ruda_binding b, const ruda_tensor_map_desc *d,
                           ruda_tensor_map *out) {
  static const char fn[] = "ruda_tensor_map_encode";
  RUDA__CHECK_DEV(dev, fn);
  if (d == NULL || out == NULL) return ruda__fail(RUDA_EINVAL, "%s: %s is NULL", fn, d ? "out" : "desc");
  const int r = RUDA__RESERVED_SET(d);
  if (r >= 0) return ruda__fail(RUDA_EINVAL, "%s: desc reserved[%d] is not zero", fn, r);
  if (dev->sched.backend.ops->tensor_map == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: tensor maps need the cuda backend (device uses %s)", fn,
                      dev->sched.backend.ops->name);
  uint64_t addr;
  int rc = ruda_binding_device_ptr(dev, b, &addr);
  if (rc != 0) return rc;
  uint64_t blen = b.size;
  if (blen == 0) {
    uint64_t total;
    if ((rc = ruda_buffer_size(dev, b.handle, &total)) != 0) return rc;
    blen = total - b.offset;
  }
  return dev->sched.backend.ops->tensor_map(dev->sched.backend.state, d, addr, blen, out);
}

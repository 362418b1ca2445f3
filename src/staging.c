/* staging.c - the public staging calls (page-locked buffers the caller
 * fills and hands to ruda_write_staged), native handles and device
 * pointers for code outside ruda (see ruda/cuda.h for the ordering
 * rules). The arena itself is staging/arena.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/device.h"
#include "src/stage_hold.h"

int ruda_staging_alloc(ruda_device *dev, size_t size, void **out) {
  RUDA__CHECK_DEV(dev, "ruda_staging_alloc");
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "ruda_staging_alloc: out is NULL");
  *out = NULL;
  if (size == 0) return ruda__fail(RUDA_EINVAL, "ruda_staging_alloc: size is 0");
  void *p = dev->sched.backend.ops->stage_alloc(dev->sched.backend.state, size, NULL);
  if (p == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_staging_alloc: no staging memory for %zu bytes", size);
  *out = p;
  return 0;
}

int ruda_staging_free(ruda_device *dev, void *p) {
  RUDA__CHECK_DEV(dev, "ruda_staging_free");
  return p != NULL ? ruda__stage_free(dev, p) : 0;
}

int ruda_staging_usage(ruda_device *dev, ruda_staging_stats *out) {
  RUDA__CHECK_DEV(dev, "ruda_staging_usage");
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "ruda_staging_usage: out is NULL");
  memset(out, 0, sizeof *out);
  if (dev->sched.backend.ops->stage_usage == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_staging_usage: the %s backend has no staging arena (it uses malloc)",
                      dev->sched.backend.ops->name);
  return dev->sched.backend.ops->stage_usage(dev->sched.backend.state, out);
}

int ruda_cuda_stream(ruda_device *dev, ruda_stream_id stream, void **cu_stream) {
  RUDA__CHECK_DEV(dev, "ruda_cuda_stream");
  if (cu_stream == NULL) return ruda__fail(RUDA_EINVAL, "ruda_cuda_stream: cu_stream is NULL");
  *cu_stream = NULL;
  if (dev->sched.backend.ops->native_stream == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_cuda_stream: the %s backend has no CUDA streams", dev->sched.backend.ops->name);
  if (stream != RUDA_STREAM_CURRENT && stream > RUDA_STREAM_EXPLICIT_MAX)
    return ruda__fail(RUDA_EINVAL, "ruda_cuda_stream: stream id %llu is reserved", (unsigned long long)stream);
  ruda__stream *s = ruda__stream_get(&dev->sched, stream);
  if (s == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_cuda_stream: out of host memory creating stream");
  *cu_stream = dev->sched.backend.ops->native_stream(s->lane->wstate);
  return 0;
}

int ruda_cuda_context(ruda_device *dev, void **cu_context) {
  RUDA__CHECK_DEV(dev, "ruda_cuda_context");
  if (cu_context == NULL) return ruda__fail(RUDA_EINVAL, "ruda_cuda_context: cu_context is NULL");
  *cu_context = NULL;
  if (dev->sched.backend.ops->native_context == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "ruda_cuda_context: the %s backend has no CUDA context", dev->sched.backend.ops->name);
  *cu_context = dev->sched.backend.ops->native_context(dev->sched.backend.state);
  return 0;
}

int ruda_binding_device_ptr(ruda_device *dev, ruda_binding b, uint64_t *addr) {
  RUDA__CHECK_DEV(dev, "ruda_binding_device_ptr");
  if (addr == NULL) return ruda__fail(RUDA_EINVAL, "ruda_binding_device_ptr: addr is NULL");
  *addr = 0;
  uint64_t base, size;
  ruda__slot *slot;
  if (ruda__handles_pin_use(&dev->handles, b.handle, UINT32_MAX, 0, &base, &size, &slot, NULL) != 0)
    return ruda__fail(RUDA_ENOTFOUND, "ruda_binding_device_ptr: handle {slot %u, gen %u} names no live buffer",
                      b.handle.slot, b.handle.gen);
  /* A dry-run buffer has no memory until its first use: this is one (its
   * address is otherwise only an offset in an unbacked page). */
  int rc = 0;
  if (base & RUDA__UNBACKED)
    rc = ruda__memory_back(&dev->memory, atomic_load(&slot->mem), base, "ruda_binding_device_ptr", &base);
  /* The pin made reading base and size safe. If the owner freed the buffer
   * meanwhile, this unpin may be the last reference and releases it. */
  ruda__handles_unpin(&dev->handles, b.handle.slot, NULL);
  if (rc != 0) return rc;
  uint64_t want = b.size ? b.size : (b.offset <= size ? size - b.offset : 0);
  if (b.offset > size || want > size - b.offset || want == 0)
    return ruda__fail(RUDA_ERANGE,
                      "ruda_binding_device_ptr: offset %llu + size %llu is outside buffer {slot %u} of %llu bytes",
                      (unsigned long long)b.offset, (unsigned long long)want, b.handle.slot,
                      (unsigned long long)size);
  *addr = base + b.offset;
  return 0;
}

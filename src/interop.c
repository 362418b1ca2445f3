/* interop.c - ordering buffers against streams ruda does not own
 * (ruda_cuda_wait_buffer, ruda_buffer_wait_cuda; ruda/cuda.h). Each is a
 * library call (ruda_call) that names the buffer with inout access, so
 * ruda's cross-stream ordering puts it after the buffer's writers and
 * readers, and later uses after it; the call's function only links its
 * worker's stream and the foreign one with an event. */
#include <string.h>

#include "src/device.h"

/* Worker: the foreign stream waits for this worker's stream so far. */
static int signal_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  ruda_device *dev = c->dev;
  void *foreign;
  memcpy(&foreign, c->data, sizeof foreign);
  if (c->cu_stream == NULL || foreign == NULL) return 0; /* host: the worker ran it, it is done */
  void *ev = NULL;
  int rc = dev->sched.backend.ops->native_record(dev->sched.backend.state, c->cu_stream, &ev, "ruda_cuda_wait_buffer");
  if (rc == 0) {
    rc = dev->sched.backend.ops->native_wait(dev->sched.backend.state, foreign, ev, "ruda_cuda_wait_buffer");
    dev->sched.backend.ops->event_release(dev->sched.backend.state, ev);
  }
  if (rc != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "%s", ruda_error_message(ruda_last_error()));
  return rc;
}

/* Worker: this worker's stream waits for the event the caller recorded. */
static int wait_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  ruda_device *dev = c->dev;
  void *ev;
  memcpy(&ev, c->data, sizeof ev);
  int rc = dev->sched.backend.ops->native_wait(dev->sched.backend.state, c->cu_stream, ev, "ruda_buffer_wait_cuda");
  dev->sched.backend.ops->event_release(dev->sched.backend.state, ev);
  if (rc != 0) snprintf(c->msg, RUDA_CALL_MSG_MAX, "%s", ruda_error_message(ruda_last_error()));
  return rc;
}

int ruda_cuda_wait_buffer(ruda_device *dev, ruda_stream_id stream, ruda_binding b, void *cu_stream,
                          ruda_error **errors) {
  static const char fn[] = "ruda_cuda_wait_buffer";
  if (errors) *errors = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (cu_stream != NULL && dev->sched.backend.ops->native_wait == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: the %s backend has no CUDA streams (pass NULL)", fn, dev->sched.backend.ops->name);
  ruda_arg buf = ruda_arg_buffer(b);
  ruda_call_desc d = {.name = fn, .fn = signal_fn, .buffers = &buf, .nbuffers = 1,
                      .flags = RUDA_CALL_NOT_CAPTURABLE, .data = &cu_stream, .data_size = sizeof cu_stream};
  int rc = ruda_call(dev, stream, &d);
  if (rc != 0) return rc;
  /* The link is made once the worker ran the call: wait for that (as a
   * flush does), never for the device. */
  return ruda_flush(dev, stream, errors);
}

int ruda_buffer_wait_cuda(ruda_device *dev, ruda_stream_id stream, ruda_binding b, void *cu_stream) {
  static const char fn[] = "ruda_buffer_wait_cuda";
  RUDA__CHECK_DEV(dev, fn);
  if (dev->sched.backend.ops->native_record == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "%s: the %s backend has no CUDA streams", fn, dev->sched.backend.ops->name);
  /* Recorded now: the foreign work to wait for is what the stream holds
   * at this call, not when the worker gets there. */
  void *ev = NULL;
  int rc = dev->sched.backend.ops->native_record(dev->sched.backend.state, cu_stream, &ev, fn);
  if (rc != 0) return rc;
  ruda_arg buf = ruda_arg_buffer(b);
  ruda_call_desc d = {.name = fn, .fn = wait_fn, .buffers = &buf, .nbuffers = 1,
                      .flags = RUDA_CALL_NOT_CAPTURABLE, .data = &ev, .data_size = sizeof ev};
  rc = ruda_call(dev, stream, &d);
  if (rc != 0) dev->sched.backend.ops->event_release(dev->sched.backend.state, ev);
  return rc;
}

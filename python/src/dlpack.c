/* python/src/dlpack.c - a Buffer as a DLPack tensor (versioned 1.x or the
 * classic capsule) and as a __cuda_array_interface__ v3 dict.
 *
 * Ordering: an exported tensor is used by its consumer outside ruda, so
 * the consumer's work must follow every command queued so far that
 * writes or reads the buffer, and nothing else: the export orders the
 * consumer's stream after them by an event on the device
 * (ruda_cuda_wait_buffer, GIL released; on the host backend it returns
 * once they ran) and raises the errors of the calling thread's stream. The layouts below are
 * DLPack's public ABI (dlpack.h, v1.0), declared here so no header is
 * needed at build time. */
#include "args.h"
#include "module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t device_type;
  int32_t device_id;
} dl_device;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dl_dtype;

typedef struct {
  void *data;
  dl_device device;
  int32_t ndim;
  dl_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
  dl_tensor t;
  void *manager_ctx;
  void (*deleter)(struct dl_managed *);
} dl_managed;

typedef struct dl_managed_v {
  struct {
    uint32_t major, minor;
  } version;
  void *manager_ctx;
  void (*deleter)(struct dl_managed_v *);
  uint64_t flags;
  dl_tensor t;
} dl_managed_v;

enum { DL_CPU = 1, DL_CUDA = 2 };

/* One allocation: the managed struct, then the shape. */
typedef struct {
  union {
    dl_managed m;
    dl_managed_v v;
  } u;
  PyObject *owner; /* the Buffer, alive while the tensor is */
  int64_t shape[RUDA_MAX_RANK];
} export_block;

static BufferObject *owner_of(BufferObject *b) { return b->base ? (BufferObject *)b->base : b; }

static void drop_owner(export_block *b) {
  /* DLPack deleters may run on any thread, with or without the GIL. */
  PyGILState_STATE st = PyGILState_Ensure();
  BufferObject *buf = (BufferObject *)b->owner;
  if (buf) {
    atomic_fetch_sub(&owner_of(buf)->exports, 1);
    ruda_py_export_end(buf->device);
  }
  Py_XDECREF(b->owner);
  PyGILState_Release(st);
  free(b);
}

static void deleter_classic(dl_managed *m) { drop_owner((export_block *)m); }
static void deleter_versioned(dl_managed_v *m) { drop_owner((export_block *)m); }

static void capsule_classic(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "used_dltensor")) return; /* the consumer owns it */
  dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
  if (!m) {
    PyErr_Clear();
    return;
  }
  m->deleter(m);
}

static void capsule_versioned(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "used_dltensor_versioned")) return;
  dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
  if (!m) {
    PyErr_Clear();
    return;
  }
  m->deleter(m);
}

static int dl_device_of(BufferObject *self, dl_device *out) {
  out->device_type = self->device->is_cuda ? DL_CUDA : DL_CPU;
  out->device_id = self->device->is_cuda ? self->device->ordinal : 0;
  return 0;
}

/* Orders the consumer after the buffer's writers and readers (see the
 * ordering rule above) and returns the address; consumer is the stream
 * the consumer's work goes on (cuda), NULL on the host backend or for a
 * consumer that asked for no ordering (skip). Counted, the export is
 * counted in the same use of the device (so a close sees it), and the
 * caller ends it (drop_owner). */
static int export_ptr(BufferObject *self, uint64_t *addr, int counted, void *consumer, int skip) {
  ruda_device *d = dev_enter(self->device);
  if (!d) return -1;
  int rc = 0;
  if (!skip) {
    ruda_error *err = NULL;
    RUDA_PY_NOGIL(rc = ruda_cuda_wait_buffer(d, RUDA_STREAM_CURRENT, self->b, consumer, &err));
    if (rc) {
      dev_leave(self->device);
      if (err) ruda_py_raise_owned(rc, err);
      else ruda_py_raise_last(rc);
      return -1;
    }
  }
  rc = ruda_binding_device_ptr(d, self->b, addr);
  if (!rc && counted) {
    atomic_fetch_add(&owner_of(self)->exports, 1);
    ruda_py_export_begin(self->device);
  }
  dev_leave(self->device);
  if (rc) {
    ruda_py_raise_last(rc);
    return -1;
  }
  return 0;
}

/* DLPack's stream argument on cuda: None and 1 the legacy default stream,
 * 2 the per-thread default stream, -1 no ordering, another positive
 * value a CUstream. Returns -1 with an error raised, else 0. */
static int consumer_stream(PyObject *o, void **out, int *skip) {
  *out = NULL;
  *skip = 0;
  if (!o || o == Py_None) {
    *out = (void *)(uintptr_t)1; /* CU_STREAM_LEGACY */
    return 0;
  }
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v == -1) {
    *skip = 1;
    return 0;
  }
  if (v <= 0) {
    PyErr_Format(PyExc_ValueError, "stream %lld is no CUDA stream a consumer may pass (DLPack: None, -1, 1, 2 or a "
                 "CUstream)", v);
    return -1;
  }
  *out = (void *)(uintptr_t)v;
  return 0;
}

static int check_shape(BufferObject *self) {
  uint64_t elems = 1;
  for (int i = 0; i < self->ndim; i++) elems *= (uint64_t)self->shape[i];
  if (!self->dl_bits || elems * self->dl_bits / 8 > self->b.size) {
    PyErr_Format(PyExc_ValueError, "shape and dtype describe more than the buffer's %llu bytes",
                 (unsigned long long)self->b.size);
    return -1;
  }
  return 0;
}

PyObject *ruda_py_buffer_dlpack(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"stream", "max_version", "dl_device", "copy"};
  PyObject *a[4];
  if (ruda_py_args("__dlpack__", args, nargs, kwnames, names, 4, 0, a) < 0) return NULL;
  if (a[3] && a[3] == Py_True) {
    PyErr_SetString(PyExc_BufferError, "ruda exports its buffers without copying (copy=True is not supported)");
    return NULL;
  }
  dl_device dev;
  dl_device_of(self, &dev);
  if (a[2] && a[2] != Py_None) {
    int t, id;
    if (!PyArg_ParseTuple(a[2], "ii", &t, &id)) return NULL;
    if (t != dev.device_type || id != dev.device_id) {
      PyErr_SetString(PyExc_BufferError, "a ruda buffer is exported only on its own device");
      return NULL;
    }
  }
  int versioned = 0;
  if (a[1] && a[1] != Py_None) {
    if (!PyTuple_Check(a[1]) || PyTuple_GET_SIZE(a[1]) < 1) {
      PyErr_SetString(PyExc_TypeError, "max_version must be a tuple (major, minor)");
      return NULL;
    }
    long major = PyLong_AsLong(PyTuple_GET_ITEM(a[1], 0));
    if (major == -1 && PyErr_Occurred()) return NULL;
    versioned = major >= 1;
  }
  /* stream: on cuda the consumer's, which then waits for ruda's work on
     the buffer on the device. The host backend has no streams: whatever
     is passed, the export returns once the buffer's writers ran. */
  void *consumer = NULL;
  int skip = 0;
  if (self->device->is_cuda && consumer_stream(a[0], &consumer, &skip) < 0) return NULL;
  if (check_shape(self) < 0) return NULL;
  uint64_t addr;
  if (export_ptr(self, &addr, 1, consumer, skip) < 0) return NULL;
  export_block *b = calloc(1, sizeof *b);
  if (!b) {
    atomic_fetch_sub(&owner_of(self)->exports, 1);
    ruda_py_export_end(self->device);
    return PyErr_NoMemory();
  }
  memcpy(b->shape, self->shape, sizeof b->shape);
  dl_tensor t = {.data = (void *)(uintptr_t)addr, .device = dev, .ndim = self->ndim,
                 .dtype = {self->dl_code, self->dl_bits, 1}, .shape = b->shape, .strides = NULL,
                 .byte_offset = 0};
  b->owner = Py_NewRef(self);
  PyObject *cap;
  if (versioned) {
    b->u.v.version.major = 1;
    b->u.v.version.minor = 0;
    b->u.v.manager_ctx = b;
    b->u.v.deleter = deleter_versioned;
    b->u.v.flags = 0;
    b->u.v.t = t;
    cap = PyCapsule_New(&b->u.v, "dltensor_versioned", capsule_versioned);
  } else {
    b->u.m.t = t;
    b->u.m.manager_ctx = b;
    b->u.m.deleter = deleter_classic;
    cap = PyCapsule_New(&b->u.m, "dltensor", capsule_classic);
  }
  if (!cap) drop_owner(b);
  return cap;
}

PyObject *ruda_py_buffer_dlpack_device(BufferObject *self, PyObject *unused) {
  dl_device d;
  dl_device_of(self, &d);
  return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static const char *typestr(BufferObject *self, char *buf) {
  char kind = self->dl_code == 0 ? 'i' : self->dl_code == 1 ? 'u' : self->dl_code == 2 ? 'f'
            : self->dl_code == 6 ? 'b' : 'V';
  snprintf(buf, 16, "<%c%d", kind, self->dl_bits / 8);
  return buf;
}

PyObject *ruda_py_buffer_cai(BufferObject *self, void *closure) {
  if (!self->device->is_cuda) {
    PyErr_SetString(PyExc_AttributeError,
                    "__cuda_array_interface__ exists on the cuda backend only (use __dlpack__ on host)");
    return NULL;
  }
  if (check_shape(self) < 0) return NULL;
  /* The consumer is told a stream to order its work on (v3 "stream"):
     the worker stream of this thread's ruda stream, made to wait for the
     buffer's writers and readers on the device. */
  ruda_device *d = dev_enter(self->device);
  if (!d) return NULL;
  void *cs = NULL;
  int rc = ruda_cuda_stream(d, RUDA_STREAM_CURRENT, &cs);
  dev_leave(self->device);
  if (rc) return ruda_py_fail(rc);
  uint64_t addr;
  if (export_ptr(self, &addr, 0, cs, 0) < 0) return NULL;
  PyObject *shape = PyTuple_New(self->ndim);
  for (int i = 0; shape && i < self->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(self->shape[i]);
    if (!v) {
      Py_CLEAR(shape);
      break;
    }
    PyTuple_SET_ITEM(shape, i, v);
  }
  if (!shape) return NULL;
  char ts[16];
  return Py_BuildValue("{s:N,s:s,s:(KO),s:i,s:O,s:K}", "shape", shape, "typestr", typestr(self, ts), "data",
                       (unsigned long long)addr, Py_False, "version", 3, "strides", Py_None, "stream",
                       (unsigned long long)(uintptr_t)cs);
}

/* ---- foreign tensors as buffers (Device._adopt) ---- */

/* What keeps an adopted tensor's memory alive until ruda released it: the
 * DLPack managed tensor taken from its capsule (its deleter frees it), or
 * the object itself (__cuda_array_interface__ has no other hook). */
typedef struct {
  dl_managed *classic;
  dl_managed_v *versioned;
  PyObject *obj;
} adopted;

/* ruda_release_fn: any thread (a worker, a ruda call, close). */
static void adopted_release(void *user, uint64_t addr, uint64_t bytes) {
  adopted *a = user;
#if PY_VERSION_HEX >= 0x030D0000
  int finalizing = Py_IsFinalizing();
#else
  int finalizing = _Py_IsFinalizing();
#endif
  if (!finalizing) { /* at exit the memory goes with the process */
    PyGILState_STATE st = PyGILState_Ensure();
    if (a->classic && a->classic->deleter) a->classic->deleter(a->classic);
    if (a->versioned && a->versioned->deleter) a->versioned->deleter(a->versioned);
    Py_XDECREF(a->obj);
    PyGILState_Release(st);
  }
  free(a);
}

/* A tensor's layout as a ruda buffer: C-contiguous (strides NULL or the
 * dense ones, in elements; DLPack and the array interface agree once the
 * interface's byte strides are divided), its byte count. */
static int dense_bytes(int ndim, const int64_t *shape, const int64_t *strides, int bits, uint64_t *bytes) {
  uint64_t n = 1, expect = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (shape[i] < 0) goto bad;
    if (strides && shape[i] > 1 && strides[i] != (int64_t)expect) {
      PyErr_SetString(PyExc_ValueError, "only C-contiguous tensors become ruda buffers (make it contiguous first)");
      return -1;
    }
    expect *= (uint64_t)shape[i];
    n *= (uint64_t)shape[i];
  }
  *bytes = n * (uint64_t)bits / 8;
  if (*bytes == 0) {
    PyErr_SetString(PyExc_ValueError, "an empty tensor cannot be a ruda buffer");
    return -1;
  }
  return 0;
bad:
  PyErr_SetString(PyExc_ValueError, "negative dimension");
  return -1;
}

static int typestr_dtype(const char *ts, uint8_t *code, uint8_t *bits) {
  if (!ts || strlen(ts) < 3 || (ts[0] != '<' && ts[0] != '|' && ts[0] != '=')) goto bad;
  int size = atoi(ts + 2);
  switch (ts[1]) {
    case 'i': *code = 0; break;
    case 'u': *code = 1; break;
    case 'f': *code = 2; break;
    case 'b': *code = 6; break;
    default: goto bad;
  }
  if (size <= 0 || size > 16) goto bad;
  *bits = (uint8_t)(size * 8);
  return 0;
bad:
  PyErr_Format(PyExc_ValueError, "typestr '%s' is no little-endian int, uint, float or bool", ts ? ts : "");
  return -1;
}

/* The consumer's stream for a producer's __dlpack__: this thread's worker
 * stream on cuda (as an int), None on host. New reference. */
static PyObject *worker_stream_arg(DeviceObject *self, void **cs) {
  *cs = NULL;
  if (!self->is_cuda) return Py_NewRef(Py_None);
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  int rc = ruda_cuda_stream(d, RUDA_STREAM_CURRENT, cs);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return PyLong_FromVoidPtr(*cs);
}

/* Calls obj.__dlpack__(stream=...): a capsule the caller owns. */
static PyObject *dlpack_capsule(PyObject *obj, PyObject *stream) {
  PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
  if (!meth) return NULL;
  PyObject *kw = stream != Py_None ? Py_BuildValue("{s:O}", "stream", stream) : NULL;
  PyObject *empty = PyTuple_New(0);
  PyObject *cap = empty && (stream == Py_None || kw) ? PyObject_Call(meth, empty, kw) : NULL;
  Py_XDECREF(empty);
  Py_XDECREF(kw);
  Py_DECREF(meth);
  return cap;
}

/* _adopt(obj, existing=None) -> Buffer: obj's memory as a ruda buffer, no
 * copy. With existing (a buffer adopted from obj before), only orders
 * ruda's later uses after the producer's work again (cuda). */
PyObject *ruda_py_device_adopt(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"obj", "existing"};
  PyObject *a[2];
  if (ruda_py_args("_adopt", args, nargs, kwnames, names, 2, 1, a) < 0) return NULL;
  PyObject *obj = a[0], *existing = a[1] && a[1] != Py_None ? a[1] : NULL;
  void *cs = NULL;
  PyObject *stream = worker_stream_arg(self, &cs);
  if (!stream) return NULL;
  int has_dl = PyObject_HasAttrString(obj, "__dlpack__");
  adopted *hold = NULL;
  uint64_t addr = 0, bytes = 0;
  uint8_t code = 1, bits = 8;
  int ndim = 1;
  int64_t shape[RUDA_MAX_RANK] = {0};
  void *producer = NULL; /* a CUDA array interface's stream to wait for */
  PyObject *cap = NULL;
  if (has_dl) {
    /* The producer makes our worker stream wait for its work (DLPack). */
    cap = dlpack_capsule(obj, stream);
    if (!cap) goto fail;
    if (existing) goto order; /* ordered: the capsule goes */
    dl_tensor *t = NULL;
    hold = calloc(1, sizeof *hold);
    if (!hold) {
      PyErr_NoMemory();
      goto fail;
    }
    if (PyCapsule_IsValid(cap, "dltensor")) {
      hold->classic = PyCapsule_GetPointer(cap, "dltensor");
      t = &hold->classic->t;
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
      hold->versioned = PyCapsule_GetPointer(cap, "dltensor_versioned");
      t = &hold->versioned->t;
    } else {
      PyErr_SetString(PyExc_TypeError, "__dlpack__ returned no unused DLPack capsule");
      goto fail;
    }
    int want = self->is_cuda ? DL_CUDA : DL_CPU;
    if (t->device.device_type != want || (self->is_cuda && t->device.device_id != self->ordinal)) {
      PyErr_Format(PyExc_BufferError, "the tensor lives on DLPack device (%d, %d), this ruda device is (%d, %d)",
                   t->device.device_type, t->device.device_id, want, self->is_cuda ? self->ordinal : 0);
      goto fail;
    }
    if (t->ndim < 0 || t->ndim > RUDA_MAX_RANK || t->dtype.lanes != 1) {
      PyErr_Format(PyExc_ValueError, "a tensor of %d dimensions and %u lanes cannot be a ruda buffer", t->ndim,
                   t->dtype.lanes);
      goto fail;
    }
    if (dense_bytes(t->ndim, t->shape, t->strides, t->dtype.bits, &bytes) < 0) goto fail;
    addr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    code = t->dtype.code;
    bits = t->dtype.bits;
    ndim = t->ndim;
    for (int i = 0; i < ndim; i++) shape[i] = t->shape[i];
  } else if (self->is_cuda && PyObject_HasAttrString(obj, "__cuda_array_interface__")) {
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (!cai) goto fail;
    PyObject *st = PyDict_GetItemString(cai, "stream");
    if (st && st != Py_None) producer = PyLong_AsVoidPtr(st);
    if (existing) {
      Py_DECREF(cai);
      if (PyErr_Occurred()) goto fail;
      goto order;
    }
    PyObject *sh = PyDict_GetItemString(cai, "shape"), *ts = PyDict_GetItemString(cai, "typestr"),
             *data = PyDict_GetItemString(cai, "data"), *strides = PyDict_GetItemString(cai, "strides");
    int ok = sh && PyTuple_Check(sh) && ts && PyUnicode_Check(ts) && data && PyTuple_Check(data) &&
             PyTuple_GET_SIZE(data) >= 1 && PyTuple_GET_SIZE(sh) <= RUDA_MAX_RANK;
    if (!ok) {
      Py_DECREF(cai);
      PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ lacks shape, typestr or data");
      goto fail;
    }
    if (typestr_dtype(PyUnicode_AsUTF8(ts), &code, &bits) < 0) {
      Py_DECREF(cai);
      goto fail;
    }
    ndim = (int)PyTuple_GET_SIZE(sh);
    int64_t el[RUDA_MAX_RANK];
    int have_strides = strides && strides != Py_None;
    for (int i = 0; i < ndim; i++) {
      shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, i));
      if (have_strides) el[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i)) / (bits / 8);
    }
    addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    Py_DECREF(cai);
    if (PyErr_Occurred() || dense_bytes(ndim, shape, have_strides ? el : NULL, bits, &bytes) < 0) goto fail;
    hold = calloc(1, sizeof *hold);
    if (!hold) {
      PyErr_NoMemory();
      goto fail;
    }
    hold->obj = Py_NewRef(obj); /* no other lifetime hook */
  } else {
    PyErr_Format(PyExc_TypeError, "%.80s has no __dlpack__%s", Py_TYPE(obj)->tp_name,
                 self->is_cuda ? " nor __cuda_array_interface__" : "");
    goto fail;
  }
  ruda_device *d = dev_enter(self);
  if (!d) goto fail;
  ruda_handle h = {0, 0};
  const char *used = hold->classic ? "used_dltensor" : "used_dltensor_versioned"; /* hold may go in a free */
  int rc = ruda_buffer_import(d, RUDA_STREAM_CURRENT, addr, bytes, adopted_release, hold, &h);
  if (rc == 0 && self->is_cuda) {
    /* Every stream's later uses follow the producer's work (already made
       to precede our worker stream by DLPack, or on the interface's). */
    rc = ruda_buffer_wait_cuda(d, RUDA_STREAM_CURRENT, ruda_bind(h), producer ? producer : cs);
    if (rc) ruda_buffer_free(d, RUDA_STREAM_CURRENT, h); /* hold goes with the release */
  }
  dev_leave(self);
  if (rc) {
    if (h.gen == 0) { /* refused: nothing adopted, hold is ours */
      Py_XDECREF(hold->obj);
      free(hold);
    } else if (cap) { /* adopted, then freed: the release owns the tensor */
      PyCapsule_SetName(cap, used);
    }
    hold = NULL;
    ruda_py_raise_last(rc);
    goto fail_cap;
  }
  if (cap) { /* the tensor is ruda's now: its capsule must not free it */
    PyCapsule_SetName(cap, used);
    Py_CLEAR(cap);
  }
  BufferObject *b = (BufferObject *)BufferType.tp_alloc(&BufferType, 0);
  if (!b) {
    if ((d = dev_try_enter(self))) {
      ruda_buffer_free(d, RUDA_STREAM_CURRENT, h);
      dev_leave(self);
    }
    Py_DECREF(stream);
    return NULL;
  }
  b->device = (DeviceObject *)Py_NewRef(self);
  b->b = ruda_bind_range(h, 0, bytes);
  b->dl_code = code;
  b->dl_bits = bits;
  b->ndim = ndim;
  memcpy(b->shape, shape, sizeof shape);
  Py_DECREF(stream);
  return (PyObject *)b;

order:
  /* A buffer adopted before: ruda's later uses wait for the producer's
     newest work (cuda; on host the producer's writes are done). */
  if (self->is_cuda) {
    if (!PyObject_TypeCheck(existing, &BufferType)) {
      PyErr_SetString(PyExc_TypeError, "existing must be a ruda.Buffer");
      goto fail;
    }
    ruda_device *d2 = dev_enter(self);
    if (!d2) goto fail;
    int rc2 = ruda_buffer_wait_cuda(d2, RUDA_STREAM_CURRENT, ((BufferObject *)existing)->b, producer ? producer : cs);
    dev_leave(self);
    if (rc2) {
      ruda_py_raise_last(rc2);
      goto fail;
    }
  }
  Py_XDECREF(cap);
  Py_DECREF(stream);
  return Py_NewRef(existing);

fail:
  if (hold) {
    Py_XDECREF(hold->obj);
    free(hold);
  }
fail_cap:
  Py_XDECREF(cap); /* an unused capsule frees its tensor */
  Py_DECREF(stream);
  return NULL;
}

/* python/src/buffer.c - ruda.Buffer (a device buffer or a view of one),
 * ruda.Arg (a buffer with an access mode) and ruda.Staging (page-locked
 * host memory with the buffer protocol). */
#include "args.h"
#include "module.h"


/* ---- Buffer ---- */

static int buffer_release(BufferObject *self) {
  if (self->base || self->freed) return 0;
  self->freed = 1;
  ruda_device *d = dev_try_enter(self->device);
  if (!d) return 0; /* the device's close released it */
  int rc = ruda_buffer_free(d, RUDA_STREAM_CURRENT, self->b.handle);
  dev_leave(self->device);
  return rc;
}

static void buffer_dealloc(BufferObject *self) {
  PyObject_GC_UnTrack(self);
  if (buffer_release(self)) PyErr_Clear();
  Py_CLEAR(self->base);
  Py_CLEAR(self->device);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int buffer_traverse(BufferObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->base);
  Py_VISIT(self->device);
  return 0;
}

static PyObject *buffer_free(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("free", args, nargs, kw, &s) < 0) return NULL;
  if (self->base) {
    PyErr_SetString(PyExc_ValueError, "a view does not own its memory: free the buffer it views");
    return NULL;
  }
  if (self->freed) {
    ruda_py_raise(RUDA_EFREE, NULL);
    return NULL;
  }
  if (atomic_load(&self->exports)) {
    PyErr_SetString(PyExc_BufferError, "the buffer is exported (a DLPack tensor of it lives): free refused");
    return NULL;
  }
  ruda_device *d = dev_enter(self->device);
  if (!d) return NULL;
  int rc = ruda_buffer_free(d, s, self->b.handle);
  dev_leave(self->device);
  self->freed = 1;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* view(offset, size=None[, dl_code, dl_bits, shape]): a byte range. */
static PyObject *buffer_view(BufferObject *self, PyObject *args) {
  unsigned long long off, size = 0;
  PyObject *sz = Py_None, *shape = Py_None;
  unsigned char code = self->dl_code, bits = self->dl_bits;
  if (!PyArg_ParseTuple(args, "K|OBBO:view", &off, &sz, &code, &bits, &shape)) return NULL;
  if (off > self->b.size) {
    ruda_py_raise(RUDA_ERANGE, NULL);
    return NULL;
  }
  size = self->b.size - off;
  if (sz != Py_None) {
    size = PyLong_AsUnsignedLongLong(sz);
    if (PyErr_Occurred()) return NULL;
  }
  if (size == 0 || off + size > self->b.size || off + size < off) {
    PyErr_Format(PyExc_ValueError, "view [%llu, +%llu) is empty or outside the buffer's %llu bytes", off, size,
                 (unsigned long long)self->b.size);
    return NULL;
  }
  BufferObject *v = (BufferObject *)BufferType.tp_alloc(&BufferType, 0);
  if (!v) return NULL;
  v->device = (DeviceObject *)Py_NewRef(self->device);
  v->base = Py_NewRef(self->base ? self->base : (PyObject *)self);
  v->b = ruda_bind_range(self->b.handle, self->b.offset + off, size);
  v->dl_code = code;
  v->dl_bits = bits;
  v->ndim = 1;
  v->shape[0] = (int64_t)(size * 8 / (bits ? bits : 8));
  if (shape != Py_None) {
    PyObject *t = PySequence_Tuple(shape);
    if (!t) goto fail;
    if (PyTuple_GET_SIZE(t) > RUDA_MAX_RANK) {
      Py_DECREF(t);
      PyErr_SetString(PyExc_ValueError, "too many dimensions");
      goto fail;
    }
    v->ndim = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < v->ndim; i++) v->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    Py_DECREF(t);
    if (PyErr_Occurred()) goto fail;
  }
  return (PyObject *)v;
fail:
  Py_DECREF(v);
  return NULL;
}

static PyObject *buffer_get_nbytes(BufferObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->b.size); }
static PyObject *buffer_get_offset(BufferObject *self, void *c) {
  return PyLong_FromUnsignedLongLong(self->b.offset);
}
static PyObject *buffer_get_device(BufferObject *self, void *c) { return Py_NewRef(self->device); }
static PyObject *buffer_get_handle(BufferObject *self, void *c) {
  return Py_BuildValue("(II)", self->b.handle.slot, self->b.handle.gen);
}
static PyObject *buffer_get_dl_dtype(BufferObject *self, void *c) {
  return Py_BuildValue("(ii)", self->dl_code, self->dl_bits);
}
static PyObject *buffer_get_shape(BufferObject *self, void *c) {
  PyObject *t = PyTuple_New(self->ndim);
  for (int i = 0; t && i < self->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(self->shape[i]);
    if (!v) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}
static PyObject *buffer_get_freed(BufferObject *self, void *c) {
  BufferObject *owner = self->base ? (BufferObject *)self->base : self;
  return PyBool_FromLong(owner->freed);
}

static PyObject *buffer_device_ptr(BufferObject *self, PyObject *unused) {
  ruda_device *d = dev_enter(self->device);
  if (!d) return NULL;
  uint64_t addr = 0;
  int rc = ruda_binding_device_ptr(d, self->b, &addr);
  dev_leave(self->device);
  if (rc) return ruda_py_fail(rc);
  return PyLong_FromUnsignedLongLong(addr);
}

static PyObject *buffer_repr(BufferObject *self) {
  return PyUnicode_FromFormat("<ruda.Buffer %s%llu bytes at +%llu>", self->base ? "view of " : "",
                              (unsigned long long)self->b.size, (unsigned long long)self->b.offset);
}

static PyMethodDef buffer_methods[] = {
    {"free", (PyCFunction)(void (*)(void))buffer_free, METH_FASTCALL | METH_KEYWORDS,
     "free(stream=None): ordered on stream; the handle dies at once"},
    {"_view", (PyCFunction)buffer_view, METH_VARARGS, NULL},
    {"device_ptr", (PyCFunction)buffer_device_ptr, METH_NOARGS,
     "the address of the first byte (a host address on the host backend)"},
    {"__dlpack__", (PyCFunction)(void (*)(void))ruda_py_buffer_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)"},
    {"__dlpack_device__", (PyCFunction)ruda_py_buffer_dlpack_device, METH_NOARGS, NULL},
    {NULL}};

static PyGetSetDef buffer_getset[] = {
    {"nbytes", (getter)buffer_get_nbytes, NULL, "bytes of the binding", NULL},
    {"offset", (getter)buffer_get_offset, NULL, "byte offset in the buffer", NULL},
    {"device", (getter)buffer_get_device, NULL, "the device", NULL},
    {"handle", (getter)buffer_get_handle, NULL, "(slot, generation)", NULL},
    {"dl_dtype", (getter)buffer_get_dl_dtype, NULL, "(DLPack type code, bits)", NULL},
    {"shape", (getter)buffer_get_shape, NULL, "the shape DLPack exports", NULL},
    {"freed", (getter)buffer_get_freed, NULL, "True once freed", NULL},
    {"__cuda_array_interface__", (getter)ruda_py_buffer_cai, NULL, "v3, cuda backend only", NULL},
    {NULL}};

PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "a device buffer (Device.buffer), or a view of one; freed when the owner dies",
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_traverse = (traverseproc)buffer_traverse,
    .tp_methods = buffer_methods,
    .tp_getset = buffer_getset,
    .tp_repr = (reprfunc)buffer_repr,
};

/* ---- Arg: ruda.in_(buf), ruda.out(buf), ruda.inout(buf) ---- */

static PyObject *arg_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *buf;
  int kind;
  if (!PyArg_ParseTuple(args, "O!i:Arg", &BufferType, &buf, &kind)) return NULL;
  if (kind != RUDA_ARG_BUFFER && kind != RUDA_ARG_BUFFER_IN && kind != RUDA_ARG_BUFFER_OUT) {
    PyErr_SetString(PyExc_ValueError, "kind must be ARG_IN, ARG_OUT or ARG_INOUT");
    return NULL;
  }
  ArgObject *self = (ArgObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->buf = (BufferObject *)Py_NewRef(buf);
  self->kind = (ruda_arg_kind)kind;
  return (PyObject *)self;
}

static void arg_dealloc(ArgObject *self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->buf);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int arg_traverse(ArgObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->buf);
  return 0;
}

static PyObject *arg_get_buffer(ArgObject *self, void *c) { return Py_NewRef(self->buf); }
static PyObject *arg_get_kind(ArgObject *self, void *c) { return PyLong_FromLong(self->kind); }

static PyGetSetDef arg_getset[] = {{"buffer", (getter)arg_get_buffer, NULL, NULL, NULL},
                                   {"kind", (getter)arg_get_kind, NULL, NULL, NULL},
                                   {NULL}};

PyTypeObject ArgType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Arg",
    .tp_basicsize = sizeof(ArgObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Arg(buffer, kind): a kernel's buffer argument with its access mode",
    .tp_new = arg_new,
    .tp_dealloc = (destructor)arg_dealloc,
    .tp_traverse = (traverseproc)arg_traverse,
    .tp_getset = arg_getset,
};

/* ---- Staging: a block of page-locked host memory ---- */

typedef struct {
  PyObject_HEAD
  DeviceObject *device;
  void *p;
  Py_ssize_t size;
  Py_ssize_t exports; /* memoryviews alive */
  int given;          /* handed to ruda by write_staged */
} StagingObject;

PyObject *ruda_py_staging_new(DeviceObject *dev, size_t size) {
  ruda_device *d = dev_enter(dev);
  if (!d) return NULL;
  void *p = NULL;
  int rc = ruda_staging_alloc(d, size, &p);
  dev_leave(dev);
  if (rc) return ruda_py_fail(rc);
  StagingObject *s = (StagingObject *)StagingType.tp_alloc(&StagingType, 0);
  if (!s) {
    if ((d = dev_try_enter(dev))) {
      ruda_staging_free(d, p);
      dev_leave(dev);
    }
    return NULL;
  }
  s->device = (DeviceObject *)Py_NewRef(dev);
  s->p = p;
  s->size = (Py_ssize_t)size;
  return (PyObject *)s;
}

static void staging_dealloc(StagingObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->p && !self->given) {
    ruda_device *d = dev_try_enter(self->device);
    if (d) { /* a closed device freed its staging memory */
      ruda_staging_free(d, self->p);
      dev_leave(self->device);
    }
  }
  Py_CLEAR(self->device);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int staging_traverse(StagingObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->device);
  return 0;
}

/* A view counts as an export of the device (its close refuses while one
 * lives); a closed device freed the block, so no view is made then. */
static int staging_getbuffer(StagingObject *self, Py_buffer *view, int flags) {
  if (self->given) {
    PyErr_SetString(PyExc_ValueError, "this staging block was handed to ruda by write_staged");
    return -1;
  }
  if (!dev_enter(self->device)) return -1;
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->size, 0, flags) < 0) {
    dev_leave(self->device);
    return -1;
  }
  ruda_py_export_begin(self->device);
  dev_leave(self->device);
  self->exports++;
  return 0;
}

static void staging_releasebuffer(StagingObject *self, Py_buffer *view) {
  self->exports--;
  ruda_py_export_end(self->device);
}

static PyBufferProcs staging_as_buffer = {(getbufferproc)staging_getbuffer,
                                          (releasebufferproc)staging_releasebuffer};

static Py_ssize_t staging_len(StagingObject *self) { return self->size; }
static PySequenceMethods staging_seq = {.sq_length = (lenfunc)staging_len};

PyTypeObject StagingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Staging",
    .tp_basicsize = sizeof(StagingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "page-locked host memory (Device.staging): a writable buffer; reads land in it directly",
    .tp_dealloc = (destructor)staging_dealloc,
    .tp_traverse = (traverseproc)staging_traverse,
    .tp_as_buffer = &staging_as_buffer,
    .tp_as_sequence = &staging_seq,
};

int ruda_py_capturing(DeviceObject *self, ruda_stream_id s);

PyObject *ruda_py_write_staged(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"dst", "staging", "stream"};
  PyObject *a[3];
  if (ruda_py_args("write_staged", args, nargs, kwnames, names, 3, 2, a) < 0) return NULL;
  if (!PyObject_TypeCheck(a[0], &BufferType) || ((BufferObject *)a[0])->device != self) {
    PyErr_SetString(PyExc_TypeError, "dst must be a ruda.Buffer of this device");
    return NULL;
  }
  if (!PyObject_TypeCheck(a[1], &StagingType) || ((StagingObject *)a[1])->device != self) {
    PyErr_SetString(PyExc_TypeError, "staging must be a ruda.Staging of this device");
    return NULL;
  }
  ruda_stream_id s;
  if (ruda_py_stream(a[2], &s) < 0) return NULL;
  StagingObject *st = (StagingObject *)a[1];
  BufferObject *dst = (BufferObject *)a[0];
  if (st->given) {
    PyErr_SetString(PyExc_ValueError, "this staging block was handed to ruda already");
    return NULL;
  }
  if ((uint64_t)st->size < dst->b.size) {
    PyErr_Format(PyExc_ValueError, "the staging block holds %zd bytes, dst %llu", st->size,
                 (unsigned long long)dst->b.size);
    return NULL;
  }
  int recorded = ruda_py_capturing(self, s);
  if (!recorded && st->exports) {
    PyErr_SetString(PyExc_BufferError, "release the memoryviews of a staging block before handing it over");
    return NULL;
  }
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_copy_desc desc = ruda_copy_contiguous(dst->b);
  int rc;
  RUDA_PY_NOGIL(rc = ruda_write_staged(d, s, &desc, st->p, (size_t)dst->b.size));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  if (!recorded) st->given = 1; /* ruda owns it now (a recorded write does not take it) */
  Py_RETURN_NONE;
}

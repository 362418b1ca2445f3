/* python/src/launch.c - ruda.Kernel (a kernel name with an optional
 * signature) and ruda.Launch (a launch packed once, issued many times).
 *
 * The hot path allocates nothing: arguments are packed into ruda_arg
 * arrays on the C stack (or, for a Launch, once at prepare) and the C API
 * copies scalars at enqueue. */
#include "args.h"
#include "module.h"

#include <stdlib.h>
#include <string.h>

/* Scalar codes of a signature, as the struct module spells them. */
static int code_size(char c) {
  switch (c) {
  case 'b': case 'B': case '?': return 1;
  case 'h': case 'H': return 2;
  case 'i': case 'I': case 'f': return 4;
  case 'q': case 'Q': case 'd': return 8;
  default: return 0;
  }
}

/* Parses sig into one code per parameter ('P' buffers); n receives the
 * count. params (may be NULL) receives the host-kernel signature. */
static int parse_codes(const char *sig, char *codes, ruda_host_param *params, uint32_t *n) {
  uint32_t k = 0;
  for (const char *p = sig; *p; p++) {
    if (*p == ' ' || *p == ',') continue;
    if (k == RUDA_MAX_ARGS) {
      PyErr_Format(PyExc_ValueError, "a signature has at most %d parameters", RUDA_MAX_ARGS);
      return -1;
    }
    if (*p != 'P' && !code_size(*p)) {
      PyErr_Format(PyExc_ValueError,
                   "signature '%s': '%c' is not P (a buffer) or a scalar code of b B ? h H i I q Q f d", sig, *p);
      return -1;
    }
    if (codes) codes[k] = *p;
    if (params) {
      params[k].kind = *p == 'P' ? RUDA_ARG_BUFFER : RUDA_ARG_SCALAR;
      params[k].size = *p == 'P' ? 0 : (uint32_t)code_size(*p);
    }
    k++;
  }
  *n = k;
  return 0;
}

int ruda_py_parse_signature(const char *sig, ruda_host_param *params, uint32_t *n) {
  return parse_codes(sig, NULL, params, n);
}

typedef struct {
  PyObject_HEAD
  DeviceObject *device;
  char *name;
  int has_sig;
  uint32_t nparams;
  char codes[RUDA_MAX_ARGS];
} KernelObject;

PyObject *ruda_py_kernel_new(DeviceObject *d, const char *name, const char *sig) {
  KernelObject *k = (KernelObject *)KernelType.tp_alloc(&KernelType, 0);
  if (!k) return NULL;
  k->device = (DeviceObject *)Py_NewRef(d);
  k->name = strdup(name);
  if (!k->name) {
    Py_DECREF(k);
    return PyErr_NoMemory();
  }
  if (sig) {
    if (parse_codes(sig, k->codes, NULL, &k->nparams) < 0) {
      Py_DECREF(k);
      return NULL;
    }
    k->has_sig = 1;
  }
  return (PyObject *)k;
}

static void kernel_dealloc(KernelObject *self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->device);
  free(self->name);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int kernel_traverse(KernelObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->device);
  return 0;
}

/* ---- packing ---- */

static int parse_dim(PyObject *o, ruda_dim3 *d, const char *what) {
  d->x = d->y = d->z = 1;
  if (PyLong_CheckExact(o) || PyLong_Check(o)) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > UINT32_MAX) goto range;
    d->x = (uint32_t)v;
    return 0;
  }
  if (PyTuple_Check(o) || PyList_Check(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    if (n < 1 || n > 3) goto shape;
    uint32_t *dst[3] = {&d->x, &d->y, &d->z};
    for (Py_ssize_t i = 0; i < n; i++) {
      unsigned long v = PyLong_AsUnsignedLong(items[i]);
      if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
      if (v > UINT32_MAX) goto range;
      *dst[i] = (uint32_t)v;
    }
    return 0;
  }
shape:
  PyErr_Format(PyExc_TypeError, "%s must be an int or a tuple of 1 to 3 ints", what);
  return -1;
range:
  PyErr_Format(PyExc_OverflowError, "%s: a dimension exceeds 2**32-1", what);
  return -1;
}

/* Where packed scalars and held buffers of one launch live. */
typedef struct {
  ruda_arg args[RUDA_MAX_ARGS];
  uint64_t words[RUDA_MAX_ARGS]; /* numbers packed per the signature */
  Py_buffer views[RUDA_MAX_ARGS]; /* bytes-like scalars, released after */
  int nviews;
  PyObject *held[RUDA_MAX_ARGS]; /* Buffers adopted from foreign tensors */
  int nheld;
} packed;

static void packed_release(packed *p) {
  for (int i = 0; i < p->nviews; i++) PyBuffer_Release(&p->views[i]);
  p->nviews = 0;
  for (int i = 0; i < p->nheld; i++) Py_DECREF(p->held[i]);
  p->nheld = 0;
}

/* A foreign tensor (a torch tensor, a CuPy array) for a buffer
 * parameter: with a signature where it says 'P', without one when the
 * object is not bytes-like (those stay scalars). */
static int is_foreign(KernelObject *k, Py_ssize_t i, PyObject *o) {
  if (k->has_sig ? k->codes[i] != 'P' : PyObject_CheckBuffer(o)) return 0;
  return PyObject_HasAttrString(o, "__dlpack__") || PyObject_HasAttrString(o, "__cuda_array_interface__");
}

static int pack_number(char code, PyObject *o, void *dst, Py_ssize_t i) {
  union {
    int8_t b; uint8_t B; int16_t h; uint16_t H; int32_t i; uint32_t I; int64_t q; uint64_t Q; float f; double d;
  } u;
  if (code == 'f' || code == 'd') {
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    if (code == 'f') u.f = (float)v;
    else u.d = v;
  } else if (code == '?') {
    int t = PyObject_IsTrue(o);
    if (t < 0) return -1;
    u.B = (uint8_t)t;
  } else if (code == 'Q' || code == 'I' || code == 'H' || code == 'B') {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    unsigned long long max = code == 'Q' ? UINT64_MAX : code == 'I' ? UINT32_MAX : code == 'H' ? UINT16_MAX : UINT8_MAX;
    if (v > max) goto range;
    if (code == 'Q') u.Q = v;
    else if (code == 'I') u.I = (uint32_t)v;
    else if (code == 'H') u.H = (uint16_t)v;
    else u.B = (uint8_t)v;
  } else {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (code == 'q') u.q = v;
    else if (code == 'i') {
      if (v < INT32_MIN || v > INT32_MAX) goto range;
      u.i = (int32_t)v;
    } else if (code == 'h') {
      if (v < INT16_MIN || v > INT16_MAX) goto range;
      u.h = (int16_t)v;
    } else {
      if (v < INT8_MIN || v > INT8_MAX) goto range;
      u.b = (int8_t)v;
    }
  }
  memcpy(dst, &u, (size_t)code_size(code));
  return 0;
range:
  PyErr_Format(PyExc_OverflowError, "argument %zd does not fit the signature's '%c'", i, code);
  return -1;
}

/* Packs the sequence args for kernel k into p; *n receives the count. */
static int pack_args(KernelObject *k, PyObject *args, packed *p, uint32_t *n) {
  p->nviews = 0;
  p->nheld = 0;
  if (!args || args == Py_None) {
    *n = 0;
    return 0;
  }
  if (!PyTuple_Check(args) && !PyList_Check(args)) {
    PyErr_SetString(PyExc_TypeError, "args must be a tuple or a list");
    return -1;
  }
  Py_ssize_t na = PySequence_Fast_GET_SIZE(args);
  PyObject **items = PySequence_Fast_ITEMS(args);
  if (na > RUDA_MAX_ARGS) {
    PyErr_Format(PyExc_ValueError, "at most %d kernel arguments", RUDA_MAX_ARGS);
    return -1;
  }
  if (k->has_sig && (uint32_t)na != k->nparams) {
    PyErr_Format(PyExc_TypeError, "kernel '%s' takes %u arguments, %zd given", k->name, k->nparams, na);
    return -1;
  }
  for (Py_ssize_t i = 0; i < na; i++) {
    PyObject *o = items[i];
    ruda_arg *a = &p->args[i];
    PyTypeObject *t = Py_TYPE(o);
    if (t == &BufferType) {
      BufferObject *b = (BufferObject *)o;
      if (b->device != k->device) goto other_device;
      *a = ruda_arg_buffer(b->b);
    } else if (t == &ArgType) {
      BufferObject *b = ((ArgObject *)o)->buf;
      if (b->device != k->device) goto other_device;
      *a = ruda_arg_buffer(b->b);
      a->kind = ((ArgObject *)o)->kind;
    } else if (is_foreign(k, i, o)) {
      /* Device.asbuffer: no copy, ordered after the producer's work. */
      PyObject *b = PyObject_CallMethod((PyObject *)k->device, "asbuffer", "O", o);
      if (!b) goto fail;
      p->held[p->nheld++] = b;
      if (!PyObject_TypeCheck(b, &BufferType) || ((BufferObject *)b)->device != k->device) goto other_device;
      *a = ruda_arg_buffer(((BufferObject *)b)->b);
    } else if (k->has_sig && k->codes[i] != 'P' && (PyLong_Check(o) || PyFloat_Check(o) || PyBool_Check(o))) {
      if (pack_number(k->codes[i], o, &p->words[i], i) < 0) goto fail;
      *a = ruda_arg_scalar(&p->words[i], (uint32_t)code_size(k->codes[i]));
    } else if (PyObject_CheckBuffer(o)) {
      Py_buffer *v = &p->views[p->nviews];
      if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) goto fail;
      p->nviews++;
      if (v->len < 1 || v->len > RUDA_MAX_SCALAR_BYTES) {
        PyErr_Format(PyExc_ValueError, "argument %zd: a scalar is 1 to %d bytes, not %zd", i,
                     RUDA_MAX_SCALAR_BYTES, v->len);
        goto fail;
      }
      *a = ruda_arg_scalar(v->buf, (uint32_t)v->len);
    } else if (PyLong_Check(o) || PyFloat_Check(o)) {
      PyErr_Format(PyExc_TypeError,
                   "argument %zd of kernel '%s': a number needs a signature to be packed "
                   "(Device.kernel(name, signature=...)), or pass bytes or a numpy scalar",
                   i, k->name);
      goto fail;
    } else {
      PyErr_Format(PyExc_TypeError, "argument %zd of kernel '%s': %.80s is not a buffer, an access mode or a scalar",
                   i, k->name, t->tp_name);
      goto fail;
    }
  }
  *n = (uint32_t)na;
  return 0;
other_device:
  PyErr_SetString(PyExc_ValueError, "a buffer argument belongs to another device");
fail:
  packed_release(p);
  return -1;
}

static int do_launch(KernelObject *k, ruda_stream_id s, ruda_launch_desc *l) {
  ruda_device *d = dev_enter(k->device);
  if (!d) return -1;
  int rc;
  /* The GIL kept around a launch that finds room: many threads then do not
     hand it over around a push that costs less than the handoff. "auto"
     asks the queue not to wait (RUDA_LAUNCH_NOWAIT) and, when it is full,
     hands the GIL over and launches again, waiting for room as the
     device's backpressure says, while other threads run. "keep" is for
     backpressure="error", where a launch never waits; "release" hands the
     GIL over every time. */
  const int gil = k->device->keep_gil;
  if (gil == RUDA_PY_GIL_AUTO) {
    const uint32_t flags = l->flags;
    l->flags |= RUDA_LAUNCH_NOWAIT;
    rc = ruda_launch(d, s, l);
    l->flags = flags;
    if (rc == RUDA_EQUEUEFULL) RUDA_PY_NOGIL(rc = ruda_launch(d, s, l));
  } else if (gil == RUDA_PY_GIL_KEEP) {
    rc = ruda_launch(d, s, l);
  } else {
    RUDA_PY_NOGIL(rc = ruda_launch(d, s, l));
  }
  dev_leave(k->device);
  if (rc) {
    ruda_py_raise_last(rc);
    return -1;
  }
  return 0;
}

/* launch(grid, block, args=(), stream=None, shared_mem=0, flags=0, indirect=None) */
static PyObject *kernel_launch(KernelObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"grid", "block", "args", "stream", "shared_mem", "flags", "indirect"};
  PyObject *a[7];
  if (ruda_py_args("launch", args, nargs, kwnames, names, 7, 2, a) < 0) return NULL;
  ruda_launch_desc l = {.kernel = self->name};
  ruda_stream_id s;
  if (parse_dim(a[0], &l.grid, "grid") < 0 || parse_dim(a[1], &l.block, "block") < 0 ||
      ruda_py_stream(a[3], &s) < 0)
    return NULL;
  if (a[4]) {
    unsigned long v = PyLong_AsUnsignedLong(a[4]);
    if (PyErr_Occurred()) return NULL;
    l.shared_mem = (uint32_t)v;
  }
  if (a[5]) {
    unsigned long v = PyLong_AsUnsignedLong(a[5]);
    if (PyErr_Occurred()) return NULL;
    l.flags = (uint32_t)v;
  }
  if (a[6] && a[6] != Py_None) {
    if (Py_TYPE(a[6]) != &BufferType || ((BufferObject *)a[6])->device != self->device) {
      PyErr_SetString(PyExc_TypeError, "indirect must be a ruda.Buffer of this device");
      return NULL;
    }
    l.indirect_grid = ((BufferObject *)a[6])->b;
    l.flags |= RUDA_LAUNCH_INDIRECT;
  }
  packed p;
  if (pack_args(self, a[2], &p, &l.nargs) < 0) return NULL;
  l.args = p.args;
  int rc = do_launch(self, s, &l);
  packed_release(&p);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

/* ---- Launch: packed once ---- */

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  KernelObject *kernel;
  PyObject *keep; /* the argument objects: buffers stay alive */
  PyObject *held;    /* Buffers adopted from foreign tensors among them */
  PyObject *foreign; /* those tensors: each call orders after their producers (cuda) */
  ruda_launch_desc desc;
  ruda_arg args[RUDA_MAX_ARGS];
  unsigned char *scalars; /* the bytes of every scalar, copied at prepare */
} LaunchObject;

static PyObject *launch_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  LaunchObject *self = (LaunchObject *)callable;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  ruda_stream_id s = RUDA_STREAM_CURRENT;
  if (nargs == 1 && !kwnames) {
    if (ruda_py_stream(args[0], &s) < 0) return NULL;
  } else if ((nargs || kwnames) && ruda_py_stream_arg("launch", args, nargs, kwnames, &s) < 0) {
    return NULL;
  }
  /* A producer may have written its tensor since: order after it again
     (DLPack's stream handshake; on host its writes are done). */
  if (self->kernel->device->is_cuda)
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->foreign); i++) {
      PyObject *b = PyObject_CallMethod((PyObject *)self->kernel->device, "asbuffer", "O",
                                        PyList_GET_ITEM(self->foreign, i));
      if (!b) return NULL;
      Py_DECREF(b);
    }
  if (do_launch(self->kernel, s, &self->desc) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *launch_method(LaunchObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return launch_vectorcall((PyObject *)self, args, (size_t)nargs, kwnames);
}

/* prepare(grid, block, args=(), shared_mem=0, flags=0) -> Launch */
static PyObject *kernel_prepare(KernelObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"grid", "block", "args", "shared_mem", "flags"};
  PyObject *a[5];
  if (ruda_py_args("prepare", args, nargs, kwnames, names, 5, 2, a) < 0) return NULL;
  LaunchObject *L = (LaunchObject *)LaunchType.tp_alloc(&LaunchType, 0);
  if (!L) return NULL;
  L->vectorcall = launch_vectorcall;
  L->kernel = (KernelObject *)Py_NewRef(self);
  L->desc.kernel = self->name;
  if (parse_dim(a[0], &L->desc.grid, "grid") < 0 || parse_dim(a[1], &L->desc.block, "block") < 0) goto fail;
  if (a[3]) {
    L->desc.shared_mem = (uint32_t)PyLong_AsUnsignedLong(a[3]);
    if (PyErr_Occurred()) goto fail;
  }
  if (a[4]) {
    L->desc.flags = (uint32_t)PyLong_AsUnsignedLong(a[4]);
    if (PyErr_Occurred()) goto fail;
  }
  L->keep = a[2] && a[2] != Py_None ? PySequence_Tuple(a[2]) : PyTuple_New(0);
  if (!L->keep) goto fail;
  packed p;
  uint32_t n;
  if (pack_args(self, L->keep, &p, &n) < 0) goto fail;
  size_t bytes = 0;
  for (uint32_t i = 0; i < n; i++)
    if (p.args[i].kind == RUDA_ARG_SCALAR) bytes += p.args[i].size;
  L->scalars = malloc(bytes ? bytes : 1);
  if (!L->scalars) {
    packed_release(&p);
    PyErr_NoMemory();
    goto fail;
  }
  size_t at = 0;
  for (uint32_t i = 0; i < n; i++) {
    L->args[i] = p.args[i];
    if (p.args[i].kind == RUDA_ARG_SCALAR) {
      memcpy(L->scalars + at, p.args[i].data, p.args[i].size);
      L->args[i].data = L->scalars + at;
      at += p.args[i].size;
    }
  }
  L->held = PyTuple_New(p.nheld);
  for (int i = 0; L->held && i < p.nheld; i++) PyTuple_SET_ITEM(L->held, i, Py_NewRef(p.held[i]));
  L->foreign = PyList_New(0);
  for (uint32_t i = 0; L->foreign && i < n; i++) {
    PyObject *o = PyTuple_GET_ITEM(L->keep, i);
    if (is_foreign(self, (Py_ssize_t)i, o) && PyList_Append(L->foreign, o) < 0) Py_CLEAR(L->foreign);
  }
  packed_release(&p);
  if (!L->held || !L->foreign) goto fail;
  L->desc.args = L->args;
  L->desc.nargs = n;
  return (PyObject *)L;
fail:
  Py_DECREF(L);
  return NULL;
}

static void launch_dealloc(LaunchObject *self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->keep);
  Py_CLEAR(self->held);
  Py_CLEAR(self->foreign);
  free(self->scalars);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int launch_traverse(LaunchObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->kernel);
  Py_VISIT(self->keep);
  Py_VISIT(self->held);
  Py_VISIT(self->foreign);
  return 0;
}

static PyMethodDef launch_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch_method, METH_FASTCALL | METH_KEYWORDS,
     "launch(stream=None): enqueues the prepared launch (also: calling the object)"},
    {NULL}};

PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Launch",
    .tp_basicsize = sizeof(LaunchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "a launch packed once (Kernel.prepare); call it, or .launch(stream), to enqueue it",
    .tp_vectorcall_offset = offsetof(LaunchObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)launch_dealloc,
    .tp_traverse = (traverseproc)launch_traverse,
    .tp_methods = launch_methods,
};

static PyObject *kernel_get_name(KernelObject *self, void *c) { return PyUnicode_FromString(self->name); }
static PyObject *kernel_get_device(KernelObject *self, void *c) { return Py_NewRef(self->device); }
static PyObject *kernel_get_signature(KernelObject *self, void *c) {
  if (!self->has_sig) Py_RETURN_NONE;
  return PyUnicode_FromStringAndSize(self->codes, self->nparams);
}

static PyObject *kernel_repr(KernelObject *self) {
  return PyUnicode_FromFormat("<ruda.Kernel '%s'>", self->name);
}

static PyMethodDef kernel_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))kernel_launch, METH_FASTCALL | METH_KEYWORDS,
     "launch(grid, block, args=(), stream=None, shared_mem=0, flags=0, indirect=None)"},
    {"prepare", (PyCFunction)(void (*)(void))kernel_prepare, METH_FASTCALL | METH_KEYWORDS,
     "prepare(grid, block, args=(), shared_mem=0, flags=0) -> Launch"},
    {NULL}};

static PyGetSetDef kernel_getset[] = {{"name", (getter)kernel_get_name, NULL, NULL, NULL},
                                      {"device", (getter)kernel_get_device, NULL, NULL, NULL},
                                      {"signature", (getter)kernel_get_signature, NULL, NULL, NULL},
                                      {NULL}};

PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Kernel",
    .tp_basicsize = sizeof(KernelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "a registered kernel by name (Device.kernel)",
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_traverse = (traverseproc)kernel_traverse,
    .tp_methods = kernel_methods,
    .tp_getset = kernel_getset,
    .tp_repr = (reprfunc)kernel_repr,
};

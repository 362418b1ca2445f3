/* python/src/device.c - ruda.Device: open and close, buffers, copies,
 * flush and sync, compilation, profiling, tracing, memory reports, graph
 * capture. Every call that can wait releases the GIL. */
#include "args.h"
#include "module.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- open and close ---- */

static int enum_arg(PyObject *o, const char *what, const char *const *names, int n, int *out) {
  const char *s = PyUnicode_AsUTF8(o);
  if (!s) return -1;
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  PyErr_Format(PyExc_ValueError, "%s must be one of those the C API knows, not '%s'", what, s);
  return -1;
}

static int u32_arg(PyObject *o, const char *what, uint32_t *out) {
  unsigned long v = PyLong_AsUnsignedLong(o);
  if (PyErr_Occurred()) return -1;
  if (v > UINT32_MAX) {
    PyErr_Format(PyExc_ValueError, "%s out of range: %lu", what, v);
    return -1;
  }
  *out = (uint32_t)v;
  return 0;
}

static int device_init(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"backend", "device", "streams", "queue_bound", "backpressure", "log",
                           "bounds_check", "cache_dir", "launch_blocking", "spin_us", "launch_gil", "lanes", NULL};
  PyObject *backend = Py_None, *ordinal = Py_None, *streams = Py_None, *qbound = Py_None, *bp = Py_None,
           *log = Py_None, *bounds = Py_None, *cache = Py_None, *blocking = Py_None, *spin = Py_None,
           *gil = Py_None, *lanes = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOOOOOOOOOO", kwlist, &backend, &ordinal, &streams, &qbound, &bp,
                                   &log, &bounds, &cache, &blocking, &spin, &gil, &lanes))
    return -1;
  if (self->dev) {
    PyErr_SetString(PyExc_RuntimeError, "ruda.Device is already open");
    return -1;
  }
  ruda_config cfg;
  ruda_config_init(&cfg); /* defaults, then the RUDA_* environment; keywords win */
  int v;
  static const char *const backends[] = {"auto", "cuda", "host"};
  static const char *const bps[] = {"block", "error"};
  static const char *const logs[] = {"off", "error", "warn", "info", "debug"};
  if (backend != Py_None) {
    if (enum_arg(backend, "backend", backends, 3, &v) < 0) return -1;
    cfg.backend = (ruda_backend_kind)v;
  }
  if (ordinal != Py_None) {
    long o = PyLong_AsLong(ordinal);
    if (o == -1 && PyErr_Occurred()) return -1;
    cfg.device_ordinal = (int)o;
  }
  if (streams != Py_None && u32_arg(streams, "streams", &cfg.num_streams) < 0) return -1;
  if (qbound != Py_None && u32_arg(qbound, "queue_bound", &cfg.queue_bound) < 0) return -1;
  if (bp != Py_None) {
    if (enum_arg(bp, "backpressure", bps, 2, &v) < 0) return -1;
    cfg.backpressure = (ruda_backpressure)v;
  }
  if (log != Py_None) {
    if (enum_arg(log, "log", logs, 5, &v) < 0) return -1;
    cfg.log_level = (ruda_log_level)v;
  }
  if (bounds != Py_None) {
    if ((v = PyObject_IsTrue(bounds)) < 0) return -1;
    cfg.bounds_checked = v;
  }
  if (blocking != Py_None) {
    if ((v = PyObject_IsTrue(blocking)) < 0) return -1;
    cfg.launch_blocking = v;
  }
  if (spin != Py_None && u32_arg(spin, "spin_us", &cfg.spin_us) < 0) return -1;
  if (lanes != Py_None && u32_arg(lanes, "lanes", &cfg.lanes) < 0) return -1;
  if (cache != Py_None) {
    cfg.cache_dir = PyUnicode_AsUTF8(cache); /* lives with the argument, past the open */
    if (!cfg.cache_dir) return -1;
  }
  int keep_gil = RUDA_PY_GIL_AUTO;
  if (gil != Py_None) {
    static const char *const gils[] = {"release", "keep", "auto"}; /* in RUDA_PY_GIL_* order */
    if (enum_arg(gil, "launch_gil", gils, 3, &keep_gil) < 0) return -1;
    /* Kept, a launch must never wait: a full queue then fails instead. */
    if (keep_gil == RUDA_PY_GIL_KEEP && cfg.backpressure != RUDA_BACKPRESSURE_ERROR) {
      PyErr_SetString(PyExc_ValueError, "launch_gil='keep' needs backpressure='error': under 'block' a launch "
                                        "into a full queue would wait with the GIL held");
      return -1;
    }
  }
  ruda_device *dev = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_device_open(&cfg, &dev));
  if (rc) {
    ruda_py_raise_last(rc);
    return -1;
  }
  self->dev = dev;
  self->ordinal = cfg.device_ordinal;
  self->is_cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
  self->keep_gil = keep_gil;
  atomic_store(&self->closed, 0);
  return 0;
}

static PyObject *device_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  DeviceObject *self = (DeviceObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  atomic_init(&self->users, 0);
  atomic_init(&self->closed, 1); /* until __init__ opened it */
  atomic_init(&self->exports, 0);
  pthread_mutex_init(&self->lock, NULL);
  return (PyObject *)self;
}

/* Marks the device closed and waits until no call holds it; then waits
 * the live futures and closes. Returns the code of ruda_device_close. */
static int device_close_now(DeviceObject *self, ruda_error **errors) {
  if (atomic_exchange(&self->closed, 1) || !self->dev) return RUDA_ECLOSED;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  /* Calls in progress are short (or waits on this device that the close
     below would wait for anyway). */
  while (atomic_load_explicit(&self->users, memory_order_acquire) != 0) sched_yield();
  Py_END_ALLOW_THREADS
  /* Exports begin under a use, so none begins after this check; a live
     one points at memory the close would free: refuse, stay open. */
  if (atomic_load_explicit(&self->exports, memory_order_seq_cst) != 0) {
    atomic_store(&self->closed, 0);
    return RUDA_PY_EXPORTED;
  }
  ruda_py_futures_finish(self);
  RUDA_PY_NOGIL(rc = ruda_device_close(self->dev, errors));
  if (rc == RUDA_EBUSY) { /* a communicator still holds it: stay open */
    atomic_store(&self->closed, 0);
    return rc;
  }
  self->dev = NULL;
  ruda_py_host_kernels_release(self);
  return rc;
}

static PyObject *device_close(DeviceObject *self, PyObject *unused) {
  if (ruda_py_refuse_wait("Device.close") < 0) return NULL;
  ruda_error *err = NULL;
  int rc = device_close_now(self, &err);
  if (rc == RUDA_ECLOSED) Py_RETURN_NONE; /* closing twice is harmless */
  if (rc == RUDA_PY_EXPORTED)
    return PyErr_Format(PyExc_BufferError,
                        "close refused: %ld exported views (memoryviews of Staging blocks, DLPack tensors) still "
                        "point at this device's memory; release them first",
                        atomic_load(&self->exports));
  if (rc == RUDA_EBUSY) {
    ruda_py_raise_last(rc);
    return NULL;
  }
  if (rc) {
    ruda_py_raise_owned(rc, err);
    return NULL;
  }
  ruda_error_free(err);
  Py_RETURN_NONE;
}

static void device_dealloc(DeviceObject *self) {
  if (self->dev) {
    ruda_error *err = NULL;
    /* Nothing is exported here: every export holds a reference to the device. */
    int rc = device_close_now(self, &err);
    if (rc != RUDA_EBUSY && rc != RUDA_PY_EXPORTED) ruda_error_free(err);
  }
  pthread_mutex_destroy(&self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- small queries ---- */

static PyObject *device_get_backend(DeviceObject *self, void *c) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  PyObject *r = PyUnicode_FromString(ruda_device_backend(d));
  dev_leave(self);
  return r;
}

static PyObject *device_get_fallback(DeviceObject *self, void *c) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  const char *s = ruda_device_fallback_reason(d);
  PyObject *r = s ? PyUnicode_FromString(s) : Py_NewRef(Py_None);
  dev_leave(self);
  return r;
}

static PyObject *device_get_num_streams(DeviceObject *self, void *c) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  PyObject *r = PyLong_FromUnsignedLong(ruda_device_num_streams(d));
  dev_leave(self);
  return r;
}

static PyObject *device_get_num_lanes(DeviceObject *self, void *c) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  PyObject *r = PyLong_FromUnsignedLong(ruda_device_num_lanes(d));
  dev_leave(self);
  return r;
}

static PyObject *device_get_closed(DeviceObject *self, void *c) {
  return PyBool_FromLong(atomic_load(&self->closed));
}

static PyObject *device_props(DeviceObject *self, PyObject *unused) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_device_props p;
  int rc = ruda_device_get_props(d, &p);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return Py_BuildValue("{s:s,s:s,s:i,s:i,s:I,s:I,s:I,s:(III),s:(III),s:I,s:I,s:K}", "name", p.name, "backend",
                       p.backend, "cc_major", p.cc_major, "cc_minor", p.cc_minor, "sm_count", p.sm_count,
                       "warp_size", p.warp_size, "max_threads_per_block", p.max_threads_per_block, "max_block",
                       p.max_block.x, p.max_block.y, p.max_block.z, "max_grid", p.max_grid.x, p.max_grid.y,
                       p.max_grid.z, "max_shared_per_block", p.max_shared_per_block,
                       "max_shared_per_block_optin", p.max_shared_per_block_optin, "total_mem",
                       (unsigned long long)p.total_mem);
}

static PyObject *device_stream_ids(DeviceObject *self, PyObject *unused) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  size_t cap = 64, n;
  ruda_stream_id *ids = NULL;
  for (;;) {
    ruda_stream_id *grown = realloc(ids, cap * sizeof *ids);
    if (!grown) {
      free(ids);
      dev_leave(self);
      return PyErr_NoMemory();
    }
    ids = grown;
    n = ruda_stream_ids(d, ids, cap);
    if (n <= cap) break;
    cap = n + 16;
  }
  dev_leave(self);
  PyObject *l = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; l && i < n; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
    if (!v) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, v);
  }
  free(ids);
  return l;
}

/* ---- buffers ---- */

static PyObject *device_buffer(DeviceObject *self, PyObject *args) {
  unsigned long long size;
  PyObject *stream = Py_None, *shape = Py_None;
  unsigned char code = 1, bits = 8; /* DLPack uint8 */
  if (!PyArg_ParseTuple(args, "K|OBBO:buffer", &size, &stream, &code, &bits, &shape)) return NULL;
  ruda_stream_id s;
  if (ruda_py_stream(stream, &s) < 0) return NULL;
  int64_t dims[RUDA_MAX_RANK];
  int ndim = 1;
  dims[0] = (int64_t)size * 8 / (bits ? bits : 8);
  if (shape != Py_None) {
    PyObject *t = PySequence_Tuple(shape);
    if (!t) return NULL;
    ndim = (int)PyTuple_GET_SIZE(t);
    if (ndim > RUDA_MAX_RANK) {
      Py_DECREF(t);
      return PyErr_Format(PyExc_ValueError, "at most %d dimensions", RUDA_MAX_RANK);
    }
    for (int i = 0; i < ndim; i++) {
      dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
      if (dims[i] < 0) {
        Py_DECREF(t);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative dimension");
        return NULL;
      }
    }
    Py_DECREF(t);
  }
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_handle h;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_buffer_create(d, s, size, &h));
  if (rc) {
    dev_leave(self);
    ruda_py_raise_last(rc);
    return NULL;
  }
  BufferObject *b = (BufferObject *)BufferType.tp_alloc(&BufferType, 0);
  if (!b) {
    ruda_buffer_free(d, s, h);
    dev_leave(self);
    return NULL;
  }
  dev_leave(self);
  Py_INCREF(self);
  b->device = self;
  b->b = ruda_bind_range(h, 0, size);
  b->dl_code = code;
  b->dl_bits = bits;
  b->ndim = ndim;
  memcpy(b->shape, dims, sizeof dims);
  return (PyObject *)b;
}

/* Checks that o is a Buffer of this device. */
static BufferObject *own_buffer(DeviceObject *self, PyObject *o, const char *what) {
  if (!PyObject_TypeCheck(o, &BufferType)) {
    PyErr_Format(PyExc_TypeError, "%s must be a ruda.Buffer, not %.80s", what, Py_TYPE(o)->tp_name);
    return NULL;
  }
  BufferObject *b = (BufferObject *)o;
  if (b->device != self) {
    PyErr_Format(PyExc_ValueError, "%s belongs to another device", what);
    return NULL;
  }
  return b;
}

/* ---- copies ---- */

static PyObject *device_write(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"dst", "src", "stream"};
  PyObject *a[3];
  if (ruda_py_args("write", args, nargs, kwnames, names, 3, 2, a) < 0) return NULL;
  BufferObject *dst = own_buffer(self, a[0], "dst");
  ruda_stream_id s;
  if (!dst || ruda_py_stream(a[2], &s) < 0) return NULL;
  Py_buffer v;
  if (PyObject_GetBuffer(a[1], &v, PyBUF_SIMPLE) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) {
    PyBuffer_Release(&v);
    return NULL;
  }
  ruda_copy_desc desc = ruda_copy_contiguous(dst->b);
  int rc;
  /* ruda copies src into staging memory before returning: the one copy. */
  RUDA_PY_NOGIL(rc = ruda_write(d, s, &desc, v.buf, (size_t)v.len));
  dev_leave(self);
  PyBuffer_Release(&v);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *device_read(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"src", "out", "stream"};
  PyObject *a[3];
  if (ruda_py_args("read", args, nargs, kwnames, names, 3, 1, a) < 0) return NULL;
  BufferObject *src = own_buffer(self, a[0], "src");
  ruda_stream_id s;
  if (!src || ruda_py_stream(a[2], &s) < 0) return NULL;
  PyObject *out = a[1];
  if (!out || out == Py_None) {
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)src->b.size);
    if (!out) return NULL;
  } else {
    Py_INCREF(out);
  }
  Py_buffer v;
  if (PyObject_GetBuffer(out, &v, PyBUF_WRITABLE) < 0) {
    Py_DECREF(out);
    return NULL;
  }
  ruda_device *d = dev_enter(self);
  if (!d) {
    PyBuffer_Release(&v);
    Py_DECREF(out);
    return NULL;
  }
  ruda_copy_desc desc = ruda_copy_contiguous(src->b);
  ruda_future *f = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_read(d, s, &desc, v.buf, (size_t)v.len, &f));
  if (rc) {
    dev_leave(self);
    PyBuffer_Release(&v);
    Py_DECREF(out);
    ruda_py_raise_last(rc);
    return NULL;
  }
  if (!f) { /* recorded into a graph being captured: nothing to wait for */
    dev_leave(self);
    PyBuffer_Release(&v);
    return out;
  }
  /* Registered before the use ends, so a close waits for it. */
  PyObject *fut = ruda_py_future_new(self, f, out, &v);
  dev_leave(self);
  Py_DECREF(out);
  return fut;
}

static PyObject *device_copy(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"dst", "src", "stream"};
  PyObject *a[3];
  if (ruda_py_args("copy", args, nargs, kwnames, names, 3, 2, a) < 0) return NULL;
  BufferObject *dst = own_buffer(self, a[0], "dst"), *src = dst ? own_buffer(self, a[1], "src") : NULL;
  ruda_stream_id s;
  if (!src || ruda_py_stream(a[2], &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_copy(d, s, dst->b, src->b));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* ---- flush, sync ---- */

typedef int (*stream_fn)(ruda_device *, ruda_stream_id);

/* fn(d, s) on the entered device with the GIL released: 0, or -1 with
 * the error raised. */
static int stream_call(DeviceObject *self, ruda_stream_id s, stream_fn fn) {
  ruda_device *d = dev_enter(self);
  if (!d) return -1;
  int rc;
  RUDA_PY_NOGIL(rc = fn(d, s));
  dev_leave(self);
  if (rc) {
    ruda_py_raise_last(rc);
    return -1;
  }
  return 0;
}

typedef int (*stream_wait_fn)(ruda_device *, ruda_stream_id, ruda_error **);

static PyObject *stream_wait(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                             const char *fname, stream_wait_fn fn) {
  ruda_stream_id s;
  if (ruda_py_stream_arg(fname, args, nargs, kwnames, &s) < 0 || ruda_py_refuse_wait(fname) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_error *err = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = fn(d, s, &err));
  dev_leave(self);
  if (rc) return ruda_py_fail_owned(rc, err);
  Py_RETURN_NONE;
}

static PyObject *device_flush(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  return stream_wait(self, args, nargs, kw, "flush", ruda_flush);
}

static PyObject *device_sync(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  return stream_wait(self, args, nargs, kw, "sync", ruda_sync);
}

static PyObject *device_device_sync(DeviceObject *self, PyObject *unused) {
  if (ruda_py_refuse_wait("device_sync") < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_error *err = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_device_sync(d, &err));
  dev_leave(self);
  if (rc) return ruda_py_fail_owned(rc, err);
  Py_RETURN_NONE;
}

static PyObject *device_sync_async(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("sync_async", args, nargs, kw, &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_future *f = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_sync_async(d, s, &f));
  if (rc) {
    dev_leave(self);
    return ruda_py_fail(rc);
  }
  PyObject *fut = ruda_py_future_new(self, f, Py_None, NULL);
  dev_leave(self);
  return fut;
}

static PyObject *device_set_in_place(DeviceObject *self, PyObject *args) {
  PyObject *stream;
  int on;
  ruda_stream_id s;
  if (!PyArg_ParseTuple(args, "Op:set_in_place", &stream, &on) || ruda_py_stream(stream, &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  int rc = ruda_stream_set_in_place(d, s, on);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* ---- kernels ---- */

/* A NULL-terminated array of UTF-8 strings from a sequence (or None). */
static const char **str_array(PyObject *seq, PyObject **keep, uint32_t *n) {
  *keep = NULL;
  if (n) *n = 0;
  if (!seq || seq == Py_None) {
    const char **none = calloc(1, sizeof *none);
    if (!none) PyErr_NoMemory();
    return none;
  }
  if (PyUnicode_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "expected a sequence of str, not one str");
    return NULL;
  }
  PyObject *t = PySequence_Tuple(seq);
  if (!t) return NULL;
  Py_ssize_t k = PyTuple_GET_SIZE(t);
  const char **arr = calloc((size_t)k + 1, sizeof *arr);
  if (!arr) {
    Py_DECREF(t);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < k; i++) {
    arr[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i));
    if (!arr[i]) {
      free(arr);
      Py_DECREF(t);
      return NULL;
    }
  }
  *keep = t;
  if (n) *n = (uint32_t)k;
  return arr;
}

static PyObject *device_kernel_source(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "source", "options", NULL};
  const char *name, *src;
  PyObject *opts = Py_None, *keep;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O:kernel_source", kwlist, &name, &src, &opts)) return NULL;
  const char **o = str_array(opts, &keep, NULL);
  if (!o) return NULL;
  ruda_device *d = dev_enter(self);
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_kernel_source(d, name, src, opts == Py_None ? NULL : o));
    dev_leave(self);
  }
  free(o);
  Py_XDECREF(keep);
  if (!d) return NULL;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *device_module_source(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"source", "names", "file_name", "options", NULL};
  const char *src, *file = NULL;
  PyObject *names, *opts = Py_None, *keep_n, *keep_o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|zO:module_source", kwlist, &src, &names, &file, &opts))
    return NULL;
  uint32_t n;
  const char **nm = str_array(names, &keep_n, &n);
  if (!nm) return NULL;
  const char **o = str_array(opts, &keep_o, NULL);
  ruda_device *d = o ? dev_enter(self) : NULL;
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_module_source(d, file, src, nm, n, opts == Py_None ? NULL : o));
    dev_leave(self);
  }
  free(nm);
  free(o);
  Py_XDECREF(keep_n);
  Py_XDECREF(keep_o);
  if (!d) return NULL;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *device_module_image(DeviceObject *self, PyObject *args) {
  Py_buffer img;
  PyObject *names, *keep;
  if (!PyArg_ParseTuple(args, "y*O:module_image", &img, &names)) return NULL;
  uint32_t n;
  const char **nm = str_array(names, &keep, &n);
  ruda_device *d = nm ? dev_enter(self) : NULL;
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_module_image(d, img.buf, (size_t)img.len, nm, n));
    dev_leave(self);
  }
  PyBuffer_Release(&img);
  free(nm);
  Py_XDECREF(keep);
  if (!d) return NULL;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *device_module_file(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "names", "options", NULL};
  PyObject *path, *names, *opts = Py_None, *keep_n, *keep_o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|O:module_file", kwlist, PyUnicode_FSConverter, &path, &names,
                                   &opts))
    return NULL;
  uint32_t n;
  const char **nm = str_array(names, &keep_n, &n);
  const char **o = nm ? str_array(opts, &keep_o, NULL) : NULL;
  ruda_device *d = o ? dev_enter(self) : NULL;
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_module_file(d, PyBytes_AS_STRING(path), nm, n, opts == Py_None ? NULL : o));
    dev_leave(self);
  }
  Py_DECREF(path);
  free(nm);
  free(o);
  Py_XDECREF(keep_n);
  if (o) Py_XDECREF(keep_o);
  if (!d) return NULL;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* A host-kernel signature: 'P' a buffer, else struct-module codes of
 * scalars (b B h H i I q Q f d, or 'Ns' for N raw bytes). */
int ruda_py_parse_signature(const char *sig, ruda_host_param *params, uint32_t *n);

static PyObject *device_host_kernel(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "fn", "signature", NULL};
  const char *name, *sig = NULL;
  PyObject *fn;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|z:host_kernel", kwlist, &name, &fn, &sig)) return NULL;
  ruda_host_param params[RUDA_MAX_ARGS];
  uint32_t n = 0;
  if (sig && ruda_py_parse_signature(sig, params, &n) < 0) return NULL;
  if (PyCallable_Check(fn)) return ruda_py_host_kernel_callable(self, name, fn, sig ? params : NULL, n);
  void *addr = PyLong_AsVoidPtr(fn);
  if (!addr) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "fn must be a callable or the address of a C host kernel");
    return NULL;
  }
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_host_kernel_fn f = (ruda_host_kernel_fn)(uintptr_t)addr;
  int rc = sig ? ruda_host_kernel_register_typed(d, name, f, params, n) : ruda_host_kernel_register(d, name, f);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* ---- profiling, tracing ---- */

static PyObject *device_profile_begin(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("profile_begin", args, nargs, kw, &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_profile_token t;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_profile_begin(d, s, &t));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return PyLong_FromUnsignedLongLong(t.id);
}

static PyObject *device_profile_end(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  static const char *const names[] = {"token", "stream"};
  PyObject *a[2];
  ruda_stream_id s;
  if (ruda_py_args("profile_end", args, nargs, kw, names, 2, 1, a) < 0 || ruda_py_stream(a[1], &s) < 0)
    return NULL;
  ruda_profile_token t = {PyLong_AsUnsignedLongLong(a[0])};
  if (PyErr_Occurred()) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  uint64_t ns = 0;
  ruda_error *err = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_profile_end(d, s, t, &ns, &err));
  dev_leave(self);
  if (rc) return ruda_py_fail_owned(rc, err);
  return PyLong_FromUnsignedLongLong(ns);
}

static PyObject *device_trace_start(DeviceObject *self, PyObject *arg) {
  PyObject *path;
  if (!PyUnicode_FSConverter(arg, &path)) return NULL;
  ruda_device *d = dev_enter(self);
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_trace_start(d, PyBytes_AS_STRING(path)));
    dev_leave(self);
  }
  Py_DECREF(path);
  if (!d) return NULL;
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *device_trace_stop(DeviceObject *self, PyObject *unused) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_trace_stop(d));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

/* ---- memory reports ---- */

static PyObject *stats_dict(const ruda_memory_stats *m) {
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "nallocs", (unsigned long long)m->nallocs, "bytes_in_use",
                       (unsigned long long)m->bytes_in_use, "bytes_padding", (unsigned long long)m->bytes_padding,
                       "bytes_reserved", (unsigned long long)m->bytes_reserved, "bytes_unbacked",
                       (unsigned long long)m->bytes_unbacked, "peak_in_use", (unsigned long long)m->peak_in_use,
                       "peak_reserved", (unsigned long long)m->peak_reserved);
}

static PyObject *device_memory_usage(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kw) {
  static const char *const names[] = {"stream"};
  PyObject *a[1];
  ruda_stream_id s;
  if (ruda_py_args("memory_usage", args, nargs, kw, names, 1, 0, a) < 0) return NULL;
  int whole = a[0] == NULL;
  if (!whole && ruda_py_stream(a[0], &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_memory_stats m;
  int rc;
  RUDA_PY_NOGIL(rc = whole ? ruda_memory_device_usage(d, &m) : ruda_memory_usage(d, s, &m));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return stats_dict(&m);
}

static PyObject *device_staging_usage(DeviceObject *self, PyObject *unused) {
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_staging_stats st;
  int rc = ruda_staging_usage(d, &st);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "pinned_bytes", (unsigned long long)st.pinned_bytes,
                       "in_use_bytes", (unsigned long long)st.in_use_bytes, "peak_bytes",
                       (unsigned long long)st.peak_bytes, "limit_bytes", (unsigned long long)st.limit_bytes,
                       "chunk_bytes", (unsigned long long)st.chunk_bytes, "fallback_bytes",
                       (unsigned long long)st.fallback_bytes, "fallback_count",
                       (unsigned long long)st.fallback_count);
}

static PyObject *device_memory_summary(DeviceObject *self, PyObject *unused) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return PyErr_SetFromErrno(PyExc_OSError);
  ruda_device *d = dev_enter(self);
  int rc = 0;
  if (d) {
    RUDA_PY_NOGIL(rc = ruda_memory_summary(d, f));
    dev_leave(self);
  }
  fclose(f);
  PyObject *r = NULL;
  if (d && rc) ruda_py_raise_last(rc);
  else if (d) r = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
  free(text);
  return r;
}

static PyObject *device_memory_cleanup(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("memory_cleanup", args, nargs, kw, &s) < 0 || stream_call(self, s, ruda_memory_cleanup) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* ---- graphs ---- */

/* The id a capture is known by: a thread's own stream resolved. */
static ruda_stream_id capture_id(ruda_stream_id s) {
  return s == RUDA_STREAM_CURRENT ? ruda_stream_current() : s;
}

int ruda_py_capturing(DeviceObject *self, ruda_stream_id s) {
  s = capture_id(s);
  int found = 0;
  pthread_mutex_lock(&self->lock);
  for (int i = 0; i < self->ncapturing; i++) found |= self->capturing[i] == s;
  pthread_mutex_unlock(&self->lock);
  return found;
}

static void capture_forget(DeviceObject *self, ruda_stream_id s) {
  s = capture_id(s);
  pthread_mutex_lock(&self->lock);
  for (int i = 0; i < self->ncapturing; i++)
    if (self->capturing[i] == s) {
      self->capturing[i] = self->capturing[--self->ncapturing];
      break;
    }
  pthread_mutex_unlock(&self->lock);
}

static PyObject *device_begin_capture(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("begin_capture", args, nargs, kw, &s) < 0) return NULL;
  /* A slot is reserved before the C call (the lock is not held across
     it), so racing calls cannot all pass the bound and then append. */
  pthread_mutex_lock(&self->lock);
  int full = self->ncapturing + self->capture_reserved >= RUDA_PY_MAX_CAPTURES;
  if (!full) self->capture_reserved++;
  pthread_mutex_unlock(&self->lock);
  if (full) return PyErr_Format(PyExc_RuntimeError, "at most %d streams capture at once", RUDA_PY_MAX_CAPTURES);
  int rc = stream_call(self, s, ruda_graph_begin_capture);
  pthread_mutex_lock(&self->lock);
  self->capture_reserved--;
  if (rc == 0) self->capturing[self->ncapturing++] = capture_id(s);
  pthread_mutex_unlock(&self->lock);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

PyObject *ruda_py_graph_new(DeviceObject *d, ruda_graph *g);

static PyObject *device_end_capture(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("end_capture", args, nargs, kw, &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  ruda_graph *g = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_graph_end_capture(d, s, &g));
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  capture_forget(self, s);
  return ruda_py_graph_new(self, g);
}

static PyObject *device_abort_capture(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("abort_capture", args, nargs, kw, &s) < 0 ||
      stream_call(self, s, ruda_graph_abort_capture) < 0)
    return NULL;
  capture_forget(self, s);
  Py_RETURN_NONE;
}

static PyObject *device_graph_prepare(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("graph_prepare", args, nargs, kw, &s) < 0 || stream_call(self, s, ruda_graph_prepare) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* ---- CUDA interop ---- */

static PyObject *device_cuda_stream(DeviceObject *self, PyObject *arg) {
  ruda_stream_id s;
  if (ruda_py_stream(arg, &s) < 0) return NULL;
  ruda_device *d = dev_enter(self);
  if (!d) return NULL;
  void *cs = NULL;
  int rc = ruda_cuda_stream(d, s, &cs);
  dev_leave(self);
  if (rc) return ruda_py_fail(rc);
  return PyLong_FromVoidPtr(cs);
}

PyObject *ruda_py_staging_new(DeviceObject *d, size_t size);
PyObject *ruda_py_write_staged(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ruda_py_kernel_new(DeviceObject *d, const char *name, const char *sig);

static PyObject *device_staging(DeviceObject *self, PyObject *arg) {
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative size");
    return NULL;
  }
  return ruda_py_staging_new(self, (size_t)n);
}

static PyObject *device_kernel(DeviceObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "signature", NULL};
  const char *name, *sig = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z:kernel", kwlist, &name, &sig)) return NULL;
  return ruda_py_kernel_new(self, name, sig);
}

static PyMethodDef device_methods[] = {
    {"close", (PyCFunction)device_close, METH_NOARGS,
     "close(): runs what is queued, stops the workers; raises the errors still queued"},
    {"props", (PyCFunction)device_props, METH_NOARGS, "props() -> dict of ruda_device_props"},
    {"stream_ids", (PyCFunction)device_stream_ids, METH_NOARGS, "the ids of the streams used so far"},
    {"_buffer", (PyCFunction)device_buffer, METH_VARARGS, NULL},
    {"write", (PyCFunction)(void (*)(void))device_write, METH_FASTCALL | METH_KEYWORDS,
     "write(dst, src, stream=None): src (any C-contiguous buffer) into dst; src reusable on return"},
    {"read", (PyCFunction)(void (*)(void))device_read, METH_FASTCALL | METH_KEYWORDS,
     "read(src, out=None, stream=None) -> Future whose result is out (a bytearray when None)"},
    {"copy", (PyCFunction)(void (*)(void))device_copy, METH_FASTCALL | METH_KEYWORDS,
     "copy(dst, src, stream=None): buffer to buffer, in stream order"},
    {"flush", (PyCFunction)(void (*)(void))device_flush, METH_FASTCALL | METH_KEYWORDS,
     "flush(stream=None): the worker submitted everything; raises the stream's errors"},
    {"sync", (PyCFunction)(void (*)(void))device_sync, METH_FASTCALL | METH_KEYWORDS,
     "sync(stream=None): the device finished everything; raises the stream's errors"},
    {"sync_async", (PyCFunction)(void (*)(void))device_sync_async, METH_FASTCALL | METH_KEYWORDS,
     "sync_async(stream=None) -> Future"},
    {"device_sync", (PyCFunction)device_device_sync, METH_NOARGS,
     "device_sync(): every stream synced; raises all their errors"},
    {"set_in_place", (PyCFunction)device_set_in_place, METH_VARARGS, "set_in_place(stream, on)"},
    {"kernel_source", (PyCFunction)(void (*)(void))device_kernel_source, METH_VARARGS | METH_KEYWORDS,
     "kernel_source(name, source, options=None): compiles a CUDA C++ kernel"},
    {"module_source", (PyCFunction)(void (*)(void))device_module_source, METH_VARARGS | METH_KEYWORDS,
     "module_source(source, names, file_name=None, options=None)"},
    {"module_image", (PyCFunction)device_module_image, METH_VARARGS, "module_image(image, names)"},
    {"module_file", (PyCFunction)(void (*)(void))device_module_file, METH_VARARGS | METH_KEYWORDS,
     "module_file(path, names, options=None)"},
    {"host_kernel", (PyCFunction)(void (*)(void))device_host_kernel, METH_VARARGS | METH_KEYWORDS,
     "host_kernel(name, fn, signature=None): fn a C function address or a Python callable"},
    {"kernel", (PyCFunction)(void (*)(void))device_kernel, METH_VARARGS | METH_KEYWORDS,
     "kernel(name, signature=None) -> Kernel"},
    {"profile_begin", (PyCFunction)(void (*)(void))device_profile_begin, METH_FASTCALL | METH_KEYWORDS,
     "profile_begin(stream=None) -> token"},
    {"profile_end", (PyCFunction)(void (*)(void))device_profile_end, METH_FASTCALL | METH_KEYWORDS,
     "profile_end(token, stream=None) -> ns"},
    {"trace_start", (PyCFunction)device_trace_start, METH_O, "trace_start(path)"},
    {"trace_stop", (PyCFunction)device_trace_stop, METH_NOARGS, "trace_stop(): writes the trace"},
    {"memory_usage", (PyCFunction)(void (*)(void))device_memory_usage, METH_FASTCALL | METH_KEYWORDS,
     "memory_usage(stream=<all>) -> dict"},
    {"memory_summary", (PyCFunction)device_memory_summary, METH_NOARGS, "memory_summary() -> str"},
    {"staging_usage", (PyCFunction)device_staging_usage, METH_NOARGS, "staging_usage() -> dict"},
    {"memory_cleanup", (PyCFunction)(void (*)(void))device_memory_cleanup, METH_FASTCALL | METH_KEYWORDS,
     "memory_cleanup(stream=None)"},
    {"graph_prepare", (PyCFunction)(void (*)(void))device_graph_prepare, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"begin_capture", (PyCFunction)(void (*)(void))device_begin_capture, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"end_capture", (PyCFunction)(void (*)(void))device_end_capture, METH_FASTCALL | METH_KEYWORDS,
     "end_capture(stream=None) -> Graph"},
    {"abort_capture", (PyCFunction)(void (*)(void))device_abort_capture, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"staging", (PyCFunction)device_staging, METH_O, "staging(size) -> Staging (page-locked)"},
    {"write_staged", (PyCFunction)(void (*)(void))ruda_py_write_staged, METH_FASTCALL | METH_KEYWORDS,
     "write_staged(dst, staging, stream=None)"},
    {"_cuda_stream", (PyCFunction)device_cuda_stream, METH_O, NULL},
    {"_adopt", (PyCFunction)(void (*)(void))ruda_py_device_adopt, METH_FASTCALL | METH_KEYWORDS, NULL},
    {NULL}};

static PyGetSetDef device_getset[] = {
    {"backend", (getter)device_get_backend, NULL, "'host' or 'cuda'", NULL},
    {"fallback_reason", (getter)device_get_fallback, NULL, "why auto chose host, or None", NULL},
    {"num_streams", (getter)device_get_num_streams, NULL, "worker streams", NULL},
    {"num_lanes", (getter)device_get_num_lanes, NULL, "device streams (CUstreams) of all workers", NULL},
    {"closed", (getter)device_get_closed, NULL, "True once closed", NULL},
    {NULL}};

PyTypeObject DeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Device",
    .tp_basicsize = sizeof(DeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "an open ruda device",
    .tp_new = device_new,
    .tp_init = (initproc)device_init,
    .tp_dealloc = (destructor)device_dealloc,
    .tp_methods = device_methods,
    .tp_getset = device_getset,
};

/* python/src/graph_comm.c - ruda.Graph (replay a captured stream) and
 * ruda.Comm (collectives between devices of this process). */
#include "args.h"
#include "module.h"

#include <stdlib.h>
#include <string.h>

/* ---- Graph ---- */

typedef struct {
  PyObject_HEAD
  DeviceObject *device;
  ruda_graph *g;
} GraphObject;

PyObject *ruda_py_graph_new(DeviceObject *d, ruda_graph *g) {
  GraphObject *o = (GraphObject *)GraphType.tp_alloc(&GraphType, 0);
  if (!o) {
    ruda_device *rd = dev_try_enter(d);
    if (rd) {
      ruda_graph_destroy(rd, g);
      dev_leave(d);
    }
    return NULL;
  }
  o->device = (DeviceObject *)Py_NewRef(d);
  o->g = g;
  return (PyObject *)o;
}

static void graph_destroy_now(GraphObject *self) {
  if (!self->g) return;
  ruda_device *d = dev_try_enter(self->device);
  if (d) { /* a closed device released its graphs */
    ruda_graph_destroy(d, self->g);
    dev_leave(self->device);
  }
  self->g = NULL;
}

static void graph_dealloc(GraphObject *self) {
  PyObject_GC_UnTrack(self);
  graph_destroy_now(self);
  Py_CLEAR(self->device);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int graph_traverse(GraphObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->device);
  return 0;
}

static ruda_device *graph_enter(GraphObject *self) {
  if (!self->g) {
    PyErr_SetString(PyExc_ValueError, "the graph was destroyed");
    return NULL;
  }
  return dev_enter(self->device);
}

static PyObject *graph_replay(GraphObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("replay", args, nargs, kw, &s) < 0) return NULL;
  ruda_device *d = graph_enter(self);
  if (!d) return NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_graph_replay(d, s, self->g));
  dev_leave(self->device);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *graph_replay_async(GraphObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("replay_async", args, nargs, kw, &s) < 0) return NULL;
  ruda_device *d = graph_enter(self);
  if (!d) return NULL;
  ruda_future *f = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_graph_replay_async(d, s, self->g, &f));
  if (rc) {
    dev_leave(self->device);
    ruda_py_raise_last(rc);
    return NULL;
  }
  PyObject *fut = ruda_py_future_new(self->device, f, Py_None, NULL);
  dev_leave(self->device);
  return fut;
}

static PyObject *graph_run(GraphObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw) {
  ruda_stream_id s;
  if (ruda_py_stream_arg("run", args, nargs, kw, &s) < 0 || ruda_py_refuse_wait("Graph.run") < 0) return NULL;
  ruda_device *d = graph_enter(self);
  if (!d) return NULL;
  ruda_error *err = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_graph_run(d, s, self->g, &err));
  dev_leave(self->device);
  if (rc) return ruda_py_fail_owned(rc, err);
  Py_RETURN_NONE;
}

static PyObject *graph_destroy(GraphObject *self, PyObject *unused) {
  graph_destroy_now(self);
  Py_RETURN_NONE;
}

static Py_ssize_t graph_len(GraphObject *self) { return self->g ? (Py_ssize_t)ruda_graph_length(self->g) : 0; }

static PyMethodDef graph_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))graph_replay, METH_FASTCALL | METH_KEYWORDS,
     "replay(stream=None): one command, fire-and-forget"},
    {"replay_async", (PyCFunction)(void (*)(void))graph_replay_async, METH_FASTCALL | METH_KEYWORDS,
     "replay_async(stream=None) -> Future"},
    {"run", (PyCFunction)(void (*)(void))graph_run, METH_FASTCALL | METH_KEYWORDS,
     "run(stream=None): replays and waits (GIL released); raises the stream's errors"},
    {"destroy", (PyCFunction)graph_destroy, METH_NOARGS, "destroy(): replays enqueued still run"},
    {NULL}};

static PySequenceMethods graph_seq = {.sq_length = (lenfunc)graph_len};

PyTypeObject GraphType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Graph",
    .tp_basicsize = sizeof(GraphObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "a captured graph (Device.end_capture); len() is its command count",
    .tp_dealloc = (destructor)graph_dealloc,
    .tp_traverse = (traverseproc)graph_traverse,
    .tp_methods = graph_methods,
    .tp_as_sequence = &graph_seq,
};

/* ---- Comm ---- */

typedef struct {
  PyObject_HEAD
  ruda_comm *comm;
  PyObject *devices; /* tuple of DeviceObject, alive while comm is */
} CommObject;

static PyObject *comm_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *seq;
  if (!PyArg_ParseTuple(args, "O:Comm", &seq)) return NULL;
  PyObject *t = PySequence_Tuple(seq);
  if (!t) return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  ruda_device **devs = calloc((size_t)(n ? n : 1), sizeof *devs);
  if (!devs) {
    Py_DECREF(t);
    return PyErr_NoMemory();
  }
  Py_ssize_t entered = 0;
  for (; entered < n; entered++) {
    PyObject *o = PyTuple_GET_ITEM(t, entered);
    if (!PyObject_TypeCheck(o, &DeviceType)) {
      PyErr_SetString(PyExc_TypeError, "Comm takes a sequence of ruda.Device");
      break;
    }
    if (!(devs[entered] = dev_enter((DeviceObject *)o))) break;
  }
  ruda_comm *c = NULL;
  int rc = 0;
  if (entered == n) RUDA_PY_NOGIL(rc = ruda_comm_init(devs, (uint32_t)n, &c));
  for (Py_ssize_t i = 0; i < entered; i++) dev_leave((DeviceObject *)PyTuple_GET_ITEM(t, i));
  free(devs);
  if (entered != n) {
    Py_DECREF(t);
    return NULL;
  }
  if (rc) {
    Py_DECREF(t);
    ruda_py_raise_last(rc);
    return NULL;
  }
  CommObject *self = (CommObject *)type->tp_alloc(type, 0);
  if (!self) {
    ruda_comm_destroy(c);
    Py_DECREF(t);
    return NULL;
  }
  self->comm = c;
  self->devices = t;
  return (PyObject *)self;
}

static int comm_destroy_now(CommObject *self) {
  if (!self->comm) return 0;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_comm_destroy(self->comm));
  self->comm = NULL;
  return rc;
}

static void comm_dealloc(CommObject *self) {
  PyObject_GC_UnTrack(self);
  comm_destroy_now(self);
  Py_CLEAR(self->devices);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int comm_traverse(CommObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->devices);
  return 0;
}

static PyObject *comm_destroy(CommObject *self, PyObject *unused) {
  int rc = comm_destroy_now(self);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static int dtype_arg(PyObject *o, ruda_dtype *out) {
  static const char *const names[] = {"f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8"};
  const char *s = PyUnicode_AsUTF8(o);
  if (!s) return -1;
  for (int i = 0; i < 8; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (ruda_dtype)i;
      return 0;
    }
  PyErr_Format(PyExc_ValueError, "dtype must be one of f32 f64 i32 i64 f16 bf16 i8 u8, not '%s'", s);
  return -1;
}

static int op_arg(PyObject *o, ruda_reduce_op *out) {
  static const char *const names[] = {"sum", "mean", "min", "max"};
  const char *s = PyUnicode_AsUTF8(o);
  if (!s) return -1;
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (ruda_reduce_op)i;
      return 0;
    }
  PyErr_Format(PyExc_ValueError, "op must be one of sum mean min max, not '%s'", s);
  return -1;
}

enum { C_ALL_REDUCE, C_REDUCE, C_BROADCAST, C_ALL_GATHER, C_REDUCE_SCATTER, C_SEND, C_RECV };

/* One entry point for the collectives: (device, src, dst, dtype, op, root/peer). */
static PyObject *collective(CommObject *self, int which, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
  static const char *const names[] = {"device", "src", "dst", "dtype", "op", "root"};
  static const char *const fnames[] = {"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                                       "send", "recv"};
  PyObject *a[6];
  if (ruda_py_args(fnames[which], args, nargs, kwnames, names, 6, 2, a) < 0) return NULL;
  if (!self->comm) {
    PyErr_SetString(PyExc_ValueError, "the communicator was destroyed");
    return NULL;
  }
  if (!PyObject_TypeCheck(a[0], &DeviceType)) {
    PyErr_SetString(PyExc_TypeError, "device must be a ruda.Device");
    return NULL;
  }
  DeviceObject *dv = (DeviceObject *)a[0];
  BufferObject *src = (BufferObject *)a[1], *dst = a[2] && a[2] != Py_None ? (BufferObject *)a[2] : src;
  if (!PyObject_TypeCheck(a[1], &BufferType) || !PyObject_TypeCheck((PyObject *)dst, &BufferType) ||
      src->device != dv || dst->device != dv) {
    PyErr_SetString(PyExc_TypeError, "src and dst must be ruda.Buffers of that device");
    return NULL;
  }
  ruda_dtype dt = RUDA_DTYPE_F32;
  ruda_reduce_op op = RUDA_REDUCE_SUM;
  unsigned long root = 0;
  if (a[3] && dtype_arg(a[3], &dt) < 0) return NULL;
  if (a[4] && op_arg(a[4], &op) < 0) return NULL;
  if (a[5]) {
    root = PyLong_AsUnsignedLong(a[5]);
    if (PyErr_Occurred()) return NULL;
  }
  ruda_device *d = dev_enter(dv);
  if (!d) return NULL;
  int rc = RUDA_EINVAL;
  ruda_comm *c = self->comm;
  /* Collectives return at once, but a full queue blocks under backpressure block. */
  Py_BEGIN_ALLOW_THREADS
  switch (which) {
  case C_ALL_REDUCE: rc = ruda_all_reduce(c, d, src->b, dst->b, dt, op); break;
  case C_REDUCE: rc = ruda_reduce(c, d, src->b, dst->b, dt, op, (uint32_t)root); break;
  case C_BROADCAST: rc = ruda_broadcast(c, d, src->b, dst->b, dt, (uint32_t)root); break;
  case C_ALL_GATHER: rc = ruda_all_gather(c, d, src->b, dst->b, dt); break;
  case C_REDUCE_SCATTER: rc = ruda_reduce_scatter(c, d, src->b, dst->b, dt, op); break;
  case C_SEND: rc = ruda_send(c, d, src->b, (uint32_t)root); break;
  case C_RECV: rc = ruda_recv(c, d, src->b, (uint32_t)root); break;
  }
  Py_END_ALLOW_THREADS
  dev_leave(dv);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

#define COLLECTIVE(fn, which)                                                                    \
  static PyObject *comm_##fn(CommObject *self, PyObject *const *args, Py_ssize_t n, PyObject *k) { \
    return collective(self, which, args, n, k);                                                  \
  }
COLLECTIVE(all_reduce, C_ALL_REDUCE)
COLLECTIVE(reduce, C_REDUCE)
COLLECTIVE(broadcast, C_BROADCAST)
COLLECTIVE(all_gather, C_ALL_GATHER)
COLLECTIVE(reduce_scatter, C_REDUCE_SCATTER)
COLLECTIVE(send, C_SEND)
COLLECTIVE(recv, C_RECV)

static PyObject *comm_sync(CommObject *self, PyObject *dev) {
  if (!PyObject_TypeCheck(dev, &DeviceType)) {
    PyErr_SetString(PyExc_TypeError, "sync(device): a ruda.Device");
    return NULL;
  }
  if (!self->comm) {
    PyErr_SetString(PyExc_ValueError, "the communicator was destroyed");
    return NULL;
  }
  if (ruda_py_refuse_wait("Comm.sync") < 0) return NULL;
  ruda_device *d = dev_enter((DeviceObject *)dev);
  if (!d) return NULL;
  ruda_error *err = NULL;
  int rc;
  RUDA_PY_NOGIL(rc = ruda_comm_sync(self->comm, d, &err));
  dev_leave((DeviceObject *)dev);
  if (rc) return ruda_py_fail_owned(rc, err);
  Py_RETURN_NONE;
}

static PyObject *comm_rank(CommObject *self, PyObject *dev) {
  if (!PyObject_TypeCheck(dev, &DeviceType) || !self->comm) {
    PyErr_SetString(PyExc_TypeError, "rank(device) of a live communicator");
    return NULL;
  }
  ruda_device *d = dev_enter((DeviceObject *)dev);
  if (!d) return NULL;
  int r = ruda_comm_rank(self->comm, d);
  dev_leave((DeviceObject *)dev);
  return PyLong_FromLong(r);
}

static Py_ssize_t comm_len(CommObject *self) { return (Py_ssize_t)ruda_comm_size(self->comm); }

#define CMETH(fn, doc) {#fn, (PyCFunction)(void (*)(void))comm_##fn, METH_FASTCALL | METH_KEYWORDS, doc}
static PyMethodDef comm_methods[] = {
    CMETH(all_reduce, "all_reduce(device, src, dst=None, dtype='f32', op='sum')"),
    CMETH(reduce, "reduce(device, src, dst=None, dtype='f32', op='sum', root=0)"),
    CMETH(broadcast, "broadcast(device, src, dst=None, dtype='f32', root=0)"),
    CMETH(all_gather, "all_gather(device, src, dst, dtype='f32')"),
    CMETH(reduce_scatter, "reduce_scatter(device, src, dst, dtype='f32', op='sum')"),
    CMETH(send, "send(device, src, root=peer)"),
    CMETH(recv, "recv(device, dst_as_src, root=peer)"),
    {"sync", (PyCFunction)comm_sync, METH_O, "sync(device): waits for the rank's collectives"},
    {"rank", (PyCFunction)comm_rank, METH_O, "rank(device) -> int (-1: not a member)"},
    {"destroy", (PyCFunction)comm_destroy, METH_NOARGS, "destroy(): waits for every rank"},
    {NULL}};

static PySequenceMethods comm_seq = {.sq_length = (lenfunc)comm_len};

PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Comm(devices): a communicator, one rank per device in the order given",
    .tp_new = comm_new,
    .tp_dealloc = (destructor)comm_dealloc,
    .tp_traverse = (traverseproc)comm_traverse,
    .tp_methods = comm_methods,
    .tp_as_sequence = &comm_seq,
};

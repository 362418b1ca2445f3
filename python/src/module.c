/* python/src/module.c - the _ruda module: errors, stream ids, module
 * functions and the type registrations. */
#include "module.h"


PyObject *ruda_py_error_factory;
PyObject *ruda_py_await_helper;

/* Builds the exception object of one error, its cause and its list. */
static PyObject *error_object(int code, const ruda_error *err) {
  if (!ruda_py_error_factory) {
    PyErr_SetString(PyExc_RuntimeError, "ruda._errors was not imported");
    return NULL;
  }
  const char *msg = err ? ruda_error_message(err) : ruda_strerror(code);
  if (err && !msg[0]) msg = ruda_strerror(code);
  PyObject *cause = Py_None, *list = NULL;
  Py_INCREF(cause);
  if (err && ruda_error_cause(err)) {
    const ruda_error *c = ruda_error_cause(err);
    Py_DECREF(cause);
    cause = error_object(ruda_error_code(c), c);
    if (!cause) return NULL;
  }
  list = PyList_New(0);
  if (!list) goto fail;
  for (const ruda_error *n = err ? ruda_error_next(err) : NULL; n; n = ruda_error_next(n)) {
    PyObject *o = error_object(ruda_error_code(n), n);
    if (!o || PyList_Append(list, o) < 0) {
      Py_XDECREF(o);
      goto fail;
    }
    Py_DECREF(o);
  }
  PyObject *e = PyObject_CallFunction(ruda_py_error_factory, "isKlOO", code, msg,
                                      (unsigned long long)(err ? ruda_error_stream(err) : 0),
                                      err ? ruda_error_backend_code(err) : 0L, cause, list);
  Py_DECREF(cause);
  Py_DECREF(list);
  return e;
fail:
  Py_DECREF(cause);
  Py_XDECREF(list);
  return NULL;
}

void ruda_py_raise(int code, const ruda_error *err) {
  if (err && ruda_error_code(err)) code = ruda_error_code(err);
  PyObject *e = error_object(code, err);
  if (!e) return;
  PyErr_SetObject((PyObject *)Py_TYPE(e), e);
  Py_DECREF(e);
}

void ruda_py_raise_last(int code) {
  const ruda_error *e = ruda_last_error();
  ruda_py_raise(code, ruda_error_code(e) == code ? e : NULL);
}

void ruda_py_raise_owned(int code, ruda_error *err) {
  ruda_py_raise(code, err);
  ruda_error_free(err);
}

int ruda_py_stream(PyObject *o, ruda_stream_id *out) {
  if (!o || o == Py_None) {
    *out = RUDA_STREAM_CURRENT;
    return 0;
  }
  if (PyLong_Check(o)) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "a stream id is an int in [0, 2**63) or ruda.CURRENT");
      return -1;
    }
    *out = v;
    return 0;
  }
  if (PyObject_TypeCheck(o, &StreamType)) {
    *out = ((StreamObject *)o)->id;
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "stream must be None, an int id or a ruda.Stream, not %.80s",
               Py_TYPE(o)->tp_name);
  return -1;
}

/* ---- ruda.Stream: an id, and the device it was taken from ---- */

static int stream_init(StreamObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device", "id", NULL};
  PyObject *dev = Py_None, *id = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", kwlist, &dev, &id)) return -1;
  if (ruda_py_stream(id, &self->id) < 0) return -1;
  if (self->id == RUDA_STREAM_CURRENT) self->id = ruda_stream_current();
  Py_INCREF(dev);
  Py_XSETREF(self->device, dev);
  return 0;
}

static void stream_dealloc(StreamObject *self) {
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->device);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int stream_traverse(StreamObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->device);
  return 0;
}

static PyObject *stream_get_id(StreamObject *self, void *c) {
  return PyLong_FromUnsignedLongLong(self->id);
}

static PyObject *stream_get_device(StreamObject *self, void *c) {
  return Py_NewRef(self->device);
}

static PyObject *stream_index(StreamObject *self) {
  return PyLong_FromUnsignedLongLong(self->id);
}

static PyObject *stream_richcompare(PyObject *a, PyObject *b, int op) {
  if (!PyObject_TypeCheck(b, &StreamType) || (op != Py_EQ && op != Py_NE)) Py_RETURN_NOTIMPLEMENTED;
  int eq = ((StreamObject *)a)->id == ((StreamObject *)b)->id &&
           ((StreamObject *)a)->device == ((StreamObject *)b)->device;
  return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t stream_hash(StreamObject *self) {
  Py_hash_t h = (Py_hash_t)(self->id ^ (self->id >> 32));
  return h == -1 ? -2 : h;
}

static PyGetSetDef stream_getset[] = {
    {"id", (getter)stream_get_id, NULL, "the stream id", NULL},
    {"device", (getter)stream_get_device, NULL, "the device", NULL},
    {NULL}};

static PyNumberMethods stream_number = {.nb_index = (unaryfunc)stream_index, .nb_int = (unaryfunc)stream_index};

PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Stream(device, id=None): a stream id of a device (None: the calling thread's own)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)stream_init,
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_traverse = (traverseproc)stream_traverse,
    .tp_getset = stream_getset,
    .tp_as_number = &stream_number,
    .tp_richcompare = stream_richcompare,
    .tp_hash = (hashfunc)stream_hash,
};

/* ---- module functions ---- */

static PyObject *mod_set_helpers(PyObject *m, PyObject *args) {
  PyObject *factory, *awaiter;
  if (!PyArg_ParseTuple(args, "OO", &factory, &awaiter)) return NULL;
  Py_INCREF(factory);
  Py_XSETREF(ruda_py_error_factory, factory);
  Py_INCREF(awaiter);
  Py_XSETREF(ruda_py_await_helper, awaiter);
  Py_RETURN_NONE;
}

static PyObject *mod_version(PyObject *m, PyObject *unused) { return PyUnicode_FromString(ruda_version()); }

static PyObject *mod_stream_current(PyObject *m, PyObject *unused) {
  return PyLong_FromUnsignedLongLong(ruda_stream_current());
}

static PyObject *mod_err_name(PyObject *m, PyObject *code) {
  long c = PyLong_AsLong(code);
  if (c == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(ruda_err_name((int)c));
}

static PyObject *mod_strerror(PyObject *m, PyObject *code) {
  long c = PyLong_AsLong(code);
  if (c == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(ruda_strerror((int)c));
}

static PyObject *mod_range_push(PyObject *m, PyObject *name) {
  const char *s = PyUnicode_AsUTF8(name);
  if (!s) return NULL;
  int rc = ruda_range_push(s);
  if (rc) return ruda_py_fail(rc);
  Py_RETURN_NONE;
}

static PyObject *mod_range_pop(PyObject *m, PyObject *unused) {
  ruda_range_pop();
  Py_RETURN_NONE;
}

/* The codes of the C table, for ruda._errors to build its classes. */
static PyObject *mod_codes(PyObject *m, PyObject *unused) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
#define RUDA_PY_CODE(name, value, text)                                 \
  do {                                                                  \
    PyObject *v = Py_BuildValue("(is)", (value), text);                 \
    if (!v || PyDict_SetItemString(d, #name, v) < 0) {                  \
      Py_XDECREF(v);                                                    \
      Py_DECREF(d);                                                     \
      return NULL;                                                      \
    }                                                                   \
    Py_DECREF(v);                                                       \
  } while (0);
  RUDA_ERRNO_MAP(RUDA_PY_CODE)
#undef RUDA_PY_CODE
  return d;
}

static PyMethodDef mod_methods[] = {
    {"_set_helpers", mod_set_helpers, METH_VARARGS, NULL},
    {"_codes", mod_codes, METH_NOARGS, "the C error table: name -> (code, text)"},
    {"version", mod_version, METH_NOARGS, "the version of libruda built in"},
    {"stream_current", mod_stream_current, METH_NOARGS, "the calling thread's stream id"},
    {"err_name", mod_err_name, METH_O, "the name of a RUDA_E* code"},
    {"strerror", mod_strerror, METH_O, "the description of a RUDA_E* code"},
    {"range_push", mod_range_push, METH_O, "opens an NVTX range on the calling thread"},
    {"range_pop", mod_range_pop, METH_NOARGS, "closes the calling thread's innermost range"},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_ruda", "ruda's C API, from Python", -1,
                                       mod_methods};

PyMODINIT_FUNC PyInit__ruda(void) {
  PyTypeObject *types[] = {&DeviceType, &BufferType, &ArgType,    &FutureType, &KernelType,
                           &LaunchType, &GraphType,  &StagingType, &CommType,  &StreamType};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (PyType_Ready(types[i]) < 0) return NULL;
  PyObject *m = PyModule_Create(&moduledef);
  if (!m) return NULL;
  const char *names[] = {"Device", "Buffer", "Arg", "Future", "Kernel", "Launch", "Graph", "Staging", "Comm",
                         "Stream"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0) goto fail;
  }
  if (PyModule_AddObject(m, "CURRENT", PyLong_FromUnsignedLongLong(RUDA_STREAM_CURRENT)) < 0) goto fail;
  if (PyModule_AddIntConstant(m, "ARG_INOUT", RUDA_ARG_BUFFER) < 0 ||
      PyModule_AddIntConstant(m, "ARG_IN", RUDA_ARG_BUFFER_IN) < 0 ||
      PyModule_AddIntConstant(m, "ARG_OUT", RUDA_ARG_BUFFER_OUT) < 0 ||
      PyModule_AddIntConstant(m, "LAUNCH_DRY_RUN", RUDA_LAUNCH_DRY_RUN) < 0 ||
      PyModule_AddIntConstant(m, "LAUNCH_INDIRECT", RUDA_LAUNCH_INDIRECT) < 0 ||
      PyModule_AddIntConstant(m, "MAX_ARGS", RUDA_MAX_ARGS) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}

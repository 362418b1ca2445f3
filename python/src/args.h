/* python/src/args.h - argument parsing for METH_FASTCALL | METH_KEYWORDS
 * methods, cheaper than PyArg_ParseTupleAndKeywords on the hot paths. */
#ifndef RUDA_PY_ARGS_H
#define RUDA_PY_ARGS_H

#include "module.h"

#include <string.h>

/* Fills out[0..n) from positional args, then keywords named names[i];
 * absent ones stay NULL (borrowed references). The first `required` must
 * be given. 0, or -1 with TypeError set. */
static inline int ruda_py_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               const char *const *names, int n, int required, PyObject **out) {
  if (nargs > n) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
    return -1;
  }
  for (int i = 0; i < n; i++) out[i] = i < nargs ? args[i] : NULL;
  if (kwnames) {
    Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nk; k++) {
      PyObject *key = PyTuple_GET_ITEM(kwnames, k);
      int found = 0;
      for (int i = 0; i < n; i++) {
        if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
          if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[i]);
            return -1;
          }
          out[i] = args[nargs + k];
          found = 1;
          break;
        }
      }
      if (!found) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
        return -1;
      }
    }
  }
  for (int i = 0; i < required; i++) {
    if (!out[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
      return -1;
    }
  }
  return 0;
}

/* For a method whose one argument is an optional stream (stream=None):
 * 0 with *s set, or -1 with the error set. */
static inline int ruda_py_stream_arg(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames, ruda_stream_id *s) {
  static const char *const names[] = {"stream"};
  PyObject *a[1];
  if (ruda_py_args(fname, args, nargs, kwnames, names, 1, 0, a) < 0) return -1;
  return ruda_py_stream(a[0], s);
}

/* Runs stmt with the GIL released. */
#define RUDA_PY_NOGIL(stmt) \
  do {                      \
    Py_BEGIN_ALLOW_THREADS  \
    stmt;                   \
    Py_END_ALLOW_THREADS    \
  } while (0)

#endif /* RUDA_PY_ARGS_H */

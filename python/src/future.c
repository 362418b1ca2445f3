/* python/src/future.c - ruda.Future: wait() with the GIL released,
 * done(), and await (the Python side's helper waits on a thread, so the
 * event loop never blocks).
 *
 * A device keeps its live futures in a list; closing it waits each one
 * first (the C API requires that futures are done before their device
 * closes), and a later wait() returns the stored result. */
#include "args.h"
#include "module.h"

#include <stdatomic.h>

PyObject *ruda_py_future_new(DeviceObject *d, ruda_future *fut, PyObject *result, Py_buffer *view) {
  FutureObject *f = (FutureObject *)FutureType.tp_alloc(&FutureType, 0);
  if (!f) {
    ruda_future_free(fut);
    if (view) PyBuffer_Release(view);
    return NULL;
  }
  pthread_mutex_init(&f->lock, NULL);
  f->device = (DeviceObject *)Py_NewRef(d);
  f->fut = fut;
  f->result = Py_NewRef(result);
  if (view) {
    f->view = *view; /* taken with PyBUF_SIMPLE: the struct holds no pointers into itself */
    f->has_view = 1;
  }
  pthread_mutex_lock(&d->lock);
  f->next = d->futures;
  if (d->futures) d->futures->prev = f;
  d->futures = f;
  pthread_mutex_unlock(&d->lock);
  return (PyObject *)f;
}

static void unlink_future(FutureObject *f) {
  DeviceObject *d = f->device;
  pthread_mutex_lock(&d->lock);
  if (f->prev) f->prev->next = f->next;
  else if (d->futures == f) d->futures = f->next;
  if (f->next) f->next->prev = f->prev;
  f->prev = f->next = NULL;
  pthread_mutex_unlock(&d->lock);
}

/* Waits the ruda future once; called without the GIL. */
static void finish_nogil(FutureObject *f) {
  pthread_mutex_lock(&f->lock);
  if (f->fut) {
    f->code = ruda_future_wait(f->fut, &f->err);
    ruda_future_free(f->fut);
    f->fut = NULL;
    atomic_store_explicit(&f->done, 1, memory_order_release);
  }
  pthread_mutex_unlock(&f->lock);
}

/* With the GIL: the destination is no longer the future's. */
static void drop_view(FutureObject *f) {
  pthread_mutex_lock(&f->lock);
  int had = f->has_view;
  f->has_view = 0;
  pthread_mutex_unlock(&f->lock);
  if (had) PyBuffer_Release(&f->view);
}

void ruda_py_futures_finish(DeviceObject *d) {
  PyObject *held = PyList_New(0);
  pthread_mutex_lock(&d->lock);
  for (FutureObject *f = d->futures; f; f = f->next)
    if (!held || PyList_Append(held, (PyObject *)f) < 0) {
      /* Without memory for the list, wait them in place below. */
      Py_CLEAR(held);
    }
  pthread_mutex_unlock(&d->lock);
  if (!held) {
    PyErr_Clear();
    for (;;) {
      pthread_mutex_lock(&d->lock);
      FutureObject *f = d->futures;
      if (f) Py_INCREF(f);
      pthread_mutex_unlock(&d->lock);
      if (!f) break;
      RUDA_PY_NOGIL(finish_nogil(f));
      unlink_future(f);
      drop_view(f);
      Py_DECREF(f);
    }
    return;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(held); i++) {
    FutureObject *f = (FutureObject *)PyList_GET_ITEM(held, i);
    RUDA_PY_NOGIL(finish_nogil(f));
    unlink_future(f);
    drop_view(f);
  }
  Py_DECREF(held);
}

static PyObject *future_wait(FutureObject *self, PyObject *unused) {
  if (!atomic_load(&self->done) && ruda_py_refuse_wait("Future.wait") < 0) return NULL;
  RUDA_PY_NOGIL(finish_nogil(self));
  unlink_future(self);
  drop_view(self);
  if (self->code) {
    ruda_py_raise(self->code, self->err);
    return NULL;
  }
  return Py_NewRef(self->result);
}

static PyObject *future_done(FutureObject *self, PyObject *unused) {
  if (atomic_load_explicit(&self->done, memory_order_acquire)) Py_RETURN_TRUE;
  /* A thread inside wait() holds the lock until completion: never block
     here with the GIL held (a worker may need it for a Python kernel). */
  if (pthread_mutex_trylock(&self->lock) != 0) Py_RETURN_FALSE;
  int done = self->done || (self->fut && ruda_future_poll(self->fut) == 1);
  pthread_mutex_unlock(&self->lock);
  return PyBool_FromLong(done);
}

static PyObject *future_await(FutureObject *self) {
  if (!ruda_py_await_helper) {
    PyErr_SetString(PyExc_RuntimeError, "ruda's asyncio helper is not installed");
    return NULL;
  }
  PyObject *coro = PyObject_CallOneArg(ruda_py_await_helper, (PyObject *)self);
  if (!coro) return NULL;
  PyObject *it = PyObject_CallMethod(coro, "__await__", NULL);
  Py_DECREF(coro);
  return it;
}

static void future_dealloc(FutureObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->device) {
    unlink_future(self);
    /* Not waited: detached (its work still runs; a read's destination is
       then never written). */
    if (self->fut) ruda_future_free(self->fut);
    self->fut = NULL;
    drop_view(self);
  }
  ruda_error_free(self->err);
  Py_CLEAR(self->result);
  Py_CLEAR(self->device);
  pthread_mutex_destroy(&self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int future_traverse(FutureObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->device);
  Py_VISIT(self->result);
  return 0;
}

static PyMethodDef future_methods[] = {
    {"wait", (PyCFunction)future_wait, METH_NOARGS,
     "wait(): blocks (GIL released) until done; returns the result or raises the stream's errors"},
    {"done", (PyCFunction)future_done, METH_NOARGS, "done() -> True once complete; never blocks"},
    {NULL}};

static PyAsyncMethods future_async = {.am_await = (unaryfunc)future_await};

PyTypeObject FutureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ruda._ruda.Future",
    .tp_basicsize = sizeof(FutureObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "the completion of a read, a sync or a graph replay; wait() or await it",
    .tp_dealloc = (destructor)future_dealloc,
    .tp_traverse = (traverseproc)future_traverse,
    .tp_methods = future_methods,
    .tp_as_async = &future_async,
};

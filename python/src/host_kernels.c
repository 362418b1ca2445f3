/* python/src/host_kernels.c - Python callables as host-backend kernels.
 *
 * A host kernel is a plain C function pointer with no user data, so each
 * callable gets one of a fixed set of trampolines; the trampoline's slot
 * says which callable to run. Workers take the GIL for each call
 * (PyGILState_Ensure), so every call that can wait for a worker releases
 * it. For tests and small glue: a call per thread of every block. */
#include "module.h"


#define SLOTS 64

static PyObject *slot_fn[SLOTS];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slots_used;

/* Set while this thread runs a Python kernel (nesting: a kernel that
 * launches in place runs the next one inside it). */
static _Thread_local int in_kernel;

int ruda_py_in_host_kernel(void) { return in_kernel != 0; }

int ruda_py_refuse_wait(const char *what) {
  if (!in_kernel) return 0;
  PyErr_Format(PyExc_RuntimeError,
               "%s waits for ruda's workers, and this thread runs a Python host kernel: its own worker would "
               "wait for itself for ever. Wait after the launch, outside the kernel",
               what);
  return -1;
}

static PyObject *dim_tuple(ruda_dim3 d) { return Py_BuildValue("(III)", d.x, d.y, d.z); }

static int call_slot(int slot, const ruda_host_ctx *ctx, void *const *args) {
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return RUDA_ECLOSED;
#else
  if (_Py_IsFinalizing()) return RUDA_ECLOSED;
#endif
  PyGILState_STATE st = PyGILState_Ensure();
  int rc = RUDA_EGENERIC;
  PyObject *fn = slot_fn[slot]; /* stable while a device holds the slot */
  PyObject *c = Py_BuildValue("(NNNN)", dim_tuple(ctx->grid_dim), dim_tuple(ctx->block_dim),
                              dim_tuple(ctx->block_idx), dim_tuple(ctx->thread_idx));
  PyObject *a = PyTuple_New(ctx->nargs);
  for (uint32_t i = 0; a && i < ctx->nargs; i++) {
    PyObject *p = PyLong_FromVoidPtr(args[i]);
    if (!p) {
      Py_CLEAR(a);
      break;
    }
    PyTuple_SET_ITEM(a, i, p);
  }
  in_kernel++;
  PyObject *r = c && a && fn ? PyObject_CallFunctionObjArgs(fn, c, a, NULL) : NULL;
  in_kernel--;
  if (r) {
    if (r == Py_None) rc = 0;
    else {
      long v = PyLong_AsLong(r);
      rc = (v == -1 && PyErr_Occurred()) ? RUDA_EGENERIC : (int)v;
    }
  }
  if (PyErr_Occurred()) PyErr_WriteUnraisable(fn); /* the launch fails with RUDA_EGENERIC */
  Py_XDECREF(r);
  Py_XDECREF(c);
  Py_XDECREF(a);
  PyGILState_Release(st);
  return rc;
}

#define T(n) \
  static int tramp_##n(const ruda_host_ctx *c, void *const *a) { return call_slot(n, c, a); }
#define T8(n) T(n##0) T(n##1) T(n##2) T(n##3) T(n##4) T(n##5) T(n##6) T(n##7)
T8(0) T8(1) T8(2) T8(3) T8(4) T8(5) T8(6) T8(7)
#undef T
#define T(n) tramp_##n,
static const ruda_host_kernel_fn tramps[SLOTS] = {T8(0) T8(1) T8(2) T8(3) T8(4) T8(5) T8(6) T8(7)};

PyObject *ruda_py_host_kernel_callable(DeviceObject *d, const char *name, PyObject *fn,
                                       const ruda_host_param *params, uint32_t n) {
  pthread_mutex_lock(&slot_lock);
  int slot = -1;
  for (int i = 0; i < SLOTS; i++)
    if (!(slots_used & (1ull << i))) {
      slot = i;
      break;
    }
  if (slot >= 0) {
    slots_used |= 1ull << slot;
    Py_INCREF(fn);
    slot_fn[slot] = fn;
  }
  pthread_mutex_unlock(&slot_lock);
  if (slot < 0) return PyErr_Format(PyExc_RuntimeError, "at most %d Python host kernels at once", SLOTS);
  ruda_device *dev = dev_enter(d);
  int rc = 0;
  if (dev) {
    rc = params ? ruda_host_kernel_register_typed(dev, name, tramps[slot], params, n)
                : ruda_host_kernel_register(dev, name, tramps[slot]);
    if (!rc) {
      pthread_mutex_lock(&d->lock);
      d->py_slots |= 1ull << slot;
      pthread_mutex_unlock(&d->lock);
    }
    dev_leave(d);
  }
  if (!dev || rc) {
    pthread_mutex_lock(&slot_lock);
    slots_used &= ~(1ull << slot);
    PyObject *old = slot_fn[slot];
    slot_fn[slot] = NULL;
    pthread_mutex_unlock(&slot_lock);
    Py_DECREF(old);
    if (rc) ruda_py_raise_last(rc);
    return NULL;
  }
  Py_RETURN_NONE;
}

void ruda_py_host_kernels_release(DeviceObject *d) {
  /* The device is closed: its workers are gone, no trampoline runs. */
  pthread_mutex_lock(&d->lock);
  uint64_t mine = d->py_slots;
  d->py_slots = 0;
  pthread_mutex_unlock(&d->lock);
  PyObject *drop[SLOTS];
  int ndrop = 0;
  pthread_mutex_lock(&slot_lock);
  for (int i = 0; i < SLOTS; i++)
    if (mine & (1ull << i)) {
      drop[ndrop++] = slot_fn[i];
      slot_fn[i] = NULL;
      slots_used &= ~(1ull << i);
    }
  pthread_mutex_unlock(&slot_lock);
  for (int i = 0; i < ndrop; i++) Py_XDECREF(drop[i]);
}

/* python/src/module.h - what the files of the _ruda extension share.
 *
 * The extension is thin over the C API: each object wraps one ruda handle
 * and each method one ruda call. The extension's own state (a device's
 * open/closed flag, its list of live futures) is guarded by atomics and
 * mutexes, never by the GIL, so that a free-threaded build needs no
 * change of design. */
#ifndef RUDA_PY_MODULE_H
#define RUDA_PY_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ruda/ruda.h>

/* Device(launch_gil=...): "auto" (the default) keeps the GIL around a
 * launch that finds room in its queue and hands it over only to wait for
 * room; "release" always hands it over; "keep" never does (with
 * backpressure="error" only, so a launch never waits). */
enum { RUDA_PY_GIL_RELEASE = 0, RUDA_PY_GIL_KEEP = 1, RUDA_PY_GIL_AUTO = 2 };

typedef struct FutureObject FutureObject;

#define RUDA_PY_MAX_CAPTURES 64

/* A ruda.Device. Calls take a use (dev_enter) for as long as they hold
 * the ruda_device pointer, so close() can wait for them: the C API makes
 * any call after ruda_device_close returned undefined. */
typedef struct {
  PyObject_HEAD
  ruda_device *dev;
  atomic_long users;
  atomic_int closed;
  int ordinal;                /* the GPU ordinal asked for (DLPack device id) */
  int is_cuda;
  int keep_gil;               /* RUDA_PY_GIL_*: how a launch treats the GIL (launch.c, do_launch) */
  pthread_mutex_t lock;       /* guards futures, py_slots, capturing */
  FutureObject *futures;      /* live ruda futures, waited at close */
  uint64_t py_slots;          /* Python-callable kernel slots this device holds */
  ruda_stream_id capturing[RUDA_PY_MAX_CAPTURES]; /* streams capturing a graph */
  int ncapturing;
  int capture_reserved;       /* begin_capture calls between their check and append */
  atomic_long exports;        /* live memoryviews and DLPack tensors of its memory */
} DeviceObject;

/* device_close_now's answer while exports live (close refuses). */
#define RUDA_PY_EXPORTED 1

/* A ruda.Stream: an id and the device it was named for (or None). */
typedef struct {
  PyObject_HEAD
  ruda_stream_id id;
  PyObject *device;
} StreamObject;

/* A ruda.Buffer: a binding of a buffer the object owns (base == NULL) or
 * a view of one (base keeps the owner alive; only the owner frees). */
typedef struct {
  PyObject_HEAD
  DeviceObject *device;
  PyObject *base;
  ruda_binding b;             /* b.size is the real size, never 0 */
  uint8_t dl_code, dl_bits;   /* DLPack dtype */
  int ndim;
  int64_t shape[RUDA_MAX_RANK];
  int freed;
  atomic_long exports;        /* the owner's: DLPack tensors of it or its views */
} BufferObject;

/* ruda.in_(buf) / ruda.out(buf): a binding with an access mode. */
typedef struct {
  PyObject_HEAD
  BufferObject *buf;
  ruda_arg_kind kind;
} ArgObject;

struct FutureObject {
  PyObject_HEAD
  DeviceObject *device;
  ruda_future *fut;           /* NULL once waited and freed */
  pthread_mutex_t lock;       /* one waiter at a time, as the C API asks */
  atomic_int done;
  int code;
  ruda_error *err;            /* owned until raised */
  PyObject *result;           /* what wait() returns */
  Py_buffer view;             /* a read's destination, held until done */
  int has_view;
  FutureObject *prev, *next;  /* device->futures, under device->lock */
};

extern PyTypeObject DeviceType, BufferType, ArgType, FutureType, KernelType, LaunchType, GraphType,
    StagingType, CommType, StreamType;

/* ruda._errors._from_c, set at import. */
extern PyObject *ruda_py_error_factory;
extern PyObject *ruda_py_await_helper;

/* Sets the Python error from a ruda error object (NULL: code alone). */
void ruda_py_raise(int code, const ruda_error *err);
/* Raises from ruda_last_error() of this thread, for a call that returned code. */
void ruda_py_raise_last(int code);
/* Raises an owned error (as the C API hands back from waits) and frees it. */
void ruda_py_raise_owned(int code, ruda_error *err);

/* ruda_py_raise_last(code), then NULL: `if (rc) return ruda_py_fail(rc);`. */
static inline PyObject *ruda_py_fail(int code) {
  ruda_py_raise_last(code);
  return NULL;
}

/* For a wait that may hand back an error: raises err (and frees it) when
 * there is one, else the thread's last error; NULL. */
static inline PyObject *ruda_py_fail_owned(int code, ruda_error *err) {
  if (err) ruda_py_raise_owned(code, err);
  else ruda_py_raise_last(code);
  return NULL;
}

/* Takes a use of the device; NULL with ruda.ECLOSED raised once closed. */
static inline ruda_device *dev_enter(DeviceObject *d) {
  atomic_fetch_add_explicit(&d->users, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&d->closed, memory_order_seq_cst)) {
    atomic_fetch_sub_explicit(&d->users, 1, memory_order_release);
    ruda_py_raise(RUDA_ECLOSED, NULL);
    return NULL;
  }
  return d->dev;
}

/* Takes a use without raising (for deallocators); NULL once closed. */
static inline ruda_device *dev_try_enter(DeviceObject *d) {
  atomic_fetch_add_explicit(&d->users, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&d->closed, memory_order_seq_cst)) {
    atomic_fetch_sub_explicit(&d->users, 1, memory_order_release);
    return NULL;
  }
  return d->dev;
}

static inline void dev_leave(DeviceObject *d) {
  atomic_fetch_sub_explicit(&d->users, 1, memory_order_release);
}

/* An export of d's memory begins (the caller holds a use, dev_enter, so
 * a close cannot pass its check in between) or ends (any thread). */
static inline void ruda_py_export_begin(DeviceObject *d) {
  atomic_fetch_add_explicit(&d->exports, 1, memory_order_seq_cst);
}
static inline void ruda_py_export_end(DeviceObject *d) {
  atomic_fetch_sub_explicit(&d->exports, 1, memory_order_seq_cst);
}

/* True on a thread running a Python host kernel (host_kernels.c). */
int ruda_py_in_host_kernel(void);

/* For a call that waits for workers: -1 with RuntimeError raised when the
 * calling thread runs a Python host kernel (the wait could be on its own
 * worker, which would never return), else 0. */
int ruda_py_refuse_wait(const char *what);

/* None or absent: the calling thread's stream; an int id; a ruda.Stream. */
int ruda_py_stream(PyObject *o, ruda_stream_id *out);

/* A new Future for fut (owned); result is what wait() returns (a new
 * reference is taken); view, when non-NULL, is held until completion. */
PyObject *ruda_py_future_new(DeviceObject *d, ruda_future *fut, PyObject *result, Py_buffer *view);

/* Waits and frees every future still live on d (close). GIL released. */
void ruda_py_futures_finish(DeviceObject *d);

/* Registers a Python callable as a host kernel (host_kernels.c). */
PyObject *ruda_py_host_kernel_callable(DeviceObject *d, const char *name, PyObject *fn,
                                       const ruda_host_param *params, uint32_t n);
/* Gives back d's Python-kernel slots (close). */
void ruda_py_host_kernels_release(DeviceObject *d);

/* Module-level functions and methods defined in other files. */
PyObject *ruda_py_buffer_dlpack(BufferObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ruda_py_buffer_dlpack_device(BufferObject *self, PyObject *unused);
PyObject *ruda_py_buffer_cai(BufferObject *self, void *closure);
PyObject *ruda_py_device_adopt(DeviceObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif /* RUDA_PY_MODULE_H */

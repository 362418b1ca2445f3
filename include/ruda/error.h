/* ruda/error.h - error codes and the error object.
 *
 * Every ruda function that can fail returns 0 or a negative RUDA_E* code.
 * Calls that fail at the call (bad input, closed device) also leave a
 * detailed error object in thread-local storage, readable with
 * ruda_last_error() until the same thread's next failing ruda call.
 * Failures found later by a stream worker are queued on that stream and
 * handed to the caller of ruda_flush() / ruda_sync() as an owned list.
 */
#ifndef RUDA_ERROR_H
#define RUDA_ERROR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ruda/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One table makes the enum, ruda_err_name() and ruda_strerror(). Codes
 * come in groups of ten: general (and driver), kernel launch, launch
 * shape against the device's limits, execution on a stream, memory and
 * copies, profiling. */
#define RUDA_ERRNO_MAP(XX)                                                        \
  XX(EINVAL, -1, "invalid argument")                                              \
  XX(ERANGE, -2, "offset or size outside the buffer, or arithmetic overflow")     \
  XX(ENOMEM, -3, "host memory exhausted")                                         \
  XX(ECLOSED, -4, "device is closed")                                             \
  XX(ENOBACKEND, -5, "requested backend is not available")                        \
  XX(EQUEUEFULL, -6, "stream command queue is full")                              \
  XX(ETIMEDOUT, -7, "timed out")                                                  \
  XX(EAGAIN, -8, "not ready yet")                                                 \
  XX(ENODRIVER, -9, "no CUDA driver found")                                       \
  XX(ENONVRTC, -10, "NVRTC is not available")                                     \
  XX(ECUDA, -11, "CUDA driver call failed")                                       \
  XX(EFAULTED, -12, "device context is faulted")                                  \
  XX(EBUSY, -13, "still in use")                                                  \
  /* kernel launch */                                                             \
  XX(ECOMPILE, -20, "kernel compilation failed")                                  \
  XX(EKERNEL, -21, "unknown kernel name")                                         \
  XX(ELAUNCH, -22, "kernel launch failed")                                        \
  /* launch shape against the device's limits */                                  \
  XX(ESHAREDMEM, -30, "too much shared memory requested")                         \
  XX(EGRIDDIM, -31, "grid dimensions exceed the device maximum")                  \
  XX(EBLOCKDIM, -32, "block dimensions exceed the device maximum")                \
  XX(EBLOCKTHREADS, -33, "threads per block exceed the device maximum")           \
  /* execution on a stream */                                                     \
  XX(EVALIDATION, -40, "validation failed during execution")                      \
  XX(EGENERIC, -41, "execution failed")                                           \
  XX(EUNHEALTHY, -42, "stream is unhealthy: it holds unreported errors")          \
  XX(EGRAPHSTATE, -43, "graph call not allowed in the stream's capture state")    \
  XX(ECALL, -44, "a library call run on a stream failed")                         \
  /* memory and copies */                                                         \
  XX(EBUFFERTOOBIG, -50, "buffer can never fit on the device")                    \
  XX(EOUTOFMEMORY, -51, "out of device memory")                                   \
  XX(EPOOLCAPACITY, -52, "memory pool capacity exceeded")                         \
  XX(EUNSUPPORTEDSTRIDES, -53, "strides not supported for this copy")             \
  XX(ENOTFOUND, -54, "no live buffer for that handle")                            \
  XX(ESTORAGENOTFOUND, -55, "storage holds no allocation for that handle")        \
  XX(ESTORAGEMAPPING, -56, "could not back a deferred allocation")                \
  XX(EFREE, -57, "buffer already freed")                                          \
  XX(EUNSUPPORTEDIO, -58, "I/O operation not supported")                          \
  XX(EIO, -59, "unknown I/O error")                                               \
  XX(EPOOLSINUSE, -60, "memory pools are in use")                                 \
  /* profiling */                                                                 \
  XX(EPROFILE, -70, "profiling failed")                                           \
  XX(EPROFILETOKEN, -71, "profiling token not registered")

/* RUDA_OK and the RUDA_E* codes of the table above. */
typedef enum ruda_errno {
  RUDA_OK = 0,
#define RUDA__ERRNO_ENUM(name, value, text) RUDA_##name = (value),
  RUDA_ERRNO_MAP(RUDA__ERRNO_ENUM)
#undef RUDA__ERRNO_ENUM
} ruda_errno;

/* Returns a static description of code ("unknown error" for codes not in
 * the table). Thread-safe, never blocks. */
RUDA_EXTERN const char *ruda_strerror(int code);

/* Returns the code's name ("RUDA_EINVAL"), or "RUDA_UNKNOWN". Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_err_name(int code);

/* An error: code, message naming the call and the values involved, an
 * optional cause, the next error in a list, the raw backend result and the
 * backtrace of the thread that found it. */
typedef struct ruda_error ruda_error;

/* Accessors. All accept NULL (returning 0 / "" / NULL) and never block. */
/* The error's RUDA_E* code. Thread-safe while err lives, non-blocking. */
RUDA_EXTERN int ruda_error_code(const ruda_error *err);
/* The message: the call that failed and the values involved. Valid while
 * err lives. Thread-safe, non-blocking. */
RUDA_EXTERN const char *ruda_error_message(const ruda_error *err);
/* The error that caused this one, or NULL. Thread-safe while err lives, non-blocking. */
RUDA_EXTERN const ruda_error *ruda_error_cause(const ruda_error *err);
/* The next error of a list (the errors an unhealthy stream held), or NULL.
 * Thread-safe while err lives, non-blocking. */
RUDA_EXTERN const ruda_error *ruda_error_next(const ruda_error *err);
/* Raw backend result (CUresult, nvrtcResult) that produced it, or 0.
 * Thread-safe while err lives, non-blocking. */
RUDA_EXTERN long ruda_error_backend_code(const ruda_error *err);
/* The stream the error belongs to (0 for errors raised at the call).
 * Thread-safe while err lives, non-blocking. */
RUDA_EXTERN uint64_t ruda_error_stream(const ruda_error *err);
/* Return addresses of the backtrace; *count receives their number.
 * Thread-safe while err lives, non-blocking. */
RUDA_EXTERN void *const *ruda_error_backtrace(const ruda_error *err, size_t *count);
/* Writes the error, its list and its causes, with symbolized backtraces
 * when with_backtrace is non-zero. Thread-safe while err lives; blocks only writing to out. */
RUDA_EXTERN void ruda_error_print(const ruda_error *err, FILE *out, int with_backtrace);
/* Frees an owned error with its causes and its list. NULL is a no-op.
 * Not thread-safe on one error (no other call may use err beside it); non-blocking. */
RUDA_EXTERN void ruda_error_free(ruda_error *err);

/* The error left by this thread's last failing ruda call. Valid until this
 * thread's next failing call; never NULL (code 0 when nothing failed yet).
 * Not to be freed. Thread-safe (each thread has its own), non-blocking. */
RUDA_EXTERN const ruda_error *ruda_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* RUDA_ERROR_H */

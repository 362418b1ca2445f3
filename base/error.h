/* error.h - building errors inside ruda (the public side is ruda/error.h). */
#ifndef RUDA_ERROR_INTERNAL_H
#define RUDA_ERROR_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "ruda/error.h"

#define RUDA__BT_DEPTH 24
#define RUDA__MSG_MAX 512

struct ruda_error {
  int code;
  long backend_code;
  uint64_t stream;
  ruda_error *cause; /* owned */
  ruda_error *next;  /* owned: the rest of a list */
  int nframes;
  void *frames[RUDA__BT_DEPTH];
  char msg[RUDA__MSG_MAX];
};

/* Allocates an error (with the caller's backtrace). Returns NULL only when
 * host memory is exhausted; callers count such losses instead of dropping
 * them silently. */
ruda_error *ruda__error_new(int code, long backend_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ruda_error *ruda__error_vnew(int code, long backend_code, const char *fmt, va_list ap);

/* Records a failure of the current call in the thread's last-error slot
 * (no allocation) and returns code, so call sites read
 * `return ruda__fail(RUDA_EINVAL, "ruda_write: src is NULL");`. */
int ruda__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The index of the first of a struct's reserved words that is not zero,
 * -1 when all are. Callers refuse such a struct with RUDA_EINVAL naming
 * that word: a later version may give it a meaning (ruda/ruda.h, "Versions
 * and ABI"). s points at a struct with a `uint64_t reserved[N]` array.
 * Thread-safe, non-blocking. */
#define RUDA__RESERVED_SET(s) ruda__reserved_set((s)->reserved, sizeof (s)->reserved / sizeof (s)->reserved[0])
static inline int ruda__reserved_set(const uint64_t *words, size_t n) {
  uint64_t any = 0; /* one branch on the launch path, not one per word */
  for (size_t i = 0; i < n; i++) any |= words[i];
  if (__builtin_expect(any == 0, 1)) return -1;
  size_t i = 0;
  while (words[i] == 0) i++;
  return (int)i;
}

/* Like ruda__fail, with a backend result attached. */
int ruda__fail_backend(int code, long backend_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies an owned error into the thread's last-error slot (first line of
 * the message and the code), frees it and returns its code. */
int ruda__fail_with(ruda_error *err);

/* A stream id as messages name it: "stream 5" (explicit ids), "thread
 * stream #3" (a thread's own, RUDA_STREAM_CURRENT), "internal stream
 * (memory fences, worker 2)" and "internal stream (collectives)" for the
 * library's private ones. buf holds RUDA__STREAM_NAME_MAX bytes; returns
 * buf. RUDA__SNAME gives one in a temporary buffer for a message. */
#define RUDA__STREAM_NAME_MAX 64
const char *ruda__stream_name(uint64_t id, char *buf);
#define RUDA__SNAME(id) ruda__stream_name((id), (char[RUDA__STREAM_NAME_MAX]){0})

/* Keeps a copy of log as the calling thread's last compile log
 * (ruda_compile_log); NULL clears it. */
void ruda__set_compile_log(const char *log);

#endif /* RUDA_ERROR_INTERNAL_H */

/* error.c - error codes, names, the error object, the thread's last
 * error and last compile log. */

#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

const char *ruda_strerror(int code) {
  switch (code) {
    case RUDA_OK:
      return "success";
#define XX(name, value, text) \
  case RUDA_##name:           \
    return text;
      RUDA_ERRNO_MAP(XX)
#undef XX
  }
  return "unknown error";
}

const char *ruda_err_name(int code) {
  switch (code) {
    case RUDA_OK:
      return "RUDA_OK";
#define XX(name, value, text) \
  case RUDA_##name:           \
    return "RUDA_" #name;
      RUDA_ERRNO_MAP(XX)
#undef XX
  }
  return "RUDA_UNKNOWN";
}

static void fill(ruda_error *e, int code, long backend_code, const char *fmt, va_list ap) {
  e->code = code;
  e->backend_code = backend_code;
  e->stream = 0;
  e->cause = NULL;
  e->next = NULL;
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  /* Skip fill() and its caller inside error.c. */
  e->nframes = backtrace(e->frames, RUDA__BT_DEPTH);
}

ruda_error *ruda__error_vnew(int code, long backend_code, const char *fmt, va_list ap) {
  ruda_error *e = malloc(sizeof *e);
  if (e == NULL) return NULL;
  fill(e, code, backend_code, fmt, ap);
  return e;
}

ruda_error *ruda__error_new(int code, long backend_code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ruda_error *e = ruda__error_vnew(code, backend_code, fmt, ap);
  va_end(ap);
  return e;
}

/* The last-error slot. Never allocated, so recording a failure cannot fail. */
static _Thread_local ruda_error last_error;

int ruda__fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fill(&last_error, code, 0, fmt, ap);
  va_end(ap);
  return code;
}

int ruda__fail_backend(int code, long backend_code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fill(&last_error, code, backend_code, fmt, ap);
  va_end(ap);
  return code;
}

int ruda__fail_with(ruda_error *err) {
  if (err == NULL) return ruda__fail(RUDA_ENOMEM, "out of host memory while reporting an error");
  last_error = *err;
  last_error.cause = NULL;
  last_error.next = NULL;
  int code = err->code;
  ruda_error_free(err);
  return code;
}

const ruda_error *ruda_last_error(void) { return &last_error; }

int ruda_error_code(const ruda_error *e) { return e ? e->code : 0; }
const char *ruda_error_message(const ruda_error *e) { return e ? e->msg : ""; }
const ruda_error *ruda_error_cause(const ruda_error *e) { return e ? e->cause : NULL; }
const ruda_error *ruda_error_next(const ruda_error *e) { return e ? e->next : NULL; }
long ruda_error_backend_code(const ruda_error *e) { return e ? e->backend_code : 0; }
uint64_t ruda_error_stream(const ruda_error *e) { return e ? e->stream : 0; }

void *const *ruda_error_backtrace(const ruda_error *e, size_t *count) {
  if (count) *count = e ? (size_t)e->nframes : 0;
  return e ? e->frames : NULL;
}

/* An error prints as a line, its backtrace, then its causes indented one
 * level (an unhealthy stream's cause is the list of errors it held). */
static void print_tree(const ruda_error *e, FILE *out, int depth, int with_bt) {
  for (; e != NULL; e = e->next) {
    fprintf(out, "%*s%s%s: %s\n", depth * 2, "", depth ? "caused by " : "", ruda_err_name(e->code),
            e->msg);
    if (with_bt && e->nframes > 0) {
      char **syms = backtrace_symbols(e->frames, e->nframes);
      for (int i = 0; i < e->nframes; i++)
        fprintf(out, "%*s    at %s\n", depth * 2, "", syms ? syms[i] : "?");
      free(syms);
    }
    print_tree(e->cause, out, depth + 1, with_bt);
  }
}

void ruda_error_print(const ruda_error *e, FILE *out, int with_bt) {
  if (e == NULL || out == NULL) return;
  print_tree(e, out, 0, with_bt);
}

void ruda_error_free(ruda_error *e) {
  while (e != NULL) {
    ruda_error *next = e->next;
    ruda_error_free(e->cause);
    free(e);
    e = next;
  }
}

/* ---- the calling thread's last compile log ---- */

static pthread_key_t log_key;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_key_make(void) { pthread_key_create(&log_key, free); }

void ruda__set_compile_log(const char *log) {
  pthread_once(&log_once, log_key_make);
  free(pthread_getspecific(log_key));
  pthread_setspecific(log_key, log ? strdup(log) : NULL);
}

const char *ruda_compile_log(void) {
  pthread_once(&log_once, log_key_make);
  const char *s = pthread_getspecific(log_key);
  return s ? s : "";
}

/* Thread streams are 2^63 | n (scheduler/stream.c); memory's fence streams
 * UINT64_MAX - 1 - worker; collective streams sit 2^32 below those. */
const char *ruda__stream_name(uint64_t id, char *buf) {
  const uint64_t top = UINT64_C(1) << 63;
  if (id < top) snprintf(buf, RUDA__STREAM_NAME_MAX, "stream %llu", (unsigned long long)id);
  else if (id >= UINT64_MAX - (UINT64_C(1) << 20))
    snprintf(buf, RUDA__STREAM_NAME_MAX, "internal stream (memory fences, worker %llu)",
             (unsigned long long)(UINT64_MAX - 1 - id));
  else if (id >= UINT64_MAX - (UINT64_C(1) << 33))
    snprintf(buf, RUDA__STREAM_NAME_MAX, "internal stream (collectives)");
  else snprintf(buf, RUDA__STREAM_NAME_MAX, "thread stream #%llu", (unsigned long long)(id - top));
  return buf;
}

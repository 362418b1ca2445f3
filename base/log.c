/* log.c - diagnostics on stderr (base/log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

void ruda__log(ruda_log_level threshold, ruda_log_level level, const char *fmt, ...) {
  if (level > threshold || level <= RUDA_LOG_OFF) return;
  static const char *tag[] = {"", "error", "warn", "info", "debug"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ruda %s: %s\n", tag[level], line);
}

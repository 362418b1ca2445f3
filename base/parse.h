/* parse.h - whole decimal numbers from strings the library does not
 * control (environment variables). Header only; any thread, non-blocking. */
#ifndef RUDA_BASE_PARSE_H
#define RUDA_BASE_PARSE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* 0 with *out the number s holds, read as strtoull reads one (leading
 * blanks and a '+' pass), or -1 when s is empty, negative, has anything
 * after the digits, or exceeds max (or 64 bits). *out is untouched on -1. */
static inline int ruda__parse_u64(const char *s, uint64_t max, uint64_t *out) {
  const char *p = s;
  while (*p == ' ' || (*p >= '\t' && *p <= '\r')) p++;
  if (*p == '-') return -1; /* strtoull would wrap it */
  char *end;
  errno = 0;
  const unsigned long long x = strtoull(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || x > max) return -1;
  *out = x;
  return 0;
}

#endif /* RUDA_BASE_PARSE_H */

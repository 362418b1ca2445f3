/* comm_timeout.h - RUDA_COMM_TIMEOUT: how long a rank waits for its peers
 * (in one collective, a rendezvous, a communicator's creation), in ms;
 * default 60000 when unset or empty, 0 waits for ever. Anything but
 * decimal digits for at most RUDA__COMM_TIMEOUT_MAX ms (a sign, a
 * suffix, -1, a value past the range) is refused where a wait starts
 * (ruda_comm_rendezvous, the communicators' creation): a deadline
 * computed from it must not wrap. Read where it is used, so a test may
 * change it between calls. Header only. */
#ifndef RUDA_BASE_COMM_TIMEOUT_H
#define RUDA_BASE_COMM_TIMEOUT_H

#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"

#define RUDA__COMM_TIMEOUT_DEFAULT 60000u
#define RUDA__COMM_TIMEOUT_MAX 2147483647u /* ms, 24.8 days: a poll() timeout */

/* 0 with *ms the timeout, or -1 when RUDA_COMM_TIMEOUT is set to
 * something else than 0..RUDA__COMM_TIMEOUT_MAX (*ms is then the
 * default). */
static inline int ruda__comm_timeout_parse(uint64_t *ms) {
  const char *v = getenv("RUDA_COMM_TIMEOUT");
  *ms = RUDA__COMM_TIMEOUT_DEFAULT;
  if (v == NULL || *v == '\0') return 0;
  uint64_t x = 0;
  for (const char *p = v; *p != '\0'; p++) {
    if (*p < '0' || *p > '9') return -1;
    x = 10 * x + (uint64_t)(*p - '0');
    if (x > RUDA__COMM_TIMEOUT_MAX) return -1;
  }
  *ms = x;
  return 0;
}

/* The timeout, the default where RUDA_COMM_TIMEOUT is refused (the calls
 * that start a wait refuse it first). */
static inline uint64_t ruda__comm_timeout_ms(void) {
  uint64_t ms;
  (void)ruda__comm_timeout_parse(&ms);
  return ms;
}

/* 0, or RUDA_EINVAL (via ruda__fail, naming fn) for a RUDA_COMM_TIMEOUT
 * that ruda__comm_timeout_parse refuses. */
static inline int ruda__comm_timeout_check(const char *fn) {
  uint64_t ms;
  if (ruda__comm_timeout_parse(&ms) == 0) return 0;
  return ruda__fail(RUDA_EINVAL, "%s: RUDA_COMM_TIMEOUT=\"%.40s\" is not a whole number of ms from 0 (wait for ever) to %u",
                    fn, getenv("RUDA_COMM_TIMEOUT"), RUDA__COMM_TIMEOUT_MAX);
}

#endif /* RUDA_BASE_COMM_TIMEOUT_H */

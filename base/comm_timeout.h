/* comm_timeout.h - RUDA_COMM_TIMEOUT: how long a rank waits for its peers
 * (in one collective, a rendezvous, a communicator's creation), in ms;
 * default 60000, 0 waits for ever, anything unparsable the default. Read
 * where it is used, so a test may change it between calls. Header only. */
#ifndef RUDA_BASE_COMM_TIMEOUT_H
#define RUDA_BASE_COMM_TIMEOUT_H

#include <stdint.h>
#include <stdlib.h>

static inline uint64_t ruda__comm_timeout_ms(void) {
  const char *v = getenv("RUDA_COMM_TIMEOUT");
  char *end;
  if (v == NULL || *v == '\0') return 60000;
  unsigned long long ms = strtoull(v, &end, 10);
  return *end != '\0' ? 60000 : (uint64_t)ms;
}

#endif /* RUDA_BASE_COMM_TIMEOUT_H */

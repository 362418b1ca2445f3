/* env.c - RUDA_* switches from the environment (env.h has the rules). */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "base/env.h"

int ruda__env_bool(const char *name, int *on) {
  static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  for (int i = 0; i < 4; i++) {
    if (!strcasecmp(v, yes[i])) return *on = 1, 1;
    if (!strcasecmp(v, no[i])) return *on = 0, 1;
  }
  fprintf(stderr, "ruda: ignoring %s=%s (1|0|true|false|yes|no|on|off)\n", name, v);
  return -1;
}

/* env.h - reading RUDA_* switches from the environment (base/env.c).
 *
 * One parser for every on/off variable, so they all take the same words
 * and all report a malformed value the same way: the environment is not
 * the caller's code, so a bad value is ignored (the default stays) with
 * a warning on stderr rather than failing. Any thread; reads the
 * environment only, never blocks. */
#ifndef RUDA_BASE_ENV_H
#define RUDA_BASE_ENV_H

/* Variable name as a switch: 1 or 0 in *on when it is set to one of
 * 1/0, true/false, yes/no, on/off (any case); returns 1 then, 0 when it
 * is unset or empty (*on untouched), -1 when malformed (warned, *on
 * untouched). */
int ruda__env_bool(const char *name, int *on);

#endif /* RUDA_BASE_ENV_H */

/* standin_lib.h - a stand-in library for ruda_library_register (ruda/
 * call.h), shared by the fuzzer and the torture test: each worker's state
 * remembers which worker made it; a call enters and leaves it, so a
 * state handed to another worker, or held by two calls at once, is
 * counted, and so is a state destroyed twice, by another worker, or while
 * held. After close every state made must be destroyed once. */
#ifndef RUDA_TESTS_STANDIN_LIB_H
#define RUDA_TESTS_STANDIN_LIB_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "ruda/ruda.h"

typedef struct standin_state {
  uint32_t worker;
  _Atomic int inside, destroyed;
} standin_state;

static _Atomic int standin_made, standin_destroyed, standin_wrong;

static inline void standin_reset(void) {
  atomic_store(&standin_made, 0);
  atomic_store(&standin_destroyed, 0);
  atomic_store(&standin_wrong, 0);
}

static inline int standin_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)user;
  standin_state *st = calloc(1, sizeof *st);
  if (st == NULL) return 12;
  st->worker = c->worker;
  *state = st;
  atomic_fetch_add(&standin_made, 1);
  return 0;
}

static inline void standin_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)user;
  standin_state *st = state;
  if (st->worker != c->worker || atomic_load(&st->inside) != 0 || atomic_fetch_add(&st->destroyed, 1) != 0)
    atomic_fetch_add(&standin_wrong, 1);
  atomic_fetch_add(&standin_destroyed, 1);
  free(st);
}

/* A call's way in: 0, or 1 (counted) when its state is missing, another
 * worker's, or held by another call. */
static inline int standin_enter(const ruda_call_ctx *c) {
  standin_state *st = c->library;
  if (st == NULL || st->worker != c->worker || atomic_fetch_add(&st->inside, 1) != 0) {
    atomic_fetch_add(&standin_wrong, 1);
    return 1;
  }
  return 0;
}

static inline void standin_leave(const ruda_call_ctx *c) { atomic_fetch_sub(&((standin_state *)c->library)->inside, 1); }

/* Registers one; 0 and *id, or ruda's code. */
static inline int standin_register(ruda_device *dev, uint32_t *id) {
  ruda_library_desc d = {.name = "standin", .create = standin_create, .destroy = standin_destroy};
  return ruda_library_register(dev, &d, id);
}

#endif /* RUDA_TESTS_STANDIN_LIB_H */

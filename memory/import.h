/* import.h - foreign memory adopted as buffers (ruda_buffer_import).
 *
 * An import is a raw handle-table slot whose last reference does not give
 * memory back to a pool or the backend: it hands the memory back to its
 * owner through the release callback, once the work of every worker that
 * pinned it has completed on the device (memory's fences, fence.h). Until
 * then its range stays reserved, so a second import overlapping it is
 * refused. Every function may run on any thread, workers included; none
 * waits for the device. import_lock (in ruda__memory) is taken before
 * fence_lock; callbacks run with no lock held.
 */
#ifndef RUDA_MEMORY_IMPORT_H
#define RUDA_MEMORY_IMPORT_H

#include <stdint.h>

#include "ruda/ruda.h"

struct ruda__memory;

/* One import, on mem->imports from import to release. */
typedef struct ruda__import {
  struct ruda__import *next;
  uint64_t addr, size;
  ruda_release_fn release;
  void *user;
  int retired;    /* the last reference dropped: waits on wait[] */
  uint32_t nwait; /* entries of wait[] (at most the device's workers) */
  struct {
    uint32_t worker;
    uint64_t need;
  } wait[];
} ruda__import;

/* Adopts [addr, addr + size) as a new live handle: RUDA_EINVAL when it
 * overlaps a live (or not yet released) import, RUDA_ENOMEM. */
int ruda__import_add(struct ruda__memory *mem, uint64_t addr, uint64_t size, ruda_release_fn release, void *user,
                     ruda_handle *out);

/* The handle table's hook for an import's last reference (handles.h):
 * notes the fences it waits for, then polls. */
void ruda__import_retire(void *ctx, void *imp, uint64_t users);

/* Releases the retired imports whose work has completed. */
void ruda__import_poll(struct ruda__memory *mem);

/* Close, after the workers stopped: releases every import left. */
void ruda__import_destroy_all(struct ruda__memory *mem);

#endif /* RUDA_MEMORY_IMPORT_H */

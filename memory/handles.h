/* handles.h - buffer handles: slot + generation, pinned by in-flight commands.
 *
 * Each slot holds one 64-bit state word: generation (31 bits), a live bit
 * and a reference count (32 bits). The live handle owns one reference; each
 * enqueued command that uses the buffer pins one more. Freeing clears the
 * live bit (so the handle is dead for new calls at once) and drops the
 * owner's reference in stream order; whoever drops the last reference
 * returns the memory. A stale handle can never pin: its generation or live
 * bit does not match. Slots live in chunks that never move, so lookups take
 * no lock.
 */
#ifndef RUDA_HANDLES_H
#define RUDA_HANDLES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ruda/ruda.h"

#define RUDA__SLOTS_PER_CHUNK 1024u
#define RUDA__MAX_CHUNKS 4096u /* 4M live buffers */

typedef struct ruda__slot {
  _Atomic uint64_t state; /* gen:31 | live:1 | refs:32 */
  uint64_t addr;
  uint64_t size;
  uint32_t next_free;
} ruda__slot;

typedef struct ruda__handles {
  _Atomic(ruda__slot *) chunks[RUDA__MAX_CHUNKS];
  pthread_mutex_t lock; /* slot allocation only */
  uint32_t nslots;      /* slots carved so far */
  uint32_t free_head;   /* UINT32_MAX: none */
  _Atomic uint64_t live_bytes, live_count;
} ruda__handles;

struct ruda_device;

void ruda__handles_init(ruda__handles *h);
/* Frees every buffer still allocated (close). */
void ruda__handles_destroy(ruda__handles *h, struct ruda_device *dev);

/* Registers memory at addr as a new live handle. */
int ruda__handles_insert(ruda__handles *h, uint64_t addr, uint64_t size, ruda_handle *out);

/* Pins a live handle; fills its address and size. RUDA_ENOTFOUND for a
 * dead or unknown handle. Lock-free. */
int ruda__handles_pin(ruda__handles *h, ruda_handle handle, uint64_t *addr, uint64_t *size);

/* Drops one reference; the last one frees the memory and the slot. */
void ruda__handles_unpin(ruda__handles *h, struct ruda_device *dev, uint32_t slot, void *wstate);

/* Marks a live handle dead. RUDA_EFREE if already freed, RUDA_ENOTFOUND if
 * it never existed. The owner's reference stays until the caller drops it
 * with ruda__handles_unpin (in stream order). */
int ruda__handles_kill(ruda__handles *h, ruda_handle handle);

/* Reads a live handle's size without pinning. */
int ruda__handles_size(ruda__handles *h, ruda_handle handle, uint64_t *size);

#endif /* RUDA_HANDLES_H */

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
 *
 * Buffers from the pools (memory/pool.c) carry their page in `mem` and
 * their home worker; a pin from another worker sets that worker's bit in
 * `users`, which is how a free learns that other streams must pass their
 * last use before the memory is reused (record-stream semantics). Beside
 * each chunk of slots lies an array of last-use records (the worker and
 * ticket of each buffer's last use), which orders data across streams
 * (scheduler/order.h; the record's format is defined here, below). They
 * are apart from the slots, a line each, because only clients write them:
 * a slot's line is also written by the worker that unpins it, and records
 * sharing a line would make unrelated buffers' clients contend. The pools
 * hand out slots in batches (take/put) so the table's lock stays off
 * the allocation path; slots released by workers go back on a lock-free
 * stack.
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
  uint64_t addr;          /* RUDA__UNBACKED set: offset in a dry-run page */
  uint64_t size;
  uint32_t next_free;
  _Atomic uint32_t home;  /* worker of the allocating stream */
  _Atomic uint64_t users; /* other workers that pinned it: bit w % 64 */
  _Atomic(void *) mem;    /* pool page; NULL once given back, or raw */
  uint8_t raw;            /* inserted by ruda__handles_insert: mem_free it */
  void *imp;              /* an import (memory/import.h): its owner gets it back */
  /* 1 once anything may have touched the memory: a command pinned it, or
   * its address went out (ruda_binding_device_ptr). Memory never touched
   * needs no fence before another stream reuses it. */
  _Atomic uint8_t used;
  /* 1 once a graph recorded a command using it (scheduler/graph.c): a
   * free then never returns the memory at once, the graph may still run. */
  _Atomic uint8_t held;
  /* Pins taken by calls that have not queued their command yet
   * (ruda__handles_pin_use, then ruda__handles_settle once queued or
   * given up). A free must not hand the memory out again while one is
   * pending: that command would run after the reuse. Balanced, never
   * reset: a settle may land after the slot was reused, which only makes
   * one free of the new buffer take the slower path. */
  _Atomic uint32_t pending;
} ruda__slot;

typedef struct ruda__handles {
  _Atomic(ruda__slot *) chunks[RUDA__MAX_CHUNKS];
  pthread_mutex_t lock; /* slot allocation only */
  uint32_t nslots;      /* slots carved so far */
  uint32_t free_head;   /* UINT32_MAX: none */
  _Atomic uint32_t returned; /* lock-free stack of slots released by workers */
  /* Handed down by memory (ruda__memory_init; NULL in a bare table): the
   * progress table for new buffers' use records, the backend that frees
   * raw buffers, and where a pool buffer's memory goes when its last
   * reference drops (ruda__memory_retire). */
  const struct ruda__progress *progress;
  const struct ruda__backend *backend;
  void (*retire)(void *ctx, void *page, uint64_t addr, uint64_t size, uint32_t home, uint64_t users);
  /* An import's last reference (memory/import.h), with the same ctx. */
  void (*retire_import)(void *ctx, void *imp, uint64_t users);
  void *retire_ctx;
} ruda__handles;

/* A slot's use record (ruda__handles_last), RUDA__USE_WORDS words on a
 * cache line of its own, kept by the scheduler to order commands by
 * buffer (scheduler/order.h). Word 0, the last write: bits 48..63 the
 * worker + 1 (0: never used), bits 32..47 the low 16 bits of the handle's
 * generation (a record written late for a freed buffer is recognised as
 * stale), bits 0..31 the worker's ticket. */
#define RUDA__USE_WORDS 8
/* Word RUDA__USE_READERS: the workers that read the buffer since its last
 * write, bit w % 64 for worker w. A read orders after the last write only
 * and sets its bit; a write orders after the last write and every
 * reader's worker, then clears the bits. Bits are only ever too many,
 * never too few. */
#define RUDA__USE_READERS 1
/* Word RUDA__USE_LOCK: the record's issue lock (order.c): the count of
 * clients issuing reads, RUDA__USE_LOCK_WRITER while one issues a write. */
#define RUDA__USE_LOCK 2
#define RUDA__USE_LOCK_WRITER (UINT64_C(1) << 63)

static inline uint64_t ruda__use_pack(uint32_t worker, uint32_t gen, uint32_t ticket) {
  return ((uint64_t)((worker + 1) & 0xffffu) << 48) | ((uint64_t)(gen & 0xffffu) << 32) | ticket;
}

void ruda__handles_init(ruda__handles *h);
/* Frees every buffer still allocated (close). */
void ruda__handles_destroy(ruda__handles *h);

/* Registers backend memory at addr as a new live handle; the last
 * reference gives it back with ops->mem_free. */
int ruda__handles_insert(ruda__handles *h, uint64_t addr, uint64_t size, ruda_handle *out);

/* Makes a taken slot a live handle of foreign memory: no home worker
 * (every pinning worker is a user), and its last reference goes to the
 * retire_import hook. Lock-free. */
void ruda__handles_publish_import(ruda__handles *h, uint32_t slot, uint64_t addr, uint64_t size, void *imp,
                                  ruda_handle *out);

/* Takes up to n free slots for the caller's cache (carving new ones as
 * needed); returns how many. put gives n back. Both take the table lock. */
uint32_t ruda__handles_take(ruda__handles *h, uint32_t *slots, uint32_t n);
void ruda__handles_put(ruda__handles *h, const uint32_t *slots, uint32_t n);
/* Makes a taken slot a live handle of pool memory mem. Lock-free. Its
 * last use is set to the home worker's current ticket: memory reused on
 * the home stream may still be in use by commands queued there, which a
 * first use on another stream must follow. */
void ruda__handles_publish(ruda__handles *h, uint32_t slot, uint64_t addr, uint64_t size, uint32_t home,
                           void *mem, ruda_handle *out);
/* The slot behind an index known to exist. */
ruda__slot *ruda__handles_slot(ruda__handles *h, uint32_t slot);

/* Pins a live handle; fills its address and size and marks the buffer
 * used. RUDA_ENOTFOUND for a dead or unknown handle. Lock-free. */
int ruda__handles_pin(ruda__handles *h, ruda_handle handle, uint64_t *addr, uint64_t *size);
/* The same for a command of worker `worker`: a worker other than the
 * buffer's home is recorded in users before the pin takes effect, as is
 * `used`, and with hold the graph's `held`. The pin is pending until the
 * caller settles it (ruda__handles_settle). *slot and *last receive the
 * pinned slot and its last-use record. */
int ruda__handles_pin_use(ruda__handles *h, ruda_handle handle, uint32_t worker, int hold, uint64_t *addr,
                          uint64_t *size, ruda__slot **slot, _Atomic uint64_t **last);
/* The command of a ruda__handles_pin_use is queued, or given up. */
static inline void ruda__handles_settle(ruda__slot *s) {
  atomic_fetch_sub_explicit(&s->pending, 1, memory_order_release);
}

/* Counts worker as a user of a pinned slot, as a pin from it would. */
void ruda__handles_add_user(ruda__handles *h, uint32_t slot, uint32_t worker);
/* The generation of a pinned slot. */
uint32_t ruda__handles_gen(ruda__handles *h, uint32_t slot);

/* The use record of a slot known to exist (RUDA__USE_WORDS words). */
_Atomic uint64_t *ruda__handles_last(ruda__handles *h, uint32_t slot);

/* Drops one reference; the last one gives back the memory (to its pool,
 * through the retire hook, or ops->mem_free for raw memory) and the
 * slot. */
void ruda__handles_unpin(ruda__handles *h, uint32_t slot, void *wstate);

/* Drops one reference of a buffer whose memory the caller already gave
 * back; returns 1 when it was the last, the slot then being the caller's
 * (to reuse, or return with ruda__handles_put). */
int ruda__handles_drop(ruda__handles *h, uint32_t slot);

/* Marks a live handle dead; *refs (if not NULL) receives the references
 * it held then: 1 is the owner's alone, more are pins of commands (queued,
 * running, or pinned by a call that has not queued yet). RUDA_EFREE if
 * already freed, RUDA_ENOTFOUND if it never existed. The owner's reference stays until the caller drops it
 * with ruda__handles_unpin (in stream order). */
int ruda__handles_kill(ruda__handles *h, ruda_handle handle, uint32_t *refs);

/* Buffers whose slot is still held (live, or freed with uses queued) and
 * their bytes. A scan of the table, for tests and diagnostics: shared
 * counters on every allocation would make all threads contend on one
 * cache line. Exact when no thread allocates or frees meanwhile. */
uint64_t ruda__handles_live_count(ruda__handles *h);
uint64_t ruda__handles_live_bytes(ruda__handles *h);

/* Reads a live handle's size without pinning. */
int ruda__handles_size(ruda__handles *h, ruda_handle handle, uint64_t *size);

#endif /* RUDA_HANDLES_H */

/* ruda/memory.h - device memory pools, allocation modes, dry runs, reports.
 *
 * Included by ruda/ruda.h; users include that. Buffers themselves are made
 * and freed with ruda_buffer_create() / ruda_buffer_free().
 *
 * Model (docs/memory.md has the reasoning)
 *  - One arena per device holds every page taken from the backend's
 *    allocator (cuMemAlloc on a GPU, aligned malloc on the host). Each
 *    stream allocates through its own set of pools, built from a layout:
 *    an ordered list of pools, each taking requests up to its max_alloc.
 *    A request goes to the first pool whose max_alloc covers it (the
 *    "allocation-routing order").
 *  - Sliced pools cut pages into equal slots of one size class (four
 *    classes per doubling); exclusive pools give each buffer a page of its
 *    own, rounded to one of sixteen sizes per doubling.
 *  - A stream's pools hold the pages they are slicing; pages a stream no
 *    longer needs go back to the shared arena, where any stream can take
 *    them. Memory is therefore not multiplied per stream.
 *  - Frees are stream-ordered. A buffer's memory is reused at once by the
 *    stream that allocated it (its home stream); it reaches another stream
 *    only after the home stream's work has passed the free. A buffer that
 *    commands on other streams used is kept until each of those streams'
 *    work has passed its last use (record-stream semantics). Neither ever
 *    makes a client thread wait for the device.
 *
 * Every function here is thread-safe and non-blocking unless it says
 * otherwise. "The stream's pools" are created at the stream's first memory
 * call, with the layout current at that moment.
 */
#ifndef RUDA_MEMORY_H
#define RUDA_MEMORY_H

#include <stdint.h>
#include <stdio.h>

#include "ruda/export.h"
#include "ruda/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a pool cuts its pages. */
typedef enum ruda_pool_kind {
  RUDA_POOL_SLICED = 0,     /* pages cut into equal slots of one size class */
  RUDA_POOL_EXCLUSIVE = 1,  /* one buffer per page */
  RUDA_POOL_PERSISTENT = 2  /* reports only: the pool of RUDA_ALLOC_PERSISTENT */
} ruda_pool_kind;

/* One pool of a layout. */
typedef struct ruda_pool_config {
  ruda_pool_kind kind;  /* RUDA_POOL_SLICED or RUDA_POOL_EXCLUSIVE */
  uint64_t max_alloc;   /* largest request routed here; UINT64_MAX: no limit */
  uint64_t page_size;   /* sliced: largest page (small classes use smaller
                           pages, at least 8 slots each); exclusive: 0 */
  uint64_t capacity;    /* most bytes of pages the pool may hold, per
                           stream; 0: no cap */
  uint64_t reserved[2]; /* zero */
} ruda_pool_config;

#define RUDA_MEMORY_MAX_POOLS 16

/* Fills pools with the default layout (up to cap entries) and returns how
 * many pools it has: two sliced pools and an exclusive one. Thread-safe, non-blocking. */
RUDA_EXTERN uint32_t ruda_memory_default_pools(ruda_pool_config *pools, uint32_t cap);

/* Installs a layout: npools pools with strictly increasing max_alloc, each
 * sliced pool's page_size at least its max_alloc, reserved words zero. The layout becomes the
 * one every stream whose pools are created later gets, and the calling
 * stream's pools are rebuilt with it when nothing is live in them (pages
 * they held go back to the arena). Fails with RUDA_EINVAL for a bad
 * layout, RUDA_EPOOLSINUSE when the calling stream still has live buffers
 * in its pools (the layout still applies to streams created later; retry
 * after freeing them). Buffers in the persistent pool do not count. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_install_pools(struct ruda_device *dev, ruda_stream_id stream,
                                          const ruda_pool_config *pools, uint32_t npools);

/* Allocation modes, a per-stream stack: push and pop nest. */
typedef enum ruda_alloc_mode {
  RUDA_ALLOC_AUTO = 0,      /* pooled: freed memory is cached and reused */
  RUDA_ALLOC_PERSISTENT = 1 /* long-lived buffers (weights): pages of their
                               exact size, kept apart from the pools so they
                               do not fragment them */
} ruda_alloc_mode;

#define RUDA_MEMORY_MODE_DEPTH 32

/* Makes mode the stream's allocation mode until the matching pop.
 * RUDA_EINVAL for an unknown mode or past RUDA_MEMORY_MODE_DEPTH. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_mode_push(struct ruda_device *dev, ruda_stream_id stream,
                                      ruda_alloc_mode mode);
/* Restores the previous mode. RUDA_EINVAL when nothing was pushed. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_mode_pop(struct ruda_device *dev, ruda_stream_id stream);

/* Dry runs (nestable per stream). While one is open, buffers created on
 * the stream are recorded in its pools exactly as real ones, so reports
 * measure the plan, but pages the plan needs beyond those already held are
 * not taken from the backend. A buffer whose page was never backed gets
 * its memory when a command first uses it; if the device cannot provide it
 * then, that call fails with RUDA_ESTORAGEMAPPING, whose message names the
 * out-of-memory that caused it: the plan was measured against more memory
 * than there is. Freeing unbacked buffers needs no backing. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_dry_run_begin(struct ruda_device *dev, ruda_stream_id stream);
/* RUDA_EINVAL when no dry run is open on the stream. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_dry_run_end(struct ruda_device *dev, ruda_stream_id stream);

/* Memory figures of a stream's pools, or of the device (filled by
 * ruda_memory_usage / ruda_memory_device_usage). */
typedef struct ruda_memory_stats {
  uint64_t nallocs;        /* live buffers (freed ones whose memory is not
                              back in a pool yet still count) */
  uint64_t bytes_in_use;   /* their sizes as requested */
  uint64_t bytes_padding;  /* rounding to size classes in their slots */
  uint64_t bytes_reserved; /* pages held, backed or not */
  uint64_t bytes_unbacked; /* of those, dry-run pages with no memory yet */
  uint64_t peak_in_use;    /* high-water marks since the pools were built */
  uint64_t peak_reserved;
  uint64_t reserved[4];    /* zero */
} ruda_memory_stats;

/* Usage of the stream's pools. Reports also while the stream holds errors
 * (they stay queued for its flush or sync). Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_usage(struct ruda_device *dev, ruda_stream_id stream,
                                  ruda_memory_stats *out);

/* The device as a whole: every stream's pools plus the pages cached in the
 * arena, whatever the streams' health. Blocks briefly on each stream's
 * pool lock. Thread-safe; never waits for a worker or the device. */
RUDA_EXTERN int ruda_memory_device_usage(struct ruda_device *dev, ruda_memory_stats *out);

/* One pool's layout and figures (filled by ruda_memory_report). */
typedef struct ruda_pool_report {
  ruda_pool_kind kind;
  uint64_t min_alloc, max_alloc; /* requests routed here: (min, max] bytes */
  uint64_t page_size;            /* largest page; 0 for exclusive pools */
  uint64_t capacity;             /* 0: no cap */
  uint32_t nclasses;             /* size classes of a sliced pool */
  uint64_t pages;                /* pages held now */
  uint64_t nallocs, bytes_in_use, bytes_padding, bytes_reserved;
  uint64_t peak_nallocs, peak_in_use, peak_reserved; /* high-water marks */
  uint64_t reserved[4];          /* zero */
} ruda_pool_report;

/* Per-pool report of the stream's pools in allocation-routing order, then
 * the persistent pool. Writes up to cap entries, sets *npools to how many
 * there are. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_memory_report(struct ruda_device *dev, ruda_stream_id stream,
                                   ruda_pool_report *pools, uint32_t cap, uint32_t *npools);

/* Prints a table a person reads (as torch.cuda.memory_summary): the
 * device's totals, the arena, then for every stream and pool its buffers,
 * bytes in use, padding, reserved, fragmentation (share of reserved not in
 * use), peak use and the largest request it could serve without a new
 * page. Reports whatever the streams' health. RUDA_EIO when out fails.
 * Thread-safe; blocks briefly on each stream's pool lock. */
RUDA_EXTERN int ruda_memory_summary(struct ruda_device *dev, FILE *out);

/* Returns unused pages to the backend: the stream's empty and cached
 * pages, and every page cached in the arena. A page still in use by
 * device work that has not passed its free stays until a later cleanup
 * (or allocation) finds it passed; cleanup gives the stream workers a
 * moment (at most about a millisecond) to get there, never the device.
 * Thread-safe; blocks for that moment at most. */
RUDA_EXTERN int ruda_memory_cleanup(struct ruda_device *dev, ruda_stream_id stream);

/* ---- foreign memory ---- */

/* Gives adopted memory back to its owner (ruda_buffer_import): called once,
 * with the import's user, address and size, after the buffer was freed (or
 * its device closed) and every command that used it completed on the
 * device. It runs on whichever thread notices that first: a worker, a
 * thread in a ruda call on the device (an import, a free, a sync, a
 * device sync) or the thread closing it; so it must be quick, thread-safe
 * and must not call ruda functions that wait (flush, sync, future waits)
 * nor free or import on the same device. */
typedef void (*ruda_release_fn)(void *user, uint64_t addr, uint64_t bytes);

/* Adopts memory ruda did not allocate as a buffer: a device pointer of the
 * device's own context on cuda (a CUdeviceptr, e.g. a torch tensor's
 * data_ptr()), host memory on the host backend. The handle is a buffer
 * like any other: bindings, access modes, cross-stream ordering, graphs,
 * ruda_buffer_free (ordered like any free). ruda never frees the memory
 * itself: release (may be NULL) gets it back when the last use is done,
 * as ruda_release_fn says. Work its owner did on the memory before the
 * call must be complete, or ordered with ruda_buffer_wait_cuda. stream
 * names the caller's stream as in ruda_buffer_create (for its checks; an
 * import has no home stream, so each stream using it counts as a user).
 * Refused with RUDA_EINVAL, nothing adopted and release not called: bytes
 * 0, addr 0 or with the top bit set, a range that overlaps a live import
 * (or one freed but not yet released), and on cuda a pointer the driver
 * does not know, host memory, another device's or context's memory, or a
 * range that runs past the allocation it starts in (the driver's
 * cuPointerGetAttribute answers; RUDA_ENOBACKEND without it). Overlap
 * with ruda's own buffers is not checked. Thread-safe, non-blocking (it
 * may run release callbacks of earlier imports that became due). */
RUDA_EXTERN int ruda_buffer_import(struct ruda_device *dev, ruda_stream_id stream, uint64_t addr, uint64_t bytes,
                                   ruda_release_fn release, void *user, ruda_handle *out);

#ifdef __cplusplus
}
#endif
#endif /* RUDA_MEMORY_H */

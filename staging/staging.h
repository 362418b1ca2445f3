/* staging.h - page-locked host memory that stages uploads and downloads.
 *
 * A jemalloc arena whose extents are carved from page-locked chunks. The
 * chunks come from a pinned-memory provider (cuMemHostAlloc for the cuda
 * backend) handed in as two functions, so this file knows nothing of CUDA
 * and unit tests can provide plain memory. jemalloc does the size classes,
 * splitting and reuse; the extent hooks only hand out chunk space and
 * never give it back (dalloc opts out, decay is disabled), so a block's
 * memory stays pinned for the arena's life.
 *
 * ruda links a private copy of jemalloc whose entry points are renamed
 * ruda_je_* (see CMakeLists.txt and staging/jemalloc_private.h), so it never
 * becomes the application's malloc; only this arena uses it. Staging blocks
 * go through mallocx/dallocx with the arena's flags, never plain free().
 */
#ifndef RUDA_STAGING_H
#define RUDA_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "ruda/ruda.h"

typedef struct ruda__pinned_ops {
  /* Returns size bytes of page-locked memory, or NULL. Any thread. */
  void *(*alloc)(void *ctx, size_t size);
  void (*free)(void *ctx, void *p);
  void *ctx;
} ruda__pinned_ops;

typedef struct ruda__staging ruda__staging;

/* Creates an arena. chunk: bytes reserved from the provider at a time (0:
 * 64 MiB); limit: most page-locked bytes to reserve (0: no limit).
 * RUDA_ENOMEM on failure (last error set). */
int ruda__staging_create(const ruda__pinned_ops *ops, size_t chunk, uint64_t limit,
                         ruda__staging **out);

/* Destroys the arena and returns every chunk to the provider; blocks still
 * handed out become invalid. */
void ruda__staging_destroy(ruda__staging *s);

/* A block of size bytes: page-locked when the limit allows, else pageable
 * (counted as a fallback). NULL only when host memory is exhausted.
 * Thread-safe. */
void *ruda__staging_alloc(ruda__staging *s, size_t size);

/* Returns a block from ruda__staging_alloc. NULL is a no-op. Thread-safe. */
void ruda__staging_free(ruda__staging *s, void *p);

/* Blocks kept by address rather than by thread: ruda__staging_free_addr
 * keeps p where ruda__staging_alloc_after(s, size, p) looks first, so a
 * user whose blocks one thread takes and another returns (a stream's
 * writes: a client takes, a worker retires) gets its previous block back
 * while it uses one at a time, at the same address (which lets a graph
 * replay leave its upload node as it is). prev is only a key, never
 * read; NULL: the calling thread's kept blocks. Thread-safe. */
void *ruda__staging_alloc_after(ruda__staging *s, size_t size, const void *prev);
void ruda__staging_free_addr(ruda__staging *s, void *p);

/* The usable bytes of block p from ruda__staging_alloc. Thread-safe. */
size_t ruda__staging_size(const ruda__staging *s, const void *p);

/* Whether p lies in page-locked memory of this arena. Lock-free. */
int ruda__staging_pinned(const ruda__staging *s, const void *p);

void ruda__staging_usage(const ruda__staging *s, ruda_staging_stats *out);

/* Reads RUDA_STAGING_LIMIT / RUDA_STAGING_CHUNK (bytes, optional K/M/G
 * suffix); defaults: a quarter of physical memory, 64 MiB. */
void ruda__staging_env(uint64_t *limit, size_t *chunk);

/* ---- parallel copies into staging (staging/copy.c) ---- */

/* Runs fn(arg, i) for i in [0, n) on the calling thread and a small pool
 * of helper threads (RUDA_COPY_THREADS; default 5 with 16 or more cores,
 * 3 with 8, 1 with 4, else none), returning when all have run. The first
 * failure stops the pieces not yet started and is returned, its message
 * in the caller's last error. fn must be safe to run concurrently for
 * different i. Used to fill staging for large writes, so the host copy of
 * one piece overlaps the DMA of the previous ones. Thread-safe; blocks
 * until done. */
int ruda__staging_parallel(size_t n, int (*fn)(void *arg, size_t i), void *arg);

/* Number of helper threads ruda__staging_parallel uses. */
unsigned ruda__staging_helpers(void);

#endif /* RUDA_STAGING_H */

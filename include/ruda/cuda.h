/* ruda/cuda.h - device properties, launch-shape helpers, staging buffers
 * and CUDA interop. Included by ruda/ruda.h; include that instead.
 *
 * Properties, the launch-shape helpers, staging buffers and
 * ruda_binding_device_ptr work on every backend; the CUDA handles only on
 * the cuda backend (RUDA_ENOBACKEND elsewhere).
 */
#ifndef RUDA_CUDA_H
#define RUDA_CUDA_H

#include "ruda/ruda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Device properties                                                   */
/* ------------------------------------------------------------------ */

/* The hardware limits launches are validated against. The host backend
 * reports the limits it emulates (compute capability 0.0). */
typedef struct ruda_device_props {
  char name[128];
  const char *backend;         /* "cuda" or "host" */
  int cc_major, cc_minor;      /* compute capability */
  uint32_t sm_count;           /* streaming multiprocessors */
  uint32_t warp_size;          /* threads per warp */
  uint32_t max_threads_per_block;
  ruda_dim3 max_block;         /* per-dimension block limits */
  ruda_dim3 max_grid;          /* per-dimension grid limits */
  uint32_t max_shared_per_block;       /* bytes a block gets without opting in */
  uint32_t max_shared_per_block_optin; /* bytes a launch may request (ruda opts in) */
  uint64_t total_mem;          /* device memory, bytes */
  uint64_t reserved[8];        /* zero */
} ruda_device_props;

/* Fills *out. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_device_get_props(const ruda_device *dev, ruda_device_props *out);

/* A block shape for a simple (element-wise) kernel over working_units
 * threads: (warp_size, warps, 1), one warp per row, where warps is the
 * largest power of two <= min(8, working_units / warp_size), at least 1,
 * capped so the block stays within max_threads_per_block. Returns (1,1,1)
 * for a NULL device. Thread-safe, non-blocking. */
RUDA_EXTERN ruda_dim3 ruda_block_for(const ruda_device *dev, uint64_t working_units);

/* Spreads num_blocks blocks over a grid within the device's limits: while
 * x exceeds its maximum it is halved (rounding up) and y doubled, then the
 * same from y into z. *actual (may be NULL) receives x*y*z, which exceeds
 * num_blocks when rounding left idle blocks: the kernel must then
 * bounds-check its block index. RUDA_EINVAL for num_blocks 0,
 * RUDA_EGRIDDIM when even z overflows. Thread-safe. */
RUDA_EXTERN int ruda_grid_spread(const ruda_device *dev, uint32_t num_blocks, ruda_dim3 *grid,
                                 uint64_t *actual);

/* ruda_grid_spread against explicit per-dimension maxima (max), for
 * shaping a launch without a device. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_grid_spread_max(ruda_dim3 max, uint32_t num_blocks, ruda_dim3 *grid,
                                     uint64_t *actual);

/* ------------------------------------------------------------------ */
/* Staging buffers                                                     */
/* ------------------------------------------------------------------ */

/* Host memory for uploads. On the cuda backend it is page-locked memory
 * from a jemalloc arena whose extents come from cuMemHostAlloc, so the
 * DMA engine reads it directly; ruda_write() copies pageable input into
 * such blocks (large writes in pieces, copied in parallel, so the copy
 * overlaps the DMA) and returns each block once its copy completed. When
 * the page-locked total would pass the limit, blocks fall back to pageable
 * memory (slower, still correct) and are counted as fallbacks.
 *
 * Limits come from the environment: RUDA_STAGING_LIMIT (bytes of
 * page-locked memory; default a quarter of physical memory) and
 * RUDA_STAGING_CHUNK (bytes reserved from the driver at a time; 64 MiB). */

/* Allocates a staging buffer of size bytes for the caller to fill, then
 * hand to ruda_write_staged() (which takes it) or give back with
 * ruda_staging_free(). Buffers die with the device. Thread-safe; may call
 * the driver to reserve more page-locked memory.
 * Never waits for a worker or the device otherwise (non-blocking). */
RUDA_EXTERN int ruda_staging_alloc(ruda_device *dev, size_t size, void **out);

/* Returns a staging buffer not handed to ruda_write_staged(). A block a
 * queued graph replay still reads or fills (ruda/graph.h: recorded, or a
 * patch's host block) is freed once those replays ran (on cuda, once the
 * device passed them); the call returns 0 at once either way, or
 * RUDA_ENOMEM when no host memory is left to defer it (the block stays
 * the caller's). NULL is a no-op. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_staging_free(ruda_device *dev, void *p);

/* ruda_write() without the copy: staged (from ruda_staging_alloc, at
 * least len bytes) is uploaded as it is. On success ruda owns staged and
 * returns it to the arena once the device copy completed; the caller must
 * not touch it again. On failure the caller still owns it. On a stream
 * capturing a graph the upload is recorded instead and staged stays the
 * caller's (ruda/graph.h). Thread-safe, non-blocking (see ruda_write for
 * a full queue). */
RUDA_EXTERN int ruda_write_staged(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *dst,
                                  void *staged, size_t len);

/* The staging arena's figures (filled by ruda_staging_usage). */
typedef struct ruda_staging_stats {
  uint64_t pinned_bytes;   /* page-locked memory reserved from the driver */
  uint64_t in_use_bytes;   /* page-locked bytes handed out and not yet returned */
  uint64_t peak_bytes;     /* high-water mark of in_use_bytes */
  uint64_t limit_bytes;    /* cap on pinned_bytes */
  uint64_t chunk_bytes;    /* reservation granularity */
  uint64_t fallback_bytes; /* pageable bytes in use because the cap was reached */
  uint64_t fallback_count; /* pageable blocks handed out so far */
  uint64_t reserved[4];    /* zero */
} ruda_staging_stats;

/* Reports the staging arena's figures. RUDA_ENOBACKEND on the host backend
 * (its staging is plain malloc). Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_staging_usage(ruda_device *dev, ruda_staging_stats *out);

/* ------------------------------------------------------------------ */
/* Interop                                                             */
/* ------------------------------------------------------------------ */

/* Ordering rules for work issued outside ruda (cuBLAS, NCCL, raw driver
 * calls) on a ruda stream's CUDA stream:
 *  - ruda submits a stream's commands from its worker thread, later than
 *    the call that enqueued them. After ruda_flush(dev, s) returns, all
 *    work enqueued on s before the flush is on the CUDA stream, so work
 *    the caller then issues on that CUstream runs after it.
 *  - Work the caller issued on the CUstream before it enqueues a ruda
 *    command (from the same thread) runs before that command.
 *  - Several ruda stream ids share one worker thread, each on one of the
 *    worker's CUstreams (its lanes: explicit id i uses worker
 *    i % num_streams, lane i / num_streams % lanes); ids that share a
 *    lane share its CUstream (ruda_config.lanes).
 *  - Never destroy, capture into or synchronize-and-reset the stream;
 *    ruda owns it until ruda_device_close().
 *  - A device pointer from ruda_binding_device_ptr() is valid while the
 *    buffer lives: ruda_buffer_free() releases the memory once ruda's own
 *    commands using it ran, not yours; free it only after your work on it
 *    completed (e.g. after a ruda_sync on the stream you used). */

/* The CUstream (as void *) that stream's commands run on: one lane of its
 * worker, fixed while the device is open. RUDA_ENOBACKEND on the host
 * backend. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_cuda_stream(ruda_device *dev, ruda_stream_id stream, void **cu_stream);

/* The CUcontext (as void *): the device's primary context. RUDA_ENOBACKEND
 * on the host backend. Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_cuda_context(ruda_device *dev, void **cu_context);

/* Ordering with streams ruda does not own (another library's CUstream,
 * torch's or CuPy's current stream), by events on the device instead of a
 * host synchronization, for handing buffers across both ways. */

/* Makes the work enqueued on cu_stream after this call wait, on the
 * device, for every ruda command enqueued before it that uses b's buffer
 * (its writers, and its readers, so the other side may also write), on
 * any stream. Other streams' work is not waited for. The ordering is a
 * command on stream with inout access to b (ruda/call.h), which the call
 * waits to see issued by stream's worker, as ruda_flush waits, and whose
 * errors, with the stream's others, it hands back as ruda_flush does
 * (errors may be NULL); it never waits for the device. cu_stream may be
 * CU_STREAM_LEGACY or CU_STREAM_PER_THREAD. On the host backend cu_stream
 * must be NULL: on return those commands have run. Refused on a stream
 * capturing a graph (RUDA_EGRAPHSTATE). Thread-safe; blocks until that
 * worker issued what stream holds. */
RUDA_EXTERN int ruda_cuda_wait_buffer(ruda_device *dev, ruda_stream_id stream, ruda_binding b, void *cu_stream,
                                      ruda_error **errors);

/* Makes every ruda command that uses b's buffer enqueued after this call,
 * on any stream, run after the work cu_stream holds at this call: an
 * event recorded on cu_stream now, waited for on the device by a command
 * on stream with inout access to b, which later uses on other streams
 * follow as they follow any writer. A failure on the device reaches
 * stream's errors as RUDA_ECALL. RUDA_ENOBACKEND on the host backend.
 * Refused on a stream capturing a graph (RUDA_EGRAPHSTATE). Thread-safe,
 * non-blocking (see ruda_write for a full queue). */
RUDA_EXTERN int ruda_buffer_wait_cuda(ruda_device *dev, ruda_stream_id stream, ruda_binding b, void *cu_stream);

/* The device address of the binding's first byte (a host address on the
 * host backend), for work issued outside ruda. Checks that the
 * handle is live and the range inside the buffer. The buffer then counts
 * as used: once freed, its memory waits for its stream's work to pass
 * before another stream reuses it, as after a command. Thread-safe,
 * non-blocking. */
RUDA_EXTERN int ruda_binding_device_ptr(ruda_device *dev, ruda_binding b, uint64_t *addr);

/* ------------------------------------------------------------------ */
/* Tensor maps (Hopper TMA)                                            */
/* ------------------------------------------------------------------ */

/* A tensor in a buffer, described for the bulk tensor copies of the
 * Tensor Memory Accelerator (cp.async.bulk.tensor, compute capability 9.0+).
 * ruda_tensor_map_encode turns it into the CUtensorMap a kernel takes.
 * Shapes, strides and boxes are row-major like ruda_copy_desc (the last
 * dimension is the contiguous one, strides in elements, the last stride
 * 1); ruda converts them to the driver's innermost-first order. The enum
 * fields take the values of the driver's CUtensorMap* enums (0 is
 * "none"/"uint8" in each). */
/* Which driver encoder builds the map. */
typedef enum ruda_tensor_map_format {
  RUDA_TENSOR_MAP_TILED = 0, /* cuTensorMapEncodeTiled */
  RUDA_TENSOR_MAP_IM2COL = 1 /* cuTensorMapEncodeIm2col */
} ruda_tensor_map_format;

/* The tensor and how copies traverse it; designated initializers leave the
 * unused fields (and reserved) zero. */
typedef struct ruda_tensor_map_desc {
  ruda_tensor_map_format format;
  int data_type;             /* CUtensorMapDataType, e.g. 7 = float32 */
  uint32_t rank;             /* 1..5; im2col 3..5 */
  uint64_t shape[5];         /* elements per dimension */
  uint64_t strides[5];       /* elements; strides[rank-1] must be 1 */
  uint32_t box[5];           /* tiled: the box one copy moves, per dim */
  uint32_t elem_strides[5];  /* traversal strides (im2col: kernel strides); 0 means 1 */
  int lower_corner[3];       /* im2col: box corners of the rank-2 spatial dims */
  int upper_corner[3];
  uint32_t channels_per_pixel; /* im2col */
  uint32_t pixels_per_column;  /* im2col */
  int interleave, swizzle, l2_promotion, oob_fill; /* CUtensorMap* values */
  uint64_t reserved[4];      /* zero */
} ruda_tensor_map_desc;

/* An encoded map: 128 opaque bytes, aligned to 128 (as CUtensorMap),
 * passed to a kernel by value. */
#ifdef __cplusplus
#define RUDA_ALIGNAS_128 alignas(128)
#else
#define RUDA_ALIGNAS_128 _Alignas(128)
#endif
typedef struct ruda_tensor_map {
  RUDA_ALIGNAS_128 uint64_t opaque[16];
} ruda_tensor_map;
#undef RUDA_ALIGNAS_128

/* Encodes a map of the tensor d describes in binding b. The map holds the
 * buffer's device address: like a pointer from ruda_binding_device_ptr it
 * stays valid while the buffer lives, so free the buffer only after the
 * launches using the map (ruda orders them if they are on the freeing
 * stream). RUDA_ERANGE when the tensor spans past the binding, RUDA_EINVAL
 * for a descriptor the driver refuses (its CUresult in the backend code),
 * RUDA_ENOBACKEND on the host backend or a driver without tensor maps.
 * Thread-safe, non-blocking. */
RUDA_EXTERN int ruda_tensor_map_encode(ruda_device *dev, ruda_binding b, const ruda_tensor_map_desc *d,
                                       ruda_tensor_map *out);

/* A kernel argument passing m by value (a `const __grid_constant__
 * CUtensorMap` parameter). */
static inline ruda_arg ruda_arg_tensor_map(const ruda_tensor_map *m) {
  return ruda_arg_scalar(m->opaque, (uint32_t)sizeof m->opaque);
}

/* The full NVRTC log of this thread's last failed kernel compilation (the
 * error message holds only its start), or "" when none failed. Valid until
 * the thread's next compilation. Thread-safe (each thread has its own), non-blocking. */
RUDA_EXTERN const char *ruda_compile_log(void);

#ifdef __cplusplus
}
#endif
#endif /* RUDA_CUDA_H */

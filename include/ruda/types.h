/* ruda/types.h - the small types every ruda header shares: the device,
 * stream ids, buffer handles and bindings. Included by ruda/ruda.h; users
 * include that. */
#ifndef RUDA_TYPES_H
#define RUDA_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An open device (ruda_device_open). Opaque. */
typedef struct ruda_device ruda_device;
/* A one-shot completion of a read, a sync or a replay (ruda_future_wait). */
typedef struct ruda_future ruda_future;

/* A stream id. Explicit ids are chosen by the user in [0, 2^63);
 * RUDA_STREAM_CURRENT names the calling thread's own stream, whose id has
 * the top bit set. Ids map to workers by a stable rule: explicit id i uses
 * worker i % num_streams, so ids 0..num_streams-1 get a worker each. */
typedef uint64_t ruda_stream_id;
#define RUDA_STREAM_CURRENT ((ruda_stream_id)UINT64_MAX)
#define RUDA_STREAM_EXPLICIT_MAX ((ruda_stream_id)INT64_MAX)

/* A buffer handle: slot index and generation. A handle whose buffer was
 * freed is stale; every call given one fails (RUDA_ENOTFOUND, or RUDA_EFREE
 * for a second free) instead of touching memory. */
typedef struct ruda_handle {
  uint32_t slot;
  uint32_t gen;
} ruda_handle;

/* A byte range of a buffer. size 0 means "to the end of the buffer". */
typedef struct ruda_binding {
  ruda_handle handle;
  uint64_t offset;
  uint64_t size;
} ruda_binding;

#ifdef __cplusplus
}
#endif
#endif /* RUDA_TYPES_H */

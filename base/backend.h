/* backend.h - the contract every backend implements.
 *
 * A backend is a table of operations, in the manner of jemalloc's extent
 * hooks: `host` runs everything on the CPU, `cuda` drives the Driver API.
 * "Worker side" (the ops marked Worker: below, and write, read, copy,
 * launch, record) means: called by whoever holds the worker's exec word,
 * with the wstate worker_start made. That is the worker thread for each
 * batch and its progress, or a client thread running one command in place
 * (scheduler/inline.c) after exec_enter made the device current on it.
 * Never two threads at once for one wstate, but not always the same
 * thread: a backend keeps no thread-local state for a worker. worker_start
 * and worker_stop run on the worker thread itself. The other ops may run
 * on any thread. Operations that fail return a negative RUDA_E* code and,
 * on the worker side, an owned error in *err (NULL if even that
 * allocation failed; the caller then counts a lost error). Who may touch
 * which field of a worker: scheduler/scheduler.h, struct ruda__worker.
 */
#ifndef RUDA_BACKEND_H
#define RUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "ruda/cuda.h"
#include "ruda/ruda.h"

/* A validated copy layout over device memory. */
typedef struct ruda__layout {
  uint32_t rank; /* 0: contiguous bytes */
  uint32_t elem_size;
  uint64_t shape[RUDA_MAX_RANK];
  uint64_t strides[RUDA_MAX_RANK]; /* elements */
  uint64_t bytes;                  /* dense size on the host side */
  uint64_t extent;                 /* bytes spanned in the buffer */
  int contiguous;                  /* dense in the buffer too */
} ruda__layout;

/* Device limits used to validate launches before they are enqueued. */
typedef struct ruda__limits {
  char name[128];
  int cc_major, cc_minor;
  uint32_t sm_count, warp_size, max_threads_per_block;
  uint32_t max_block[3], max_grid[3];
  uint32_t max_shared, max_shared_optin;
  uint64_t total_mem;
} ruda__limits;

/* A registered kernel. Entries live until the device closes. */
typedef struct ruda__kernel {
  const char *name;
  ruda_host_kernel_fn host_fn; /* host backend */
  ruda_host_param *host_params; /* host backend: the signature, or NULL (unchecked) */
  uint32_t host_nparams;
  char *source;                /* cuda backend: CUDA C source */
  char **options;              /* NULL-terminated NVRTC options, or NULL */
  /* cuda: every name compiled with this source (a module: each is a name
   * expression, so C++ names resolve), NULL-terminated, or NULL. */
  char **module_names;
  const char *file_name;       /* cuda: the source's name in logs, or NULL */
  /* cuda: a precompiled image (cubin, PTX, fatbin) instead of a source;
   * valid during kernel_prepare only. */
  const void *image;
  size_t image_size;
  void *impl;                  /* backend's compiled form (cuda) */
} ruda__kernel;

typedef struct ruda__karg {
  uint32_t kind; /* ruda_arg_kind */
  uint32_t size; /* scalar bytes */
  uint64_t addr; /* buffer: device address of the binding's first byte */
  uint64_t len;  /* buffer: the binding's bytes (a graph patch's buffer must hold as many) */
  const unsigned char *bytes; /* scalar: points into the command */
} ruda__karg;

typedef struct ruda__launch_cmd {
  ruda__kernel *kernel;
  uint64_t stream, seq; /* the command's stream id and number, for messages */
  ruda_dim3 grid, block;
  uint32_t shared_mem, flags, nargs;
  uint64_t indirect_addr; /* RUDA_LAUNCH_INDIRECT: u32[3] on the device */
  ruda__karg *args;
} ruda__launch_cmd;

/* What a future waits for once its command was submitted: an optional
 * backend event, then an optional finishing step (e.g. copy a read out of
 * staging memory) run by the waiting thread. */
typedef struct ruda__completion {
  void *event;
  void (*finish)(void *backend_state, void *arg);  /* after the event */
  void (*discard)(void *backend_state, void *arg); /* future dropped unfinished */
  void *arg;
} ruda__completion;

/* A collective as the worker runs it (ruda/comm.h). */
typedef enum {
  RUDA__COLL_ALL_REDUCE,
  RUDA__COLL_SEND,
  RUDA__COLL_RECV,
  RUDA__COLL_REDUCE,
  RUDA__COLL_BROADCAST,
  RUDA__COLL_ALL_GATHER,
  RUDA__COLL_REDUCE_SCATTER
} ruda__coll_kind;

typedef struct ruda__coll {
  void *rank_handle; /* the backend's handle of this rank (comm_init) */
  uint32_t kind, rank, peer; /* peer: the root of reduce and broadcast */
  uint32_t dtype, op; /* ruda_dtype, ruda_reduce_op */
  uint64_t src, dst;  /* device addresses (host pointers on the host backend) */
  /* Elements, or bytes for send and recv. All-gather: each rank's part
   * (dst holds nranks of them); reduce-scatter: each rank's result (src
   * holds nranks of them). */
  uint64_t count;
  uint64_t dst_bytes; /* room at dst */
  uint32_t nranks;
} ruda__coll;

/* What a collective's src holds, in elements (send, recv: bytes). */
static inline uint64_t ruda__coll_src_count(const ruda__coll *k) {
  return k->kind == RUDA__COLL_REDUCE_SCATTER ? k->count * k->nranks : k->count;
}

/* What the device hands a backend at open. The backend keeps what it
 * needs (a copy of the fields, the callbacks); cfg is valid for the call
 * only. */
typedef struct ruda__backend_env {
  const ruda_config *cfg;
  void *ctx;
  /* Any thread: a sticky fault poisons the device; err is consumed (the
   * first one is kept, later ones freed). */
  void (*fault)(void *ctx, ruda_error *err);
  /* Any thread: 1 once the device is faulted. */
  int (*faulted)(void *ctx);
} ruda__backend_env;

/* What exec_enter changed on the calling thread, for exec_leave. */
typedef struct ruda__exec_guard {
  void *prev;
  int changed;
} ruda__exec_guard;

typedef struct ruda__backend_ops {
  const char *name;
  /* Capabilities, read by the API layer instead of naming a backend.
   * host_kernels: kernels are C functions (ruda_host_kernel_register);
   * otherwise they are CUDA C or images for the device (ruda_kernel_*). */
  unsigned host_kernels : 1;
  /* auto_graphs_pay: replaying a recorded run costs less than issuing its
   * commands one by one (a driver launch per command), so cfg.auto_graphs'
   * default (-1) turns automatic graphs on. */
  unsigned auto_graphs_pay : 1;
  /* in_place_pays: a client issuing its own command returns as soon as
   * the device took it (an asynchronous driver call), so a request loop's
   * commands may run in place by default; not where running in place is
   * running the kernel (host). */
  unsigned in_place_pays : 1;
  /* hold_with_peers: a request issued in place is held for its wait point
   * (scheduler/inline.c) only while other workers issue too. One thread
   * alone gets its kernels started sooner by launching them as they come
   * than by one graph at the wait; under several threads the driver's
   * launch path is contended and one graph launch beats several (cuda).
   * Without it (host) runs are held whenever automatic graphs are on. */
  unsigned hold_with_peers : 1;
  /* Opens the backend; fills *limits. Failure: ruda__fail(). */
  int (*open)(const ruda__backend_env *env, void **state, ruda__limits *limits);
  void (*close)(void *state);
  /* On the worker thread, before its first and after its last command. */
  int (*worker_start)(void *state, uint32_t index, void **wstate);
  void (*worker_stop)(void *state, void *wstate);
  /* Device memory. Failure: ruda__fail(). Any thread. */
  int (*mem_alloc)(void *state, uint64_t size, uint64_t *addr);
  void (*mem_free)(void *state, uint64_t addr, void *wstate);
  /* Optional, any thread: is [addr, addr + size) memory of this device
   * that commands may use (ruda_buffer_import)? 0, or a failure recorded
   * with ruda__fail naming fn. NULL: any non-null address is. */
  int (*mem_check)(void *state, uint64_t addr, uint64_t size, const char *fn);
  /* Host memory that stages a write until its copy ran. Any thread.
   * prev: the same user's previous block (a stream's last write's), which
   * the backend may hand out again if it came back, or NULL. Only a key:
   * it may have been freed. */
  void *(*stage_alloc)(void *state, size_t size, const void *prev);
  void (*stage_free)(void *state, void *p);
  /* Worker side. write takes ownership of the staged bytes. */
  int (*write)(void *wstate, uint64_t dst, const ruda__layout *l, void *staged, ruda_error **err);
  int (*read)(void *wstate, void *dst, uint64_t src, const ruda__layout *l, ruda__completion *c,
              ruda_error **err);
  int (*copy)(void *wstate, uint64_t dst, uint64_t src, uint64_t size, ruda_error **err);
  /* Worker: contiguous copies between device memory and a host block that
   * stays the caller's (page-locked staging memory, stage_owns), in
   * stream order, asynchronous, with no event: what a graph records for
   * ruda_write_staged and ruda_read (graph_replay captures them). */
  int (*upload)(void *wstate, uint64_t dst, const void *src, uint64_t size, ruda_error **err);
  int (*download)(void *wstate, void *dst, uint64_t src, uint64_t size, ruda_error **err);
  /* Worker: a write's staged block whose copy was issued by upload (a
   * write replayed in an automatic graph, scheduler/auto_graph.c) goes
   * back as write's own would: once the copy ran (cuda: after a later
   * event completed; host: now). */
  void (*stage_retire)(void *wstate, void *staged, uint64_t bytes);
  /* Any thread: 1 when [p, p + size) lies in staging memory the device
   * can copy to and from asynchronously (blocks of ruda_staging_alloc). */
  int (*stage_owns)(void *state, const void *p, size_t size);
  /* Any thread: the bytes of block p from stage_alloc (at least the size
   * asked for), so a free can tell which host ranges lie in it. */
  size_t (*stage_size)(void *state, const void *p);
  int (*launch)(void *wstate, const ruda__launch_cmd *cmd, ruda_error **err);
  /* Worker, optional: a library call (ruda_call) of stream's command seq
   * is about to issue its own work on the worker's stream; fault reports,
   * which name what each worker had in flight, then name it. */
  void (*call_begin)(void *wstate, uint64_t stream, uint64_t seq);
  /* Marks "everything submitted so far" in c (event NULL: already done). */
  int (*record)(void *wstate, ruda__completion *c, ruda_error **err);
  /* Waiter side, any thread. */
  int (*event_wait)(void *state, void *event, ruda_error **err);
  int (*event_query)(void *state, void *event); /* 1 done, 0 pending */
  void (*event_release)(void *state, void *event);
  /* Registry hooks: accept a host kernel (host), compile sources (cuda). */
  int (*kernel_prepare)(void *state, ruda__kernel *k);
  void (*kernel_release)(void *state, ruda__kernel *k);
  /* Optional (NULL: nothing to do / not supported). */
  /* Worker: retires finished device work (returns write staging whose copy
   * completed). idle 0: between batches, where the backend may defer it
   * while little is held; idle 1: the worker is about to sleep, so all of
   * it is looked at now. Non-zero while some is still pending: the worker
   * then sleeps with a short timeout instead of indefinitely. */
  int (*progress)(void *wstate, int idle);
  /* Any thread: takes event (which it then releases) and runs fn(state,
   * arg) once the event completed, from the recording worker's progress()
   * (or its worker_stop, which waits for whatever is still pending). For
   * a future dropped before it was waited: the thread dropping it, often
   * a worker, must not block on the device. NULL: the caller waits for
   * the event itself. */
  void (*retire)(void *state, void *event, void (*fn)(void *state, void *arg), void *arg);
  /* Client: can a non-contiguous layout be copied? 0, or a failure
   * (RUDA_EUNSUPPORTEDSTRIDES) recorded with ruda__fail naming fn. */
  int (*layout_check)(void *state, const ruda__layout *l, const char *fn);
  /* Client: limits of the compiled kernel (registers, shared memory,
   * parameters), checked for every launch, dry runs included. */
  int (*launch_check)(void *state, const ruda__kernel *k, const ruda_launch_desc *l);
  /* Worker: makes the worker's device stream wait (asynchronously) for an
   * event another worker recorded. NULL: the backend's work is done once
   * its worker ran it (host), so a worker that saw another pass a point
   * needs nothing more; no events are recorded for ordering then. */
  int (*stream_wait)(void *wstate, void *event, ruda_error **err);
  /* Any thread: lets the calling thread run worker ops on a worker's
   * state it holds (scheduler/inline.c): the device's context made
   * current, and put back by exec_leave. 0, or a failure (the command then
   * goes to the worker). NULL: any thread can, as it is. */
  int (*exec_enter)(void *state, ruda__exec_guard *g);
  void (*exec_leave)(void *state, ruda__exec_guard *g);
  /* Native handles for interop: a worker's CUstream, the CUcontext. */
  void *(*native_stream)(void *wstate);
  void *(*native_context)(void *state);
  /* Optional (NULL: no native streams), any thread, never blocking: an
   * event recorded on a native stream (the device's context made current
   * for the call), released with event_release; and a native stream's
   * later work made to wait on the device for such an event. 0, or a
   * failure recorded with ruda__fail naming fn. */
  int (*native_record)(void *state, void *native_stream, void **event, const char *fn);
  int (*native_wait)(void *state, void *native_stream, void *event, const char *fn);
  int (*stage_usage)(void *state, ruda_staging_stats *out);
  /* Worker: replays a graph of n recorded commands. *exec is the
   * backend's own graph, NULL at the first replay: the op then starts
   * capturing on the worker's stream, calls issue(ctx, i) for i = 0..n-1,
   * which issues command i (with this replay's patches) through this
   * table's launch, copy, upload or download, and keeps what it captured
   * in *exec. Otherwise changed[0..nchanged) (sorted) lists the commands
   * whose arguments differ from what *exec holds: the op calls issue(ctx,
   * i) for each while the worker's launch and copies update command i's
   * node of *exec instead of issuing work, then launches. A failure may
   * leave *exec released and NULL (the next replay captures again), never
   * half patched. NULL op: the commands run again each replay. */
  int (*graph_replay)(void *wstate, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                      const uint32_t *changed, uint32_t nchanged, void *ctx, ruda_error **err);
  /* Any thread: frees what graph_replay kept. */
  void (*graph_release)(void *state, void *exec);
  /* Optional, on a thread of its own with a wstate of its own (from
   * worker_start): captures and instantiates what graph_replay would, the
   * same issue calls on that wstate, into *exec, launching nothing. The
   * graph is then replayed on any worker by graph_replay (scheduler/
   * builder.c: automatic graphs' templates made off the workers' path). */
  int (*graph_build)(void *wstate, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                     void *ctx, ruda_error **err);
  /* Profiling. Worker: records in c an event that keeps time (NULL op: the
   * worker's clock when it ran the command is the time). Any thread, both
   * events complete: the device time between them in ms. */
  int (*stamp)(void *wstate, ruda__completion *c, ruda_error **err);
  int (*elapsed)(void *state, void *from, void *to, double *ms);
  /* Collectives (src/comm.c). comm_init: one handle per rank for the
   * states of n devices of this backend, blocking; failure: ruda__fail(),
   * nothing left allocated. collective runs on the rank's worker, in the
   * order the rank issued them. */
  int (*comm_init)(void *const *states, uint32_t n, void **ranks);
  void (*comm_destroy)(void *state, void *rank);
  /* One rank of a communicator spanning processes (ruda_comm_init_rank):
   * its handle in *rank; transport may be NULL. Blocking. comm_id fills
   * the id ranks share (NULL op: none needed). */
  int (*comm_init_rank)(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                        const ruda_comm_transport *transport, void **handle);
  int (*comm_id)(void *state, ruda_comm_id *id);
  int (*collective)(void *wstate, void *rank, const ruda__coll *c, ruda_error **err);
  /* Any thread: a tensor map of d over device memory at addr (blen bytes
   * there). NULL: the backend has none (host). */
  int (*tensor_map)(void *state, const ruda_tensor_map_desc *d, uint64_t addr, uint64_t blen,
                    ruda_tensor_map *out);
} ruda__backend_ops;

/* A device's backend: its table and the state its open made. One per
 * device, in the scheduler's root (scheduler/sched.h); memory and the
 * handle table hold a pointer to it, so swapping `ops` (a test's fake
 * backend) swaps it for every layer. Written at open, read-only after. */
typedef struct ruda__backend {
  const ruda__backend_ops *ops;
  void *state;
} ruda__backend;

extern const ruda__backend_ops ruda__host_backend;
/* NULL when built without the CUDA toolkit headers. */
extern const ruda__backend_ops *const ruda__cuda_backend;

/* Strided copies between a dense host buffer and a strided region; shared
 * by the host backend and the CUDA fallback paths. */
void ruda__copy_to_strided(unsigned char *dst, const ruda__layout *l, const unsigned char *src);
void ruda__copy_from_strided(unsigned char *dst, const ruda__layout *l, const unsigned char *src);

#endif /* RUDA_BACKEND_H */

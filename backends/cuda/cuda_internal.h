/* cuda_internal.h - state shared by the cuda backend's files.
 *
 *   cuda_backend.c  open/close, workers and their streams, memory,
 *                   staging, the operations table
 *   cuda_event.c    the event pool and its refiller
 *   cuda_copy.c     writes, reads and device copies (1D, 2D, 3D)
 *   cuda_launch.c   launches, launch checks, indirect grids
 *   cuda_compile.c  NVRTC, the in-memory module cache, the on-disk cache
 *   cu_loader.c     the driver and NVRTC entry points
 */
#ifndef RUDA_CUDA_INTERNAL_H
#define RUDA_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backends/cuda/cu_loader.h"
#include "base/backend.h"
#include "base/error.h"
#include "base/log.h"
#include "staging/staging.h"

typedef struct ruda__cu_module ruda__cu_module;

/* A pooled event. Besides the CUevent it remembers the last launch the
 * worker submitted before recording it, so a fault found by whoever waits
 * on it can name the command that was in flight. */
typedef struct ruda__cu_event {
  CUevent ev;
  struct ruda__cu_event *next_free;
  struct ruda__cu_event *next_all;
  const char *kernel; /* registry-owned name, alive until close */
  uint64_t stream, seq;
  /* The worker that recorded it and how many writes it had retired-to-be
   * then: once this event completed, so had those writes' copies. */
  struct ruda__cu_worker *worker;
  uint64_t writes;
  uint8_t timed; /* created with timing (profiling stamps); its own free list */
  uint16_t home; /* the free lists it goes back to: b->ev_lists[home] */
  /* Holders: the recorder's future or dependency, and the pending writes
   * it covers (cuda_backend.c); the last ruda__cu_event_put pools it. */
  _Atomic uint32_t refs;
} ruda__cu_event;

#define RUDA__CU_EV_LISTS 1024u

typedef struct ruda__cu_backend {
  ruda__backend_env env; /* the device's callbacks (env.cfg is not kept) */
  /* Every running worker by index (set at worker_start, cleared at stop):
   * a fault report lists what each had in flight. */
  struct ruda__cu_worker *_Atomic workers[1024];
  ruda_log_level log_level;
  ruda__limits limits; /* as open reported them */
  CUdevice cudev;
  CUcontext ctx; /* the device's primary context, retained */
  int ordinal;
  char arch[16]; /* "sm_90" */
  uint64_t max_pitch;
  uint32_t max_shared_optin;
  ruda__staging *staging;
  /* Event pool (cuda_event.c): free lists per lane, each under its lock;
   * ev_all (every event, for close) under ev_lock, touched only when an
   * event is created; the refiller's queue of lists running low. */
  pthread_mutex_t ev_lock;
  ruda__cu_event *ev_all;
  struct ruda__cu_event_list {
    pthread_mutex_t lock;
    ruda__cu_event *free[2]; /* [1]: timed */
    uint32_t nfree[2];
    uint8_t asked; /* bit k: a refill of free[k] is queued or running */
  } ev_lists[RUDA__CU_EV_LISTS];
  pthread_mutex_t refill_lock;
  pthread_cond_t refill_cond;
  pthread_t refiller;
  int refiller_started, refill_stop;
  uint32_t refill_n, refill_want[2 * RUDA__CU_EV_LISTS]; /* list << 1 | timed */
  /* Module cache: one module per (source, options, arch, versions). */
  pthread_mutex_t mod_lock;
  pthread_cond_t mod_cond;
  ruda__cu_module *modules;
  char *cache_dir; /* NULL: no disk cache */
  int bounds_checked;
  _Atomic uint64_t compiles, disk_hits, mem_hits; /* cache figures, for tests */
} ruda__cu_backend;

/* A write's staging block, returned once the event says its copy ran. */
typedef struct ruda__cu_pending {
  ruda__cu_event *ev; /* NULL: covered by the next entry that has one */
  void *staged;
  size_t bytes;
  uint64_t n; /* the worker's write number */
} ruda__cu_pending;

/* An event whose future was dropped unwaited, and what to run after it. */
typedef struct ruda__cu_detached {
  struct ruda__cu_detached *next;
  struct ruda__cu_event *ev;
  void (*fn)(void *state, void *arg);
  void *arg;
} ruda__cu_detached;

typedef struct ruda__cu_worker {
  ruda__cu_backend *b;
  CUstream stream;
  uint32_t index;
  /* The last read's bounce block (only a key for the next one, see
   * ruda__staging_alloc_after; it may be freed): its exec holder's. */
  const void *last_read;
  /* FIFO of writes in flight; stream order means they finish in order.
   * The worker adds and polls; a thread that saw a later event of this
   * stream complete (a sync's waiter) may retire them too, so the lock. */
  pthread_mutex_t plock;
  ruda__cu_pending *pending;
  uint32_t head, count, cap;
  uint64_t writes; /* writes queued so far */
  size_t pending_bytes; /* staging the pending writes hold */
  uint32_t between; /* progress calls between batches since the last full one; worker only */
  /* Dropped futures' events (cu_retire), also under plock: each runs its
   * fn once its event completed. Apart from the writes: any thread adds
   * them, in no stream order, and ruda__cu_retire_upto's write numbers do
   * not cover them. */
  struct ruda__cu_detached *detached;
  uint32_t *indirect; /* 16 page-locked bytes for indirect grid reads */
  /* The last launch submitted, for fault reports: the kernel's name, or
   * ruda__cu_call_mark for a library call (ruda_call). */
  /* Written by the worker at each launch; read by a thread that finds the
   * device faulted, to list what every worker had in flight. */
  _Atomic(const char *) last_kernel;
  _Atomic uint64_t last_stream, last_seq;
  /* Set by ruda__cu_graph_replay while it patches a node of an executable
   * graph: launch, copy, upload and download then update that node
   * (ruda__cu_graph_set_kernel, _set_copy) instead of issuing work. */
  const struct ruda__cu_patch *patch;
  int capturing; /* ruda__cu_graph_replay or _build is capturing the stream */
} ruda__cu_worker;

typedef struct ruda__cu_patch {
  CUgraphExec exec;
  CUgraphNode node;
  const CUDA_MEMCPY3D *copy; /* a copy node's parameters as captured */
} ruda__cu_patch;

/* The cuda form of a registered kernel (ruda__kernel.impl). */
typedef struct ruda__cu_kernel {
  ruda__cu_module *module;
  CUfunction fn;
  uint32_t max_threads;     /* register-limited threads per block */
  uint32_t static_shared;   /* bytes of __shared__ the kernel declares */
  uint32_t max_dyn_shared;  /* dynamic shared memory a launch may ask for */
  int nparams;              /* -1 when the driver cannot tell */
  uint32_t param_size[RUDA_MAX_ARGS];
} ruda__cu_kernel;

/* Makes b's context current on the calling thread for the duration of a
 * call from a client thread, restoring whatever was current before (an
 * application may use other contexts on its threads). */
typedef struct ruda__cu_guard {
  CUcontext prev;
  int changed;
} ruda__cu_guard;

int ruda__cu_enter(ruda__cu_backend *b, ruda__cu_guard *g);
void ruda__cu_leave(ruda__cu_guard *g);

/* cuda_event.c: the event pool. init and fini at open and close (fini
 * stops the refiller and destroys every event). */
void ruda__cu_events_init(ruda__cu_backend *b);
void ruda__cu_events_fini(ruda__cu_backend *b);
/* Fills w's list ahead of its first takes (worker start, context
 * current); the driver's failure, if any. */
CUresult ruda__cu_events_fill(struct ruda__cu_worker *w);
/* An event from the pool, for w (its exec holder): untimed, or timed
 * (profiling stamps); _shared from any thread (few: ordering with foreign
 * streams). ruda__cu_event_put from any thread. NULL with *r set on
 * error. */
ruda__cu_event *ruda__cu_event_get(struct ruda__cu_worker *w, CUresult *r);
ruda__cu_event *ruda__cu_event_get_timed(struct ruda__cu_worker *w, CUresult *r);
ruda__cu_event *ruda__cu_event_get_shared(ruda__cu_backend *b, CUresult *r);
void ruda__cu_event_put(ruda__cu_backend *b, ruda__cu_event *e);

/* Records a pooled event on w's stream, tagged with w's last launch. */
ruda__cu_event *ruda__cu_record(ruda__cu_worker *w, CUresult *r);

/* Reports a failed driver call on a worker: builds the error, and when r
 * poisons the context marks the device faulted (naming the last launch).
 * Returns the ruda code. */
int ruda__cu_worker_fail(ruda__cu_worker *w, CUresult r, ruda_error **err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Worker: keeps a write's staging block until ev shows its copy ran. */
void ruda__cu_retire(ruda__cu_worker *w, ruda__cu_event *ev, void *staged, size_t bytes);
/* Any thread: e completed, so every write its worker queued before it did:
 * return their staging now. */
void ruda__cu_retire_upto(ruda__cu_event *e);

/* cuda_copy.c */
int ruda__cu_layout_check(void *state, const ruda__layout *l, const char *fn);
int ruda__cu_write(void *ws, uint64_t dst, const ruda__layout *l, void *staged, ruda_error **err);
int ruda__cu_read(void *ws, void *dst, uint64_t src, const ruda__layout *l, ruda__completion *c,
                  ruda_error **err);
int ruda__cu_copy(void *ws, uint64_t dst, uint64_t src, uint64_t size, ruda_error **err);
/* Graph-recorded copies to and from caller-owned staging blocks (backend.h). */
int ruda__cu_upload(void *ws, uint64_t dst, const void *src, uint64_t size, ruda_error **err);
void ruda__cu_stage_retire(void *ws, void *staged, uint64_t bytes);
int ruda__cu_download(void *ws, void *dst, uint64_t src, uint64_t size, ruda_error **err);
int ruda__cu_stage_owns(void *state, const void *p, size_t size);

/* cuda_launch.c */
int ruda__cu_launch(void *ws, const ruda__launch_cmd *cmd, ruda_error **err);
/* A library call's work goes in flight (the call_begin op). */
extern const char ruda__cu_call_mark[];
void ruda__cu_call_begin(void *ws, uint64_t stream, uint64_t seq);
int ruda__cu_launch_check(void *state, const ruda__kernel *k, const ruda_launch_desc *l);

/* cuda_graph.c: the graph_replay and graph_release ops, and the node
 * updates launch and copies make while w->patch is set. */
int ruda__cu_graph_replay(void *ws, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                          const uint32_t *changed, uint32_t nchanged, void *ctx, ruda_error **err);
void ruda__cu_graph_release(void *state, void *exec);
int ruda__cu_graph_build(void *ws, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                         void *ctx, ruda_error **err);
int ruda__cu_graph_set_kernel(ruda__cu_worker *w, CUfunction fn, ruda_dim3 g, ruda_dim3 b, uint32_t shared,
                              void **params, ruda_error **err);
int ruda__cu_graph_set_copy(ruda__cu_worker *w, uintptr_t dst, uintptr_t src, ruda_error **err);

/* cuda_comm.c: collectives through NCCL (backend ops). */
int ruda__cu_comm_init(void *const *states, uint32_t n, void **ranks);
/* cuda_tensor_map.c: the tensor_map op. */
int ruda__cu_tensor_map(void *state, const ruda_tensor_map_desc *d, uint64_t addr, uint64_t blen,
                        ruda_tensor_map *out);
void ruda__cu_comm_destroy(void *state, void *rank);
/* Ranks in several processes: NCCL's unique id and ncclCommInitRank. */
int ruda__cu_comm_id(void *state, ruda_comm_id *id);
int ruda__cu_comm_init_rank(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                            const ruda_comm_transport *transport, void **handle);
int ruda__cu_collective(void *wstate, void *rank, const ruda__coll *c, ruda_error **err);

/* cuda_compile.c */
int ruda__cu_kernel_prepare(void *state, ruda__kernel *k);
void ruda__cu_kernel_release(void *state, ruda__kernel *k);
/* Resolves the disk cache directory from the config and environment. */
char *ruda__cu_cache_dir(const ruda_config *cfg);
void ruda__cu_modules_destroy(ruda__cu_backend *b);
/* NVRTC compilations, disk-cache hits and in-memory hits of a cuda device. */
void ruda__cu_cache_stats(void *state, uint64_t *compiles, uint64_t *disk_hits, uint64_t *mem_hits);

#endif /* RUDA_CUDA_INTERNAL_H */

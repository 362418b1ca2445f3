/* cuda_launch.c - kernel launches.
 *
 * Device-wide limits are checked by api.c before a launch is enqueued;
 * launch_check adds what depends on the compiled function (register-
 * limited threads per block, shared memory left after its static
 * __shared__, its parameter list), so those fail at the call too, dry
 * runs included.
 *
 * Indirect grids: the u32[3] lives in device memory and may be written by
 * earlier work on the stream, so it can only be read once that work ran.
 * The worker reads it (never the client): it queues a 12-byte copy into a
 * page-locked word and waits for the stream to reach it. That wait stalls
 * this worker's stream - only it - until the preceding work finished; an
 * indirect launch costs one stream round trip. A zero dimension dispatches
 * nothing, as on the host backend.
 */
#include <stddef.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

int ruda__cu_launch_check(void *state, const ruda__kernel *k, const ruda_launch_desc *l) {
  (void)state;
  const ruda__cu_kernel *ck = k->impl;
  if (ck == NULL) return 0;
  uint64_t threads = (uint64_t)l->block.x * l->block.y * l->block.z;
  if (threads > ck->max_threads)
    return ruda__fail(RUDA_EBLOCKTHREADS,
                      "ruda_launch \"%s\": %llu threads per block requested, maximum is %u for this "
                      "kernel (limited by its register use)",
                      l->kernel, (unsigned long long)threads, ck->max_threads);
  if (l->shared_mem > ck->max_dyn_shared)
    return ruda__fail(RUDA_ESHAREDMEM,
                      "ruda_launch \"%s\": %u bytes of dynamic shared memory requested, maximum is %u "
                      "(device opt-in limit less the kernel's %u static bytes)",
                      l->kernel, l->shared_mem, ck->max_dyn_shared, ck->static_shared);
  if (ck->nparams >= 0) {
    if ((int)l->nargs != ck->nparams)
      return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": %u arguments given, the kernel takes %d",
                        l->kernel, l->nargs, ck->nparams);
    for (uint32_t i = 0; i < l->nargs; i++) {
      uint32_t want = ck->param_size[i];
      uint32_t have = l->args[i].kind != RUDA_ARG_SCALAR ? (uint32_t)sizeof(CUdeviceptr) : l->args[i].size;
      if (have != want)
        return ruda__fail(RUDA_EINVAL,
                          "ruda_launch \"%s\": argument %u is %s of %u bytes, the kernel's parameter "
                          "%u is %u bytes",
                          l->kernel, i, l->args[i].kind != RUDA_ARG_SCALAR ? "a buffer pointer" : "a scalar",
                          have, i, want);
    }
  }
  return 0;
}

static int read_indirect(ruda__cu_worker *w, const ruda__launch_cmd *cmd, ruda_dim3 *g, ruda_error **err) {
  CUresult r = ruda__cu.cuMemcpyDtoHAsync(w->indirect, (CUdeviceptr)cmd->indirect_addr, 12, w->stream);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuStreamSynchronize(w->stream);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "reading the indirect grid at 0x%llx",
                                (unsigned long long)cmd->indirect_addr);
  *g = (ruda_dim3){w->indirect[0], w->indirect[1], w->indirect[2]};
  return 0;
}

int ruda__cu_launch(void *ws, const ruda__launch_cmd *cmd, ruda_error **err) {
  ruda__cu_worker *w = ws;
  const ruda__cu_kernel *ck = cmd->kernel->impl;
  ruda_dim3 g = cmd->grid;
  if (cmd->flags & RUDA_LAUNCH_INDIRECT) {
    int rc = read_indirect(w, cmd, &g, err);
    if (rc != 0) return rc;
    if (g.x == 0 || g.y == 0 || g.z == 0) return 0;
    const ruda__limits *lim = &w->b->limits;
    if (g.x > lim->max_grid[0] || g.y > lim->max_grid[1] || g.z > lim->max_grid[2]) {
      *err = ruda__error_new(RUDA_EGRIDDIM, 0, "indirect grid (%u,%u,%u) exceeds maximum (%u,%u,%u)", g.x, g.y,
                             g.z, lim->max_grid[0], lim->max_grid[1], lim->max_grid[2]);
      return RUDA_EGRIDDIM;
    }
  }
  /* Buffers pass their device address by value, scalars their bytes: the
   * driver copies what each pointer points at during the call. */
  void *params[RUDA_MAX_ARGS];
  for (uint32_t i = 0; i < cmd->nargs; i++)
    params[i] = cmd->args[i].kind == RUDA_ARG_BUFFER ? (void *)&cmd->args[i].addr
                                                     : (void *)(uintptr_t)cmd->args[i].bytes;
  if (__builtin_expect(w->patch != NULL, 0)) /* a graph's node, not a launch */
    return ruda__cu_graph_set_kernel(w, ck->fn, g, cmd->block, cmd->shared_mem, params, err);
  /* Remember what went in flight, so a fault found later can name it. */
  atomic_store_explicit(&w->last_kernel, cmd->kernel->name, memory_order_relaxed);
  atomic_store_explicit(&w->last_stream, cmd->stream, memory_order_relaxed);
  atomic_store_explicit(&w->last_seq, cmd->seq, memory_order_relaxed);
  CUresult r = ruda__cu.cuLaunchKernel(ck->fn, g.x, g.y, g.z, cmd->block.x, cmd->block.y, cmd->block.z,
                                       cmd->shared_mem, w->stream, params, NULL);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "cuLaunchKernel grid (%u,%u,%u) block (%u,%u,%u) shared %u", g.x,
                                g.y, g.z, cmd->block.x, cmd->block.y, cmd->block.z, cmd->shared_mem);
  return 0;
}

/* What a library call puts on the stream has no kernel name ruda knows,
 * and the call's own name dies with its command: fault reports name it by
 * this mark, its stream and its command number. */
const char ruda__cu_call_mark[] = "ruda_call";

void ruda__cu_call_begin(void *ws, uint64_t stream, uint64_t seq) {
  ruda__cu_worker *w = ws;
  atomic_store_explicit(&w->last_kernel, ruda__cu_call_mark, memory_order_relaxed);
  atomic_store_explicit(&w->last_stream, stream, memory_order_relaxed);
  atomic_store_explicit(&w->last_seq, seq, memory_order_relaxed);
}

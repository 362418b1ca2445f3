/* cuda_graph.c - graphs on the cuda backend: the first replay captures the
 * recorded commands on the worker's stream and instantiates them once;
 * every replay then patches the nodes whose arguments changed (a replay's
 * patches, or the last replay's to put back) with the driver's
 * executable-graph updates, and launches.
 *
 * Capture is thread-local, so other workers' calls are not disturbed, and
 * allocates no device memory (the pools did that before). While capturing,
 * each command's node is read back from the capture's dependencies after
 * the command was issued: a stream capture is a chain, so the one
 * dependency left is the node just added. Patching a node goes through the
 * worker's launch and copy code (w->patch set), so the parameters are built
 * exactly as for a launch. Where the driver cannot say which node a
 * command made (no cuStreamGetCaptureInfo, or a command that made none),
 * a replay that changes arguments captures and instantiates again.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

typedef struct ruda__cu_graph {
  CUgraphExec exec;
  CUgraph graph; /* kept: node updates name the nodes of the graph instantiated */
  uint32_t n;
  int patchable; /* every command's node is known */
  CUgraphNode *nodes;
  CUDA_MEMCPY3D *copies; /* a copy node's parameters as captured */
} ruda__cu_graph;

static void graph_free(ruda__cu_graph *cg) {
  if (cg == NULL) return;
  if (cg->exec != NULL) ruda__cu.cuGraphExecDestroy(cg->exec);
  if (cg->graph != NULL) ruda__cu.cuGraphDestroy(cg->graph);
  free(cg->nodes);
  free(cg->copies);
  free(cg);
}

/* The node the capture added last, or NULL when it added none since prev. */
static CUgraphNode last_node(ruda__cu_worker *w, CUgraphNode prev) {
  if (ruda__cu.cuStreamGetCaptureInfo == NULL) return NULL;
  CUstreamCaptureStatus st;
  const CUgraphNode *deps = NULL;
  size_t ndeps = 0;
  if (ruda__cu.cuStreamGetCaptureInfo(w->stream, &st, NULL, NULL, &deps, NULL, &ndeps) != CUDA_SUCCESS ||
      st != CU_STREAM_CAPTURE_STATUS_ACTIVE || ndeps != 1 || deps[0] == prev)
    return NULL;
  return deps[0];
}

static int capture(ruda__cu_worker *w, ruda__cu_graph **out, uint32_t n,
                   int (*issue)(void *ctx, uint32_t i, ruda_error **err), void *ctx, ruda_error **err) {
  ruda__cu_graph *cg = calloc(1, sizeof *cg);
  if (cg != NULL) {
    cg->n = n;
    cg->nodes = calloc(n ? n : 1, sizeof *cg->nodes);
  }
  if (cg == NULL || cg->nodes == NULL) {
    graph_free(cg);
    *err = ruda__error_new(RUDA_ENOMEM, 0, "capturing a graph: out of host memory");
    return RUDA_ENOMEM;
  }
  CUresult r = ruda__cu.cuStreamBeginCapture(w->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != CUDA_SUCCESS) {
    graph_free(cg);
    return ruda__cu_worker_fail(w, r, err, "cuStreamBeginCapture");
  }
  int rc = 0;
  CUgraphNode prev = NULL;
  cg->patchable = ruda__cu.cuStreamGetCaptureInfo != NULL && ruda__cu.cuGraphNodeGetType != NULL &&
                  ruda__cu.cuGraphExecKernelNodeSetParams != NULL &&
                  ruda__cu.cuGraphExecMemcpyNodeSetParams != NULL && ruda__cu.cuGraphMemcpyNodeGetParams != NULL;
  w->capturing = 1;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    rc = issue(ctx, i, err);
    if (rc == 0 && cg->patchable) {
      if ((cg->nodes[i] = last_node(w, prev)) == NULL) cg->patchable = 0;
      prev = cg->nodes[i];
    }
  }
  w->capturing = 0;
  /* Ended whatever happened, or the stream stays in capture mode. */
  r = ruda__cu.cuStreamEndCapture(w->stream, &cg->graph);
  if (rc == 0 && r != CUDA_SUCCESS) rc = ruda__cu_worker_fail(w, r, err, "cuStreamEndCapture");
  if (rc == 0 && cg->patchable) {
    /* A copy node keeps its memory types; a patch changes its addresses. */
    cg->copies = calloc(n ? n : 1, sizeof *cg->copies);
    if (cg->copies == NULL) cg->patchable = 0;
    for (uint32_t i = 0; i < n && cg->patchable; i++) {
      CUgraphNodeType t;
      if (ruda__cu.cuGraphNodeGetType(cg->nodes[i], &t) != CUDA_SUCCESS) cg->patchable = 0;
      else if (t == CU_GRAPH_NODE_TYPE_MEMCPY &&
               ruda__cu.cuGraphMemcpyNodeGetParams(cg->nodes[i], &cg->copies[i]) != CUDA_SUCCESS)
        cg->patchable = 0;
    }
  }
  if (rc == 0) {
    r = ruda__cu.cuGraphInstantiateWithFlags(&cg->exec, cg->graph, 0);
    if (r != CUDA_SUCCESS) rc = ruda__cu_worker_fail(w, r, err, "cuGraphInstantiateWithFlags");
  }
  if (rc != 0) {
    graph_free(cg);
    return rc;
  }
  *out = cg;
  return 0;
}

int ruda__cu_graph_build(void *ws, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                         void *ctx, ruda_error **err) {
  ruda__cu_worker *w = ws;
  if (ruda__cu.cuStreamBeginCapture == NULL || ruda__cu.cuGraphInstantiateWithFlags == NULL) {
    *err = ruda__error_new(RUDA_ENOBACKEND, 0, "this CUDA driver (%d) has no graph API", ruda__cu.driver_version);
    return RUDA_ENOBACKEND;
  }
  if (*exec != NULL) return 0;
  ruda__cu_graph *cg = NULL;
  int rc = capture(w, &cg, n, issue, ctx, err);
  if (rc == 0) *exec = cg;
  return rc;
}

int ruda__cu_graph_replay(void *ws, void **exec, uint32_t n, int (*issue)(void *ctx, uint32_t i, ruda_error **err),
                          const uint32_t *changed, uint32_t nchanged, void *ctx, ruda_error **err) {
  ruda__cu_worker *w = ws;
  if (ruda__cu.cuGraphLaunch == NULL || ruda__cu.cuStreamBeginCapture == NULL ||
      ruda__cu.cuGraphInstantiateWithFlags == NULL) {
    *err = ruda__error_new(RUDA_ENOBACKEND, 0, "this CUDA driver (%d) has no graph API", ruda__cu.driver_version);
    return RUDA_ENOBACKEND;
  }
  ruda__cu_graph *cg = *exec;
  if (cg != NULL && nchanged > 0 && !cg->patchable) { /* nodes unknown: capture again */
    graph_free(cg);
    *exec = cg = NULL;
  }
  int rc = 0;
  if (cg == NULL) {
    if ((rc = capture(w, &cg, n, issue, ctx, err)) != 0) return rc;
    *exec = cg;
  } else {
    for (uint32_t k = 0; k < nchanged && rc == 0; k++) {
      uint32_t i = changed[k];
      ruda__cu_patch p = {cg->exec, cg->nodes[i], &cg->copies[i]};
      w->patch = &p;
      rc = issue(ctx, i, err);
      w->patch = NULL;
    }
    if (rc != 0) { /* some nodes patched, some not: start afresh next time */
      graph_free(cg);
      *exec = NULL;
      return rc;
    }
  }
  CUresult r = ruda__cu.cuGraphLaunch(cg->exec, w->stream);
  if (r != CUDA_SUCCESS) return ruda__cu_worker_fail(w, r, err, "cuGraphLaunch");
  return 0;
}

int ruda__cu_graph_set_kernel(ruda__cu_worker *w, CUfunction fn, ruda_dim3 g, ruda_dim3 b, uint32_t shared,
                              void **params, ruda_error **err) {
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = fn;
  kp.gridDimX = g.x, kp.gridDimY = g.y, kp.gridDimZ = g.z;
  kp.blockDimX = b.x, kp.blockDimY = b.y, kp.blockDimZ = b.z;
  kp.sharedMemBytes = shared;
  kp.kernelParams = params;
  CUresult r = ruda__cu.cuGraphExecKernelNodeSetParams(w->patch->exec, w->patch->node, &kp);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "cuGraphExecKernelNodeSetParams grid (%u,%u,%u)", g.x, g.y, g.z);
  return 0;
}

/* A pointer into a copy's side, by the memory type the node was captured with. */
static void set_side(CUmemorytype t, const void **host, CUdeviceptr *dev, uintptr_t p) {
  if (t == CU_MEMORYTYPE_HOST) *host = (const void *)p;
  else *dev = (CUdeviceptr)p;
}

int ruda__cu_graph_set_copy(ruda__cu_worker *w, uintptr_t dst, uintptr_t src, ruda_error **err) {
  CUDA_MEMCPY3D c = *w->patch->copy;
  const void *dst_host = c.dstHost;
  set_side(c.srcMemoryType, &c.srcHost, &c.srcDevice, src);
  set_side(c.dstMemoryType, &dst_host, &c.dstDevice, dst);
  c.dstHost = (void *)(uintptr_t)dst_host;
  CUresult r = ruda__cu.cuGraphExecMemcpyNodeSetParams(w->patch->exec, w->patch->node, &c, w->b->ctx);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "cuGraphExecMemcpyNodeSetParams 0x%llx -> 0x%llx",
                                (unsigned long long)src, (unsigned long long)dst);
  return 0;
}

/* Any thread. A graph still running finishes first: the driver frees an
 * executable graph in flight once it completed. */
void ruda__cu_graph_release(void *state, void *exec) {
  ruda__cu_guard g;
  if (ruda__cu_enter(state, &g) != 0) return;
  graph_free(exec);
  ruda__cu_leave(&g);
}

#define _GNU_SOURCE
/* bench_graph_patch.c - what a replay with new arguments costs beside a
 * new graph (issue 20, item 2).
 *
 *   bench_graph_patch [-n iterations] [-k kernels]
 *
 * The request: upload a 4 KiB staging block into x, k launches of
 * y = 0.5 x + y (default 3), download y into a staging block. Three
 * sets of buffers and blocks: A (recorded), B and C. Three phases of n
 * iterations each (medians; a few warm-up iterations dropped):
 *   run      ruda_graph_run of the graph as recorded, on A
 *   patched  ruda_graph_run_with moving every command onto B, then C, in
 *            turn (the buffers of each launch, the copies' buffers and
 *            blocks: 2k + 4 patches), as a server moves one graph onto
 *            each request's buffers
 *   new      what re-recording for B or C costs instead: begin_capture,
 *            the k + 2 calls, end_capture, ruda_graph_run (on cuda the
 *            first replay captures and instantiates), ruda_graph_destroy
 * The update's cost is patched - run; a new graph's, new - run. Every
 * result is checked (the download holds what the kernels computed). The
 * kernel is axpy, which the mock driver also runs. Host backend unless RUDA_BACKEND=cuda (then the device's).
 *
 * On cuda the driver's own floor follows, in the same process: the same
 * request as a raw CUDA graph built node by node (a copy node, k kernel
 * nodes, a copy node, on a CUstream of its own, ruda's compiled axpy),
 * moved between the same kind of sets B and C in three ways:
 *   plain    cuGraphLaunch + cuStreamSynchronize, as built
 *   setters  cuGraphExec{Kernel,Memcpy}NodeSetParams on every node, then
 *            launch + sync (what ruda does for the nodes a patch changes)
 *   update   the template's nodes set (cuGraph{Kernel,Memcpy}NodeSetParams)
 *            and cuGraphExecUpdate on the whole graph, then launch + sync
 *   captured the setters on the same request captured from a stream (as
 *            ruda makes its graphs: cuStreamBeginCapture, the driver
 *            calls, each node read back with cuStreamGetCaptureInfo)
 * with each update's own time and its cost per node. ruda's patched/plain
 * beside the driver's setters/plain says how much of the update is ruda.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ruda/ruda.h"
#ifdef RUDA_BENCH_CUDA
#include "backends/cuda/cu_loader.h"
#include "backends/cuda/cuda_internal.h"
#include "src/api.h"
#endif
#define BENCH_NAME "bench_graph_patch"
#include "bench/bench_check.h"
#include "bench/bench_clock.h"

enum { NF = 1024, BYTES = NF * 4, MAXK = 16 };

static const char SRC_AXPY[] =
    "extern \"C\" __global__ void axpy(unsigned n, float a, const float *x, float *y) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

/* Host: the same, launched with blocks of one thread, each call covering
 * the 256 elements a cuda block would. */
static int host_axpy(const ruda_host_ctx *c, void *const *args) {
  unsigned n = *(const unsigned *)args[0];
  float a = *(const float *)args[1];
  const float *x = args[2];
  float *y = args[3];
  for (unsigned i = c->block_idx.x * 256; i < n && i < (c->block_idx.x + 1) * 256; i++) y[i] = a * x[i] + y[i];
  return 0;
}

static double median_us(uint64_t *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  return (double)v[n / 2] / 1e3;
}

typedef struct set {
  ruda_handle x, y;
  float *in, *out;
} set;

static int kernels = 3;
static unsigned block = 256; /* host: 1, its kernel covers a block per call */
static const unsigned n_elems = NF;
static const float half = 0.5f;

static void request(ruda_device *dev, const set *t) {
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(t->x)), dy = ruda_copy_contiguous(ruda_bind(t->y));
  ruda_future *none = NULL;
  CHECK(ruda_write_staged(dev, 0, &dx, t->in, BYTES));
  ruda_arg a[4] = {ruda_arg_scalar(&n_elems, sizeof n_elems), ruda_arg_scalar(&half, sizeof half),
                   ruda_arg_in(ruda_bind(t->x)), ruda_arg_buffer(ruda_bind(t->y))};
  ruda_launch_desc l = {.kernel = "axpy", .grid = {NF / 256, 1, 1}, .block = {block, 1, 1}, .args = a, .nargs = 4};
  for (int k = 0; k < kernels; k++) CHECK(ruda_launch(dev, 0, &l));
  CHECK(ruda_read(dev, 0, &dy, t->out, BYTES, &none));
}

static ruda_graph *record(ruda_device *dev, const set *t) {
  ruda_graph *g;
  CHECK(ruda_graph_begin_capture(dev, 0));
  request(dev, t);
  CHECK(ruda_graph_end_capture(dev, 0, &g));
  return g;
}

/* What y holds after a request: y = 0.5 x + y, k times (y starts at 0;
 * each set keeps its own). */
static void model(float *y, const float *x) {
  for (int k = 0; k < kernels; k++)
    for (int i = 0; i < NF; i++) y[i] = half * x[i] + y[i];
}

static int same(const float *a, const float *b) {
  for (int i = 0; i < NF; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

#ifdef RUDA_BENCH_CUDA
/* One raw set: device x and y, page-locked in and out. */
typedef struct raw_set {
  CUdeviceptr x, y;
  float *in, *out;
  void *params[4];
  float model[NF];
} raw_set;

static CUDA_MEMCPY3D raw_copy(int up, const raw_set *t) {
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.WidthInBytes = BYTES;
  c.Height = c.Depth = 1;
  if (up) {
    c.srcMemoryType = CU_MEMORYTYPE_HOST, c.srcHost = t->in;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE, c.dstDevice = t->x;
  } else {
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE, c.srcDevice = t->y;
    c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = t->out;
  }
  return c;
}

static CUDA_KERNEL_NODE_PARAMS raw_kernel(CUfunction f, raw_set *t) {
  CUDA_KERNEL_NODE_PARAMS k;
  memset(&k, 0, sizeof k);
  k.func = f;
  k.gridDimX = NF / 256, k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 256, k.blockDimY = k.blockDimZ = 1;
  t->params[0] = (void *)&n_elems, t->params[1] = (void *)&half, t->params[2] = &t->x, t->params[3] = &t->y;
  k.kernelParams = t->params;
  return k;
}

/* The driver's floor (see the header): medians in us of plain, setters,
 * update, captured setters (each with launch + sync), then of the setters,
 * the update and the captured setters alone. Returns the results that did
 * not match the model. */
static long raw_floor(ruda_device *dev, long iters, double us[7]) {
  void *c = NULL;
  CHECK(ruda_cuda_context(dev, &c));
  CUcontext ctx = (CUcontext)c;
  CU(ruda__cu.cuCtxSetCurrent(ctx));
  if (ruda__cu.cuGraphCreate == NULL || ruda__cu.cuGraphExecUpdate == NULL || ruda__cu.cuGraphAddKernelNode == NULL) {
    printf("  driver floor: skipped, the driver lacks cuGraphCreate/cuGraphExecUpdate\n");
    return 0;
  }
  CUfunction f = ((ruda__cu_kernel *)ruda__kernel_find(dev, "axpy")->impl)->fn;
  CUstream st;
  CU(ruda__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  raw_set r[3];
  static const float zero[NF];
  for (int i = 0; i < 3; i++) {
    CU(ruda__cu.cuMemAlloc(&r[i].x, BYTES));
    CU(ruda__cu.cuMemAlloc(&r[i].y, BYTES));
    CU(ruda__cu.cuMemcpyHtoD(r[i].y, zero, BYTES));
    CU(ruda__cu.cuMemHostAlloc((void **)&r[i].in, BYTES, 0));
    CU(ruda__cu.cuMemHostAlloc((void **)&r[i].out, BYTES, 0));
    for (int j = 0; j < NF; j++) r[i].in[j] = (float)((j + 5 * i) % 11);
    memset(r[i].model, 0, sizeof r[i].model);
  }
  /* The template: upload -> k kernels -> download, a chain. */
  CUgraph graph, cgraph;
  CUgraphNode nodes[MAXK + 2], cnodes[MAXK + 2];
  const int nn = kernels + 2;
  CU(ruda__cu.cuGraphCreate(&graph, 0));
  CUDA_MEMCPY3D up = raw_copy(1, &r[0]), down = raw_copy(0, &r[0]);
  CU(ruda__cu.cuGraphAddMemcpyNode(&nodes[0], graph, NULL, 0, &up, ctx));
  for (int k = 0; k < kernels; k++) {
    CUDA_KERNEL_NODE_PARAMS kp = raw_kernel(f, &r[0]);
    CU(ruda__cu.cuGraphAddKernelNode(&nodes[k + 1], graph, &nodes[k], 1, &kp));
  }
  CU(ruda__cu.cuGraphAddMemcpyNode(&nodes[nn - 1], graph, &nodes[nn - 2], 1, &down, ctx));
  CUgraphExec exec, cexec;
  CU(ruda__cu.cuGraphInstantiateWithFlags(&exec, graph, 0));
  /* The same request captured from a stream, each node read back. */
  CU(ruda__cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  for (int i = 0; i < nn; i++) {
    if (i == 0) {
      CU(ruda__cu.cuMemcpyHtoDAsync(r[0].x, r[0].in, BYTES, st));
    } else if (i == nn - 1) {
      CU(ruda__cu.cuMemcpyDtoHAsync(r[0].out, r[0].y, BYTES, st));
    } else {
      CUDA_KERNEL_NODE_PARAMS kp = raw_kernel(f, &r[0]);
      CU(ruda__cu.cuLaunchKernel(f, kp.gridDimX, 1, 1, kp.blockDimX, 1, 1, 0, st, kp.kernelParams, NULL));
    }
    CUstreamCaptureStatus cs;
    const CUgraphNode *deps = NULL;
    size_t ndeps = 0;
    CU(ruda__cu.cuStreamGetCaptureInfo(st, &cs, NULL, NULL, &deps, NULL, &ndeps));
    if (ndeps != 1) {
      fprintf(stderr, "bench_graph_patch: a captured node was not read back\n");
      exit(1);
    }
    cnodes[i] = deps[0];
  }
  CU(ruda__cu.cuStreamEndCapture(st, &cgraph));
  CU(ruda__cu.cuGraphInstantiateWithFlags(&cexec, cgraph, 0));
  /* A captured copy node keeps its memory types: read them back. */
  CUDA_MEMCPY3D cup, cdown;
  CU(ruda__cu.cuGraphMemcpyNodeGetParams(cnodes[0], &cup));
  CU(ruda__cu.cuGraphMemcpyNodeGetParams(cnodes[nn - 1], &cdown));
  uint64_t *t_all[7];
  for (int i = 0; i < 7; i++) t_all[i] = malloc((size_t)iters * sizeof(uint64_t));
  long bad = 0;
  const long skip = 8;
  for (int phase = 0; phase < 4; phase++) {
    for (long it = 0; it < iters + skip; it++) {
      raw_set *t = &r[phase == 0 ? 0 : 1 + (int)(it % 2)];
      const uint64_t t0 = mono_ns();
      if (phase == 1) {
        CUDA_MEMCPY3D cu = raw_copy(1, t), cd = raw_copy(0, t);
        CU(ruda__cu.cuGraphExecMemcpyNodeSetParams(exec, nodes[0], &cu, ctx));
        for (int k = 0; k < kernels; k++) {
          CUDA_KERNEL_NODE_PARAMS kp = raw_kernel(f, t);
          CU(ruda__cu.cuGraphExecKernelNodeSetParams(exec, nodes[k + 1], &kp));
        }
        CU(ruda__cu.cuGraphExecMemcpyNodeSetParams(exec, nodes[nn - 1], &cd, ctx));
      } else if (phase == 2) {
        CUDA_MEMCPY3D cu = raw_copy(1, t), cd = raw_copy(0, t);
        CU(ruda__cu.cuGraphMemcpyNodeSetParams(nodes[0], &cu));
        for (int k = 0; k < kernels; k++) {
          CUDA_KERNEL_NODE_PARAMS kp = raw_kernel(f, t);
          CU(ruda__cu.cuGraphKernelNodeSetParams(nodes[k + 1], &kp));
        }
        CU(ruda__cu.cuGraphMemcpyNodeSetParams(nodes[nn - 1], &cd));
        CUgraphExecUpdateResultInfo info;
        CU(ruda__cu.cuGraphExecUpdate(exec, graph, &info));
      } else if (phase == 3) {
        CUDA_MEMCPY3D cu = cup, cd = cdown;
        cu.srcHost = t->in, cu.dstDevice = t->x;
        cd.srcDevice = t->y, cd.dstHost = t->out;
        CU(ruda__cu.cuGraphExecMemcpyNodeSetParams(cexec, cnodes[0], &cu, ctx));
        for (int k = 0; k < kernels; k++) {
          CUDA_KERNEL_NODE_PARAMS kp = raw_kernel(f, t);
          CU(ruda__cu.cuGraphExecKernelNodeSetParams(cexec, cnodes[k + 1], &kp));
        }
        CU(ruda__cu.cuGraphExecMemcpyNodeSetParams(cexec, cnodes[nn - 1], &cd, ctx));
      }
      const uint64_t t1 = mono_ns();
      CU(ruda__cu.cuGraphLaunch(phase == 3 ? cexec : exec, st));
      CU(ruda__cu.cuStreamSynchronize(st));
      const uint64_t t2 = mono_ns();
      model(t->model, t->in);
      bad += !same(t->out, t->model);
      if (it >= skip) {
        t_all[phase][it - skip] = t2 - t0;
        if (phase > 0) t_all[3 + phase][it - skip] = t1 - t0;
      }
    }
  }
  for (int i = 0; i < 7; i++) {
    us[i] = median_us(t_all[i], (size_t)iters);
    free(t_all[i]);
  }
  CU(ruda__cu.cuGraphExecDestroy(exec));
  CU(ruda__cu.cuGraphDestroy(graph));
  CU(ruda__cu.cuGraphExecDestroy(cexec));
  CU(ruda__cu.cuGraphDestroy(cgraph));
  CU(ruda__cu.cuStreamDestroy(st));
  for (int i = 0; i < 3; i++) {
    CU(ruda__cu.cuMemFree(r[i].x));
    CU(ruda__cu.cuMemFree(r[i].y));
    CU(ruda__cu.cuMemFreeHost(r[i].in));
    CU(ruda__cu.cuMemFreeHost(r[i].out));
  }
  return bad;
}
#endif

int main(int argc, char **argv) {
  long iters = 2000;
  int opt;
  while ((opt = getopt(argc, argv, "n:k:")) != -1) {
    if (opt == 'n' && atol(optarg) > 10) iters = atol(optarg);
    else if (opt == 'k' && atoi(optarg) >= 1 && atoi(optarg) <= MAXK) kernels = atoi(optarg);
    else {
      fprintf(stderr, "usage: bench_graph_patch [-n iterations (>10)] [-k kernels (1..%d)]\n", MAXK);
      return 2;
    }
  }
  ruda_config cfg;
  ruda_config_init(&cfg);
  if (cfg.log_level > RUDA_LOG_WARN) cfg.log_level = RUDA_LOG_WARN;
  ruda_device *dev;
  CHECK(ruda_device_open(&cfg, &dev));
  const int cuda = strcmp(ruda_device_backend(dev), "cuda") == 0;
  if (cuda) CHECK(ruda_kernel_source(dev, "axpy", SRC_AXPY, NULL));
  else CHECK(ruda_host_kernel_register(dev, "axpy", host_axpy));
  if (!cuda) block = 1;
  set s[3];
  static float zero[NF];
  for (int i = 0; i < 3; i++) {
    CHECK(ruda_buffer_create(dev, 0, BYTES, &s[i].x));
    CHECK(ruda_buffer_create(dev, 0, BYTES, &s[i].y));
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(s[i].y));
    CHECK(ruda_write(dev, 0, &d, zero, BYTES));
    CHECK(ruda_staging_alloc(dev, BYTES, (void **)&s[i].in));
    CHECK(ruda_staging_alloc(dev, BYTES, (void **)&s[i].out));
    for (int j = 0; j < NF; j++) s[i].in[j] = (float)((j + 7 * i) % 13);
  }
  CHECK(ruda_sync(dev, 0, NULL));
  float model_y[3][NF];
  memset(model_y, 0, sizeof model_y);
  ruda_graph *g = record(dev, &s[0]);
  /* Every command onto set t: the launches' x and y, the copies. */
  ruda_graph_patch p[2][2 * MAXK + 4];
  uint32_t np = 0;
  for (int t = 1; t <= 2; t++) {
    ruda_graph_patch *q = p[t - 1];
    np = 0;
    q[np++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(s[t].x));
    q[np++] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, s[t].in);
    for (int k = 0; k < kernels; k++) {
      q[np++] = ruda_graph_patch_arg((uint32_t)k + 1, 2, ruda_arg_in(ruda_bind(s[t].x)));
      q[np++] = ruda_graph_patch_arg((uint32_t)k + 1, 3, ruda_arg_buffer(ruda_bind(s[t].y)));
    }
    q[np++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, (uint32_t)kernels + 1, ruda_bind(s[t].y));
    q[np++] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, (uint32_t)kernels + 1, s[t].out);
  }

  uint64_t *t_run = malloc((size_t)iters * sizeof *t_run), *t_patch = malloc((size_t)iters * sizeof *t_patch),
           *t_new = malloc((size_t)iters * sizeof *t_new);
  long bad = 0;
  const long skip = 8;
  for (int phase = 0; phase < 3; phase++) {
    uint64_t *out = phase == 0 ? t_run : phase == 1 ? t_patch : t_new;
    for (long it = 0; it < iters + skip; it++) {
      const int t = phase == 0 ? 0 : 1 + (int)(it % 2);
      uint64_t t0 = mono_ns();
      if (phase == 0) {
        CHECK(ruda_graph_run(dev, 0, g, NULL));
      } else if (phase == 1) {
        CHECK(ruda_graph_run_with(dev, 0, g, p[t - 1], np, NULL));
      } else {
        ruda_graph *g2 = record(dev, &s[t]);
        CHECK(ruda_graph_run(dev, 0, g2, NULL));
        CHECK(ruda_graph_destroy(dev, g2));
      }
      uint64_t t1 = mono_ns();
      model(model_y[t], s[t].in);
      bad += !same(s[t].out, model_y[t]);
      if (it >= skip) out[it - skip] = t1 - t0;
    }
  }
  double run = median_us(t_run, (size_t)iters), patched = median_us(t_patch, (size_t)iters),
         fresh = median_us(t_new, (size_t)iters);
  ruda_device_props props;
  CHECK(ruda_device_get_props(dev, &props));
  printf("bench_graph_patch: backend %s (%s), %u workers; request = upload 4 KiB, %d launches, download 4 KiB; "
         "%u patches; medians of %ld\n",
         ruda_device_backend(dev), props.name, ruda_device_num_streams(dev), kernels, np, iters);
  printf("  ruda_graph_run, as recorded                        %9.2f us\n", run);
  printf("  ruda_graph_run_with, every command moved           %9.2f us  (update: %.2f us)\n", patched,
         patched - run);
  printf("  capture + end + first run + destroy of a new graph  %9.2f us  (capture+instantiate: %.2f us)\n", fresh,
         fresh - run);
  if (patched - run > 0.005)
    printf("  a new graph costs %.1fx the update\n", (fresh - run) / (patched - run));
  else
    printf("  the update is below the timer's resolution beside a run\n");
#ifdef RUDA_BENCH_CUDA
  if (cuda) {
    double us[7] = {0};
    const long rbad = raw_floor(dev, iters, us);
    bad += rbad;
    if (us[0] > 0) {
      const int nn = kernels + 2;
      printf("  driver floor, a raw graph of the same %d nodes on its own CUstream (medians of %ld):\n", nn, iters);
      printf("    cuGraphLaunch + sync, as built                   %9.2f us\n", us[0]);
      printf("    per-node cuGraphExec*SetParams, then launch      %9.2f us  (setters: %.2f us, %.2f us a node)\n",
             us[1], us[4], us[4] / nn);
      printf("    template set + cuGraphExecUpdate, then launch    %9.2f us  (update: %.2f us, %.2f us a node)\n",
             us[2], us[5], us[5] / nn);
      printf("    the setters on a captured graph, then launch     %9.2f us  (setters: %.2f us, %.2f us a node)\n",
             us[3], us[6], us[6] / nn);
      printf("  patched / plain: ruda %.2f; driver, setters %.2f, whole-graph update %.2f (%ld raw mismatches)\n",
             patched / run, us[1] / us[0], us[2] / us[0], rbad);
    }
  }
#endif
  printf("  results checked every iteration: %ld mismatches\n", bad);
  CHECK(ruda_graph_destroy(dev, g));
  CHECK(ruda_sync(dev, 0, NULL));
  for (int i = 0; i < 3; i++) {
    CHECK(ruda_buffer_free(dev, 0, s[i].x));
    CHECK(ruda_buffer_free(dev, 0, s[i].y));
    CHECK(ruda_staging_free(dev, s[i].in));
    CHECK(ruda_staging_free(dev, s[i].out));
  }
  free(t_run);
  free(t_patch);
  free(t_new);
  ruda_error *errs = NULL;
  if (ruda_device_close(dev, &errs) != 0) {
    fprintf(stderr, "bench_graph_patch: close: %s\n", ruda_error_message(errs));
    return 1;
  }
  return bad ? 1 : 0;
}

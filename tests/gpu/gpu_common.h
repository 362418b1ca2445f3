/* gpu_common.h - what the GPU tests share: opening a cuda device (or
 * skipping), the CUDA C test kernels, random inputs, float64 references.
 *
 * Every gpu_* test binary is registered twice with ctest: labelled `gpu`,
 * against the real driver (skipped, exit code 77, where there is none),
 * and labelled `mock`, against tests/gpu_mock_driver.c (RUDA_CUDA_DRIVER),
 * which runs the backend's host-side logic on machines without a GPU.
 * NVRTC is real in both. The mock emulates the kernels below by name. */
#ifndef RUDA_TESTS_GPU_COMMON_H
#define RUDA_TESTS_GPU_COMMON_H

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#include "backends/cuda/cu_loader.h"

/* Skips the current case (tests/common.h): only for a machine without a
 * GPU to test on, never for a failure of ruda's. */
#define gpu_skip(...) test_skip(__VA_ARGS__)

/* Why a cuda device open that returned rc means "no GPU here" (no driver
 * library, a driver before CUDA 12, no device, fewer devices than the
 * ordinal asks), or NULL when it is a failure: a driver that lacks an
 * entry point ruda needs (a loader regression looks exactly like this),
 * a cuInit that failed for another reason, or any other code. */
static inline const char *gpu_absent(int rc, int ordinal) {
  if (rc != RUDA_ENODRIVER && rc != RUDA_ENOBACKEND) return NULL;
  switch (ruda__cu_load_status()) {
    case RUDA__CU_NO_LIBRARY: return "no CUDA driver library";
    case RUDA__CU_TOO_OLD: return "the CUDA driver is older than CUDA 12";
    case RUDA__CU_NO_DEVICE: return "no CUDA device";
    case RUDA__CU_LOADED: {
      /* Loaded: ENOBACKEND is then the ordinal beyond the devices present. */
      int count = 0;
      if (rc == RUDA_ENOBACKEND && ruda__cu.cuDeviceGetCount(&count) == CUDA_SUCCESS && ordinal >= count)
        return "fewer CUDA devices than the test needs";
      return NULL;
    }
    case RUDA__CU_NO_SYMBOL:
    case RUDA__CU_INIT_FAILED: return NULL;
  }
  return NULL;
}

/* A cuda device with explicit settings; 0 or the open's code. */
static inline int gpu_try_open_ordinal(int ordinal, uint32_t streams, const char *cache_dir, int bounds_checked,
                                       ruda_device **out) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_CUDA;
  cfg.device_ordinal = ordinal;
  cfg.num_streams = streams;
  cfg.lanes = test_lanes(streams); /* 4 workers: 16 CUstreams each */
  cfg.queue_bound = 1u << 20;
  cfg.backpressure = RUDA_BACKPRESSURE_BLOCK;
  cfg.log_level = RUDA_LOG_ERROR;
  cfg.cache_dir = cache_dir;
  cfg.bounds_checked = bounds_checked;
  return ruda_device_open(&cfg, out);
}

static inline int gpu_try_open(uint32_t streams, const char *cache_dir, int bounds_checked, ruda_device **out) {
  return gpu_try_open_ordinal(0, streams, cache_dir, bounds_checked, out);
}

/* The device, a skip when this machine has none (gpu_absent), or a
 * failure with the open's message. */
static inline ruda_device *gpu_open_ordinal(int ordinal, uint32_t streams, const char *cache_dir, int bounds_checked) {
  ruda_device *dev = NULL;
  int rc = gpu_try_open_ordinal(ordinal, streams, cache_dir, bounds_checked, &dev);
  if (rc == 0) return dev;
  const char *absent = gpu_absent(rc, ordinal);
  if (absent != NULL) gpu_skip("%s: %s", absent, ruda_error_message(ruda_last_error()));
  fail_msg("ruda_device_open(cuda, ordinal %d): %s: %s", ordinal, ruda_err_name(rc),
           ruda_error_message(ruda_last_error()));
  return NULL;
}

static inline ruda_device *gpu_open_cfg(uint32_t streams, const char *cache_dir, int bounds_checked) {
  return gpu_open_ordinal(0, streams, cache_dir, bounds_checked);
}

/* The default: 4 streams, kernel cache disabled so every run compiles. */
static inline ruda_device *gpu_open(void) { return gpu_open_cfg(4, "", 0); }

static inline int gpu_is_mock(ruda_device *dev) {
  ruda_device_props p;
  return ruda_device_get_props(dev, &p) == 0 && strcmp(p.name, "ruda mock GPU") == 0;
}

/* A test hook the mock driver exports (tests/gpu/gpu_mock_driver.c, "test
 * hooks"), or NULL on a real device. */
static inline void *gpu_mock_hook(ruda_device *dev, const char *name) {
  const char *path = getenv("RUDA_CUDA_DRIVER");
  void *lib = gpu_is_mock(dev) && path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (lib == NULL) return NULL;
  void *p = dlsym(lib, name);
  dlclose(lib); /* ruda still holds it */
  return p;
}

/* ---- kernels ---- */

/* Linear thread index over any grid and block shape. */
#define GPU_PRELUDE                                                                          \
  "__device__ unsigned long long gid() {\n"                                                  \
  "  unsigned long long blk = blockIdx.x + (unsigned long long)gridDim.x *\n"                \
  "      (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);\n"                       \
  "  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);\n"    \
  "  return blk * (blockDim.x * blockDim.y * blockDim.z) + t;\n"                             \
  "}\n"                                                                                      \
  "__device__ unsigned long long nthreads() {\n"                                             \
  "  return (unsigned long long)gridDim.x * gridDim.y * gridDim.z *\n"                       \
  "         blockDim.x * blockDim.y * blockDim.z;\n"                                         \
  "}\n"

static const char *const SRC_AXPY = GPU_PRELUDE
    "extern \"C\" __global__ void axpy(unsigned n, float a, const float *x, float *y) {\n"
    "  unsigned long long i = gid();\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

/* Block tree reduction in dynamic shared memory, one atomic per block. */
static const char *const SRC_REDUCE = GPU_PRELUDE
    "extern \"C\" __global__ void reduce_sum(unsigned n, const float *x, double *out) {\n"
    "  extern __shared__ double part[];\n"
    "  unsigned t = threadIdx.x + blockDim.x * threadIdx.y;\n"
    "  unsigned nt = blockDim.x * blockDim.y;\n"
    "  double s = 0;\n"
    "  for (unsigned long long i = gid(); i < n; i += nthreads()) s += x[i];\n"
    "  part[t] = s;\n"
    "  __syncthreads();\n"
    "  for (unsigned k = nt / 2; k > 0; k /= 2) {\n"
    "    if (t < k) part[t] += part[t + k];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (t == 0) atomicAdd(out, part[0]);\n"
    "}\n";

/* Square tiles of TILE x TILE (an NVRTC option), staged in dynamic
 * shared memory: block (TILE, TILE), grid (ceil(N/TILE), ceil(M/TILE)). */
static const char *const SRC_MATMUL =
    "extern \"C\" __global__ void matmul(unsigned M, unsigned N, unsigned K, const float *A,\n"
    "                                    const float *B, float *C) {\n"
    "  extern __shared__ float sm[];\n"
    "  float *As = sm, *Bs = sm + TILE * TILE;\n"
    "  unsigned tx = threadIdx.x, ty = threadIdx.y;\n"
    "  unsigned row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;\n"
    "  float acc = 0;\n"
    "  for (unsigned k0 = 0; k0 < K; k0 += TILE) {\n"
    "    As[ty * TILE + tx] = (row < M && k0 + tx < K) ? A[(size_t)row * K + k0 + tx] : 0.0f;\n"
    "    Bs[ty * TILE + tx] = (col < N && k0 + ty < K) ? B[(size_t)(k0 + ty) * N + col] : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (unsigned k = 0; k < TILE; k++) acc += As[ty * TILE + k] * Bs[k * TILE + tx];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (row < M && col < N) C[(size_t)row * N + col] = acc;\n"
    "}\n";

/* buf[i] == k becomes k + 1; anything else becomes a poison value, so a
 * launch that runs out of order or twice is visible in the result. */
static const char *const SRC_STEP = GPU_PRELUDE
    "extern \"C\" __global__ void step(unsigned n, unsigned *buf, unsigned k) {\n"
    "  unsigned long long i = gid();\n"
    "  if (i < n) buf[i] = buf[i] == k ? k + 1 : 0xffffffffu;\n"
    "}\n";

/* sum of w[i] * (2i + 1) mod 2^64: order-free, position-sensitive. */
static const char *const SRC_CHECKSUM = GPU_PRELUDE
    "extern \"C\" __global__ void checksum(unsigned long long n, const unsigned *w,\n"
    "                                      unsigned long long *out) {\n"
    "  unsigned long long s = 0;\n"
    "  for (unsigned long long i = gid(); i < n; i += nthreads())\n"
    "    s += (unsigned long long)w[i] * (2 * i + 1);\n"
    "  atomicAdd(out, s);\n"
    "}\n";

static const char *const SRC_MARK_BLOCKS =
    "extern \"C\" __global__ void mark_blocks(unsigned *out) {\n"
    "  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)\n"
    "    atomicAdd(&out[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)], 1u);\n"
    "}\n";

/* Writes through a pointer the caller chooses: an unmapped one faults. */
static const char *const SRC_FAULT =
    "extern \"C\" __global__ void planted_fault(int *p) { *(volatile int *)p = 1; }\n";

/* Spin for `spin` clock cycles, then write: a long writer (order_fill) or
 * a long reader-writer (order_add) whose result shows if a later command
 * on another stream ran before it. The mock driver sleeps spin / 2000 us. */
static const char *const SRC_ORDER =
    "extern \"C\" __global__ void order_fill(unsigned n, unsigned *buf, unsigned v, long long spin) {\n"
    "  long long t0 = clock64();\n"
    "  while (clock64() - t0 < spin) {}\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "    buf[i] = v + i;\n"
    "}\n"
    "extern \"C\" __global__ void order_add(unsigned n, const unsigned *src, unsigned *dst, unsigned k,\n"
    "                                      long long spin) {\n"
    "  long long t0 = clock64();\n"
    "  while (clock64() - t0 < spin) {}\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "    dst[i] = src[i] + k;\n"
    "}\n";

/* Each block of every launch arrives at a shared counter, then waits (up
 * to timeout cycles) until `want` have arrived: only launches running at
 * the same time all meet. */
static const char *const SRC_ACCESS =
    "extern \"C\" __global__ void access_meet(int *counter, int want, long long timeout, int *met) {\n"
    "  if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "  atomicAdd(counter, 1);\n"
    "  long long t0 = clock64();\n"
    "  while (atomicAdd(counter, 0) < want && clock64() - t0 < timeout) {}\n"
    "  met[0] = atomicAdd(counter, 0) >= want;\n"
    "}\n";

/* CUDA C++ as users bring it: no extern "C", a template, a namespaced
 * template with a non-type parameter, cooperative groups, cuda/std,
 * half and bfloat16 types; nothing but the default include paths. The
 * mock emulates the first four by their mangled names. */
static const char *const SRC_CXX =
    "#include <cooperative_groups.h>\n"
    "#include <cuda/std/type_traits>\n"
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "namespace cg = cooperative_groups;\n"
    "\n"
    "__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) c[i] = a[i] + b[i];\n"
    "}\n"
    "\n"
    "template <typename T>\n"
    "__global__ void scale(T *x, T a, int n) {\n"
    "  static_assert(cuda::std::is_floating_point<T>::value, \"floating point only\");\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] = x[i] * a;\n"
    "}\n"
    "\n"
    "namespace ns {\n"
    "template <typename T, int U>\n"
    "__global__ void axpy(const T *x, T *y, T a, int n) {\n"
    "  cg::thread_block block = cg::this_thread_block();\n"
    "  int i = (blockIdx.x * block.size() + block.thread_rank()) * U;\n"
    "  for (int k = 0; k < U; k++)\n"
    "    if (i + k < n) y[i + k] = a * x[i + k] + y[i + k];\n"
    "}\n"
    "}  // namespace ns\n"
    "\n"
    "/* A cooperative-groups block reduction: out[blockIdx.x] = sum of its block's x. */\n"
    "__global__ void block_sum(const float *x, float *out, int n) {\n"
    "  extern __shared__ float s[];\n"
    "  cg::thread_block block = cg::this_thread_block();\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  s[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
    "  block.sync();\n"
    "  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {\n"
    "    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];\n"
    "    block.sync();\n"
    "  }\n"
    "  if (threadIdx.x == 0) out[blockIdx.x] = s[0];\n"
    "}\n"
    "\n"
    "__global__ void halves(const __half *h, const __nv_bfloat16 *b, float *out, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = __half2float(h[i]) + __bfloat162float(b[i]);\n"
    "}\n"
;

static const char *const SRC_EMPTY = "extern \"C\" __global__ void empty() {}\n";

static const char *const SRC_STATIC_SMEM =
    "extern \"C\" __global__ void static_smem(float *out) {\n"
    "  __shared__ float s[4096];\n"
    "  s[threadIdx.x] = threadIdx.x;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) out[0] = s[blockDim.x - 1];\n"
    "}\n";

static const char *const SRC_BOUNDED =
    "extern \"C\" __global__ void __launch_bounds__(128) bounded128(float *out) {\n"
    "  out[threadIdx.x] = 1.0f;\n"
    "}\n";

/* Defines bounds_on only in bounds-checked builds. */
static const char *const SRC_BOUNDS =
    "#ifdef RUDA_BOUNDS_CHECKED\n"
    "extern \"C\" __global__ void bounds_on(int *p) { p[0] = 1; }\n"
    "#endif\n"
    "extern \"C\" __global__ void bounds_any(int *p) { p[0] = 2; }\n";

/* A 32x32 float tile through the tensor memory accelerator: one thread
 * issues cp.async.bulk.tensor into shared memory, completing on an
 * mbarrier, then the block copies the tile out. The map's type is
 * declared here (NVRTC has no <cuda.h>): 128 opaque bytes. */
static const char *const SRC_TMA =
    "struct __align__(64) tmap_t { unsigned long long v[16]; };\n"
    "extern \"C\" __global__ void tma_copy(const __grid_constant__ tmap_t map, float *out, int x0, int y0) {\n"
    "  __shared__ __align__(128) float tile[32 * 32];\n"
    "  __shared__ __align__(8) unsigned long long bar;\n"
    "  unsigned tile_s = (unsigned)__cvta_generic_to_shared(tile);\n"
    "  unsigned bar_s = (unsigned)__cvta_generic_to_shared(&bar);\n"
    "  if (threadIdx.x == 0) {\n"
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: \"r\"(bar_s) : \"memory\");\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n"
    "    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\"\n"
    "                 :: \"r\"(bar_s), \"r\"(32 * 32 * 4) : \"memory\");\n"
    "    asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes\"\n"
    "                 \" [%0], [%1, {%2, %3}], [%4];\"\n"
    "                 :: \"r\"(tile_s), \"l\"(&map), \"r\"(x0), \"r\"(y0), \"r\"(bar_s) : \"memory\");\n"
    "  }\n"
    "  asm volatile(\"{\\n .reg .pred p;\\n WAIT_%=:\\n\"\n"
    "               \" mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\\n\"\n"
    "               \" @!p bra WAIT_%=;\\n}\" :: \"r\"(bar_s) : \"memory\");\n"
    "  for (unsigned i = threadIdx.x; i < 32 * 32; i += blockDim.x) out[i] = tile[i];\n"
    "}\n";

/* ---- inputs and references ---- */

static inline uint64_t gpu_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
  fprintf(stderr, "seed %llu\n", (unsigned long long)s);
  return s ? s : 1;
}

static inline uint64_t gpu_rand(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Uniform in [-1, 1). */
static inline float gpu_randf(uint64_t *s) { return (float)((gpu_rand(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

static inline void gpu_fill(float *x, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++) x[i] = gpu_randf(s);
}

/* A launch of n threads in the shape ruda suggests. */
static inline ruda_launch_desc gpu_launch_1d(ruda_device *dev, const char *kernel, uint64_t n,
                                             const ruda_arg *args, uint32_t nargs) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = kernel;
  l.block = ruda_block_for(dev, n);
  uint64_t per = (uint64_t)l.block.x * l.block.y * l.block.z;
  uint64_t actual;
  assert_ok(ruda_grid_spread(dev, (uint32_t)((n + per - 1) / per), &l.grid, &actual));
  l.args = args;
  l.nargs = nargs;
  return l;
}

static inline void gpu_sync_ok(ruda_device *dev, ruda_stream_id s) {
  ruda_error *err = NULL;
  int rc = ruda_sync(dev, s, &err);
  if (rc != 0) {
    ruda_error_print(err, stderr, 0);
    ruda_error_free(err);
    fail_msg("ruda_sync: %s", ruda_err_name(rc));
  }
}

/* Runs the group after making sure a cuda device exists: exit 77 (a
 * skip) when this machine has none, exit 1 with the reason when opening
 * one fails otherwise (a driver missing a symbol is not "no GPU"). */
static inline int gpu_main(const char *group, const struct CMUnitTest *tests, size_t n, int argc, char **argv) {
  ruda_device *dev = NULL;
  int rc = gpu_try_open(1, "", 0, &dev);
  if (rc != 0) {
    const char *absent = gpu_absent(rc, 0);
    fprintf(stderr, "%s: %s: %s\n", group, absent ? absent : "cannot open the cuda device",
            ruda_error_message(ruda_last_error()));
    return absent ? TEST_SKIP : 1;
  }
  ruda_device_close(dev, NULL);
  return test_main(group, tests, n, argc, argv);
}

#define GPU_MAIN(group, tests) \
  int main(int argc, char **argv) { return gpu_main(group, tests, sizeof(tests) / sizeof(tests[0]), argc, argv); }

#endif /* RUDA_TESTS_GPU_COMMON_H */

/* gpu_kernels.c - NVRTC kernels on the cuda backend: results against
 * float64 CPU references on fresh random inputs, compile errors, launch
 * limits, dry runs, the bounds-checked define, the kernel caches and
 * indirect grids. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "gpu_common.h"
#include "backends/cuda/cuda_internal.h"
#include "src/device.h"

static ruda_handle buffer_with(ruda_device *dev, const void *data, size_t bytes) {
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, bytes, &h));
  if (data) test_write(dev, 0, ruda_bind(h), data, bytes);
  return h;
}

static void axpy_matches_float64(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const unsigned n = 100000 + (unsigned)(gpu_rand(&seed) % 3000000);
  const float a = gpu_randf(&seed) * 4;
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *got = malloc(n * sizeof *got);
  gpu_fill(x, n, &seed);
  gpu_fill(y, n, &seed);
  assert_ok(ruda_kernel_source(dev, "axpy", SRC_AXPY, NULL));
  ruda_handle hx = buffer_with(dev, x, n * sizeof *x), hy = buffer_with(dev, y, n * sizeof *y);
  ruda_arg args[] = {ruda_arg_scalar(&n, 4), ruda_arg_scalar(&a, 4), ruda_arg_buffer(ruda_bind(hx)),
                     ruda_arg_buffer(ruda_bind(hy))};
  ruda_launch_desc l = gpu_launch_1d(dev, "axpy", n, args, 4);
  assert_ok(ruda_launch(dev, 0, &l));
  test_read(dev, 0, ruda_bind(hy), got, n * sizeof *got);
  for (unsigned i = 0; i < n; i++) {
    double ref = (double)a * x[i] + y[i];
    double tol = 4 * 1.1920929e-7 * (fabs((double)a * x[i]) + fabs(y[i])) + 1e-30;
    if (fabs(got[i] - ref) > tol) fail_msg("axpy[%u] = %.9g, float64 reference %.9g (n %u)", i, got[i], ref, n);
  }
  assert_ok(ruda_buffer_free(dev, 0, hx));
  assert_ok(ruda_buffer_free(dev, 0, hy));
  test_close(dev);
  free(x), free(y), free(got);
}

static void reduction_matches_float64(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const unsigned n = 1 + (unsigned)(gpu_rand(&seed) % (1u << 22));
  float *x = malloc(n * sizeof *x);
  gpu_fill(x, n, &seed);
  double ref = 0, mag = 0;
  for (unsigned i = 0; i < n; i++) ref += x[i], mag += fabs(x[i]);
  assert_ok(ruda_kernel_source(dev, "reduce_sum", SRC_REDUCE, NULL));
  const double zero = 0;
  ruda_handle hx = buffer_with(dev, x, n * sizeof *x), ho = buffer_with(dev, &zero, sizeof zero);
  ruda_arg args[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(hx)), ruda_arg_buffer(ruda_bind(ho))};
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  /* A grid-stride loop: a few blocks per SM, not one thread per element. */
  ruda_launch_desc l = gpu_launch_1d(dev, "reduce_sum", n, args, 3);
  if (l.grid.x > 4 * p.sm_count) l.grid = (ruda_dim3){4 * p.sm_count, 1, 1};
  l.shared_mem = l.block.x * l.block.y * (uint32_t)sizeof(double);
  assert_ok(ruda_launch(dev, 0, &l));
  double got;
  test_read(dev, 0, ruda_bind(ho), &got, sizeof got);
  if (fabs(got - ref) > 1e-9 * mag + 1e-12)
    fail_msg("sum of %u floats = %.17g, float64 reference %.17g", n, got, ref);
  assert_ok(ruda_buffer_free(dev, 0, hx));
  assert_ok(ruda_buffer_free(dev, 0, ho));
  test_close(dev);
  free(x);
}

static void matmul_matches_float64(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  /* Sizes that are not multiples of the tile exercise the edges. */
  const unsigned M = 65 + (unsigned)(gpu_rand(&seed) % 300), N = 65 + (unsigned)(gpu_rand(&seed) % 300),
                 K = 65 + (unsigned)(gpu_rand(&seed) % 300), T = 16;
  float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)K * N * 4), *C = malloc((size_t)M * N * 4);
  gpu_fill(A, (size_t)M * K, &seed);
  gpu_fill(B, (size_t)K * N, &seed);
  const char *opts[] = {"-DTILE=16", NULL};
  assert_ok(ruda_kernel_source(dev, "matmul", SRC_MATMUL, opts));
  ruda_handle ha = buffer_with(dev, A, (size_t)M * K * 4), hb = buffer_with(dev, B, (size_t)K * N * 4),
              hc = buffer_with(dev, NULL, (size_t)M * N * 4);
  ruda_arg args[] = {ruda_arg_scalar(&M, 4),          ruda_arg_scalar(&N, 4),
                     ruda_arg_scalar(&K, 4),          ruda_arg_buffer(ruda_bind(ha)),
                     ruda_arg_buffer(ruda_bind(hb)), ruda_arg_buffer(ruda_bind(hc))};
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "matmul";
  l.block = (ruda_dim3){T, T, 1};
  l.grid = (ruda_dim3){(N + T - 1) / T, (M + T - 1) / T, 1};
  l.shared_mem = 2 * T * T * 4;
  l.args = args;
  l.nargs = 6;
  assert_ok(ruda_launch(dev, 0, &l));
  test_read(dev, 0, ruda_bind(hc), C, (size_t)M * N * 4);
  for (unsigned i = 0; i < M; i++)
    for (unsigned j = 0; j < N; j++) {
      double ref = 0, mag = 0;
      for (unsigned k = 0; k < K; k++) {
        double t = (double)A[(size_t)i * K + k] * B[(size_t)k * N + j];
        ref += t;
        mag += fabs(t);
      }
      double got = C[(size_t)i * N + j];
      if (fabs(got - ref) > 2.0 * K * 1.1920929e-7 * mag + 1e-6)
        fail_msg("C[%u][%u] = %.9g, float64 reference %.9g (M %u N %u K %u)", i, j, got, ref, M, N, K);
    }
  assert_ok(ruda_buffer_free(dev, 0, ha));
  assert_ok(ruda_buffer_free(dev, 0, hb));
  assert_ok(ruda_buffer_free(dev, 0, hc));
  test_close(dev);
  free(A), free(B), free(C);
}

static void compile_error_carries_log(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  const char *bad = "extern \"C\" __global__ void broken(int *p) { p[0] = undeclared_thing; }\n";
  assert_rc(ruda_kernel_source(dev, "broken", bad, NULL), RUDA_ECOMPILE);
  const ruda_error *e = ruda_last_error();
  assert_contains(ruda_error_message(e), "\"broken\"");
  assert_contains(ruda_error_message(e), "undeclared_thing");
  assert_true(ruda_error_backend_code(e) != 0); /* the nvrtcResult */
  assert_contains(ruda_compile_log(), "undeclared_thing");
  /* The kernel was not registered. */
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "broken";
  l.grid = l.block = (ruda_dim3){1, 1, 1};
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EKERNEL);
  test_close(dev);
}

static void missing_function_is_ekernel(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_rc(ruda_kernel_source(dev, "not_there", SRC_EMPTY, NULL), RUDA_EKERNEL);
  assert_last_error_contains("not_there");
  test_close(dev);
}

static int launch_shape(ruda_device *dev, const char *k, ruda_dim3 grid, ruda_dim3 block, uint32_t shared,
                        const ruda_arg *args, uint32_t nargs, uint32_t flags) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = k;
  l.grid = grid;
  l.block = block;
  l.shared_mem = shared;
  l.args = args;
  l.nargs = nargs;
  l.flags = flags;
  return ruda_launch(dev, 0, &l);
}

static void resource_limits_fail_at_the_call(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  assert_ok(ruda_kernel_source(dev, "static_smem", SRC_STATIC_SMEM, NULL));
  assert_ok(ruda_kernel_source(dev, "bounded128", SRC_BOUNDED, NULL));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 4096, &h));
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  const ruda_dim3 one = {1, 1, 1};
  char want[64];

  assert_rc(launch_shape(dev, "static_smem", one, (ruda_dim3){p.max_block.x + 1, 1, 1}, 0, &a, 1, 0),
            RUDA_EBLOCKDIM);
  snprintf(want, sizeof want, "(%u,%u,%u)", p.max_block.x, p.max_block.y, p.max_block.z);
  assert_last_error_contains(want);
  assert_rc(launch_shape(dev, "static_smem", one, (ruda_dim3){32, 32, 2}, 0, &a, 1, 0), RUDA_EBLOCKTHREADS);
  assert_last_error_contains("2048");
  assert_rc(launch_shape(dev, "static_smem", (ruda_dim3){1, p.max_grid.y + 1, 1}, one, 0, &a, 1, 0), RUDA_EGRIDDIM);
  assert_rc(launch_shape(dev, "static_smem", one, one, p.max_shared_per_block_optin + 1, &a, 1, 0),
            RUDA_ESHAREDMEM);
  /* Kernel-specific: its 16 KiB of static shared memory leave less. */
  assert_rc(launch_shape(dev, "static_smem", one, one, p.max_shared_per_block_optin, &a, 1, 0), RUDA_ESHAREDMEM);
  assert_last_error_contains("16384 static");
  /* Kernel-specific: __launch_bounds__(128). */
  assert_rc(launch_shape(dev, "bounded128", one, (ruda_dim3){256, 1, 1}, 0, &a, 1, 0), RUDA_EBLOCKTHREADS);
  assert_last_error_contains("maximum is 128");
  /* Opt-in shared memory above the 48 KiB default is allowed. */
  assert_ok(launch_shape(dev, "bounded128", one, (ruda_dim3){128, 1, 1}, 100 * 1024, &a, 1, 0));
  /* Parameter lists: checked wherever the driver can tell (CUDA 12.4's
   * cuFuncGetParamInfo; the mock has it). A driver of 12.4 or later
   * without it is a loader fault, not a reason to check less. */
  if (ruda__cu.driver_version >= 12040) assert_non_null(ruda__cu.cuFuncGetParamInfo);
  if (ruda__cu.cuFuncGetParamInfo != NULL) {
    ruda_arg two[] = {a, a};
    assert_rc(launch_shape(dev, "bounded128", one, one, 0, two, 2, 0), RUDA_EINVAL);
    assert_last_error_contains("the kernel takes 1");
    const uint32_t small = 1;
    ruda_arg s = ruda_arg_scalar(&small, 4);
    assert_rc(launch_shape(dev, "bounded128", one, one, 0, &s, 1, 0), RUDA_EINVAL);
    assert_last_error_contains("8 bytes");
  } else {
    fprintf(stderr, "note: driver %d predates cuFuncGetParamInfo; argument checks not possible\n",
            ruda__cu.driver_version);
  }
  gpu_sync_ok(dev, 0);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void dry_run_dispatches_nothing(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned n = 1000, k = 0;
  unsigned *zeros = calloc(n, 4), *got = malloc(n * 4);
  ruda_handle h = buffer_with(dev, zeros, n * 4);
  ruda_arg args[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  ruda_launch_desc l = gpu_launch_1d(dev, "step", n, args, 3);
  l.flags = RUDA_LAUNCH_DRY_RUN;
  assert_ok(ruda_launch(dev, 0, &l));
  /* Validation still applies to dry runs. */
  ruda_launch_desc bad = l;
  bad.block = (ruda_dim3){4096, 1, 1};
  assert_rc(ruda_launch(dev, 0, &bad), RUDA_EBLOCKDIM);
  bad = l;
  bad.nargs = 2;
  assert_rc(ruda_launch(dev, 0, &bad), RUDA_EINVAL);
  gpu_sync_ok(dev, 0);
  test_read(dev, 0, ruda_bind(h), got, n * 4);
  for (unsigned i = 0; i < n; i++) assert_int_equal(got[i], 0);
  /* The same launch for real does run. */
  l.flags = 0;
  assert_ok(ruda_launch(dev, 0, &l));
  test_read(dev, 0, ruda_bind(h), got, n * 4);
  for (unsigned i = 0; i < n; i++) assert_int_equal(got[i], 1);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
  free(zeros), free(got);
}

static void bounds_checked_define(void **state) {
  (void)state;
  ruda_device *plain = gpu_open_cfg(1, "", 0), *checked = gpu_open_cfg(1, "", 1);
  assert_rc(ruda_kernel_source(plain, "bounds_on", SRC_BOUNDS, NULL), RUDA_EKERNEL);
  assert_ok(ruda_kernel_source(plain, "bounds_any", SRC_BOUNDS, NULL));
  assert_ok(ruda_kernel_source(checked, "bounds_on", SRC_BOUNDS, NULL));
  assert_ok(ruda_kernel_source(checked, "bounds_any", SRC_BOUNDS, NULL));
  test_close(plain);
  test_close(checked);
}

typedef struct reg_arg {
  ruda_device *dev;
  pthread_barrier_t *go;
  int rc;
} reg_arg;

static void *register_axpy(void *p) {
  reg_arg *a = p;
  pthread_barrier_wait(a->go);
  a->rc = ruda_kernel_source(a->dev, "axpy", SRC_AXPY, NULL);
  return NULL;
}

static void concurrent_registrations_compile_once(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  enum { T = 16 };
  pthread_t t[T];
  reg_arg a[T];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, T);
  for (int i = 0; i < T; i++) {
    a[i] = (reg_arg){dev, &go, -1};
    assert_int_equal(pthread_create(&t[i], NULL, register_axpy, &a[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(a[i].rc, 0);
  uint64_t compiles, disk, mem;
  ruda__cu_cache_stats(dev->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles, 1);
  assert_int_equal(disk, 0);
  assert_int_equal(mem, T - 1);
  /* Different options are a different module. */
  const char *opts[] = {"-DUNUSED=1", NULL};
  assert_ok(ruda_kernel_source(dev, "axpy", SRC_AXPY, opts));
  ruda__cu_cache_stats(dev->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles, 2);
  pthread_barrier_destroy(&go);
  test_close(dev);
}

static int count_cubins(const char *dir, char *path, size_t len) {
  DIR *d = opendir(dir);
  if (d == NULL) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l > 6 && strcmp(e->d_name + l - 6, ".cubin") == 0) {
      n++;
      snprintf(path, len, "%s/%s", dir, e->d_name);
    }
  }
  closedir(d);
  return n;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void disk_cache_warm_start(void **state) {
  (void)state;
  char dir[] = "/tmp/ruda-kcache-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sub[300], file[600];
  snprintf(sub, sizeof sub, "%s/nested/dir", dir); /* created on demand */
  uint64_t compiles, disk, mem;

  ruda_device *cold = gpu_open_cfg(1, sub, 0);
  double t0 = now_ms();
  assert_ok(ruda_kernel_source(cold, "axpy", SRC_AXPY, NULL));
  double cold_ms = now_ms() - t0;
  ruda__cu_cache_stats(cold->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles, 1);
  assert_int_equal(disk, 0);
  test_close(cold);
  assert_int_equal(count_cubins(sub, file, sizeof file), 1);

  ruda_device *warm = gpu_open_cfg(1, sub, 0);
  t0 = now_ms();
  assert_ok(ruda_kernel_source(warm, "axpy", SRC_AXPY, NULL));
  double warm_ms = now_ms() - t0;
  ruda__cu_cache_stats(warm->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles, 0);
  assert_int_equal(disk, 1);
  fprintf(stderr, "kernel load: NVRTC %.2f ms, disk cache %.3f ms\n", cold_ms, warm_ms);
  /* The cached kernel works. */
  const unsigned n = 256;
  const float a = 2;
  float x[256], y[256], got[256];
  for (unsigned i = 0; i < n; i++) x[i] = (float)i, y[i] = 1;
  ruda_handle hx = buffer_with(warm, x, sizeof x), hy = buffer_with(warm, y, sizeof y);
  ruda_arg args[] = {ruda_arg_scalar(&n, 4), ruda_arg_scalar(&a, 4), ruda_arg_buffer(ruda_bind(hx)),
                     ruda_arg_buffer(ruda_bind(hy))};
  ruda_launch_desc l = gpu_launch_1d(warm, "axpy", n, args, 4);
  assert_ok(ruda_launch(warm, 0, &l));
  test_read(warm, 0, ruda_bind(hy), got, sizeof got);
  for (unsigned i = 0; i < n; i++) assert_true(got[i] == 2.0f * i + 1);
  assert_ok(ruda_buffer_free(warm, 0, hx));
  assert_ok(ruda_buffer_free(warm, 0, hy));
  test_close(warm);

  /* A damaged file is a miss: recompiled and rewritten. */
  int fd = open(file, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, "XXXX", 4, 200), 4);
  close(fd);
  ruda_device *again = gpu_open_cfg(1, sub, 0);
  assert_ok(ruda_kernel_source(again, "axpy", SRC_AXPY, NULL));
  ruda__cu_cache_stats(again->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles, 1);
  assert_int_equal(disk, 0);
  test_close(again);
  ruda_device *fixed = gpu_open_cfg(1, sub, 0);
  assert_ok(ruda_kernel_source(fixed, "axpy", SRC_AXPY, NULL));
  ruda__cu_cache_stats(fixed->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(disk, 1);
  test_close(fixed);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void indirect_grid_read_on_the_worker(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "mark_blocks", SRC_MARK_BLOCKS, NULL));
  unsigned zeros[64] = {0}, got[64];
  ruda_handle out = buffer_with(dev, zeros, sizeof zeros);
  const uint32_t dims[3] = {3, 2, 2};
  ruda_handle grid = buffer_with(dev, dims, sizeof dims);
  ruda_arg a = ruda_arg_buffer(ruda_bind(out));
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "mark_blocks";
  l.block = (ruda_dim3){32, 1, 1};
  l.args = &a;
  l.nargs = 1;
  l.flags = RUDA_LAUNCH_INDIRECT;
  l.indirect_grid = ruda_bind(grid);
  assert_ok(ruda_launch(dev, 0, &l));
  /* The grid is read when the launch runs, after this write landed. */
  const uint32_t empty[3] = {0, 1, 1};
  test_write(dev, 0, ruda_bind(grid), empty, sizeof empty);
  assert_ok(ruda_launch(dev, 0, &l));
  test_read(dev, 0, ruda_bind(out), got, sizeof got);
  for (unsigned i = 0; i < 64; i++) assert_int_equal(got[i], i < 12 ? 1 : 0);
  /* Too short a binding fails at the call. */
  l.indirect_grid = ruda_bind_range(grid, 0, 8);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_ERANGE);
  gpu_sync_ok(dev, 0);
  assert_ok(ruda_buffer_free(dev, 0, out));
  assert_ok(ruda_buffer_free(dev, 0, grid));
  test_close(dev);
}

static void tensor_map_tiled_copy(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_device_props p;
  assert_ok(ruda_device_get_props(dev, &p));
  if (p.cc_major < 9) gpu_skip("tensor maps need compute capability 9.0 (device has %d.%d)", p.cc_major, p.cc_minor);
  enum { H = 48, W = 64, T = 32 };
  float m[H * W], got[T * T];
  uint64_t seed = gpu_seed();
  gpu_fill(m, H * W, &seed);
  ruda_handle hm, ho;
  assert_ok(ruda_buffer_create(dev, 0, sizeof m, &hm));
  assert_ok(ruda_buffer_create(dev, 0, sizeof got, &ho));
  test_write(dev, 0, ruda_bind(hm), m, sizeof m);
  ruda_tensor_map_desc d;
  memset(&d, 0, sizeof d);
  d.format = RUDA_TENSOR_MAP_TILED;
  d.data_type = 7; /* CU_TENSOR_MAP_DATA_TYPE_FLOAT32 */
  d.rank = 2;
  d.shape[0] = H, d.shape[1] = W;
  d.strides[0] = W, d.strides[1] = 1;
  d.box[0] = T, d.box[1] = T;
  ruda_tensor_map map;
  assert_ok(ruda_tensor_map_encode(dev, ruda_bind(hm), &d, &map));
  assert_ok(ruda_kernel_source(dev, "tma_copy", SRC_TMA, NULL));
  /* An inner tile, then one hanging over the bottom edge (zero fill). */
  const int corners[2][2] = {{32, 16}, {0, 32}};
  for (int c = 0; c < 2; c++) {
    const int x0 = corners[c][0], y0 = corners[c][1];
    ruda_arg args[] = {ruda_arg_tensor_map(&map), ruda_arg_buffer(ruda_bind(ho)), ruda_arg_scalar(&x0, 4),
                       ruda_arg_scalar(&y0, 4)};
    ruda_launch_desc l;
    memset(&l, 0, sizeof l);
    l.kernel = "tma_copy";
    l.grid = (ruda_dim3){1, 1, 1};
    l.block = (ruda_dim3){128, 1, 1};
    l.args = args;
    l.nargs = 4;
    assert_ok(ruda_launch(dev, 0, &l));
    test_read(dev, 0, ruda_bind(ho), got, sizeof got);
    for (int y = 0; y < T; y++)
      for (int x = 0; x < T; x++) {
        float want = y0 + y < H && x0 + x < W ? m[(y0 + y) * W + x0 + x] : 0.0f;
        if (got[y * T + x] != want)
          fail_msg("tile at (%d,%d): [%d][%d] = %g, expected %g", x0, y0, y, x, got[y * T + x], want);
      }
  }
  /* Refusals: a row stride the TMA cannot take, a tensor past the binding. */
  ruda_tensor_map_desc bad = d;
  bad.shape[1] = 3, bad.strides[0] = 3, bad.box[1] = 3; /* 12-byte rows */
  /* The driver's refusal (the mock's, under the mock): what ruda adds is
   * the code, the message naming the map, and the driver's raw result. */
  assert_rc(ruda_tensor_map_encode(dev, ruda_bind(hm), &bad, &map), RUDA_EINVAL);
  assert_last_error_contains("the driver refused a rank-2 tiled map");
  assert_int_equal(ruda_error_backend_code(ruda_last_error()), CUDA_ERROR_INVALID_VALUE);
  /* ruda's own checks, before any driver call. */
  bad = d;
  bad.shape[0] = H + 1;
  assert_rc(ruda_tensor_map_encode(dev, ruda_bind(hm), &bad, &map), RUDA_ERANGE);
  assert_last_error_contains("the binding holds");
  bad = d;
  bad.strides[1] = 2;
  assert_rc(ruda_tensor_map_encode(dev, ruda_bind(hm), &bad, &map), RUDA_EINVAL);
  assert_last_error_contains("must be contiguous");
  assert_ok(ruda_buffer_free(dev, 0, hm));
  assert_ok(ruda_buffer_free(dev, 0, ho));
  test_close(dev);
}

/* ctest runs this case with RUDA_NVRTC pointing nowhere. */
static void nvrtc_missing_is_clear(void **state) {
  (void)state;
  const char *v = getenv("RUDA_NVRTC");
  if (v == NULL || access(v, F_OK) == 0) gpu_skip("needs RUDA_NVRTC set to a missing file");
  ruda_device *dev = gpu_open();
  assert_rc(ruda_kernel_source(dev, "empty", SRC_EMPTY, NULL), RUDA_ENONVRTC);
  assert_last_error_contains(v);
  assert_last_error_contains("\"empty\"");
  /* The device itself still works. */
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* ---- CUDA C++ as users write it ---- */

static void launch1d(ruda_device *dev, const char *kernel, unsigned n, unsigned per_thread, uint32_t shared,
                     const ruda_arg *args, uint32_t nargs) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = kernel;
  l.block = (ruda_dim3){128, 1, 1};
  l.grid = (ruda_dim3){(n / per_thread + 127) / 128 + 1, 1, 1};
  l.shared_mem = shared;
  l.args = args;
  l.nargs = nargs;
  assert_ok(ruda_launch(dev, 0, &l));
}

/* Kernels registered by their C++ names, no extern "C" and no options:
 * a plain function, a template instance, a mangled name; results against
 * the CPU. An unknown name lists what the source defines. */
static void cxx_names_register_and_run(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed();
  const int n = 5000 + (int)(gpu_rand(&seed) % 5000);
  float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
  gpu_fill(a, (size_t)n, &seed);
  gpu_fill(b, (size_t)n, &seed);
  assert_ok(ruda_kernel_source(dev, "vectorAdd", SRC_CXX, NULL));
  assert_ok(ruda_kernel_source(dev, "scale<float>", SRC_CXX, NULL));
  assert_ok(ruda_kernel_source(dev, "_Z9block_sumPKfPfi", SRC_CXX, NULL)); /* a mangled name works too */
  assert_rc(ruda_kernel_source(dev, "vectorSub", SRC_CXX, NULL), RUDA_EKERNEL);
  assert_last_error_contains("defines no __global__ function \"vectorSub\"");
  assert_rc(ruda_kernel_source(dev, "scale<int>", SRC_CXX, NULL), RUDA_ECOMPILE); /* its static_assert */
  ruda_handle ha = buffer_with(dev, a, n * 4), hb = buffer_with(dev, b, n * 4), hc = buffer_with(dev, NULL, n * 4);
  ruda_arg va[4] = {ruda_arg_in(ruda_bind(ha)), ruda_arg_in(ruda_bind(hb)), ruda_arg_out(ruda_bind(hc)),
                    ruda_arg_scalar(&n, 4)};
  launch1d(dev, "vectorAdd", (unsigned)n, 1, 0, va, 4);
  const float k = 0.5f + gpu_randf(&seed);
  ruda_arg sa[3] = {ruda_arg_buffer(ruda_bind(hc)), ruda_arg_scalar(&k, 4), ruda_arg_scalar(&n, 4)};
  launch1d(dev, "scale<float>", (unsigned)n, 1, 0, sa, 3);
  test_read(dev, 0, ruda_bind(hc), c, n * 4);
  for (int i = 0; i < n; i++)
    if (fabsf(c[i] - (a[i] + b[i]) * k) > 1e-5f * (fabsf(a[i]) + fabsf(b[i]) + 1) * fabsf(k))
      fail_msg("c[%d] = %g, expected %g", i, c[i], (a[i] + b[i]) * k);
  /* Launch checks come from the compiled function, as for extern "C". */
  ruda_arg bad[2] = {ruda_arg_in(ruda_bind(ha)), ruda_arg_in(ruda_bind(hb))};
  ruda_launch_desc l = {.kernel = "vectorAdd", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = bad, .nargs = 2};
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_ok(ruda_buffer_free(dev, 0, ha));
  assert_ok(ruda_buffer_free(dev, 0, hb));
  assert_ok(ruda_buffer_free(dev, 0, hc));
  free(a), free(b), free(c);
  test_close(dev);
}

/* One source, several kernels, one compile: names as the source spells
 * them, a namespaced template with a non-type parameter, cooperative
 * groups; a broken source is named by its file name. */
static void module_compiles_once_for_all_its_kernels(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  uint64_t seed = gpu_seed(), compiles0, compiles, disk, mem;
  ruda__cu_cache_stats(dev->sched.backend.state, &compiles0, &disk, &mem);
  const char *names[] = {"vectorAdd", "ns::axpy<float, 4>", "block_sum", "halves"};
  assert_ok(ruda_module_source(dev, "samples.cu", SRC_CXX, names, 4, NULL));
  ruda__cu_cache_stats(dev->sched.backend.state, &compiles, &disk, &mem);
  assert_int_equal(compiles - compiles0, 1);
  const int n = 4096 + (int)(gpu_rand(&seed) % 4096);
  float *x = malloc(n * 4), *y = malloc(n * 4), *got = malloc(n * 4);
  gpu_fill(x, (size_t)n, &seed);
  gpu_fill(y, (size_t)n, &seed);
  ruda_handle hx = buffer_with(dev, x, n * 4), hy = buffer_with(dev, y, n * 4);
  const float a = gpu_randf(&seed);
  ruda_arg aa[4] = {ruda_arg_in(ruda_bind(hx)), ruda_arg_buffer(ruda_bind(hy)), ruda_arg_scalar(&a, 4),
                    ruda_arg_scalar(&n, 4)};
  launch1d(dev, "ns::axpy<float, 4>", (unsigned)n, 4, 0, aa, 4);
  test_read(dev, 0, ruda_bind(hy), got, n * 4);
  for (int i = 0; i < n; i++)
    if (fabsf(got[i] - (a * x[i] + y[i])) > 1e-5f * (fabsf(a * x[i]) + fabsf(y[i]) + 1))
      fail_msg("y[%d] = %g, expected %g", i, got[i], a * x[i] + y[i]);
  /* The cooperative-groups block sum: one partial sum per block of 128. */
  const unsigned blocks = ((unsigned)n + 127) / 128;
  ruda_handle hs = buffer_with(dev, NULL, blocks * 4);
  ruda_arg ba[3] = {ruda_arg_in(ruda_bind(hx)), ruda_arg_out(ruda_bind(hs)), ruda_arg_scalar(&n, 4)};
  ruda_launch_desc l = {.kernel = "block_sum", .grid = {blocks, 1, 1}, .block = {128, 1, 1}, .shared_mem = 128 * 4,
                        .args = ba, .nargs = 3};
  assert_ok(ruda_launch(dev, 0, &l));
  test_read(dev, 0, ruda_bind(hs), got, blocks * 4);
  for (unsigned blk = 0; blk < blocks; blk++) {
    double ref = 0, mag = 0;
    for (int i = (int)blk * 128; i < n && i < (int)blk * 128 + 128; i++) ref += x[i], mag += fabs(x[i]);
    if (fabs(got[blk] - ref) > 1e-5 * mag + 1e-6) fail_msg("block %u sum %g, expected %g", blk, got[blk], ref);
  }
  /* Errors: a broken source is named by its file; an unknown name lists
   * the kernels; either way nothing is registered. */
  assert_rc(ruda_module_source(dev, "broken.cu", "__global__ void f( {", names, 1, NULL), RUDA_ECOMPILE);
  assert_last_error_contains("broken.cu");
  const char *mixed[] = {"scale<double>", "nope<int>"};
  assert_rc(ruda_module_source(dev, "mixed.cu", SRC_CXX, mixed, 2, NULL), RUDA_EKERNEL);
  ruda_arg one = ruda_arg_scalar(&n, 4);
  ruda_launch_desc ld = {.kernel = "scale<double>", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &one, .nargs = 1};
  assert_rc(ruda_launch(dev, 0, &ld), RUDA_EKERNEL); /* all or nothing */
  assert_ok(ruda_buffer_free(dev, 0, hx));
  assert_ok(ruda_buffer_free(dev, 0, hy));
  assert_ok(ruda_buffer_free(dev, 0, hs));
  free(x), free(y), free(got);
  test_close(dev);
}

/* vectorAdd and scale<float> of SRC_CXX without its headers, so making
 * the PTX needs nothing but NVRTC: a failure to compile is a failure. */
static const char *const SRC_PRE =
    "__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) c[i] = a[i] + b[i];\n"
    "}\n"
    "template <typename T>\n"
    "__global__ void scale(T *x, T a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] = x[i] * a;\n"
    "}\n";

enum { PRE_N = 1000 };

/* c = a + b through vectorAdd (whichever module registered it last). */
static void pre_vector_add(ruda_device *dev, float *c) {
  float a[PRE_N], b[PRE_N];
  for (int i = 0; i < PRE_N; i++) a[i] = (float)i, b[i] = (float)(2 * i);
  const int cnt = PRE_N;
  ruda_handle ha = buffer_with(dev, a, sizeof a), hb = buffer_with(dev, b, sizeof b),
              hc = buffer_with(dev, NULL, sizeof a);
  ruda_arg va[4] = {ruda_arg_in(ruda_bind(ha)), ruda_arg_in(ruda_bind(hb)), ruda_arg_out(ruda_bind(hc)),
                    ruda_arg_scalar(&cnt, 4)};
  launch1d(dev, "_Z9vectorAddPKfS0_Pfi", cnt, 1, 0, va, 4);
  test_read(dev, 0, ruda_bind(hc), c, sizeof a);
  assert_ok(ruda_buffer_free(dev, 0, ha));
  assert_ok(ruda_buffer_free(dev, 0, hb));
  assert_ok(ruda_buffer_free(dev, 0, hc));
}

/* A precompiled module: PTX from NVRTC as an image in memory and as a
 * .ptx file. */
static void precompiled_images_run(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  if (ruda__nvrtc_load() != 0) gpu_skip("no NVRTC to make the PTX: %s", ruda_error_message(ruda_last_error()));
  nvrtcProgram prog;
  assert_int_equal(ruda__nvrtc.nvrtcCreateProgram(&prog, SRC_PRE, "pre.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  assert_int_equal(ruda__nvrtc.nvrtcAddNameExpression(prog, "scale<float>"), NVRTC_SUCCESS); /* instantiate it */
  const char *opts[] = {"--gpu-architecture=compute_90"};
  if (ruda__nvrtc.nvrtcCompileProgram(prog, 1, opts) != NVRTC_SUCCESS) {
    size_t ln = 0;
    ruda__nvrtc.nvrtcGetProgramLogSize(prog, &ln);
    char *log = malloc(ln + 1);
    log[0] = '\0';
    if (ln > 0) ruda__nvrtc.nvrtcGetProgramLog(prog, log);
    fail_msg("NVRTC cannot compile the header-free source: %s", log);
  }
  size_t n = 0;
  assert_int_equal(ruda__nvrtc.nvrtcGetPTXSize(prog, &n), NVRTC_SUCCESS);
  char *ptx = malloc(n);
  assert_int_equal(ruda__nvrtc.nvrtcGetPTX(prog, ptx), NVRTC_SUCCESS);
  ruda__nvrtc.nvrtcDestroyProgram(&prog);
  const char *mangled[] = {"_Z9vectorAddPKfS0_Pfi"};
  assert_ok(ruda_module_image(dev, ptx, n, mangled, 1));
  char path[] = "/tmp/ruda-ptx-XXXXXX.ptx";
  int fd = mkstemps(path, 4);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, ptx, n - 1), (ssize_t)(n - 1));
  close(fd);
  const char *scaled[] = {"_Z5scaleIfEvPT_S0_i"};
  assert_ok(ruda_module_file(dev, path, scaled, 1, NULL));
  unlink(path);
  const char *absent[] = {"not_in_the_image"};
  assert_rc(ruda_module_image(dev, ptx, n, absent, 1), RUDA_EKERNEL);
  assert_last_error_contains("not_in_the_image");
  free(ptx);
  float c[PRE_N];
  pre_vector_add(dev, c);
  for (int i = 0; i < PRE_N; i++) assert_true(c[i] == 3.0f * (float)i);
  const int cnt = PRE_N;
  ruda_handle hc = buffer_with(dev, c, sizeof c);
  const float two = 2.0f;
  ruda_arg sa[3] = {ruda_arg_buffer(ruda_bind(hc)), ruda_arg_scalar(&two, 4), ruda_arg_scalar(&cnt, 4)};
  launch1d(dev, "_Z5scaleIfEvPT_S0_i", cnt, 1, 0, sa, 3);
  test_read(dev, 0, ruda_bind(hc), c, sizeof c);
  for (int i = 0; i < cnt; i++) assert_true(c[i] == 6.0f * (float)i);
  assert_ok(ruda_buffer_free(dev, 0, hc));
  test_close(dev);
}

/* A cubin built by nvcc from tests/gpu/precompiled.cu: the build makes
 * it where nvcc is found and ctest names it in RUDA_TEST_CUBIN. */
static void cubin_image_runs(void **state) {
  (void)state;
  const char *cubin = getenv("RUDA_TEST_CUBIN");
  if (cubin == NULL || *cubin == '\0') gpu_skip("no nvcc at configure time: RUDA_TEST_CUBIN is not set");
  ruda_device *dev = gpu_open();
  const char *names[] = {"_Z9vectorAddPKfS0_Pfi"};
  assert_ok(ruda_module_file(dev, cubin, names, 1, NULL));
  float c[PRE_N];
  pre_vector_add(dev, c);
  for (int i = 0; i < PRE_N; i++) assert_true(c[i] == 3.0f * (float)i);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(axpy_matches_float64),
      cmocka_unit_test(reduction_matches_float64),
      cmocka_unit_test(matmul_matches_float64),
      cmocka_unit_test(cxx_names_register_and_run),
      cmocka_unit_test(module_compiles_once_for_all_its_kernels),
      cmocka_unit_test(precompiled_images_run),
      cmocka_unit_test(cubin_image_runs),
      cmocka_unit_test(compile_error_carries_log),
      cmocka_unit_test(missing_function_is_ekernel),
      cmocka_unit_test(resource_limits_fail_at_the_call),
      cmocka_unit_test(dry_run_dispatches_nothing),
      cmocka_unit_test(bounds_checked_define),
      cmocka_unit_test(concurrent_registrations_compile_once),
      cmocka_unit_test(disk_cache_warm_start),
      cmocka_unit_test(indirect_grid_read_on_the_worker),
      cmocka_unit_test(tensor_map_tiled_copy),
      cmocka_unit_test(nvrtc_missing_is_clear),
  };
  return gpu_main("gpu_kernels", tests, sizeof tests / sizeof tests[0], argc, argv);
}

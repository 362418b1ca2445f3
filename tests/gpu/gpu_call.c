/* gpu_call.c - library calls (ruda_call) on the cuda backend: the function
 * gets the worker's CUstream with the device's context current on its
 * thread, the driver work it issues there is ordered against other
 * streams' kernels by access mode, a captured call becomes part of the
 * CUDA graph (the function runs once, at the first replay), and its
 * failure reaches the stream. The "library" is the driver itself
 * (cuMemsetD8Async, cuMemcpyDtoDAsync), so the mock driver runs it too. */
#include "gpu_common.h"
#include "backends/cuda/cuda_internal.h"

#define SPIN 40000000LL /* ~20 ms on the H200; the mock sleeps spin / 2000 us */

typedef struct seen {
  void *cu_stream, *cu_context, *current;
  uint32_t worker;
  int capturing, calls;
  char thread[16];
} seen;

/* Fills buffer 0 with the byte in data, on the call's stream. */
static int memset_fn(const ruda_call_ctx *c, void *user) {
  seen *s = user;
  CUcontext cur = NULL;
  ruda__cu.cuCtxGetCurrent(&cur);
  s->cu_stream = c->cu_stream;
  s->cu_context = c->cu_context;
  s->current = cur;
  s->worker = c->worker;
  s->capturing = c->capturing;
  s->calls++;
  pthread_getname_np(pthread_self(), s->thread, sizeof s->thread);
  unsigned char v = *(const unsigned char *)c->data;
  CUresult r = ruda__cu.cuMemsetD8Async((CUdeviceptr)c->addr[0], v, c->size[0], (CUstream)c->cu_stream);
  if (r != CUDA_SUCCESS) snprintf(c->msg, RUDA_CALL_MSG_MAX, "cuMemsetD8Async: %d", (int)r);
  return (int)r;
}

static void call_gets_the_worker_stream_and_context(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 1, 4096, &x));
  seen s = {0};
  unsigned char v = 0x5a;
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = {.name = "memset", .fn = memset_fn, .user = &s, .buffers = &b, .nbuffers = 1, .data = &v,
                      .data_size = 1};
  assert_ok(ruda_call(dev, 1, &d));
  unsigned char got[4096];
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (size_t i = 0; i < sizeof got; i++) assert_int_equal(got[i], 0x5a);
  void *stream = NULL, *ctx = NULL;
  assert_ok(ruda_cuda_stream(dev, 1, &stream));
  assert_ok(ruda_cuda_context(dev, &ctx));
  assert_int_equal(s.calls, 1);
  assert_ptr_equal(s.cu_stream, stream);
  assert_ptr_equal(s.cu_context, ctx);
  assert_ptr_equal(s.current, ctx); /* current on the function's thread */
  assert_int_equal(s.worker, 1);
  assert_int_equal(s.capturing, 0);
  assert_ok(ruda_buffer_free(dev, 1, x));
  test_close(dev);
}

/* y = x, by the driver, on the call's stream. */
static int copy_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  return (int)ruda__cu.cuMemcpyDtoDAsync((CUdeviceptr)c->addr[1], (CUdeviceptr)c->addr[0], c->size[1],
                                        (CUstream)c->cu_stream);
}

static void call_follows_a_kernel_writing_its_input_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "order_fill", SRC_ORDER, NULL));
  enum { N = 1 << 16 };
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, N * 4, &x));
  assert_ok(ruda_buffer_create(dev, 1, N * 4, &y));
  unsigned *zeros = calloc(N, 4);
  test_write(dev, 0, ruda_bind(x), zeros, N * 4);
  test_write(dev, 1, ruda_bind(y), zeros, N * 4);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_sync(dev, 1, NULL));
  unsigned n = N, base = 1000;
  long long spin = SPIN;
  ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_out(ruda_bind(x)), ruda_arg_scalar(&base, 4),
                   ruda_arg_scalar(&spin, 8)};
  ruda_launch_desc l = {.kernel = "order_fill", .grid = {64, 1, 1}, .block = {256, 1, 1}, .args = a, .nargs = 4};
  assert_ok(ruda_launch(dev, 0, &l));
  ruda_arg bufs[2] = {ruda_arg_in(ruda_bind(x)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = "copy", .fn = copy_fn, .buffers = bufs, .nbuffers = 2};
  assert_ok(ruda_call(dev, 1, &d));
  unsigned *got = malloc(N * 4);
  test_read(dev, 1, ruda_bind(y), got, N * 4);
  for (unsigned i = 0; i < N; i++)
    if (got[i] != base + i) fail_msg("y[%u] = %u, expected %u: the call ran before the writer", i, got[i], base + i);
  free(got);
  free(zeros);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  test_close(dev);
}

static void a_captured_call_is_part_of_the_graph(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 1024, &x));
  seen s = {0};
  unsigned char v = 0x3c, zeros[1024] = {0}, got[1024];
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = {.name = "memset", .fn = memset_fn, .user = &s, .buffers = &b, .nbuffers = 1, .data = &v,
                      .data_size = 1};
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_call(dev, 0, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  for (int r = 0; r < 3; r++) {
    test_write(dev, 2, ruda_bind(x), zeros, sizeof zeros);
    assert_ok(ruda_graph_replay(dev, 2, g));
    test_read(dev, 2, ruda_bind(x), got, sizeof got);
    for (size_t i = 0; i < sizeof got; i++) assert_int_equal(got[i], 0x3c);
  }
  /* Called once, capturing, at the first replay; the graph reran its work. */
  assert_int_equal(s.calls, 1);
  assert_int_equal(s.capturing, 1);
  assert_int_equal(s.worker, 2);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

static int failing_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  snprintf(c->msg, RUDA_CALL_MSG_MAX, "CUBLAS_STATUS_NOT_SUPPORTED");
  return 15;
}

static void a_failure_reaches_the_stream(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_call_desc d = {.name = "gemm", .fn = failing_fn};
  assert_ok(ruda_call(dev, 3, &d));
  ruda_error *err = NULL;
  assert_rc(ruda_sync(dev, 3, &err), RUDA_EUNHEALTHY);
  const ruda_error *e = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(e), RUDA_ECALL);
  assert_int_equal(ruda_error_backend_code(e), 15);
  assert_contains(ruda_error_message(e), "ruda_call \"gemm\" (stream 3, command #1): the function returned 15: "
                                         "CUBLAS_STATUS_NOT_SUPPORTED");
  ruda_error_free(err);
  assert_ok(ruda_sync(dev, 3, NULL)); /* the device is not faulted */
  test_close(dev);
}

/* ---- a lane's stream is fixed; library state per lane ---- */

typedef struct lib_seen {
  pthread_mutex_t lock;
  int creates, destroys, calls, capturing_creates, bad;
  void *create_stream[8], *destroy_stream[8], *destroy_current;
  char destroy_thread[16];
  void *call_stream[64], *call_state[64];
  uint32_t call_worker[64];
} lib_seen;

static lib_seen lseen = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A stand-in library: its state is a device buffer (made with cuMemAlloc,
 * which a capture forbids), freed by destroy. */
static int dev_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)user;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  ruda__cu.cuStreamGetCaptureInfo((CUstream)c->cu_stream, &st, NULL, NULL, NULL, NULL, NULL);
  CUdeviceptr p = 0;
  CUresult r = ruda__cu.cuMemAlloc(&p, 4096);
  pthread_mutex_lock(&lseen.lock);
  if (lseen.creates < 8) lseen.create_stream[lseen.creates] = c->cu_stream;
  lseen.creates++;
  lseen.capturing_creates += st != CU_STREAM_CAPTURE_STATUS_NONE || c->capturing;
  pthread_mutex_unlock(&lseen.lock);
  *state = (void *)(uintptr_t)p;
  return (int)r;
}

static void dev_destroy(const ruda_call_ctx *c, void *user, void *state) {
  (void)user;
  CUcontext cur = NULL;
  ruda__cu.cuCtxGetCurrent(&cur);
  /* Synchronizing is allowed here: the worker's work is done. */
  CUresult r = ruda__cu.cuStreamSynchronize((CUstream)c->cu_stream);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuMemFree((CUdeviceptr)(uintptr_t)state);
  pthread_mutex_lock(&lseen.lock);
  if (lseen.destroys < 8) lseen.destroy_stream[lseen.destroys] = c->cu_stream;
  lseen.destroys++;
  lseen.bad += r != CUDA_SUCCESS;
  lseen.destroy_current = cur;
  pthread_getname_np(pthread_self(), lseen.destroy_thread, sizeof lseen.destroy_thread);
  pthread_mutex_unlock(&lseen.lock);
}

/* Copies buffer 0 into the library's scratch and from there into buffer 1,
 * on the call's stream; notes the stream it got. */
static int via_scratch_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  CUstream st = (CUstream)c->cu_stream;
  CUdeviceptr scratch = (CUdeviceptr)(uintptr_t)c->library;
  pthread_mutex_lock(&lseen.lock);
  int i = lseen.calls++;
  if (i < 64) {
    lseen.call_stream[i] = c->cu_stream;
    lseen.call_state[i] = c->library;
    lseen.call_worker[i] = c->worker;
  }
  pthread_mutex_unlock(&lseen.lock);
  CUresult r = ruda__cu.cuMemcpyDtoDAsync(scratch, (CUdeviceptr)c->addr[0], c->size[0], st);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuMemcpyDtoDAsync((CUdeviceptr)c->addr[1], scratch, c->size[1], st);
  return (int)r;
}

static int seen_in(void *const *list, int n, void *p) {
  for (int i = 0; i < n; i++)
    if (list[i] == p) return 1;
  return 0;
}

static void the_stream_is_fixed_per_lane_and_the_library_state_lives_with_it(void **state) {
  (void)state;
  memset(&lseen.creates, 0, sizeof lseen - offsetof(lib_seen, creates));
  /* 4 workers of 16 lanes: streams 1, 5 and 9 share worker 1, each on a
   * lane of its own; stream 65 shares stream 1's lane. */
  ruda_device *dev = gpu_open();
  assert_int_equal(ruda_device_num_lanes(dev), 64);
  void *cs[4] = {0};
  const ruda_stream_id ids[4] = {1, 5, 9, 65};
  for (int i = 0; i < 4; i++) assert_ok(ruda_cuda_stream(dev, ids[i], &cs[i]));
  assert_ptr_not_equal(cs[0], cs[1]);
  assert_ptr_not_equal(cs[0], cs[2]);
  assert_ptr_not_equal(cs[1], cs[2]);
  assert_ptr_equal(cs[3], cs[0]);
  ruda_library_desc l = {.name = "scratch", .create = dev_create, .destroy = dev_destroy};
  uint32_t id = 0;
  assert_ok(ruda_library_register(dev, &l, &id));
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 1, 1024, &x));
  assert_ok(ruda_buffer_create(dev, 1, 1024, &y));
  unsigned char in[1024], got[1024];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 7);
  test_write(dev, 1, ruda_bind(x), in, sizeof in);
  ruda_arg b[2] = {ruda_arg_in(ruda_bind(x)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = {.name = "scratch", .fn = via_scratch_fn, .buffers = b, .nbuffers = 2, .library = id};
  /* The first call on stream 9's lane comes through a graph's first
   * replay there: the state is made before the capture starts, and the
   * call is captured on the replaying stream's CUstream. */
  assert_ok(ruda_graph_begin_capture(dev, 5));
  assert_ok(ruda_call(dev, 5, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 5, &g));
  assert_ok(ruda_graph_replay(dev, 9, g));
  test_read(dev, 9, ruda_bind(y), got, sizeof got);
  assert_memory_equal(got, in, sizeof in);
  for (int i = 0; i < 4; i++) {
    memset(got, 0, sizeof got);
    test_write(dev, ids[i], ruda_bind(y), got, sizeof got);
    assert_ok(ruda_call(dev, ids[i], &d));
    test_read(dev, ids[i], ruda_bind(y), got, sizeof got);
    assert_memory_equal(got, in, sizeof in);
  }
  assert_int_equal(lseen.creates, 3); /* one per lane used */
  assert_int_equal(lseen.capturing_creates, 0);
  assert_int_equal(lseen.calls, 5); /* the capture's on 9, then 1, 5, 9, 65 */
  void *const want[5] = {cs[2], cs[0], cs[1], cs[2], cs[0]};
  for (int i = 0; i < lseen.calls; i++) {
    assert_ptr_equal(lseen.call_stream[i], want[i]); /* the issuing stream id's, the replaying one's for a graph */
    assert_int_equal(lseen.call_worker[i], 1);
  }
  assert_ptr_equal(lseen.call_state[3], lseen.call_state[0]); /* stream 9's state both times */
  assert_ptr_equal(lseen.call_state[4], lseen.call_state[1]); /* 65 shares 1's lane and state */
  assert_ptr_not_equal(lseen.call_state[1], lseen.call_state[2]);
  assert_ptr_equal(lseen.create_stream[0], cs[2]);
  for (int i = 0; i < 3; i++) assert_true(seen_in(lseen.create_stream, 3, cs[i]));
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 1, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  void *ctx = NULL;
  assert_ok(ruda_cuda_context(dev, &ctx));
  assert_int_equal(lseen.destroys, 0);
  test_close(dev);
  assert_int_equal(lseen.destroys, 3);
  assert_int_equal(lseen.bad, 0);
  for (int i = 0; i < 3; i++) /* each with its lane's stream, still alive */
    assert_true(seen_in(lseen.destroy_stream, 3, cs[i]));
  assert_ptr_equal(lseen.destroy_current, ctx);
  assert_string_equal(lseen.destroy_thread, "ruda-w1");
}

/* Allocates and frees device memory inside the call: allowed (it holds
 * up the worker's streams meanwhile). */
static int alloc_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  CUdeviceptr p = 0;
  CUresult r = ruda__cu.cuMemAlloc(&p, 1 << 20);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuMemsetD8Async(p, 0x11, 1 << 20, (CUstream)c->cu_stream);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuMemcpyDtoDAsync((CUdeviceptr)c->addr[0], p, c->size[0], (CUstream)c->cu_stream);
  if (r == CUDA_SUCCESS) r = ruda__cu.cuMemFree(p);
  return (int)r;
}

static void a_call_may_allocate(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 2, 4096, &x));
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = {.name = "alloc", .fn = alloc_fn, .buffers = &b, .nbuffers = 1};
  assert_ok(ruda_call(dev, 2, &d));
  unsigned char got[4096];
  test_read(dev, 2, ruda_bind(x), got, sizeof got);
  for (size_t i = 0; i < sizeof got; i++) assert_int_equal(got[i], 0x11);
  assert_ok(ruda_buffer_free(dev, 2, x));
  test_close(dev);
}

/* ruda_graph_run on an idle worker issues the replay on the calling
 * thread, the call's function included: the first replay's capture runs
 * there, with the device's context current and the worker's stream. */
static void a_graph_run_issues_its_call_on_the_calling_thread(void **state) {
  (void)state;
  ruda_device *dev = gpu_open();
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 3, 1024, &x));
  seen s = {0};
  unsigned char v = 0x6b, got[1024];
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = {.name = "memset", .fn = memset_fn, .user = &s, .buffers = &b, .nbuffers = 1, .data = &v,
                      .data_size = 1};
  assert_ok(ruda_graph_begin_capture(dev, 3));
  assert_ok(ruda_call(dev, 3, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 3, &g));
  assert_ok(ruda_sync(dev, 3, NULL));
  pthread_setname_np(pthread_self(), "gpu-call-main");
  pid_t w3 = test_thread_named("ruda-w3");
  assert_true(w3 != 0);
  test_wait_blocked(w3); /* idle: nothing queued, nothing retiring */
  assert_ok(ruda_graph_run(dev, 3, g, NULL));
  assert_int_equal(s.calls, 1);
  assert_int_equal(s.capturing, 1);
  assert_string_equal(s.thread, "gpu-call-main");
  void *stream = NULL, *ctx = NULL;
  assert_ok(ruda_cuda_stream(dev, 3, &stream));
  assert_ok(ruda_cuda_context(dev, &ctx));
  assert_ptr_equal(s.cu_stream, stream);
  assert_ptr_equal(s.current, ctx);
  test_read(dev, 3, ruda_bind(x), got, sizeof got);
  for (size_t i = 0; i < sizeof got; i++) assert_int_equal(got[i], 0x6b);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 3, x));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(call_gets_the_worker_stream_and_context),
      cmocka_unit_test(call_follows_a_kernel_writing_its_input_on_another_stream),
      cmocka_unit_test(a_captured_call_is_part_of_the_graph),
      cmocka_unit_test(a_failure_reaches_the_stream),
      cmocka_unit_test(the_stream_is_fixed_per_lane_and_the_library_state_lives_with_it),
      cmocka_unit_test(a_call_may_allocate),
      cmocka_unit_test(a_graph_run_issues_its_call_on_the_calling_thread),
  };
  return gpu_main("gpu_call", tests, sizeof tests / sizeof tests[0], argc, argv);
}

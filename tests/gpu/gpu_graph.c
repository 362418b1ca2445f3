/* gpu_graph.c - graph capture and replay on the cuda backend: the worker
 * captures the recorded launches into a CUDA graph at the first replay and
 * launches the instantiated graph after; replays rerun the sequence once
 * each, follow other streams' writers, copies are recorded too, and a
 * graph destroyed with replays in flight lets them finish, and
 * ruda_graph_run serves requests from the calling thread, and replays with
 * patches update the executable graph in place. Under the mock
 * driver the same paths run against its capture emulation. */
#include <dlfcn.h>
#include <sched.h>

#include "gpu_common.h"
#include "backends/cuda/cuda_internal.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define SPIN 40000000LL /* ~20 ms on the H200; the mock sleeps spin / 2000 us */

static ruda_device *open_graph_gpu(void) {
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  assert_ok(ruda_kernel_source(dev, "empty", SRC_EMPTY, NULL));
  assert_ok(ruda_kernel_source(dev, "order_add", SRC_ORDER, NULL));
  assert_ok(ruda_kernel_source(dev, "order_fill", SRC_ORDER, NULL));
  return dev;
}

static void launch(ruda_device *dev, ruda_stream_id s, const char *k, const ruda_arg *a, uint32_t n, unsigned grid) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = k;
  l.grid = (ruda_dim3){grid, 1, 1};
  l.block = (ruda_dim3){256, 1, 1};
  l.args = a;
  l.nargs = n;
  assert_ok(ruda_launch(dev, s, &l));
}

static void step(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned k) {
  ruda_arg a[3] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  launch(dev, s, "step", a, 3, (n + 255) / 256);
}

static void expect_all(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned want,
                       unsigned plus_i, const char *what) {
  unsigned *got = malloc((size_t)n * 4);
  test_read(dev, s, ruda_bind_range(h, 0, (uint64_t)n * 4), got, (size_t)n * 4);
  for (unsigned i = 0; i < n; i++)
    if (got[i] != want + plus_i * i) {
      unsigned g = got[i];
      free(got);
      fail_msg("%s: element %u is %#x, expected %#x", what, i, g, want + plus_i * i);
    }
  free(got);
}

static void zero(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n) {
  unsigned *z = calloc(n, 4);
  test_write(dev, s, ruda_bind(h), z, (size_t)n * 4);
  free(z);
}

/* Ten steps, each turning k into k + 1 and anything else into poison: a
 * step run twice, out of order or at capture time shows. */
static void steps_replay_once_each(void **state) {
  (void)state;
  ruda_device *dev = open_graph_gpu();
  const unsigned n = 1u << 20;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &h));
  zero(dev, 0, h, n);
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  for (unsigned k = 0; k < 10; k++) step(dev, 0, h, n, k);
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 10);
  expect_all(dev, 0, h, n, 0, 0, "after capture");
  for (int r = 0; r < 3; r++) {
    assert_ok(ruda_graph_replay(dev, 0, g));
    expect_all(dev, 0, h, n, 10, 0, "after a replay");
    zero(dev, 0, h, n);
  }
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, h));
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

/* The graph reads x; stream 1 writes x with a long kernel just before the
 * replay on stream 2, which must wait for it on the device. */
static void replay_follows_a_writer_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_graph_gpu();
  const unsigned n = 1u << 16;
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &x));
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &y));
  zero(dev, 0, x, n);
  unsigned one = 1;
  long long nospin = 0, spin = SPIN;
  ruda_arg add[5] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(x)), ruda_arg_buffer(ruda_bind(y)),
                     ruda_arg_scalar(&one, 4), ruda_arg_scalar(&nospin, 8)};
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  launch(dev, 0, "order_add", add, 5, 64);
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  for (unsigned round = 0; round < 4; round++) {
    unsigned v = 1000 * (round + 1);
    ruda_arg fill[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&v, 4),
                        ruda_arg_scalar(&spin, 8)};
    launch(dev, 1, "order_fill", fill, 4, 64);
    assert_ok(ruda_graph_replay(dev, 2, g));
    expect_all(dev, 3, y, n, v + 1, 1, "replay after the writer");
  }
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  for (ruda_stream_id s = 0; s < 4; s++) gpu_sync_ok(dev, s);
  test_close(dev);
}

static void copies_are_recorded(void **state) {
  (void)state;
  ruda_device *dev = open_graph_gpu();
  const unsigned n = 4096;
  ruda_handle a, b;
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &a));
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &b));
  unsigned *src = malloc((size_t)n * 4);
  for (unsigned i = 0; i < n; i++) src[i] = 7 * i + 3;
  test_write(dev, 0, ruda_bind(a), src, (size_t)n * 4);
  zero(dev, 0, b, n);
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_copy(dev, 0, ruda_bind(b), ruda_bind(a)));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  expect_all(dev, 0, b, n, 0, 0, "after capture");
  assert_ok(ruda_graph_replay(dev, 0, g));
  expect_all(dev, 0, b, n, 3, 7, "after the replay");
  free(src);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, a));
  assert_ok(ruda_buffer_free(dev, 0, b));
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

/* A request as one graph: upload from a staging block, a step of k = 5,
 * download into another block. */
typedef struct request {
  ruda_device *dev;
  unsigned n;
  ruda_handle h;
  unsigned *in, *out;
  ruda_graph *g;
} request;

static request request_open(unsigned n) {
  request q = {open_graph_gpu(), n, {0}, NULL, NULL, NULL};
  assert_ok(ruda_buffer_create(q.dev, 0, (uint64_t)n * 4, &q.h));
  assert_ok(ruda_staging_alloc(q.dev, (size_t)n * 4, (void **)&q.in));
  assert_ok(ruda_staging_alloc(q.dev, (size_t)n * 4, (void **)&q.out));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(q.h));
  ruda_future *f = NULL;
  assert_ok(ruda_graph_begin_capture(q.dev, 0));
  assert_ok(ruda_write_staged(q.dev, 0, &d, q.in, (size_t)n * 4));
  step(q.dev, 0, q.h, n, 5);
  assert_ok(ruda_read(q.dev, 0, &d, q.out, (size_t)n * 4, &f));
  assert_null(f);
  assert_ok(ruda_graph_end_capture(q.dev, 0, &q.g));
  assert_int_equal(ruda_graph_length(q.g), 3);
  return q;
}

/* Fills the input with v and clears the output: input 5 steps to 6; 7 is
 * not the step's k, so it poisons (the expected output returned). */
static unsigned request_fill(request *q, unsigned v) {
  for (unsigned i = 0; i < q->n; i++) q->in[i] = v;
  memset(q->out, 0, (size_t)q->n * 4);
  return v == 5 ? 6 : 0xffffffffu;
}

static void request_check(const request *q, int r, unsigned want) {
  for (unsigned i = 0; i < q->n; i++)
    if (q->out[i] != want) fail_msg("request %d: element %u is %#x, expected %#x", r, i, q->out[i], want);
}

static void request_close(request *q) {
  assert_ok(ruda_graph_destroy(q->dev, q->g));
  assert_ok(ruda_buffer_free(q->dev, 0, q->h));
  gpu_sync_ok(q->dev, 0);
  assert_ok(ruda_staging_free(q->dev, q->in));
  assert_ok(ruda_staging_free(q->dev, q->out));
  test_close(q->dev);
}

/* Each replay moves the blocks' current contents. */
static void request_graph_moves_current_blocks(void **state) {
  (void)state;
  request q = request_open(1u << 16);
  for (int r = 0; r < 3; r++) {
    unsigned want = request_fill(&q, r == 1 ? 7 : 5);
    ruda_future *f = NULL;
    assert_ok(ruda_graph_replay_async(q.dev, (ruda_stream_id)(r % 2), q.g, &f));
    assert_ok(ruda_future_wait(f, NULL));
    ruda_future_free(f);
    request_check(&q, r, want);
  }
  request_close(&q);
}

typedef void (*graph_stats_fn)(unsigned *instantiated, unsigned *updated);

/* The mock driver's count of instantiations and node updates, or NULL on
 * a real driver. */
static graph_stats_fn mock_graph_stats(ruda_device *dev) {
  const char *path = getenv("RUDA_CUDA_DRIVER");
  void *lib = gpu_is_mock(dev) && path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  graph_stats_fn fn = NULL;
  if (lib != NULL) {
    void *p = dlsym(lib, "ruda_mock_graph_stats");
    memcpy(&fn, &p, sizeof fn);
    dlclose(lib); /* ruda still holds it */
  }
  return fn;
}

/* Where patched replays move a request: another buffer and two staging
 * blocks of q's size; closed with q. */
static void patch_targets_open(const request *q, ruda_handle *h2, unsigned **in2, unsigned **out2) {
  assert_ok(ruda_buffer_create(q->dev, 0, (uint64_t)q->n * 4, h2));
  assert_ok(ruda_staging_alloc(q->dev, (size_t)q->n * 4, (void **)in2));
  assert_ok(ruda_staging_alloc(q->dev, (size_t)q->n * 4, (void **)out2));
}

static void patch_targets_close(request *q, ruda_handle h2, unsigned *in2, unsigned *out2) {
  assert_ok(ruda_buffer_free(q->dev, 0, h2));
  gpu_sync_ok(q->dev, 0);
  assert_ok(ruda_staging_free(q->dev, in2));
  assert_ok(ruda_staging_free(q->dev, out2));
  request_close(q);
}

/* Replays with patches move the request onto other buffers and blocks, a
 * new scalar and a smaller grid by updating the executable graph's nodes
 * (cuGraphExecKernelNodeSetParams, cuGraphExecMemcpyNodeSetParams), never
 * capturing or instantiating again; a plain replay puts them back. */
static void patched_replays_update_nodes(void **state) {
  (void)state;
  request q = request_open(4096);
  graph_stats_fn stats = mock_graph_stats(q.dev);
  ruda_handle h2;
  unsigned *in2, *out2;
  patch_targets_open(&q, &h2, &in2, &out2);
  unsigned inst0 = 0, upd0 = 0, inst, upd;
  unsigned want = request_fill(&q, 5);
  assert_ok(ruda_graph_run(q.dev, 0, q.g, NULL));
  request_check(&q, 0, want);
  if (stats) stats(&inst0, &upd0);
  const unsigned k7 = 7;
  ruda_graph_patch p[7] = {
      ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(h2)),
      ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in2),
      ruda_graph_patch_arg(1, 1, ruda_arg_buffer(ruda_bind(h2))),
      ruda_graph_patch_arg(1, 2, ruda_arg_scalar(&k7, 4)),
      ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 2, ruda_bind(h2)),
      ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out2),
      ruda_graph_patch_grid(1, (ruda_dim3){1, 1, 1}),
  };
  for (int r = 0; r < 4; r++) {
    for (unsigned i = 0; i < q.n; i++) in2[i] = 7;
    memset(out2, 0, (size_t)q.n * 4);
    want = request_fill(&q, 5);
    /* All but the grid: every element steps 7 to 8; then with the grid
     * of one block, only the first 256. */
    ruda_error *err = NULL;
    assert_ok(ruda_graph_run_with(q.dev, (ruda_stream_id)(r % 2), q.g, p, r < 2 ? 6 : 7, &err));
    assert_null(err);
    for (unsigned i = 0; i < q.n; i++)
      if (out2[i] != (r < 2 || i < 256 ? 8u : 7u)) fail_msg("replay %d: element %u is %#x", r, i, out2[i]);
    for (unsigned i = 0; i < q.n; i++) assert_int_equal(q.out[i], 0); /* the recorded block untouched */
    /* The recorded request again: the nodes are put back. */
    assert_ok(ruda_graph_run(q.dev, 0, q.g, NULL));
    request_check(&q, r, want);
  }
  if (stats) {
    stats(&inst, &upd);
    assert_int_equal(inst, inst0);     /* no capture or instantiation again */
    assert_int_equal(upd - upd0, 4 * 2 * 3); /* three nodes patched, three put back, per round */
  }
  patch_targets_close(&q, h2, in2, out2);
}

/* A replay that patches commands exactly as the executable graph holds
 * them (the previous replay's patches) updates no node; one value that
 * differs updates its node alone; a plain replay then puts back only
 * what is held patched. Results stay right throughout. */
static void repeated_patches_update_no_node(void **state) {
  (void)state;
  request q = request_open(4096);
  graph_stats_fn stats = mock_graph_stats(q.dev);
  ruda_handle h2;
  unsigned *in2, *out2;
  patch_targets_open(&q, &h2, &in2, &out2);
  unsigned inst0 = 0, upd0 = 0, inst = 0, upd = 0;
  assert_ok(ruda_graph_run(q.dev, 0, q.g, NULL)); /* captured and instantiated */
  unsigned k = 7;
  ruda_graph_patch p[6] = {
      ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(h2)),
      ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in2),
      ruda_graph_patch_arg(1, 1, ruda_arg_buffer(ruda_bind(h2))),
      ruda_graph_patch_arg(1, 2, ruda_arg_scalar(&k, 4)),
      ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 2, ruda_bind(h2)),
      ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out2),
  };
  /* Replays 0-3 with k 7, 4 with k 9 (the scalar is read at the call). */
  const unsigned want_upd[5] = {3, 0, 0, 0, 1};
  for (int r = 0; r < 5; r++) {
    if (r == 4) k = 9;
    for (unsigned i = 0; i < q.n; i++) in2[i] = k;
    memset(out2, 0, (size_t)q.n * 4);
    if (stats) stats(&inst0, &upd0);
    assert_ok(ruda_graph_run_with(q.dev, 0, q.g, p, 6, NULL));
    for (unsigned i = 0; i < q.n; i++)
      if (out2[i] != k + 1) fail_msg("replay %d: element %u is %#x, expected %#x", r, i, out2[i], k + 1);
    if (stats) {
      stats(&inst, &upd);
      assert_int_equal(inst, inst0);
      if (upd - upd0 != want_upd[r]) fail_msg("replay %d: %u node updates, expected %u", r, upd - upd0, want_upd[r]);
    }
  }
  for (int r = 0; r < 2; r++) { /* plain: three nodes put back, then none */
    unsigned want = request_fill(&q, 5);
    if (stats) stats(&inst0, &upd0);
    assert_ok(ruda_graph_run(q.dev, 0, q.g, NULL));
    request_check(&q, r, want);
    if (stats) {
      stats(&inst, &upd);
      assert_int_equal(upd - upd0, r == 0 ? 3 : 0);
    }
  }
  patch_targets_close(&q, h2, in2, out2);
}

/* A driver that cannot say which node a command made (here: no
 * cuStreamGetCaptureInfo, as before CUDA 12.3): replays that change
 * arguments capture and instantiate again, with the same results. */
static void patched_replays_capture_again_without_node_updates(void **state) {
  (void)state;
  __typeof__(ruda__cu.cuStreamGetCaptureInfo) saved = ruda__cu.cuStreamGetCaptureInfo;
  request q = request_open(4096);
  ruda__cu.cuStreamGetCaptureInfo = NULL; /* before the first replay captures */
  graph_stats_fn stats = mock_graph_stats(q.dev);
  unsigned *in2, *out2, inst0 = 0, upd0 = 0, inst = 0, upd = 0;
  assert_ok(ruda_staging_alloc(q.dev, (size_t)q.n * 4, (void **)&in2));
  assert_ok(ruda_staging_alloc(q.dev, (size_t)q.n * 4, (void **)&out2));
  if (stats) stats(&inst0, &upd0);
  ruda_graph_patch p[2] = {ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in2),
                           ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out2)};
  for (int r = 0; r < 3; r++) {
    for (unsigned i = 0; i < q.n; i++) in2[i] = 5;
    memset(out2, 0, (size_t)q.n * 4);
    unsigned want = request_fill(&q, 5);
    assert_ok(ruda_graph_run_with(q.dev, 0, q.g, p, 2, NULL));
    for (unsigned i = 0; i < q.n; i++) assert_int_equal(out2[i], 6);
    assert_ok(ruda_graph_run(q.dev, 0, q.g, NULL));
    request_check(&q, r, want);
  }
  if (stats) {
    stats(&inst, &upd);
    assert_int_equal(upd, upd0);            /* no node was updated */
    assert_int_equal(inst - inst0, 3 * 2); /* each change captured again */
  }
  ruda__cu.cuStreamGetCaptureInfo = saved;
  gpu_sync_ok(q.dev, 0);
  assert_ok(ruda_staging_free(q.dev, in2));
  assert_ok(ruda_staging_free(q.dev, out2));
  request_close(&q);
}

typedef void (*hook_fn)(int on);

/* A library call that holds its worker until the test lets it go: how a
 * real GPU holds the worker (the mock holds it in a gated event record). */
static atomic_int hold_entered, hold_release;

static int hold_worker(const ruda_call_ctx *ctx, void *user) {
  (void)ctx, (void)user;
  atomic_store(&hold_entered, 1);
  for (long i = 0; !atomic_load(&hold_release); i++) {
    if (i == 400000000L) return 1; /* the test died: fail the call, not hang */
    sched_yield();
  }
  return 0;
}

/* One wave: REQ requests of three steps on h[] queued behind a held
 * worker (so it takes each whole into one batch), each buffer checked. */
enum { REQ = 8 };
static void queued_wave(ruda_device *dev, ruda_handle *h, unsigned n, hook_fn gate, int (*waiting)(void)) {
  for (int j = 0; j < REQ; j++) zero(dev, 0, h[j], n);
  gpu_sync_ok(dev, 0);
  ruda_future *held = NULL, *f[REQ];
  if (gate != NULL) {
    gate(1);
    assert_ok(ruda_sync_async(dev, 0, &held)); /* the worker stops in its record */
  } else {
    atomic_store(&hold_entered, 0);
    atomic_store(&hold_release, 0);
    /* On the worker: a call issued in place would hold this thread. */
    assert_ok(ruda_stream_set_in_place(dev, 0, 0));
    ruda_call_desc c = {.name = "hold", .fn = hold_worker};
    assert_ok(ruda_call(dev, 0, &c));
    assert_ok(ruda_sync_async(dev, 0, &held));
  }
  /* Only once it is held: a worker taking part of the first request into
   * the batch it runs would split the request into two runs. */
  for (long i = 0; gate != NULL ? waiting() == 0 : !atomic_load(&hold_entered); i++) {
    if (i == 20000000) fail_msg("the worker was never held");
    sched_yield();
  }
  for (int j = 0; j < REQ; j++) {
    for (unsigned k = 0; k < 3; k++) step(dev, 0, h[j], n, k);
    assert_ok(ruda_sync_async(dev, 0, &f[j])); /* a wait point ends each run */
  }
  if (gate != NULL) gate(0);
  else atomic_store(&hold_release, 1);
  assert_ok(ruda_future_wait(held, NULL));
  ruda_future_free(held);
  for (int j = 0; j < REQ; j++) {
    assert_ok(ruda_future_wait(f[j], NULL));
    ruda_future_free(f[j]);
    expect_all(dev, 0, h[j], n, 3, 0, "a request's buffer");
  }
}

/* cfg.auto_graphs: requests of three steps queued behind a held worker are
 * issued as one graph once their shape was seen twice and the device's
 * builder made its graph (off the worker: meanwhile they go one by one),
 * moved onto each request's buffer by node updates; every buffer ends as
 * the steps one by one leave it. On the mock the worker is held in a gated
 * cuEventRecord, on a GPU in a library call. */
static void auto_graphs_replay_queued_runs(void **state) {
  (void)state;
  setenv("RUDA_AUTO_GRAPHS", "1", 1);
  ruda_device *dev = gpu_open_cfg(1, "", 0);
  unsetenv("RUDA_AUTO_GRAPHS");
  graph_stats_fn stats = mock_graph_stats(dev);
  hook_fn gate = NULL;
  int (*waiting)(void) = NULL;
  const char *path = getenv("RUDA_CUDA_DRIVER");
  void *lib = gpu_is_mock(dev) && path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (lib != NULL) {
    void *p = dlsym(lib, "ruda_mock_gate_records");
    memcpy(&gate, &p, sizeof gate);
    p = dlsym(lib, "ruda_mock_records_waiting");
    memcpy(&waiting, &p, sizeof waiting);
    dlclose(lib);
  }
  if (gpu_is_mock(dev) && (stats == NULL || gate == NULL || waiting == NULL)) {
    test_close(dev);
    gpu_skip("needs the mock driver's hooks to hold the worker");
  }
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned n = 4096;
  ruda_handle h[REQ];
  for (int j = 0; j < REQ; j++) assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &h[j]));
  gpu_sync_ok(dev, 0);
  unsigned inst0 = 0, upd0 = 0, inst = 0, upd = 0;
  if (stats != NULL) stats(&inst0, &upd0);
  /* The first wave notes the shape and hands its template to the builder. */
  queued_wave(dev, h, n, gate, waiting);
  for (long i = 0; atomic_load(&dev->sched.auto_built) == 0; i++) {
    if (i == 20000000) fail_msg("the builder never made the graph");
    sched_yield();
  }
  const uint64_t before = atomic_load(&dev->sched.workers[0].auto_cmds);
  if (stats != NULL) stats(&inst, &upd0);
  /* The second replays every request from the graph made. */
  queued_wave(dev, h, n, gate, waiting);
  if (stats != NULL) { /* the driver's side, counted by the mock */
    stats(&inst, &upd);
    assert_int_equal(inst - inst0, 1); /* captured once, by the builder */
    assert_true(upd - upd0 >= 3 * (REQ - 1)); /* each run moved its three nodes */
  }
  assert_int_equal(atomic_load(&dev->sched.workers[0].auto_cmds) - before, 3 * REQ);
  for (int j = 0; j < REQ; j++) assert_ok(ruda_buffer_free(dev, 0, h[j]));
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

/* ruda_graph_run serves requests synchronously: with the worker idle the
 * calling thread issues the replay itself, leaving a context the thread
 * had current as it found it. */
static void run_serves_requests_in_place(void **state) {
  (void)state;
  request q = request_open(1u << 12);
  gpu_sync_ok(q.dev, 0);
  CUcontext before = (CUcontext)1, after = (CUcontext)1;
  ruda__cu.cuCtxGetCurrent(&before);
  for (int r = 0; r < 20; r++) {
    unsigned want = request_fill(&q, r % 3 == 1 ? 7 : 5);
    ruda_error *err = NULL;
    assert_ok(ruda_graph_run(q.dev, (ruda_stream_id)(r % 2), q.g, &err));
    assert_null(err);
    request_check(&q, r, want);
  }
  ruda__cu.cuCtxGetCurrent(&after);
  /* A thread with a context of its own gets it back; one with none keeps
   * the device's. */
  void *ctx = NULL;
  assert_ok(ruda_cuda_context(q.dev, &ctx));
  assert_ptr_equal(after, before != NULL ? before : (CUcontext)ctx);
  request_close(&q);
}

/* A 100-launch graph replayed 50 times and destroyed at once; replays on
 * four streams share its executable graph. */
static void destroyed_with_replays_in_flight(void **state) {
  (void)state;
  ruda_device *dev = open_graph_gpu();
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  for (int i = 0; i < 100; i++) launch(dev, 0, "empty", NULL, 0, 1);
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  for (int r = 0; r < 50; r++) assert_ok(ruda_graph_replay(dev, (ruda_stream_id)(r % 4), g));
  assert_ok(ruda_graph_destroy(dev, g));
  for (ruda_stream_id s = 0; s < 4; s++) gpu_sync_ok(dev, s);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(steps_replay_once_each),
      cmocka_unit_test(replay_follows_a_writer_on_another_stream),
      cmocka_unit_test(copies_are_recorded),
      cmocka_unit_test(request_graph_moves_current_blocks),
      cmocka_unit_test(destroyed_with_replays_in_flight),
      cmocka_unit_test(run_serves_requests_in_place),
      cmocka_unit_test(patched_replays_update_nodes),
      cmocka_unit_test(repeated_patches_update_no_node),
      cmocka_unit_test(patched_replays_capture_again_without_node_updates),
      cmocka_unit_test(auto_graphs_replay_queued_runs),
  };
  return gpu_main("gpu_graph", tests, sizeof tests / sizeof tests[0], argc, argv);
}

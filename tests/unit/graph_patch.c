/* graph_patch.c - replays with new arguments on the host backend
 * (ruda_graph_replay_with, ruda_graph_run_with): the same results as the
 * commands run one by one with those arguments, ordering by the buffers a
 * replay really uses, refusals that leave the graph as it was, failures
 * named with the command, patch buffers kept until the replay ran, and
 * replays with patches racing from threads. */
#include <pthread.h>

#include "common.h"
#include "src/device.h"
#include "scheduler/graph.h"
#include "u64_kernels.h"

#define N TEST_U64_N

/* addk(x, k), twice(x): u64_kernels.h's add and twice;  count(x): x[0] += 1
 * per thread run;  check(x, v): fails when v is not 0. */
static int k_count(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  x[0] += 1;
  return 0;
}

static int k_check(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  return *(const uint64_t *)args[1] != 0 ? RUDA_EGENERIC : 0;
}

static ruda_device *open_patch(uint32_t streams) {
  ruda_device *dev = test_open(streams, 4096, RUDA_BACKPRESSURE_BLOCK);
  const ruda_host_param bk[2] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 8}}, b[1] = {{RUDA_ARG_BUFFER, 0}};
  assert_ok(ruda_host_kernel_register_typed(dev, "addk", test_k_add, bk, 2));
  assert_ok(ruda_host_kernel_register_typed(dev, "twice", test_k_twice, b, 1));
  assert_ok(ruda_host_kernel_register_typed(dev, "count", k_count, b, 1));
  assert_ok(ruda_host_kernel_register_typed(dev, "check", k_check, bk, 2));
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  atomic_store(&test_gate_open, 1);
  return dev;
}

static int addk(ruda_device *dev, ruda_stream_id s, ruda_handle x, uint64_t k) {
  ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&k, sizeof k)};
  return test_launch(dev, s, "addk", a, 2);
}

static int one_buffer(ruda_device *dev, ruda_stream_id s, const char *k, ruda_handle x) {
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  return test_launch(dev, s, k, &a, 1);
}

/* A request on one set of buffers and blocks, as an inference server
 * keeps one per request in flight. */
typedef struct set {
  ruda_handle x, y;
  uint64_t *in, *out;
} set;

static set set_new(ruda_device *dev) {
  set t = {test_u64_buffer(dev, 0, 0), test_u64_buffer(dev, 0, 0), NULL, NULL};
  assert_ok(ruda_staging_alloc(dev, N * sizeof(uint64_t), (void **)&t.in));
  assert_ok(ruda_staging_alloc(dev, N * sizeof(uint64_t), (void **)&t.out));
  return t;
}

static void set_free(ruda_device *dev, set *t) {
  assert_ok(ruda_buffer_free(dev, 0, t->x));
  assert_ok(ruda_buffer_free(dev, 0, t->y));
  assert_ok(ruda_staging_free(dev, t->in));
  assert_ok(ruda_staging_free(dev, t->out));
}

/* The request, issued on s (recorded when s captures):
 *   0 upload in -> x   1 addk(x, k1)   2 twice(x)   3 copy x -> y
 *   4 addk(y, k2)      5 download y -> out
 * f NULL: recording; otherwise *f receives the download's future. */
static void request(ruda_device *dev, ruda_stream_id s, const set *t, uint64_t k1, uint64_t k2, ruda_future **f) {
  ruda_copy_desc dx = ruda_copy_contiguous(ruda_bind(t->x)), dy = ruda_copy_contiguous(ruda_bind(t->y));
  /* Recorded, the upload reads the block at each replay; run at once, a
   * staged write would take the block, so the copy is a plain write. */
  if (f == NULL) assert_ok(ruda_write_staged(dev, s, &dx, t->in, N * sizeof(uint64_t)));
  else assert_ok(ruda_write(dev, s, &dx, t->in, N * sizeof(uint64_t)));
  assert_ok(addk(dev, s, t->x, k1));
  assert_ok(one_buffer(dev, s, "twice", t->x));
  assert_ok(ruda_copy(dev, s, ruda_bind(t->y), ruda_bind(t->x)));
  assert_ok(addk(dev, s, t->y, k2));
  ruda_future *none = NULL;
  assert_ok(ruda_read(dev, s, &dy, t->out, N * sizeof(uint64_t), f ? f : &none));
  if (f == NULL) assert_null(none);
}

static ruda_graph *record_request(ruda_device *dev, ruda_stream_id s, const set *t) {
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, s));
  request(dev, s, t, 1, 5, NULL);
  assert_ok(ruda_graph_end_capture(dev, s, &g));
  assert_int_equal(ruda_graph_length(g), 6);
  return g;
}

/* The patches that move the recorded request onto t, with scalars k1, k2. */
static uint32_t request_patches(const set *t, const uint64_t *k1, const uint64_t *k2, ruda_graph_patch *p) {
  uint32_t n = 0;
  p[n++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(t->x));
  p[n++] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, t->in);
  p[n++] = ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(t->x)));
  p[n++] = ruda_graph_patch_arg(2, 0, ruda_arg_buffer(ruda_bind(t->x)));
  p[n++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 3, ruda_bind(t->y));
  p[n++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 3, ruda_bind(t->x));
  p[n++] = ruda_graph_patch_arg(4, 0, ruda_arg_buffer(ruda_bind(t->y)));
  p[n++] = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 5, ruda_bind(t->y));
  p[n++] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 5, t->out);
  if (k1) p[n++] = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(k1, sizeof *k1));
  if (k2) p[n++] = ruda_graph_patch_arg(4, 1, ruda_arg_scalar(k2, sizeof *k2));
  return n;
}

static void fill(uint64_t *in, uint64_t seed) {
  for (int i = 0; i < N; i++) in[i] = seed * 1000 + (uint64_t)i;
}

/* Random requests on random sets, replayed with patches (or without, on
 * the recorded set) and run one by one on a reference set: the same
 * blocks, the same buffers, every time. */
static void patched_replays_match_commands_run_one_by_one(void **state) {
  (void)state;
  ruda_device *dev = open_patch(2);
  set sets[3] = {set_new(dev), set_new(dev), set_new(dev)}, ref = set_new(dev);
  ruda_graph *g = record_request(dev, 0, &sets[0]);
  unsigned seed = 12345;
  for (uint64_t r = 0; r < 60; r++) {
    const uint32_t j = (uint32_t)rand_r(&seed) % 3, how = (uint32_t)rand_r(&seed) % 4;
    uint64_t k1 = (uint64_t)rand_r(&seed) % 100, k2 = (uint64_t)rand_r(&seed) % 100;
    set *t = &sets[j];
    fill(t->in, r);
    ruda_graph_patch p[16];
    uint32_t n = j != 0 || how != 0 ? request_patches(t, &k1, &k2, p) : 0;
    if (n == 0) k1 = 1, k2 = 5; /* recorded */
    ruda_future *f = NULL;
    const ruda_stream_id s = r % 2;
    if (how == 1) {
      assert_ok(ruda_graph_run_with(dev, s, g, p, n, NULL));
    } else {
      assert_ok(ruda_graph_replay_with(dev, s, g, p, n, &f));
      assert_ok(ruda_future_wait(f, NULL));
      ruda_future_free(f);
    }
    /* The same request, call by call. */
    fill(ref.in, r);
    request(dev, 1 - s, &ref, k1, k2, &f);
    assert_ok(ruda_future_wait(f, NULL));
    ruda_future_free(f);
    assert_memory_equal(t->out, ref.out, N * sizeof(uint64_t));
    for (int i = 0; i < N; i++) assert_int_equal(t->out[i], (r * 1000 + (uint64_t)i + k1) * 2 + k2);
    uint64_t got[N], want[N];
    test_read(dev, s, ruda_bind(t->x), got, sizeof got);
    test_read(dev, s, ruda_bind(ref.x), want, sizeof want);
    assert_memory_equal(got, want, sizeof got);
  }
  assert_ok(ruda_graph_destroy(dev, g));
  for (int j = 0; j < 3; j++) set_free(dev, &sets[j]);
  set_free(dev, &ref);
  test_close(dev);
}

/* Each bad patch is refused at the call with a clear error, enqueues
 * nothing, keeps no pin, and the graph replays correctly after. */
static void bad_patches_are_refused_and_the_graph_stays_usable(void **state) {
  (void)state;
  ruda_device *dev = open_patch(2);
  set a = set_new(dev), b = set_new(dev);
  ruda_graph *g = record_request(dev, 0, &a);
  ruda_handle small, dead;
  assert_ok(ruda_buffer_create(dev, 0, 8, &small));
  assert_ok(ruda_buffer_create(dev, 0, N * 8, &dead));
  assert_ok(ruda_buffer_free(dev, 0, dead));
  const uint32_t k4 = 4;
  const uint64_t k8 = 8;
  uint64_t pageable[N];
  ruda_graph_patch p[RUDA_GRAPH_MAX_PATCHES + 1];
  for (int i = 0; i <= RUDA_GRAPH_MAX_PATCHES; i++) p[i] = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&k8, 8));
  ruda__worker *w = ruda__stream_get(&dev->sched, 0)->worker;
  const uint64_t tickets = atomic_load(&w->tickets);
  const struct {
    ruda_graph_patch p;
    int rc;
    const char *says;
  } bad[] = {
      {ruda_graph_patch_arg(6, 0, ruda_arg_buffer(ruda_bind(b.x))), RUDA_EINVAL, "names command 6, the graph has 6"},
      {ruda_graph_patch_arg(0, 0, ruda_arg_buffer(ruda_bind(b.x))), RUDA_EINVAL, "command 0 is an upload"},
      {ruda_graph_patch_grid(3, (ruda_dim3){1, 1, 1}), RUDA_EINVAL, "command 3 is a copy"},
      {ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 1, ruda_bind(b.x)), RUDA_EINVAL, "is a launch of \"addk\""},
      {ruda_graph_patch_arg(1, 2, ruda_arg_scalar(&k8, 8)), RUDA_EINVAL,
       "argument 2 of command 1 (\"addk\"), which takes 2"},
      {ruda_graph_patch_arg(1, 0, ruda_arg_scalar(&k8, 8)), RUDA_EINVAL, "gives a scalar for argument 0"},
      {ruda_graph_patch_arg(1, 1, ruda_arg_buffer(ruda_bind(b.x))), RUDA_EINVAL, "gives a buffer for argument 1"},
      {ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&k4, 4)), RUDA_EINVAL, "has size 4 bytes, recorded with 8"},
      {ruda_graph_patch_grid(1, (ruda_dim3){0, 1, 1}), RUDA_EINVAL, "has a zero dimension"},
      {ruda_graph_patch_grid(1, (ruda_dim3){UINT32_MAX, 70000, 1}), RUDA_EGRIDDIM, "exceeds maximum"},
      {ruda_graph_patch_arg(2, 0, ruda_arg_buffer(ruda_bind(dead))), RUDA_ENOTFOUND, "names no live buffer"},
      {ruda_graph_patch_arg(2, 0, ruda_arg_buffer(ruda_bind(small))), RUDA_ERANGE,
       "a binding of 8 bytes for command 2"},
      {ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 3, ruda_bind(small)), RUDA_ERANGE, "which uses 128"},
      {ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, pageable), RUDA_EINVAL, "ruda_staging_alloc"},
      {ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 5, b.out + 1), RUDA_EINVAL, "ruda_staging_alloc"},
      {ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 5, NULL), RUDA_EINVAL, "ruda_staging_alloc"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    /* Alone, and behind a good patch that pins a buffer first. */
    ruda_graph_patch two[2] = {ruda_graph_patch_arg(2, 0, ruda_arg_buffer(ruda_bind(b.x))), bad[i].p};
    assert_rc(ruda_graph_replay_with(dev, 0, g, &bad[i].p, 1, NULL), bad[i].rc);
    assert_last_error_contains(bad[i].says);
    ruda_future *f = (ruda_future *)&two;
    assert_rc(ruda_graph_replay_with(dev, 0, g, two, 2, &f), bad[i].rc);
    assert_null(f);
    assert_rc(ruda_graph_run_with(dev, 1, g, two, 2, NULL), bad[i].rc);
  }
  ruda_graph_patch odd = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&k8, 8));
  odd.reserved[1] = 1;
  assert_rc(ruda_graph_replay_with(dev, 0, g, &odd, 1, NULL), RUDA_EINVAL);
  odd = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&k8, 8));
  odd.kind = (ruda_graph_patch_kind)9;
  assert_rc(ruda_graph_replay_with(dev, 0, g, &odd, 1, NULL), RUDA_EINVAL);
  assert_last_error_contains("unknown kind 9");
  odd = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(NULL, 8));
  assert_rc(ruda_graph_replay_with(dev, 0, g, &odd, 1, NULL), RUDA_EINVAL);
  assert_last_error_contains("NULL data");
  assert_rc(ruda_graph_replay_with(dev, 0, g, p, RUDA_GRAPH_MAX_PATCHES + 1, NULL), RUDA_EINVAL);
  assert_last_error_contains("at most 64");
  assert_rc(ruda_graph_replay_with(dev, 0, g, NULL, 1, NULL), RUDA_EINVAL);
  assert_rc(ruda_graph_replay_with(dev, 0, NULL, NULL, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_graph_run_with(NULL, 0, g, NULL, 0, NULL), RUDA_EINVAL);
  /* Nothing was queued by any of them. */
  assert_int_equal(atomic_load(&w->tickets), tickets);
  /* No pin was kept: b.x's and small's memory go back when freed. */
  ruda_memory_stats u0, u1;
  assert_ok(ruda_memory_usage(dev, 0, &u0));
  assert_ok(ruda_buffer_free(dev, 0, small));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_memory_usage(dev, 0, &u1));
  assert_int_equal(u1.nallocs, u0.nallocs - 1);
  /* The graph is as recorded: plain, and patched, replays are right. */
  fill(a.in, 3);
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  for (int i = 0; i < N; i++) assert_int_equal(a.out[i], (3000 + (uint64_t)i + 1) * 2 + 5);
  fill(b.in, 4);
  const uint64_t k1 = 10, k2 = 20;
  uint32_t n = request_patches(&b, &k1, &k2, p);
  assert_ok(ruda_graph_run_with(dev, 1, g, p, n, NULL));
  for (int i = 0; i < N; i++) assert_int_equal(b.out[i], (4000 + (uint64_t)i + 10) * 2 + 20);
  assert_ok(ruda_graph_destroy(dev, g));
  set_free(dev, &a);
  set_free(dev, &b);
  test_close(dev);
}

/* A patched replay waits for other streams' uses of its new buffers, and
 * not for uses of the recorded buffers it no longer touches. */
static void patched_replays_order_by_the_buffers_they_use(void **state) {
  (void)state;
  ruda_device *dev = open_patch(4); /* streams 0..3 on workers 0..3 */
  ruda_handle x = test_u64_buffer(dev, 0, 0), x2 = test_u64_buffer(dev, 0, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(addk(dev, 0, x, 1));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  ruda__worker *w3 = ruda__stream_get(&dev->sched, 3)->worker;
  ruda_graph_patch to_x2 = ruda_graph_patch_arg(0, 0, ruda_arg_buffer(ruda_bind(x2)));
  /* Stream 2 sets x2 behind the gate: the replay on x2 waits for it (a
   * WAIT precedes it on worker 3). */
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 2, "gate", NULL, 0));
  assert_ok(addk(dev, 2, x2, 100));
  uint64_t t0 = atomic_load(&w3->tickets);
  ruda_future *f;
  assert_ok(ruda_graph_replay_with(dev, 3, g, &to_x2, 1, &f));
  assert_int_equal(atomic_load(&w3->tickets) - t0, 2);
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  uint64_t got[N];
  test_read(dev, 3, ruda_bind(x2), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 101);
  /* Stream 2 now holds x behind the gate: a replay moved off x does not
   * wait for it (it completes while the gate is shut), one on x does. */
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 2, "gate", NULL, 0));
  assert_ok(addk(dev, 2, x, 1000));
  t0 = atomic_load(&w3->tickets);
  assert_ok(ruda_graph_replay_with(dev, 3, g, &to_x2, 1, &f));
  assert_int_equal(atomic_load(&w3->tickets) - t0, 1);
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  t0 = atomic_load(&w3->tickets);
  assert_ok(ruda_graph_replay_async(dev, 3, g, &f));
  assert_int_equal(atomic_load(&w3->tickets) - t0, 2);
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  test_read(dev, 1, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 1001);
  /* And a later use on another stream follows a patched replay. */
  assert_ok(ruda_graph_replay_with(dev, 3, g, &to_x2, 1, NULL));
  assert_ok(one_buffer(dev, 1, "twice", x2));
  test_read(dev, 1, ruda_bind(x2), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * ((uint64_t)i + 103));
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, x2));
  test_close(dev);
}

/* Batch-size buckets: a patched grid dispatches that many blocks, the
 * next plain replay the recorded number again. */
static void patched_grids_dispatch_their_blocks(void **state) {
  (void)state;
  ruda_device *dev = open_patch(1);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  ruda_graph *g;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  ruda_launch_desc l = {.kernel = "count", .grid = {4, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
  assert_ok(ruda_launch(dev, 0, &l));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  ruda_graph_patch p = ruda_graph_patch_grid(0, (ruda_dim3){3, 3, 1});
  assert_ok(ruda_graph_run_with(dev, 0, g, &p, 1, NULL));
  uint64_t got[N];
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  assert_int_equal(got[0], 9);
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  assert_int_equal(got[0], 13);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* A replay that fails in a patched command names it, as any replay does;
 * the graph replays fine afterwards. */
static void a_failing_patched_command_is_named(void **state) {
  (void)state;
  ruda_device *dev = open_patch(1);
  ruda_handle x = test_u64_buffer(dev, 0, 0);
  ruda_graph *g;
  const uint64_t zero = 0, one = 1;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(addk(dev, 0, x, 1));
  ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&zero, 8)};
  assert_ok(test_launch(dev, 0, "check", a, 2));
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  ruda_graph_patch p = ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&one, 8));
  ruda_error *err = NULL;
  assert_rc(ruda_graph_run_with(dev, 0, g, &p, 1, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  const ruda_error *cause = ruda_error_cause(err); /* err sums up the stream's list */
  assert_non_null(cause);
  assert_contains(ruda_error_message(cause), "command 2 (launch of check, patched)");
  assert_contains(ruda_error_message(cause), "ruda_graph_run_with (stream 0, command #");
  assert_null(ruda_error_next(cause));
  /* The same commands one by one fail the same way: one error, its code. */
  ruda_arg bad[2] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&one, 8)};
  assert_ok(addk(dev, 0, x, 1));
  assert_ok(test_launch(dev, 0, "check", bad, 2));
  ruda_error *direct = NULL;
  assert_rc(ruda_sync(dev, 0, &direct), RUDA_EUNHEALTHY);
  const ruda_error *dc = ruda_error_cause(direct);
  assert_non_null(dc);
  assert_int_equal(ruda_error_code(dc), ruda_error_code(cause));
  assert_contains(ruda_error_message(dc), "check");
  assert_null(ruda_error_next(dc));
  ruda_error_free(direct);
  ruda_error_free(err);
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  uint64_t got[N];
  test_read(dev, 0, ruda_bind(x), got, sizeof got);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], (uint64_t)i + 3);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* A patch's buffer freed while its replay is queued keeps its memory
 * until the replay ran: a buffer made meanwhile gets other memory. */
static void a_patch_keeps_its_buffer_until_the_replay_ran(void **state) {
  (void)state;
  ruda_device *dev = open_patch(1);
  set a = set_new(dev), b = set_new(dev);
  ruda_graph *g = record_request(dev, 0, &a);
  const uint64_t k1 = 2, k2 = 3;
  ruda_graph_patch p[16];
  uint32_t n = request_patches(&b, &k1, &k2, p);
  fill(b.in, 7);
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  ruda_future *f;
  assert_ok(ruda_graph_replay_with(dev, 0, g, p, n, &f));
  assert_ok(ruda_buffer_free(dev, 0, b.x));
  assert_ok(ruda_buffer_free(dev, 0, b.y));
  ruda_handle junk[4];
  const uint64_t ones[N] = {[0 ... N - 1] = UINT64_MAX};
  for (int i = 0; i < 4; i++) {
    assert_ok(ruda_buffer_create(dev, 0, sizeof ones, &junk[i]));
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(junk[i]));
    assert_ok(ruda_write(dev, 0, &d, ones, sizeof ones));
  }
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  for (int i = 0; i < N; i++) assert_int_equal(b.out[i], (7000 + (uint64_t)i + 2) * 2 + 3);
  for (int i = 0; i < 4; i++) assert_ok(ruda_buffer_free(dev, 0, junk[i]));
  assert_ok(ruda_graph_destroy(dev, g));
  set_free(dev, &a);
  assert_ok(ruda_staging_free(dev, b.in));
  assert_ok(ruda_staging_free(dev, b.out));
  test_close(dev);
}

typedef struct client {
  ruda_device *dev;
  ruda_graph *g;
  ruda_stream_id s;
  set t;
  int bad;
} client;

static void *serve(void *arg) {
  client *c = arg;
  for (uint64_t r = 0; r < 200 && !c->bad; r++) {
    uint64_t k1 = r, k2 = c->s;
    fill(c->t.in, r + c->s);
    ruda_graph_patch p[16];
    uint32_t n = request_patches(&c->t, &k1, &k2, p);
    if (ruda_graph_run_with(c->dev, c->s, c->g, p, n, NULL) != 0) c->bad = 1;
    for (int i = 0; i < N && !c->bad; i++)
      if (c->t.out[i] != ((r + c->s) * 1000 + (uint64_t)i + k1) * 2 + k2) c->bad = 2;
  }
  return NULL;
}

/* Clients replay one graph at once, each with its own buffers and blocks
 * on its own stream (two streams share each worker). */
static void clients_replay_one_graph_with_their_own_buffers(void **state) {
  (void)state;
  ruda_device *dev = open_patch(2);
  set rec = set_new(dev);
  ruda_graph *g = record_request(dev, 0, &rec);
  client c[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    c[i] = (client){dev, g, (ruda_stream_id)(10 + i), set_new(dev), 0};
    assert_int_equal(pthread_create(&th[i], NULL, serve, &c[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(c[i].bad, 0);
    set_free(dev, &c[i].t);
  }
  assert_ok(ruda_graph_destroy(dev, g));
  set_free(dev, &rec);
  test_close(dev);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(patched_replays_match_commands_run_one_by_one),
    cmocka_unit_test(bad_patches_are_refused_and_the_graph_stays_usable),
    cmocka_unit_test(patched_replays_order_by_the_buffers_they_use),
    cmocka_unit_test(patched_grids_dispatch_their_blocks),
    cmocka_unit_test(a_failing_patched_command_is_named),
    cmocka_unit_test(a_patch_keeps_its_buffer_until_the_replay_ran),
    cmocka_unit_test(clients_replay_one_graph_with_their_own_buffers),
};

TEST_MAIN("graph_patch", tests)

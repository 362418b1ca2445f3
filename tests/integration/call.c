/* call.c - library calls as stream commands (ruda_call, ruda/call.h) on
 * the host backend: what the function sees, stream order, ordering against
 * other streams' writers and readers by access mode, errors, capture and
 * replay, refusal, bad inputs, and user code that calls back into ruda. */
#include <pthread.h>
#include <stddef.h>
#include <time.h>

#include "common.h"

/* ruda_call_desc keeps 0.2's layout: library took reserved[0]'s place, so
 * a caller built before it (all reserved words zero) names no library. */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(ruda_call_desc) == 88 && offsetof(ruda_call_desc, library) == 56 &&
                   offsetof(ruda_call_desc, reserved) == 56,
               "ruda_call_desc's layout changed");
_Static_assert(sizeof(ruda_call_ctx) == 120 && offsetof(ruda_call_ctx, library) == 88,
               "ruda_call_ctx's layout changed");
#endif

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Waits up to ms for *flag to become non-zero; returns it. The window in
 * which a wrongly ordered command would show itself, never the order. */
static int within_ms(_Atomic int *flag, unsigned ms) {
  uint64_t until = now_ns() + (uint64_t)ms * 1000000u;
  while (!atomic_load(flag) && now_ns() < until) usleep(100);
  return atomic_load(flag);
}

static ruda_call_desc desc_of(const char *name, ruda_call_fn fn, void *user, const ruda_arg *bufs, uint32_t n) {
  ruda_call_desc d = {.name = name, .fn = fn, .user = user, .buffers = bufs, .nbuffers = n};
  return d;
}

/* ---- what the function sees, in stream order ---- */

typedef struct seen {
  ruda_call_ctx ctx;
  uint64_t addr0, size0, size1;
  float scale;
  pthread_t thread;
  char thread_name[16];
  int calls;
} seen;

/* y[i] = x[i] * scale, scale from the call's data. */
static int scale_fn(const ruda_call_ctx *c, void *user) {
  seen *s = user;
  s->ctx = *c;
  s->addr0 = c->addr[0];
  s->size0 = c->size[0];
  s->size1 = c->size[1];
  memcpy(&s->scale, c->data, sizeof s->scale);
  s->thread = pthread_self();
  pthread_getname_np(pthread_self(), s->thread_name, sizeof s->thread_name);
  s->calls++;
  const float *x = ruda_call_ptr(c, 0);
  float *y = ruda_call_ptr(c, 1);
  for (uint64_t i = 0; i < c->size[1] / sizeof(float); i++) y[i] = x[i] * s->scale;
  return 0;
}

static int add_one_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  float *y = args[0];
  for (int i = 0; i < 8; i++) y[i] += 1.0f;
  return 0;
}

static void runs_in_stream_order_with_its_buffers(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "add_one", add_one_kernel));
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 6, 16 * sizeof(float), &x));
  assert_ok(ruda_buffer_create(dev, 6, 8 * sizeof(float), &y));
  float in[16];
  for (int i = 0; i < 16; i++) in[i] = (float)i;
  test_write(dev, 6, ruda_bind(x), in, sizeof in);
  seen s = {0};
  float scale = 3.0f;
  ruda_arg bufs[2] = {ruda_arg_in(ruda_bind_range(x, 4 * sizeof(float), 8 * sizeof(float))),
                      ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = desc_of("scale", scale_fn, &s, bufs, 2);
  d.data = &scale;
  d.data_size = sizeof scale;
  assert_ok(ruda_call(dev, 6, &d));
  scale = -100.0f; /* the data was copied at the call */
  ruda_arg a = ruda_arg_buffer(ruda_bind(y));
  assert_ok(test_launch(dev, 6, "add_one", &a, 1));
  float out[8];
  test_read(dev, 6, ruda_bind(y), out, sizeof out);
  for (int i = 0; i < 8; i++) assert_true(out[i] == (float)(i + 4) * 3.0f + 1.0f);
  assert_int_equal(s.calls, 1);
  assert_true(s.scale == 3.0f);
  assert_ptr_equal(s.ctx.dev, dev);
  assert_int_equal(s.ctx.stream, 6);
  assert_int_equal(s.ctx.seq, 2); /* after the write */
  assert_int_equal(s.ctx.worker, 6 % 4);
  assert_int_equal(s.ctx.nbuffers, 2);
  assert_int_equal(s.size0, 8 * sizeof(float));
  assert_int_equal(s.size1, 8 * sizeof(float));
  uint64_t base = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(x), &base));
  assert_int_equal(s.addr0, base + 4 * sizeof(float));
  assert_null(s.ctx.cu_stream);
  assert_null(s.ctx.cu_context);
  assert_int_equal(s.ctx.capturing, 0);
  assert_int_equal(s.ctx.data_size, sizeof(float));
  /* On its worker's thread, not the caller's. */
  assert_false(pthread_equal(s.thread, pthread_self()));
  assert_string_equal(s.thread_name, "ruda-w2");
  assert_ok(ruda_buffer_free(dev, 6, x));
  assert_ok(ruda_buffer_free(dev, 6, y));
  test_close(dev);
}

/* ---- ordering against other streams ---- */

static _Atomic int gate_seen_closed, call_ran;

/* Copies buffer 0 into buffer 1, noting whether the gate was still shut. */
static int copy_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if (!atomic_load(&test_gate_open)) atomic_store(&gate_seen_closed, 1);
  memcpy(ruda_call_ptr(c, 1), ruda_call_ptr(c, 0), c->size[1]);
  atomic_store(&call_ran, 1);
  return 0;
}

/* Writes 42 once the gate opens. */
static int gated_fill_kernel(const ruda_host_ctx *c, void *const *args) {
  test_gate_kernel(c, args);
  *(int *)args[0] = 42;
  return 0;
}

static void call_follows_a_writer_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "gated_fill", gated_fill_kernel));
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 1, sizeof(int), &x));
  assert_ok(ruda_buffer_create(dev, 2, sizeof(int), &y));
  int zero = 0;
  test_write(dev, 1, ruda_bind(x), &zero, sizeof zero);
  test_write(dev, 2, ruda_bind(y), &zero, sizeof zero);
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_ok(ruda_sync(dev, 2, NULL));
  atomic_store(&gate_seen_closed, 0);
  atomic_store(&call_ran, 0);
  atomic_store(&test_gate_open, 0);
  ruda_arg w = ruda_arg_out(ruda_bind(x));
  assert_ok(test_launch(dev, 1, "gated_fill", &w, 1));
  ruda_arg bufs[2] = {ruda_arg_in(ruda_bind(x)), ruda_arg_out(ruda_bind(y))};
  ruda_call_desc d = desc_of("copy", copy_fn, NULL, bufs, 2);
  assert_ok(ruda_call(dev, 2, &d));
  /* Unordered, the call would run now, with the writer held at the gate. */
  assert_false(within_ms(&call_ran, 30));
  atomic_store(&test_gate_open, 1);
  int got = 0;
  test_read(dev, 2, ruda_bind(y), &got, sizeof got);
  assert_int_equal(got, 42);
  assert_int_equal(atomic_load(&gate_seen_closed), 0);
  assert_ok(ruda_buffer_free(dev, 1, x));
  assert_ok(ruda_buffer_free(dev, 2, y));
  test_close(dev);
}

/* Writes 7 into buffer 0 once the gate opens (the function may block its
 * own worker; it blocks on the test, not on another stream). */
static int gated_write_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  while (!atomic_load(&test_gate_open)) usleep(100);
  *(int *)ruda_call_ptr(c, 0) = 7;
  return 0;
}

static void readers_on_other_streams_follow_a_call_that_writes(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 1, sizeof(int), &x));
  int zero = 0;
  test_write(dev, 1, ruda_bind(x), &zero, sizeof zero);
  assert_ok(ruda_sync(dev, 1, NULL));
  atomic_store(&test_gate_open, 0);
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = desc_of("gated_write", gated_write_fn, NULL, &b, 1);
  assert_ok(ruda_call(dev, 1, &d));
  int got = -1;
  ruda_copy_desc cd = ruda_copy_contiguous(ruda_bind(x));
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 3, &cd, &got, sizeof got, &f));
  /* The read waits for the call: unordered, it would complete now. */
  uint64_t until = now_ns() + 30000000u;
  while (now_ns() < until) {
    assert_int_equal(ruda_future_poll(f), 0);
    usleep(200);
  }
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  assert_int_equal(got, 7);
  assert_ok(ruda_buffer_free(dev, 1, x));
  test_close(dev);
}

/* A reader kernel held at the gate; a call writing the buffer on another
 * stream must wait for it. */
static int gated_reader_kernel(const ruda_host_ctx *c, void *const *args) { return test_gate_kernel(c, args); }

static int note_gate_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if (!atomic_load(&test_gate_open)) atomic_store(&gate_seen_closed, 1);
  *(int *)ruda_call_ptr(c, 0) = 5;
  atomic_store(&call_ran, 1);
  return 0;
}

static void call_that_writes_waits_for_readers_on_other_streams(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "gated_reader", gated_reader_kernel));
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 1, sizeof(int), &x));
  int zero = 0;
  test_write(dev, 1, ruda_bind(x), &zero, sizeof zero);
  assert_ok(ruda_sync(dev, 1, NULL));
  atomic_store(&gate_seen_closed, 0);
  atomic_store(&call_ran, 0);
  atomic_store(&test_gate_open, 0);
  ruda_arg r = ruda_arg_in(ruda_bind(x));
  assert_ok(test_launch(dev, 2, "gated_reader", &r, 1));
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = desc_of("note_gate", note_gate_fn, NULL, &b, 1);
  assert_ok(ruda_call(dev, 3, &d));
  assert_false(within_ms(&call_ran, 30));
  atomic_store(&test_gate_open, 1);
  int got = 0;
  test_read(dev, 3, ruda_bind(x), &got, sizeof got);
  assert_int_equal(got, 5);
  assert_int_equal(atomic_load(&gate_seen_closed), 0);
  assert_ok(ruda_buffer_free(dev, 1, x));
  test_close(dev);
}

/* Calls that only read one buffer, on N streams, meet (run at once);
 * declared read-write they run one after another. */
static _Atomic int arrived, met;

static int meet_fn(const ruda_call_ctx *c, void *user) {
  (void)c;
  int want = *(const int *)user;
  atomic_fetch_add(&arrived, 1);
  uint64_t until = now_ns() + 300000000ull * test_patience();
  while (atomic_load(&arrived) < want && now_ns() < until) usleep(50);
  if (atomic_load(&arrived) >= want) atomic_fetch_add(&met, 1);
  return 0;
}

static int run_meeting(ruda_arg (*make)(ruda_binding)) {
  enum { N = 3 };
  ruda_device *dev = test_open(N, 65536, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle w;
  assert_ok(ruda_buffer_create(dev, 0, 64, &w));
  static char zeros[64];
  test_write(dev, 0, ruda_bind(w), zeros, sizeof zeros);
  assert_ok(ruda_sync(dev, 0, NULL));
  atomic_store(&arrived, 0);
  atomic_store(&met, 0);
  static int want = N;
  for (int s = 0; s < N; s++) {
    ruda_arg b = make(ruda_bind(w));
    ruda_call_desc d = desc_of("meet", meet_fn, &want, &b, 1);
    assert_ok(ruda_call(dev, (ruda_stream_id)s, &d));
  }
  for (int s = 0; s < N; s++) assert_ok(ruda_sync(dev, (ruda_stream_id)s, NULL));
  assert_ok(ruda_buffer_free(dev, 0, w));
  test_close(dev);
  return atomic_load(&met);
}

static void calls_reading_one_buffer_run_at_once(void **state) {
  (void)state;
  assert_int_equal(run_meeting(ruda_arg_in), 3);
  /* The control: read-write declarations order them, so only the last meets. */
  assert_int_equal(run_meeting(ruda_arg_buffer), 1);
}

/* ---- errors ---- */

static int failing_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  snprintf(c->msg, RUDA_CALL_MSG_MAX, "CUBLAS_STATUS_EXECUTION_FAILED (stand-in)");
  return 13;
}

/* Fills the whole message buffer with no terminator. */
static int overlong_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  memset(c->msg, 'z', RUDA_CALL_MSG_MAX);
  return -1;
}

static int count_fn(const ruda_call_ctx *c, void *user) {
  (void)c;
  atomic_fetch_add((_Atomic int *)user, 1);
  return 0;
}

static void a_failure_is_an_error_on_its_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 3, 64, &x));
  ruda_arg b = ruda_arg_buffer(ruda_bind(x));
  ruda_call_desc ok = desc_of("ok", count_fn, NULL, NULL, 0);
  static _Atomic int after;
  atomic_store(&after, 0);
  ok.user = (void *)&after;
  assert_ok(ruda_call(dev, 3, &ok));                  /* command #1 */
  ruda_call_desc bad = desc_of("sgemm layer 1", failing_fn, NULL, &b, 1);
  assert_ok(ruda_call(dev, 3, &bad));                 /* command #2 */
  assert_ok(ruda_call(dev, 3, &ok));                  /* later commands still run */
  ruda_error *err = NULL;
  assert_rc(ruda_sync(dev, 3, &err), RUDA_EUNHEALTHY);
  assert_int_equal(atomic_load(&after), 2);
  const ruda_error *e = ruda_error_cause(err);
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_ECALL);
  assert_int_equal(ruda_error_backend_code(e), 13);
  assert_int_equal(ruda_error_stream(e), 3);
  assert_contains(ruda_error_message(e), "ruda_call \"sgemm layer 1\" (stream 3, command #2)");
  assert_contains(ruda_error_message(e), "returned 13: CUBLAS_STATUS_EXECUTION_FAILED (stand-in)");
  assert_null(ruda_error_next(e));
  ruda_error_free(err);
  /* A message without its terminator is cut, not overrun; no name: "call". */
  ruda_call_desc longer = desc_of(NULL, overlong_fn, NULL, NULL, 0);
  assert_ok(ruda_call(dev, 3, &longer));
  assert_rc(ruda_flush(dev, 3, &err), RUDA_EUNHEALTHY);
  assert_contains(ruda_error_message(ruda_error_cause(err)), "ruda_call \"call\" (stream 3, command #5)");
  assert_contains(ruda_error_message(ruda_error_cause(err)), "returned -1: zzzz");
  assert_int_equal(ruda_error_backend_code(ruda_error_cause(err)), -1);
  ruda_error_free(err);
  assert_ok(ruda_sync(dev, 3, NULL)); /* drained */
  assert_ok(ruda_buffer_free(dev, 3, x));
  test_close(dev);
}

static _Atomic int never_called;

static int never_fn(const ruda_call_ctx *c, void *user) {
  (void)c;
  (void)user;
  atomic_fetch_add(&never_called, 1);
  return 0;
}

static void bad_inputs_are_refused_at_the_call(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&never_called, 0);
  ruda_handle x, gone;
  assert_ok(ruda_buffer_create(dev, 0, 64, &x));
  assert_ok(ruda_buffer_create(dev, 0, 64, &gone));
  assert_ok(ruda_buffer_free(dev, 0, gone));
  ruda_arg b = ruda_arg_in(ruda_bind(x));
  ruda_call_desc d = desc_of("k", never_fn, NULL, &b, 1);

  assert_rc(ruda_call(NULL, 0, &d), RUDA_EINVAL);
  assert_rc(ruda_call(dev, 0, NULL), RUDA_EINVAL);
  assert_last_error_contains("desc is NULL");
  ruda_call_desc t = d;
  t.fn = NULL;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("ruda_call \"k\": fn is NULL");
  ruda_arg many[RUDA_MAX_ARGS + 1];
  for (int i = 0; i <= RUDA_MAX_ARGS; i++) many[i] = ruda_arg_in(ruda_bind(x));
  t = desc_of("k", never_fn, NULL, many, RUDA_MAX_ARGS + 1);
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("65 buffers, at most 64");
  t.nbuffers = RUDA_MAX_ARGS; /* the most is fine: one buffer named 64 times */
  assert_ok(ruda_call(dev, 0, &t));
  t = d;
  t.buffers = NULL;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("buffers is NULL with nbuffers 1");
  int v = 1;
  ruda_arg scalar = ruda_arg_scalar(&v, sizeof v);
  t = desc_of("k", never_fn, NULL, &scalar, 1);
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("buffer 0 has kind 1");
  t = d;
  t.flags = 0x80;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("unknown flags 0x80");
  t = d;
  t.reserved[2] = 1;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("reserved[2] is not zero");
  static char big[RUDA_CALL_MAX_DATA + 1];
  t = d;
  t.data = big;
  t.data_size = sizeof big;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("data_size 4097 exceeds 4096 bytes");
  t.data = NULL;
  t.data_size = 4;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_last_error_contains("data is NULL with data_size 4");
  /* Stale handles and ranges outside the buffer, the second buffer failing
   * after the first was pinned: nothing is left pinned or queued. */
  ruda_arg two[2] = {ruda_arg_in(ruda_bind(x)), ruda_arg_out(ruda_bind(gone))};
  t = desc_of("k", never_fn, NULL, two, 2);
  assert_rc(ruda_call(dev, 0, &t), RUDA_ENOTFOUND);
  assert_last_error_contains("ruda_call \"k\": buffer 1 handle");
  two[1] = ruda_arg_out(ruda_bind_range(x, 60, 8));
  assert_rc(ruda_call(dev, 0, &t), RUDA_ERANGE);
  assert_last_error_contains("buffer 1 binding offset 60 + size 8 is outside");
  /* A reserved id that names no stream. */
  assert_rc(ruda_call(dev, RUDA_STREAM_EXPLICIT_MAX + 5, &d), RUDA_EINVAL);
  assert_last_error_contains("ruda_call \"k\": ");
  /* Names longer than the kept part are cut in messages. */
  char name[200];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  t = d;
  t.name = name;
  t.fn = NULL;
  assert_rc(ruda_call(dev, 0, &t), RUDA_EINVAL);
  assert_contains(ruda_error_message(ruda_last_error()), "nnnn\": fn is NULL");
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&never_called), 1); /* the one accepted above */
  /* Every pin was dropped: the buffer can be freed and its slot reused. */
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_sync(dev, 0, NULL));
  test_close(dev);
}

/* A full queue under RUDA_BACKPRESSURE_ERROR refuses the call whole:
 * nothing runs, its pins go (the buffer frees at once after). */
static void a_full_queue_refuses_the_call(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 1, RUDA_BACKPRESSURE_ERROR);
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  atomic_store(&never_called, 0);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 64, &x));
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0)); /* holds the one place */
  ruda_arg b = ruda_arg_out(ruda_bind(x));
  ruda_call_desc d = desc_of("k", never_fn, NULL, &b, 1);
  assert_rc(ruda_call(dev, 0, &d), RUDA_EQUEUEFULL);
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&never_called), 0);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_call(dev, 0, &(ruda_call_desc){.fn = never_fn})); /* room again */
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&never_called), 1);
  test_close(dev);
}

/* ---- graphs ---- */

static _Atomic int replays_seen, capturing_seen;

/* y[0] += 1 */
static int bump_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  atomic_fetch_add(&replays_seen, 1);
  if (c->capturing) atomic_store(&capturing_seen, 1);
  (*(int *)ruda_call_ptr(c, 0))++;
  return 0;
}

static void capture_records_a_call_and_replays_run_it(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "gated_fill", gated_fill_kernel));
  ruda_handle y;
  assert_ok(ruda_buffer_create(dev, 0, sizeof(int), &y));
  int zero = 0;
  test_write(dev, 0, ruda_bind(y), &zero, sizeof zero);
  atomic_store(&replays_seen, 0);
  atomic_store(&capturing_seen, 0);
  assert_ok(ruda_graph_begin_capture(dev, 0));
  ruda_arg b = ruda_arg_buffer(ruda_bind(y));
  ruda_call_desc d = desc_of("bump", bump_fn, NULL, &b, 1);
  assert_ok(ruda_call(dev, 0, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&replays_seen), 0); /* recorded, not run */
  assert_ok(ruda_graph_replay(dev, 0, g));
  assert_ok(ruda_graph_replay(dev, 1, g));
  assert_ok(ruda_graph_run(dev, 2, g, NULL)); /* not in place: the worker runs it */
  int got = 0;
  test_read(dev, 0, ruda_bind(y), &got, sizeof got);
  assert_int_equal(got, 3);
  assert_int_equal(atomic_load(&replays_seen), 3);
  assert_int_equal(atomic_load(&capturing_seen), 0); /* host: run at each replay */
  /* A replay follows another stream's writer of the call's buffer. */
  atomic_store(&test_gate_open, 0);
  ruda_arg w = ruda_arg_out(ruda_bind(y));
  assert_ok(test_launch(dev, 3, "gated_fill", &w, 1)); /* y = 42 once open */
  assert_ok(ruda_graph_replay(dev, 1, g));
  atomic_store(&test_gate_open, 1);
  test_read(dev, 1, ruda_bind(y), &got, sizeof got);
  assert_int_equal(got, 43);
  /* A recorded call's buffers cannot be patched: refused whole, the graph
   * left as recorded (it still bumps y). */
  ruda_graph_patch p = ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(y));
  assert_int_equal(ruda_graph_run_with(dev, 0, g, &p, 1, NULL), RUDA_EINVAL);
  assert_non_null(strstr(ruda_error_message(ruda_last_error()), "library call"));
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  test_read(dev, 0, ruda_bind(y), &got, sizeof got);
  assert_int_equal(got, 44);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

static int fail_in_graph_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  snprintf(c->msg, RUDA_CALL_MSG_MAX, "library said no");
  return 3;
}

static void a_failing_recorded_call_names_the_graph_and_the_call(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_graph_begin_capture(dev, 0));
  ruda_call_desc ok = desc_of("fine", never_fn, NULL, NULL, 0);
  ruda_call_desc bad = desc_of("gemm2", fail_in_graph_fn, NULL, NULL, 0);
  assert_ok(ruda_call(dev, 0, &ok));
  assert_ok(ruda_call(dev, 0, &bad));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  ruda_error *err = NULL;
  assert_rc(ruda_graph_run(dev, 1, g, &err), RUDA_EUNHEALTHY);
  const ruda_error *e = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(e), RUDA_ECALL);
  assert_int_equal(ruda_error_backend_code(e), 3);
  assert_contains(ruda_error_message(e), "ruda_graph_run (stream 1, command #1)");
  assert_contains(ruda_error_message(e), "graph of 2 commands captured on stream 0, command 2 (call gemm2)");
  assert_contains(ruda_error_message(e), "returned 3: library said no");
  ruda_error_free(err);
  assert_ok(ruda_graph_destroy(dev, g));
  test_close(dev);
}

static int noop_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static void a_call_not_capturable_is_refused_at_capture(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "noop", noop_kernel));
  atomic_store(&never_called, 0);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 64, &x));
  ruda_arg b = ruda_arg_in(ruda_bind(x));
  ruda_call_desc d = desc_of("nccl_send", never_fn, NULL, &b, 1);
  d.flags = RUDA_CALL_NOT_CAPTURABLE;
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_rc(ruda_call(dev, 0, &d), RUDA_EGRAPHSTATE);
  assert_last_error_contains("ruda_call \"nccl_send\": stream 0 is capturing a graph");
  assert_last_error_contains("RUDA_CALL_NOT_CAPTURABLE");
  /* The capture stays open and records what comes next. */
  assert_ok(test_launch(dev, 0, "noop", NULL, 0));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_int_equal(ruda_graph_length(g), 1);
  /* Outside a capture the same call runs. */
  assert_ok(ruda_call(dev, 0, &d));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&never_called), 1);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* ---- user code calling back into ruda ---- */

/* Launches add_one on its own buffer from inside the call, and issues a
 * nested call: both queue behind it on the same stream. Had the call run
 * under its buffer's issue lock (in place), the launch would wait for that
 * lock for ever. */
static int reenter_fn(const ruda_call_ctx *c, void *user) {
  ruda_handle y = *(const ruda_handle *)user;
  *(float *)ruda_call_ptr(c, 0) = 10.0f;
  ruda_arg a = ruda_arg_buffer(ruda_bind(y));
  ruda_launch_desc l = {.kernel = "add_one", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
  int rc = ruda_launch(c->dev, c->stream, &l);
  if (rc != 0) return rc;
  ruda_call_desc inner = desc_of("inner", count_fn, (void *)&call_ran, NULL, 0);
  return ruda_call(c->dev, c->stream, &inner);
}

static void the_function_may_issue_on_its_own_buffers(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "add_one", add_one_kernel));
  ruda_handle y;
  assert_ok(ruda_buffer_create(dev, 0, 8 * sizeof(float), &y));
  float zeros[8] = {0};
  test_write(dev, 0, ruda_bind(y), zeros, sizeof zeros);
  assert_ok(ruda_sync(dev, 0, NULL));
  /* In place: the stream's other commands run on the caller's thread
   * while its worker idles; a call still goes to the worker. */
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  atomic_store(&call_ran, 0);
  ruda_arg b = ruda_arg_out(ruda_bind(y));
  ruda_call_desc d = desc_of("reenter", reenter_fn, &y, &b, 1);
  assert_ok(ruda_call(dev, 0, &d));
  /* What the function queued goes behind whatever the stream held then:
   * the nested call, queued last, says when it all ran. */
  assert_true(within_ms(&call_ran, 10000));
  float got[8];
  test_read(dev, 0, ruda_bind(y), got, sizeof got);
  assert_true(got[0] == 11.0f && got[1] == 1.0f);
  /* The same from a graph replayed by ruda_graph_run, which would run in
   * place holding the graph's locks. */
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_call(dev, 0, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  atomic_store(&call_ran, 0);
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  assert_true(within_ms(&call_ran, 10000));
  test_read(dev, 0, ruda_bind(y), got, sizeof got);
  assert_true(got[0] == 11.0f && got[1] == 2.0f);
  assert_ok(ruda_graph_destroy(dev, g));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

/* RUDA_WORKER_STATS=1 counts calls as a kind of their own (and a trace's
 * own commands beside them), printed at close. */
static void worker_stats_count_calls(void **state) {
  (void)state;
  char out[] = "/tmp/ruda_call_statsXXXXXX", trace[] = "/tmp/ruda_call_traceXXXXXX";
  int fd = mkstemp(out), tfd = mkstemp(trace);
  assert_true(fd >= 0 && tfd >= 0);
  close(tfd);
  setenv("RUDA_WORKER_STATS", "1", 1);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  ruda_device *dev = test_open(1, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&never_called, 0);
  ruda_call_desc d = desc_of("k", never_fn, NULL, NULL, 0);
  assert_ok(ruda_trace_start(dev, trace));
  for (int i = 0; i < 3; i++) assert_ok(ruda_call(dev, 0, &d));
  assert_ok(ruda_trace_stop(dev));
  test_close(dev);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  unsetenv("RUDA_WORKER_STATS");
  char *s = test_slurp(out);
  const char *call = strstr(s, " call ");
  if (call == NULL || strncmp(strstr(call, "ms/"), "ms/3", 4) != 0) fail_msg("no count of 3 calls in: %s", s);
  assert_contains(s, " trace ");
  char *t = test_slurp(trace);
  assert_contains(t, "\"name\":\"k\",\"cat\":\"call\""); /* a call's span is named after the call */
  free(t);
  free(s);
  unlink(out);
  unlink(trace);
  assert_int_equal(atomic_load(&never_called), 3);
}

/* ---- per-worker library state (ruda_library_register) ---- */

/* A stand-in library that logs what ruda makes it do, in order: each
 * entry says what ran (create, call, kernel, destroy), on which worker,
 * on which thread, with which state. */
enum { EV_CREATE = 1, EV_CALL, EV_KERNEL, EV_DESTROY, MAXEV = 256 };
typedef struct lib_event {
  int what;
  uint32_t worker;
  ruda_stream_id stream;
  void *state;
  char thread[16];
} lib_event;
typedef struct lib_log {
  pthread_mutex_t lock;
  lib_event ev[MAXEV];
  int n;
  int fail_creates; /* creates left to fail */
} lib_log;
typedef struct lib_state {
  uint32_t worker; /* whose state */
  int calls;
} lib_state;

static lib_log liblog = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void log_event(int what, uint32_t worker, ruda_stream_id stream, void *state) {
  pthread_mutex_lock(&liblog.lock);
  if (liblog.n < MAXEV) {
    lib_event *e = &liblog.ev[liblog.n++];
    e->what = what;
    e->worker = worker;
    e->stream = stream;
    e->state = state;
    pthread_getname_np(pthread_self(), e->thread, sizeof e->thread);
  }
  pthread_mutex_unlock(&liblog.lock);
}

static void log_reset(void) {
  pthread_mutex_lock(&liblog.lock);
  liblog.n = 0;
  liblog.fail_creates = 0;
  pthread_mutex_unlock(&liblog.lock);
}

static int lib_create(const ruda_call_ctx *c, void *user, void **state) {
  if (user != &liblog) return 98;
  pthread_mutex_lock(&liblog.lock);
  int fail = liblog.fail_creates > 0 ? liblog.fail_creates-- : 0;
  pthread_mutex_unlock(&liblog.lock);
  if (fail) {
    snprintf(c->msg, RUDA_CALL_MSG_MAX, "no handle today");
    return 7;
  }
  lib_state *st = calloc(1, sizeof *st);
  st->worker = c->worker;
  *state = st;
  log_event(EV_CREATE, c->worker, c->stream, st);
  return 0;
}

static void lib_destroy(const ruda_call_ctx *c, void *user, void *state) {
  log_event(EV_DESTROY, user == &liblog ? c->worker : 99, c->stream, state);
  free(state);
}

static int lib_call(const ruda_call_ctx *c, void *user) {
  (void)user;
  lib_state *st = c->library;
  if (st == NULL || st->worker != c->worker) return 99; /* another worker's state */
  st->calls++;
  log_event(EV_CALL, c->worker, c->stream, st);
  return 0;
}

static int log_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)args;
  (void)c;
  log_event(EV_KERNEL, *(const uint32_t *)args[0], 0, NULL);
  return 0;
}

static uint32_t register_lib(ruda_device *dev) {
  ruda_library_desc l = {.name = "standin", .create = lib_create, .destroy = lib_destroy, .user = &liblog};
  uint32_t id = 0;
  assert_ok(ruda_library_register(dev, &l, &id));
  assert_true(id >= 1);
  return id;
}

static void a_library_state_is_made_per_lane_and_destroyed_after_its_work(void **state) {
  (void)state;
  log_reset();
  ruda_device *dev = test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "log_kernel", log_kernel));
  const uint32_t id = register_lib(dev);
  assert_int_equal(liblog.n, 0); /* nothing made at registration */
  ruda_call_desc d = {.name = "lib", .fn = lib_call, .library = id};
  /* Streams 0..5 on workers 0..3, each on a lane of its own (4 and 5 on
   * the second lanes of workers 0 and 1); worker 3 only runs kernels, so
   * it never makes a state. */
  for (int round = 0; round < 3; round++)
    for (ruda_stream_id s = 0; s < 6; s++)
      if (s % 4 != 3) assert_ok(ruda_call(dev, s, &d));
  assert_ok(ruda_sync(dev, 0, NULL));
  /* Then, unsynced, more work on each worker: close must run it all
   * before any destroy. */
  for (uint32_t w = 0; w < 4; w++) {
    if (w != 3) assert_ok(ruda_call(dev, w, &d));
    uint32_t ww = w;
    ruda_arg a = ruda_arg_scalar(&ww, sizeof ww);
    assert_ok(test_launch(dev, w, "log_kernel", &a, 1));
  }
  test_close(dev);
  /* Per stream: the state its calls saw, made on its worker before its
   * first call, destroyed once after its worker's last command. */
  void *made[6] = {0};
  int creates[4] = {0}, destroys[6] = {0}, calls[6] = {0}, kernels[4] = {0};
  for (int i = 0; i < liblog.n; i++) {
    const lib_event *e = &liblog.ev[i];
    uint32_t w = e->worker;
    assert_true(w < 4);
    char name[16];
    snprintf(name, sizeof name, "ruda-w%u", w);
    assert_string_equal(e->thread, name); /* on the worker's thread */
    switch (e->what) {
      case EV_CREATE: /* named by the call it is made for */
        assert_true(e->stream < 6 && e->stream % 4 == w);
        assert_null(made[e->stream]);
        made[e->stream] = e->state;
        creates[w]++;
        break;
      case EV_CALL:
        assert_true(e->stream < 6);
        assert_ptr_equal(e->state, made[e->stream]);
        calls[e->stream]++;
        break;
      case EV_KERNEL:
        for (int k = 0; k < 6; k++) assert_int_equal(destroys[k], 0);
        kernels[w]++;
        break;
      case EV_DESTROY: {
        assert_int_equal(e->stream, 0);
        int k = 0;
        while (k < 6 && made[k] != e->state) k++;
        assert_true(k < 6 && (uint32_t)k % 4 == w);
        destroys[k]++;
        break;
      }
      default: fail();
    }
  }
  for (uint32_t w = 0; w < 4; w++) {
    assert_int_equal(kernels[w], 1);
    assert_int_equal(creates[w], w == 3 ? 0 : w < 2 ? 2 : 1); /* one per lane used */
  }
  for (int k = 0; k < 6; k++) {
    if (k == 3) continue;
    assert_non_null(made[k]);
    assert_int_equal(destroys[k], 1);
    assert_int_equal(calls[k], k < 4 ? 4 : 3); /* 3 rounds, + 1 for streams 0..2 */
    for (int j = 0; j < k; j++) assert_true(made[j] != made[k]); /* lanes share no state */
  }
}

/* The state a call on each of streams `ids` sees, on a host device of 2
 * workers with `lanes` (0: the default) where ids[0..before) are first
 * used before the library is registered. */
static void states_seen(uint32_t lanes, const ruda_stream_id *ids, int n, int before, void **seen) {
  log_reset();
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  cfg.lanes = lanes;
  cfg.log_level = RUDA_LOG_ERROR;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&cfg, &dev));
  assert_int_equal(ruda_device_num_lanes(dev), lanes ? 2 * lanes : 4);
  unsigned char bytes[64] = {1};
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, sizeof bytes, &h));
  for (int i = 0; i < before; i++) { /* first used: a write makes the stream */
    ruda_copy_desc c = ruda_copy_contiguous(ruda_bind(h));
    assert_ok(ruda_write(dev, ids[i], &c, bytes, sizeof bytes));
  }
  const uint32_t id = register_lib(dev);
  ruda_call_desc d = {.name = "lib", .fn = lib_call, .library = id};
  for (int i = 0; i < n; i++) assert_ok(ruda_call(dev, ids[i], &d));
  for (int i = 0; i < n; i++) assert_ok(ruda_sync(dev, ids[i], NULL));
  for (int i = 0; i < n; i++) {
    seen[i] = NULL;
    for (int k = 0; k < liblog.n; k++)
      if (liblog.ev[k].what == EV_CALL && liblog.ev[k].stream == ids[i]) seen[i] = liblog.ev[k].state;
    assert_non_null(seen[i]);
  }
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void registering_a_library_spreads_later_streams_over_two_lanes(void **state) {
  (void)state;
  /* Streams 0, 2 and 4 are worker 0's; 1 and 3 worker 1's. By default a
   * worker has two lanes but spreads stream ids over them only once a
   * library is registered: 0 and 2, first used before, share lane 0; 4
   * (digit 2: lane 0) joins them, 6 (digit 3) takes lane 1. */
  const ruda_stream_id ids[] = {0, 2, 4, 6, 1, 3};
  void *seen[6];
  states_seen(0, ids, 6, 2, seen);
  assert_ptr_equal(seen[0], seen[1]);
  assert_ptr_equal(seen[0], seen[2]);
  assert_true(seen[3] != seen[0]);
  assert_true(seen[4] != seen[5]); /* worker 1: 1 (digit 0) and 3 (digit 1), both made after */
  assert_true(seen[4] != seen[0] && seen[4] != seen[3] && seen[5] != seen[0] && seen[5] != seen[3]);
  /* Lanes set explicitly are used from the start: stream 2 first used
   * before the registration is on worker 0's second lane. */
  states_seen(2, ids, 6, 2, seen);
  assert_true(seen[0] != seen[1]);
  assert_ptr_equal(seen[0], seen[2]);
  assert_ptr_equal(seen[1], seen[3]);
  /* One lane: a worker's streams share its one state. */
  states_seen(1, ids, 6, 2, seen);
  assert_ptr_equal(seen[0], seen[1]);
  assert_ptr_equal(seen[0], seen[3]);
  assert_ptr_equal(seen[4], seen[5]);
  assert_true(seen[0] != seen[4]);
}

static void a_failing_create_fails_the_call_and_is_tried_again(void **state) {
  (void)state;
  log_reset();
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  const uint32_t id = register_lib(dev);
  liblog.fail_creates = 1;
  ruda_call_desc d = {.name = "lib", .fn = lib_call, .library = id};
  assert_ok(ruda_call(dev, 1, &d));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(dev, 1, &err), RUDA_EUNHEALTHY);
  const ruda_error *e = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(e), RUDA_ECALL);
  assert_int_equal(ruda_error_backend_code(e), 7);
  assert_contains(ruda_error_message(e), "ruda_call \"lib\"");
  assert_contains(ruda_error_message(e), "library \"standin\": create returned 7 on worker 1, device stream 16: no handle today");
  ruda_error_free(err);
  assert_int_equal(liblog.n, 0); /* the function did not run */
  assert_ok(ruda_call(dev, 1, &d));
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_int_equal(liblog.n, 2);
  assert_int_equal(liblog.ev[0].what, EV_CREATE);
  assert_int_equal(liblog.ev[1].what, EV_CALL);
  test_close(dev);
  assert_int_equal(liblog.n, 3);
  assert_int_equal(liblog.ev[2].what, EV_DESTROY);
}

static int noop_create(const ruda_call_ctx *c, void *user, void **state) {
  (void)c;
  (void)user;
  *state = NULL;
  return 0;
}

static void register_refuses_bad_input(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  uint32_t id = 0;
  ruda_library_desc bad = {.name = "x"};
  assert_rc(ruda_library_register(dev, &bad, &id), RUDA_EINVAL);
  assert_last_error_contains("create is NULL");
  ruda_library_desc r = {.create = noop_create, .reserved = {0, 1}};
  assert_rc(ruda_library_register(dev, &r, &id), RUDA_EINVAL);
  assert_last_error_contains("reserved[1] is not zero");
  assert_rc(ruda_library_register(NULL, &r, &id), RUDA_EINVAL);
  assert_rc(ruda_library_register(dev, NULL, &id), RUDA_EINVAL);
  ruda_call_desc d = {.name = "lib", .fn = never_fn, .library = 1};
  assert_rc(ruda_call(dev, 0, &d), RUDA_EINVAL); /* nothing registered yet */
  assert_last_error_contains("library 1 is not registered");
  ruda_library_desc ok = {.create = noop_create}; /* destroy may be NULL */
  for (uint32_t i = 1; i <= RUDA_LIBRARY_MAX; i++) {
    assert_ok(ruda_library_register(dev, &ok, &id));
    assert_int_equal(id, i);
  }
  assert_rc(ruda_library_register(dev, &ok, &id), RUDA_EINVAL);
  assert_last_error_contains("at most 16");
  atomic_store(&never_called, 0);
  d.library = RUDA_LIBRARY_MAX;
  assert_ok(ruda_call(dev, 0, &d));
  d.library = RUDA_LIBRARY_MAX + 1;
  assert_rc(ruda_call(dev, 0, &d), RUDA_EINVAL);
  d.library = (1ull << 32) + 1; /* not cut to 1 */
  assert_rc(ruda_call(dev, 0, &d), RUDA_EINVAL);
  assert_last_error_contains("library 4294967297 is not registered");
  d.library = 0;
  d.reserved[2] = 1;
  assert_rc(ruda_call(dev, 0, &d), RUDA_EINVAL);
  assert_last_error_contains("reserved[2] is not zero");
  test_close(dev);
  assert_int_equal(atomic_load(&never_called), 1);
}

/* ---- where the function runs ---- */

static _Thread_local int is_issuer;
static _Atomic int inside[4], overlapped, on_worker, on_issuer, elsewhere;

/* Notes where it runs and whether another call held its worker. */
static int where_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if (atomic_fetch_add(&inside[c->worker], 1) != 0) atomic_store(&overlapped, 1);
  char name[16], want[16];
  pthread_getname_np(pthread_self(), name, sizeof name);
  snprintf(want, sizeof want, "ruda-w%u", c->worker);
  if (strcmp(name, want) == 0) atomic_fetch_add(&on_worker, 1);
  else if (is_issuer) atomic_fetch_add(&on_issuer, 1);
  else atomic_fetch_add(&elsewhere, 1);
  for (volatile int i = 0; i < 2000; i++) {
  }
  atomic_fetch_sub(&inside[c->worker], 1);
  return 0;
}

typedef struct where_arg {
  ruda_device *dev;
  ruda_stream_id stream;
  ruda_graph *g;
} where_arg;

static void *where_thread(void *p) {
  where_arg *a = p;
  is_issuer = 1;
  ruda_call_desc d = desc_of("where", where_fn, NULL, NULL, 0);
  for (int i = 0; i < 200; i++) {
    if (ruda_call(a->dev, a->stream, &d) != 0) atomic_fetch_add(&elsewhere, 1000);
    if (i % 4 == 0 && ruda_graph_run(a->dev, a->stream, a->g, NULL) != 0) atomic_fetch_add(&elsewhere, 1000);
  }
  return NULL;
}

static void the_function_runs_holding_its_worker_on_the_worker_or_the_issuer(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&overlapped, 0);
  atomic_store(&on_worker, 0);
  atomic_store(&on_issuer, 0);
  atomic_store(&elsewhere, 0);
  /* Idle worker, in place: a ruda_graph_run and an in-place call run on
   * the calling thread. The worker is seen asleep first. */
  assert_ok(ruda_stream_set_in_place(dev, 0, 1));
  ruda_call_desc d = desc_of("where", where_fn, NULL, NULL, 0);
  assert_ok(ruda_graph_begin_capture(dev, 0));
  assert_ok(ruda_call(dev, 0, &d));
  ruda_graph *g = NULL;
  assert_ok(ruda_graph_end_capture(dev, 0, &g));
  assert_ok(ruda_sync(dev, 0, NULL));
  pid_t w0 = test_thread_named("ruda-w0");
  assert_true(w0 != 0);
  is_issuer = 1;
  test_wait_blocked(w0);
  assert_ok(ruda_graph_run(dev, 0, g, NULL));
  assert_int_equal(atomic_load(&on_issuer), 1);
  test_wait_blocked(w0);
  assert_ok(ruda_call(dev, 0, &d));
  assert_int_equal(atomic_load(&on_issuer), 2);
  /* A stream not in place: on the worker. */
  assert_ok(ruda_call(dev, 1, &d));
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_int_equal(atomic_load(&on_worker), 1);
  /* Four threads on streams 0, 2, 4 (in place) and 6 share worker 0:
   * wherever each call runs, it holds the worker alone. */
  for (ruda_stream_id s = 2; s <= 4; s += 2) assert_ok(ruda_stream_set_in_place(dev, s, 1));
  where_arg a[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (where_arg){dev, (ruda_stream_id)(2 * i), g};
    assert_int_equal(pthread_create(&t[i], NULL, where_thread, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) assert_ok(ruda_sync(dev, (ruda_stream_id)(2 * i), NULL));
  assert_int_equal(atomic_load(&overlapped), 0);
  assert_int_equal(atomic_load(&elsewhere), 0);
  assert_int_equal(atomic_load(&on_worker) + atomic_load(&on_issuer), 3 + 4 * 250);
  assert_ok(ruda_graph_destroy(dev, g));
  test_close(dev);
}

/* ---- ctx->data's alignment ---- */

static _Atomic int misaligned, data_wrong, data_calls;

static int data_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if ((uintptr_t)c->data % RUDA_CALL_DATA_ALIGN != 0) atomic_store(&misaligned, 1);
  const unsigned char *b = c->data;
  for (uint32_t i = 0; i < c->data_size; i++)
    if (b[i] != (unsigned char)(c->data_size + i)) atomic_store(&data_wrong, 1);
  atomic_fetch_add(&data_calls, 1);
  return 0;
}

static void data_is_aligned_for_any_type(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 64, &x));
  ruda_arg bufs[3] = {ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(x)), ruda_arg_in(ruda_bind(x))};
  unsigned char data[48];
  atomic_store(&misaligned, 0);
  atomic_store(&data_wrong, 0);
  atomic_store(&data_calls, 0);
  int n = 0;
  /* Every buffer count (the arrays before the data differ) and sizes
   * around the alignment, issued and recorded. */
  for (int rec = 0; rec < 2; rec++) {
    if (rec) assert_ok(ruda_graph_begin_capture(dev, 0));
    for (uint32_t nb = 0; nb <= 3; nb++)
      for (uint32_t size = 1; size <= sizeof data; size += 3) {
        for (uint32_t i = 0; i < size; i++) data[i] = (unsigned char)(size + i);
        ruda_call_desc d = desc_of("data", data_fn, NULL, bufs, nb);
        d.data = data;
        d.data_size = size;
        assert_ok(ruda_call(dev, 0, &d));
        n++;
      }
    if (rec) {
      ruda_graph *g = NULL;
      assert_ok(ruda_graph_end_capture(dev, 0, &g));
      assert_ok(ruda_graph_run(dev, 0, g, NULL));
      assert_ok(ruda_graph_destroy(dev, g));
    }
  }
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&data_calls), n);
  assert_int_equal(atomic_load(&misaligned), 0);
  assert_int_equal(atomic_load(&data_wrong), 0);
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(runs_in_stream_order_with_its_buffers),
      cmocka_unit_test(call_follows_a_writer_on_another_stream),
      cmocka_unit_test(readers_on_other_streams_follow_a_call_that_writes),
      cmocka_unit_test(call_that_writes_waits_for_readers_on_other_streams),
      cmocka_unit_test(calls_reading_one_buffer_run_at_once),
      cmocka_unit_test(a_failure_is_an_error_on_its_stream),
      cmocka_unit_test(bad_inputs_are_refused_at_the_call),
      cmocka_unit_test(a_full_queue_refuses_the_call),
      cmocka_unit_test(capture_records_a_call_and_replays_run_it),
      cmocka_unit_test(a_failing_recorded_call_names_the_graph_and_the_call),
      cmocka_unit_test(a_call_not_capturable_is_refused_at_capture),
      cmocka_unit_test(the_function_may_issue_on_its_own_buffers),
      cmocka_unit_test(worker_stats_count_calls),
      cmocka_unit_test(a_library_state_is_made_per_lane_and_destroyed_after_its_work),
      cmocka_unit_test(registering_a_library_spreads_later_streams_over_two_lanes),
      cmocka_unit_test(a_failing_create_fails_the_call_and_is_tried_again),
      cmocka_unit_test(register_refuses_bad_input),
      cmocka_unit_test(the_function_runs_holding_its_worker_on_the_worker_or_the_issuer),
      cmocka_unit_test(data_is_aligned_for_any_type),
  };
  return test_main("call", tests, sizeof tests / sizeof tests[0], argc, argv);
}

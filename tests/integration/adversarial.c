/* adversarial.c - calls made to break the concurrency core: handles freed
 * while other threads use them, tiny queue bounds with cross-stream
 * dependencies, close with much still queued, futures polled while
 * waited, flushes racing on one stream, malformed descriptors. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "common.h"

/* Adds 1 to the u64 at args[0]. */
static int inc_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (*(uint64_t *)args[0])++;
  return 0;
}

static int fail_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EINVAL;
}

static int nop_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static uint64_t pack(ruda_handle h) { return (uint64_t)h.slot << 32 | h.gen; }
static ruda_handle unpack(uint64_t v) { return (ruda_handle){(uint32_t)(v >> 32), (uint32_t)v}; }

static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

/* ---- stale handles used while they are freed ---- */

enum { SHARED = 16 };

typedef struct churn {
  ruda_device *dev;
  _Atomic uint64_t *shared;
  int index, iters;
  ruda_handle own; /* this thread's private buffer */
  uint64_t *sink;  /* one slot per iteration: reads may be detached */
  int bad; /* a return code that must not happen */
  int bad_call;
} churn;

static void note_bad(churn *c, int call, int rc) {
  if (c->bad == 0) {
    c->bad = rc ? rc : -1000;
    c->bad_call = call;
  }
}

/* Reads args[0]'s first word. */
static _Atomic uint64_t peeked;
static int peek_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  atomic_fetch_add_explicit(&peeked, *(const uint64_t *)args[0], memory_order_relaxed);
  return 0;
}

/* Creates buffers, writes them once and publishes them where the others
 * grab them; the others only read them (so they race with nothing but
 * the runtime) while any thread may free them. A use of a grabbed handle
 * must succeed or fail with RUDA_ENOTFOUND (RUDA_EFREE for a free),
 * nothing else; and memory must not be reused (written by the next
 * buffer's first write) before every queued read of it ran, which TSan
 * and ASan watch. */
static void *churn_main(void *p) {
  churn *c = p;
  uint32_t seed = 0x9e3779b9u * (uint32_t)(c->index + 1);
  for (int i = 0; i < c->iters; i++) {
    ruda_stream_id s = rnd(&seed) % 6;
    uint32_t k = rnd(&seed) % SHARED;
    ruda_handle g = unpack(atomic_load(&c->shared[k]));
    switch (rnd(&seed) % 6) {
      case 0: { /* create, write, publish; free what was there */
        ruda_handle h;
        int rc = ruda_buffer_create(c->dev, s, 64 + rnd(&seed) % 4096, &h);
        if (rc != 0) {
          note_bad(c, 0, rc);
          break;
        }
        uint64_t v[8] = {(uint64_t)i, 1, 2, 3, 4, 5, 6, 7};
        ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, 0, sizeof v));
        if ((rc = ruda_write(c->dev, rnd(&seed) % 6, &d, v, sizeof v)) != 0) note_bad(c, 1, rc);
        uint64_t old = atomic_exchange(&c->shared[k], pack(h));
        if (old != 0) {
          rc = ruda_buffer_free(c->dev, rnd(&seed) % 6, unpack(old));
          if (rc != 0 && rc != RUDA_EFREE) note_bad(c, 2, rc);
        }
        break;
      }
      case 1: { /* a kernel reading a maybe-stale buffer */
        ruda_arg a = ruda_arg_buffer(ruda_bind_range(g, 0, 8));
        int rc = test_launch(c->dev, s, "peek", &a, 1);
        if (rc != 0 && rc != RUDA_ENOTFOUND) note_bad(c, 3, rc);
        break;
      }
      case 2: { /* read it back, waited or detached */
        ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(g, 8, 8));
        ruda_future *f = NULL;
        int rc = ruda_read(c->dev, s, &d, &c->sink[i], 8, &f);
        if (rc != 0 && rc != RUDA_ENOTFOUND) note_bad(c, 4, rc);
        if (rc == 0 && (rnd(&seed) & 1)) {
          if ((rc = ruda_future_wait(f, NULL)) != 0) note_bad(c, 5, rc);
          if (c->sink[i] != 1) note_bad(c, 6, 0); /* the buffer's own bytes */
        }
        ruda_future_free(f);
        break;
      }
      case 3: { /* copy it into the thread's own buffer */
        int rc = ruda_copy(c->dev, s, ruda_bind_range(c->own, 0, 32), ruda_bind_range(g, 32, 32));
        if (rc != 0 && rc != RUDA_ENOTFOUND) note_bad(c, 7, rc);
        break;
      }
      case 4: { /* size of a maybe-stale handle */
        uint64_t size = 0;
        int rc = ruda_buffer_size(c->dev, g, &size);
        if (rc != 0 && rc != RUDA_ENOTFOUND) note_bad(c, 8, rc);
        if (rc == 0 && (size < 64 || size >= 64 + 4096)) note_bad(c, 9, 0);
        break;
      }
      case 5: { /* free it (another free may race with this one) */
        int rc = ruda_buffer_free(c->dev, s, g);
        if (rc != 0 && rc != RUDA_EFREE) note_bad(c, 10, rc);
        break;
      }
    }
  }
  return NULL;
}

static void stale_handles_while_freed(void **state) {
  (void)state;
  ruda_device *dev = test_open(3, 64, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "peek", peek_kernel));
  static _Atomic uint64_t shared[SHARED];
  for (int i = 0; i < SHARED; i++) {
    ruda_handle h;
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)i, 4096, &h));
    uint64_t v[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    test_write(dev, (ruda_stream_id)i, ruda_bind_range(h, 0, sizeof v), v, sizeof v);
    atomic_store(&shared[i], pack(h));
  }
  enum { T = 4, ITERS = 6000 };
  churn c[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    c[i] = (churn){dev, shared, i, ITERS, {0, 0}, calloc(ITERS, sizeof(uint64_t)), 0, 0};
    assert_non_null(c[i].sink);
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)i, 64, &c[i].own));
    assert_int_equal(pthread_create(&t[i], NULL, churn_main, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++)
    if (c[i].bad != 0) fail_msg("thread %d call %d returned %s", i, c[i].bad_call, ruda_err_name(c[i].bad));
  /* Free the survivors (some were freed already). */
  for (int i = 0; i < SHARED; i++) {
    int rc = ruda_buffer_free(dev, 0, unpack(shared[i]));
    if (rc != 0) assert_int_equal(rc, RUDA_EFREE);
  }
  for (ruda_stream_id s = 0; s < 6; s++) assert_ok(ruda_flush(dev, s, NULL));
  test_close(dev);
  for (int i = 0; i < T; i++) free(c[i].sink);
}

/* ---- tiny bounds and cross-stream chains ---- */

typedef struct bouncer {
  ruda_device *dev;
  ruda_handle h;
  int index, n, nstreams;
  int rc;
} bouncer;

/* Increments one counter, each time on another stream: every increment
 * must follow the one before (cross-stream ordering), whatever the bound. */
static void *bounce_main(void *p) {
  bouncer *b = p;
  ruda_arg a = ruda_arg_buffer(ruda_bind_range(b->h, 0, 8));
  for (int i = 0; i < b->n && b->rc == 0; i++)
    b->rc = test_launch(b->dev, (ruda_stream_id)((b->index + i) % b->nstreams), "inc", &a, 1);
  return NULL;
}

static void bounce(uint32_t workers, uint32_t bound, int nstreams) {
  ruda_device *dev = test_open(workers, bound, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "inc", inc_kernel));
  enum { T = 4, N = 1500 };
  bouncer b[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    b[i] = (bouncer){dev, {0, 0}, i, N, nstreams, 0};
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)i, 8, &b[i].h));
    uint64_t zero = 0;
    test_write(dev, (ruda_stream_id)i, ruda_bind(b[i].h), &zero, 8);
  }
  for (int i = 0; i < T; i++) assert_int_equal(pthread_create(&t[i], NULL, bounce_main, &b[i]), 0);
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) {
    if (b[i].rc != 0) fail_msg("bouncer %d: %s", i, ruda_err_name(b[i].rc));
    uint64_t v = 0;
    test_read(dev, 7, ruda_bind(b[i].h), &v, 8);
    assert_int_equal(v, N);
    assert_ok(ruda_buffer_free(dev, 0, b[i].h));
  }
  test_close(dev);
}

static void bound_one_cross_stream(void **state) {
  (void)state;
  bounce(2, 1, 5);
}

static void bound_two_many_streams_few_workers(void **state) {
  (void)state;
  bounce(3, 2, 11);
}

/* ---- close with everything still queued ---- */

static _Atomic int slow_calls;
static int slow_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  atomic_fetch_add(&slow_calls, 1);
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
  (*(uint64_t *)args[0])++;
  return 0;
}

static void close_with_cross_stream_work_queued(void **state) {
  (void)state;
  for (int round = 0; round < 4; round++) {
    ruda_device *dev = test_open(4, 1u << 16, RUDA_BACKPRESSURE_BLOCK);
    assert_ok(ruda_host_kernel_register(dev, "slow", slow_kernel));
    assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
    atomic_store(&slow_calls, 0);
    enum { B = 8, N = 200 };
    ruda_handle h[B];
    static uint64_t sink[B][4];
    for (int i = 0; i < B; i++) assert_ok(ruda_buffer_create(dev, (ruda_stream_id)i, 64, &h[i]));
    int launches = 0, failures = 0;
    for (int i = 0; i < N; i++) {
      int b = i % B;
      ruda_arg a = ruda_arg_buffer(ruda_bind_range(h[b], 0, 8));
      assert_ok(test_launch(dev, (ruda_stream_id)(i % 7), "slow", &a, 1)); /* MARK/WAIT pairs */
      launches++;
      if (i % 37 == 0) {
        assert_ok(test_launch(dev, (ruda_stream_id)(i % 5), "fail", NULL, 0));
        failures++;
      }
      if (i % 11 == 0) { /* a read whose future is dropped at once */
        ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h[b], 0, 32));
        ruda_future *f = NULL;
        assert_ok(ruda_read(dev, (ruda_stream_id)(i % 3), &d, sink[b], 32, &f));
        ruda_future_free(f);
      }
      if (i % 13 == 0) { /* a sync whose future is dropped */
        ruda_future *f = NULL;
        assert_ok(ruda_sync_async(dev, (ruda_stream_id)(i % 9), &f));
        ruda_future_free(f);
      }
      if (i % 17 == 0) { /* freed with uses queued */
        assert_ok(ruda_buffer_free(dev, (ruda_stream_id)(i % 4), h[b]));
        assert_ok(ruda_buffer_create(dev, (ruda_stream_id)(i % 6), 64, &h[b]));
      }
    }
    ruda_error *errs = NULL;
    assert_int_equal(ruda_device_close(dev, &errs), RUDA_EUNHEALTHY);
    /* Every queued launch ran; every failure is reported. */
    assert_int_equal(atomic_load(&slow_calls), launches);
    int n = 0;
    for (const ruda_error *s = errs; s != NULL; s = ruda_error_next(s))
      for (const ruda_error *e = ruda_error_cause(s); e != NULL; e = ruda_error_next(e)) n++;
    assert_int_equal(n, failures);
    ruda_error_free(errs);
  }
}

/* ---- futures polled while another thread waits ---- */

typedef struct poller {
  ruda_future *f;
  _Atomic int stop;
  long polls;
} poller;

static void *poll_main(void *p) {
  poller *q = p;
  while (!atomic_load(&q->stop)) {
    int r = ruda_future_poll(q->f);
    if (r != 0 && r != 1) q->polls = -1000000;
    q->polls++;
  }
  return NULL;
}

static void future_polled_while_waited(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "slow", slow_kernel));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  uint64_t zero = 0;
  test_write(dev, 0, ruda_bind_range(h, 0, 8), &zero, 8);
  ruda_arg a = ruda_arg_buffer(ruda_bind_range(h, 0, 8));
  for (int i = 0; i < 300; i++) {
    assert_ok(test_launch(dev, 0, "slow", &a, 1));
    ruda_future *f = NULL;
    uint64_t v = 0;
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, 0, 8));
    if (i % 2) assert_ok(ruda_read(dev, 0, &d, &v, 8, &f));
    else assert_ok(ruda_sync_async(dev, 0, &f));
    poller q = {f, 0, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, poll_main, &q), 0);
    assert_ok(ruda_future_wait(f, NULL));
    assert_ok(ruda_future_wait(f, NULL)); /* twice: same result */
    atomic_store(&q.stop, 1);
    pthread_join(t, NULL);
    assert_true(q.polls >= 0);
    assert_int_equal(ruda_future_poll(f), 1);
    ruda_future_free(f);
    if (i % 2) assert_int_equal(v, (uint64_t)i + 1);
  }
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* ---- flushes racing on one stream, errors counted once ---- */

typedef struct flusher {
  ruda_device *dev;
  int launches, failures, seen, rc;
} flusher;

static void *flush_main(void *p) {
  flusher *f = p;
  for (int i = 0; i < f->launches; i++) {
    int fail = i % 5 == 0;
    int rc = test_launch(f->dev, 0, fail ? "fail" : "nop", NULL, 0);
    if (rc != 0) {
      f->rc = rc;
      return NULL;
    }
    f->failures += fail;
    if (i % 7 == 0) {
      ruda_error *e = NULL;
      rc = ruda_flush(f->dev, 0, &e);
      if (rc == RUDA_EUNHEALTHY) {
        for (const ruda_error *c = ruda_error_cause(e); c != NULL; c = ruda_error_next(c)) f->seen++;
      } else if (rc != 0) {
        f->rc = rc;
      }
      ruda_error_free(e);
    }
  }
  return NULL;
}

static void flush_from_many_threads_one_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 8, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
  assert_ok(ruda_host_kernel_register(dev, "nop", nop_kernel));
  enum { T = 4 };
  flusher f[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    f[i] = (flusher){dev, 2000, 0, 0, 0};
    assert_int_equal(pthread_create(&t[i], NULL, flush_main, &f[i]), 0);
  }
  int failures = 0, seen = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(f[i].rc, 0);
    failures += f[i].failures;
    seen += f[i].seen;
  }
  ruda_error *e = NULL;
  if (ruda_flush(dev, 0, &e) == RUDA_EUNHEALTHY)
    for (const ruda_error *c = ruda_error_cause(e); c != NULL; c = ruda_error_next(c)) seen++;
  ruda_error_free(e);
  assert_int_equal(seen, failures);
  test_close(dev);
}

/* ---- malformed input ---- */

static void malformed_descriptors_and_handles(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "inc", inc_kernel));
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 256, &h));
  uint64_t size = 0;
  unsigned char buf[512];
  ruda_future *f = NULL;

  /* Handles that never existed, or are stale. */
  ruda_handle bogus[] = {{0, 0}, {UINT32_MAX, 1}, {UINT32_MAX, UINT32_MAX}, {h.slot, h.gen + 1},
                         {h.slot, h.gen | 0x80000000u}, {h.slot + 1, 1}, {4096u * 1024u, 1}};
  for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; i++) {
    assert_rc(ruda_buffer_size(dev, bogus[i], &size), RUDA_ENOTFOUND);
    ruda_arg a = ruda_arg_buffer(ruda_bind(bogus[i]));
    assert_rc(test_launch(dev, 0, "inc", &a, 1), RUDA_ENOTFOUND);
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(bogus[i]));
    assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_ENOTFOUND);
    assert_rc(ruda_read(dev, 0, &d, buf, 8, &f), RUDA_ENOTFOUND);
    assert_null(f);
    assert_rc(ruda_copy(dev, 0, ruda_bind(h), ruda_bind(bogus[i])), RUDA_ENOTFOUND);
    assert_rc(ruda_copy(dev, 0, ruda_bind(bogus[i]), ruda_bind(h)), RUDA_ENOTFOUND);
  }

  /* Ranges that overflow. */
  ruda_binding ranges[] = {ruda_bind_range(h, UINT64_MAX, 1), ruda_bind_range(h, 1, UINT64_MAX),
                           ruda_bind_range(h, UINT64_MAX, UINT64_MAX), ruda_bind_range(h, 256, 0),
                           ruda_bind_range(h, 255, 2), ruda_bind_range(h, 0, 257)};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    ruda_arg a = ruda_arg_buffer(ranges[i]);
    assert_rc(test_launch(dev, 0, "inc", &a, 1), RUDA_ERANGE);
    ruda_copy_desc d = ruda_copy_contiguous(ranges[i]);
    assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_ERANGE);
    assert_rc(ruda_read(dev, 0, &d, buf, 8, &f), RUDA_ERANGE);
    assert_rc(ruda_copy(dev, 0, ruda_bind(h), ranges[i]), RUDA_ERANGE);
  }

  /* Descriptors: rank past the maximum, elem_size 0, shape 0, huge
   * shapes and strides. */
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  d.rank = RUDA_MAX_RANK + 1;
  d.elem_size = 1;
  assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_EINVAL);
  d.rank = UINT32_MAX;
  assert_rc(ruda_read(dev, 0, &d, buf, 8, &f), RUDA_EINVAL);
  d = ruda_copy_contiguous(ruda_bind(h));
  d.rank = 1;
  d.shape[0] = 8;
  d.strides[0] = 1;
  d.elem_size = 0;
  assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_EINVAL);
  d.elem_size = 1;
  d.shape[0] = 0;
  assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_EINVAL);
  d.rank = 2;
  d.shape[0] = UINT64_MAX;
  d.shape[1] = 2;
  d.strides[0] = 1;
  d.strides[1] = 1;
  assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_ERANGE);
  d.shape[0] = 2;
  d.strides[0] = UINT64_MAX;
  assert_rc(ruda_write(dev, 0, &d, buf, 4), RUDA_ERANGE);
  d.strides[0] = UINT64_MAX / 2;
  assert_rc(ruda_read(dev, 0, &d, buf, 4, &f), RUDA_ERANGE);
  d.strides[0] = 2;
  d.elem_size = UINT32_MAX;
  assert_rc(ruda_read(dev, 0, &d, buf, 4, &f), RUDA_ERANGE);
  /* All of rank 8, each dim 2^8, elem 1: 2^64 elements overflow. */
  d = ruda_copy_contiguous(ruda_bind(h));
  d.rank = RUDA_MAX_RANK;
  d.elem_size = 1;
  for (int i = 0; i < RUDA_MAX_RANK; i++) d.shape[i] = 256, d.strides[i] = 0;
  assert_rc(ruda_write(dev, 0, &d, buf, 8), RUDA_ERANGE);
  /* Length mismatch: 1 byte vs 8. */
  d = ruda_copy_contiguous(ruda_bind_range(h, 0, 8));
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_EINVAL);
  assert_rc(ruda_write(dev, 0, &d, buf, 0), RUDA_EINVAL);
  assert_rc(ruda_read(dev, 0, &d, buf, SIZE_MAX, &f), RUDA_EINVAL);
  assert_null(f);

  /* Launch descriptors. */
  ruda_arg many[RUDA_MAX_ARGS + 1];
  for (int i = 0; i <= RUDA_MAX_ARGS; i++) many[i] = ruda_arg_buffer(ruda_bind(h));
  assert_rc(test_launch(dev, 0, "inc", many, RUDA_MAX_ARGS + 1), RUDA_EINVAL);
  assert_ok(test_launch(dev, 0, "inc", many, RUDA_MAX_ARGS)); /* 64 pins of one buffer */
  uint64_t x = 0;
  ruda_arg sc = ruda_arg_scalar(&x, RUDA_MAX_SCALAR_BYTES + 1);
  assert_rc(test_launch(dev, 0, "inc", &sc, 1), RUDA_EINVAL);
  sc = ruda_arg_scalar(NULL, 8);
  assert_rc(test_launch(dev, 0, "inc", &sc, 1), RUDA_EINVAL);
  ruda_arg odd = ruda_arg_buffer(ruda_bind(h));
  odd.kind = (ruda_arg_kind)7;
  assert_rc(test_launch(dev, 0, "inc", &odd, 1), RUDA_EINVAL);
  assert_rc(test_launch(dev, RUDA_STREAM_EXPLICIT_MAX + 1, "inc", many, 1), RUDA_EINVAL);
  ruda_handle h2;
  assert_rc(ruda_buffer_create(dev, 0, UINT64_MAX, &h2), RUDA_EBUFFERTOOBIG);
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_ok(ruda_buffer_size(dev, h, &size));
  assert_int_equal(size, 256);
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_EFREE);
  assert_rc(ruda_buffer_size(dev, h, &size), RUDA_ENOTFOUND);
  test_close(dev);
}

/* ---- indirect grids beyond the limits ---- */

static _Atomic uint64_t blocks_run;
static int count_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&blocks_run, 1);
  return 0;
}

static void indirect_grid_checked_at_run_time(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "count", count_kernel));
  atomic_store(&blocks_run, 0);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  /* At an odd offset: the host reads it without aligned loads. */
  uint32_t ok[3] = {2, 3, 1}, big[3] = {1, 70000, 1}, huge[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "count";
  l.block = (ruda_dim3){1, 1, 1};
  l.flags = RUDA_LAUNCH_INDIRECT;
  l.indirect_grid = ruda_bind_range(h, 1, 12);
  test_write(dev, 0, ruda_bind_range(h, 1, 12), ok, 12);
  assert_ok(ruda_launch(dev, 0, &l));
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&blocks_run), 6);
  const uint32_t *bad[] = {big, huge};
  for (int i = 0; i < 2; i++) {
    test_write(dev, 0, ruda_bind_range(h, 1, 12), bad[i], 12);
    assert_ok(ruda_launch(dev, 0, &l));
    ruda_error *e = NULL;
    assert_int_equal(ruda_flush(dev, 0, &e), RUDA_EUNHEALTHY);
    assert_int_equal(ruda_error_code(ruda_error_cause(e)), RUDA_EGRIDDIM);
    assert_contains(ruda_error_message(ruda_error_cause(e)), "exceeds maximum");
    ruda_error_free(e);
  }
  assert_int_equal(atomic_load(&blocks_run), 6);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* ---- device pointers of dry-run buffers ---- */

static void device_ptr_of_a_dry_run_buffer(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  ruda_handle h;
  assert_ok(ruda_memory_dry_run_begin(dev, 0));
  assert_ok(ruda_buffer_create(dev, 0, 4096, &h));
  assert_ok(ruda_memory_dry_run_end(dev, 0));
  /* Never used yet: the pointer must be real memory, backed now. */
  uint64_t addr = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind_range(h, 16, 64), &addr));
  assert_int_equal(addr >> 63, 0);
  assert_true(addr != 0);
  /* And the memory commands use (the host backend's pointers are CPU
   * addresses). */
  unsigned char v[64];
  for (int i = 0; i < 64; i++) v[i] = (unsigned char)(i * 3 + 1);
  test_write(dev, 0, ruda_bind_range(h, 16, 64), v, 64);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_memory_equal((const void *)(uintptr_t)addr, v, 64);
  uint64_t again = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind_range(h, 16, 64), &again));
  assert_int_equal(again, addr);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stale_handles_while_freed),
      cmocka_unit_test(bound_one_cross_stream),
      cmocka_unit_test(bound_two_many_streams_few_workers),
      cmocka_unit_test(close_with_cross_stream_work_queued),
      cmocka_unit_test(future_polled_while_waited),
      cmocka_unit_test(flush_from_many_threads_one_stream),
      cmocka_unit_test(malformed_descriptors_and_handles),
      cmocka_unit_test(indirect_grid_checked_at_run_time),
      cmocka_unit_test(device_ptr_of_a_dry_run_buffer),
  };
  return test_main("integration_adversarial", tests, sizeof tests / sizeof tests[0], argc, argv);
}

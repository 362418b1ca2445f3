/* semantics.c - what flush, sync, sync_async and read futures promise.
 *
 * A "gate" kernel blocks its worker until the test opens it, so the test
 * decides exactly which commands have run. (That submission and
 * completion differ is tested in unit/backend_faults.c, with a backend
 * whose events complete when the test says.) */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static _Atomic int gate_open;
static _Atomic uint64_t incs;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(200);
  return 0;
}

static int inc_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&incs, 1);
  return 0;
}

static ruda_device *open_gated(uint32_t streams) {
  ruda_device *dev = test_open(streams, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&gate_open, 0);
  atomic_store(&incs, 0);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "inc", inc_kernel));
  return dev;
}

static void incs_on(ruda_device *dev, ruda_stream_id s, int n) {
  for (int i = 0; i < n; i++) assert_ok(test_launch(dev, s, "inc", NULL, 0));
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void flush_and_sync_cover_earlier_commands(void **state) {
  (void)state;
  ruda_device *dev = open_gated(2);
  incs_on(dev, 0, 1000);
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), 1000);
  incs_on(dev, 0, 500);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), 1500);
  /* Across streams: each sync covers its own stream. */
  for (ruda_stream_id s = 0; s < 6; s++) incs_on(dev, s, 100);
  for (ruda_stream_id s = 0; s < 6; s++) assert_ok(ruda_sync(dev, s, NULL));
  assert_int_equal(atomic_load(&incs), 2100);
  test_close(dev);
}

typedef struct flusher {
  ruda_device *dev;
  ruda_stream_id stream;
  int sync;
  _Atomic int done;
  int rc;
} flusher;

static void *flush_thread(void *p) {
  flusher *f = p;
  f->rc = f->sync ? ruda_sync(f->dev, f->stream, NULL) : ruda_flush(f->dev, f->stream, NULL);
  atomic_store(&f->done, 1);
  return NULL;
}

static void flush_waits_for_the_worker(void **state) {
  (void)state;
  ruda_device *dev = open_gated(2);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  incs_on(dev, 0, 10);
  flusher fl = {.dev = dev, .stream = 0, .sync = 0}, sy = {.dev = dev, .stream = 0, .sync = 1};
  pthread_t t1, t2;
  assert_int_equal(pthread_create(&t1, NULL, flush_thread, &fl), 0);
  assert_int_equal(pthread_create(&t2, NULL, flush_thread, &sy), 0);
  /* The gate holds the worker: neither may return, however long we wait. */
  sleep_ms(100);
  assert_int_equal(atomic_load(&fl.done), 0);
  assert_int_equal(atomic_load(&sy.done), 0);
  /* Meanwhile another stream on another worker flushes freely. */
  incs_on(dev, 1, 5);
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_int_equal(atomic_load(&incs), 5);
  atomic_store(&gate_open, 1);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  assert_int_equal(fl.rc, 0);
  assert_int_equal(sy.rc, 0);
  assert_int_equal(atomic_load(&incs), 15);
  test_close(dev);
}

static void sync_async_covers_only_earlier_commands(void **state) {
  (void)state;
  ruda_device *dev = open_gated(1);
  incs_on(dev, 0, 100);
  ruda_future *f = NULL;
  assert_ok(ruda_sync_async(dev, 0, &f));
  assert_non_null(f);
  /* Work enqueued after the sync_async does not hold its future back. */
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  incs_on(dev, 0, 7);
  assert_rc(ruda_future_wait(f, NULL), 0);
  assert_int_equal(atomic_load(&incs), 100);
  assert_int_equal(ruda_future_poll(f), 1);
  ruda_future_free(f);
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), 107);
  test_close(dev);
}

static void sync_async_poll_and_wait(void **state) {
  (void)state;
  ruda_device *dev = open_gated(1);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  incs_on(dev, 0, 3);
  ruda_future *f = NULL;
  assert_ok(ruda_sync_async(dev, 0, &f));
  /* Behind a closed gate the future cannot complete. */
  for (int i = 0; i < 20; i++) {
    assert_int_equal(ruda_future_poll(f), 0);
    sleep_ms(2);
  }
  atomic_store(&gate_open, 1);
  int polls = 0;
  while (ruda_future_poll(f) == 0) {
    assert_true(++polls < 10000); /* 10 s: it must complete */
    sleep_ms(1);
  }
  assert_int_equal(atomic_load(&incs), 3);
  ruda_error *err = (ruda_error *)&err;
  assert_rc(ruda_future_wait(f, &err), 0);
  assert_null(err);
  assert_rc(ruda_future_wait(f, &err), 0); /* waiting twice is fine */
  assert_int_equal(ruda_future_poll(f), 1);
  ruda_future_free(f);
  test_close(dev);
}

static void read_future_returns_the_data(void **state) {
  (void)state;
  ruda_device *dev = open_gated(2);
  enum { N = 1000 };
  int32_t src[N], dst[N];
  for (int i = 0; i < N; i++) src[i] = i * 7 - 3000, dst[i] = -1;
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, sizeof src, &h));
  test_write(dev, 0, ruda_bind(h), src, sizeof src);
  /* The source may change right after ruda_write returns. */
  memset(src + 500, 0, 100 * sizeof src[0]);
  int32_t expect[N];
  for (int i = 0; i < N; i++) expect[i] = i * 7 - 3000;

  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, dst, sizeof dst, &f));
  sleep_ms(20);
  assert_int_equal(ruda_future_poll(f), 0);
  assert_int_equal(dst[0], -1); /* not read yet */
  atomic_store(&gate_open, 1);
  assert_rc(ruda_future_wait(f, NULL), 0);
  assert_int_equal(ruda_future_poll(f), 1);
  assert_memory_equal(dst, expect, sizeof dst);
  ruda_future_free(f);

  /* A sub-range through an offset binding. */
  int32_t part[10];
  d = ruda_copy_contiguous(ruda_bind_range(h, 40 * sizeof(int32_t), sizeof part));
  assert_ok(ruda_read(dev, 1, &d, part, sizeof part, &f));
  assert_rc(ruda_future_wait(f, NULL), 0);
  ruda_future_free(f);
  assert_memory_equal(part, expect + 40, sizeof part);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void detached_futures_still_run(void **state) {
  (void)state;
  ruda_device *dev = open_gated(1);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  char pattern[64];
  for (int i = 0; i < 64; i++) pattern[i] = (char)(i * 3);
  test_write(dev, 0, ruda_bind(h), pattern, 64);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  char dst[64] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *r = NULL, *s = NULL;
  assert_ok(ruda_read(dev, 0, &d, dst, 64, &r));
  assert_ok(ruda_sync_async(dev, 0, &s));
  ruda_future_free(r); /* detached before completion */
  ruda_future_free(s);
  incs_on(dev, 0, 2);
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  /* The work ran; the dropped read's bytes went nowhere: a read fills
   * dst when its future is waited, on every backend. */
  char zero[64] = {0};
  assert_memory_equal(dst, zero, 64);
  assert_int_equal(atomic_load(&incs), 2);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* A read's destination is filled when its future is waited, not when the
 * worker ran it: on the host backend as on cuda, code that forgets to
 * wait sees nothing. */
static void read_fills_dst_at_the_wait(void **state) {
  (void)state;
  ruda_device *dev = open_gated(1);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  char pattern[64], dst[64] = {0}, zero[64] = {0};
  for (int i = 0; i < 64; i++) pattern[i] = (char)(i + 1);
  test_write(dev, 0, ruda_bind(h), pattern, 64);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, dst, 64, &f));
  assert_ok(ruda_sync(dev, 0, NULL)); /* the read ran */
  assert_memory_equal(dst, zero, 64);
  assert_ok(ruda_future_wait(f, NULL));
  assert_memory_equal(dst, pattern, 64);
  ruda_future_free(f);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

static void free_is_ordered_after_earlier_use(void **state) {
  (void)state;
  /* The free is enqueued behind a read of the same buffer: the read must
   * still see the data, because the memory goes only after it ran. */
  ruda_device *dev = open_gated(1);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 32, &h));
  test_write(dev, 0, ruda_bind(h), "abcdefghijklmnopqrstuvwxyz012345", 32);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  char dst[32] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, dst, 32, &f));
  assert_ok(ruda_buffer_free(dev, 0, h));
  /* Dead for new calls at once, though its memory is still in use. */
  ruda_future *g = NULL;
  assert_rc(ruda_read(dev, 0, &d, dst, 32, &g), RUDA_ENOTFOUND);
  assert_null(g);
  atomic_store(&gate_open, 1);
  assert_rc(ruda_future_wait(f, NULL), 0);
  ruda_future_free(f);
  assert_memory_equal(dst, "abcdefghijklmnopqrstuvwxyz012345", 32);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flush_and_sync_cover_earlier_commands),
      cmocka_unit_test(flush_waits_for_the_worker),
      cmocka_unit_test(sync_async_covers_only_earlier_commands),
      cmocka_unit_test(sync_async_poll_and_wait),
      cmocka_unit_test(read_future_returns_the_data),
      cmocka_unit_test(detached_futures_still_run),
      cmocka_unit_test(read_fills_dst_at_the_wait),
      cmocka_unit_test(free_is_ordered_after_earlier_use),
  };
  return test_main("integration_semantics", tests, sizeof tests / sizeof tests[0], argc, argv);
}

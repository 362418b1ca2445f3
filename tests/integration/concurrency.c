/* concurrency.c - thread-safe calls used at once: kernels replaced while
 * being launched, several devices used by the same threads, buffers
 * created and freed while others launch. Run under TSan, these are the
 * race checks of the calls the stress test does not make. */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

static _Atomic uint64_t ran_a, ran_b;

static int kernel_a(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&ran_a, 1);
  return 0;
}

static int kernel_b(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&ran_b, 1);
  return 0;
}

typedef struct launcher {
  ruda_device *dev;
  ruda_stream_id stream;
  const char *kernel;
  int count;
  int rc;
} launcher;

static void *launch_many(void *p) {
  launcher *l = p;
  for (int i = 0; i < l->count && l->rc == 0; i++) l->rc = test_launch(l->dev, l->stream, l->kernel, NULL, 0);
  if (l->rc == 0) l->rc = ruda_flush(l->dev, l->stream, NULL);
  return NULL;
}

static void kernels_replaced_while_launching(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  atomic_store(&ran_a, 0);
  atomic_store(&ran_b, 0);
  assert_ok(ruda_host_kernel_register(dev, "k", kernel_a));
  enum { T = 3, N = 20000 };
  launcher l[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    l[i] = (launcher){dev, (ruda_stream_id)i, "k", N, 0};
    assert_int_equal(pthread_create(&t[i], NULL, launch_many, &l[i]), 0);
  }
  /* Replace it back and forth, and register new names (growing the
   * table) while the launchers look it up. */
  for (int i = 0; i < 300; i++) {
    assert_ok(ruda_host_kernel_register(dev, "k", i % 2 ? kernel_a : kernel_b));
    char name[32];
    snprintf(name, sizeof name, "extra_%d", i);
    assert_ok(ruda_host_kernel_register(dev, name, kernel_b));
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(l[i].rc, 0);
  /* Each launch ran exactly one of the two versions. */
  assert_int_equal(atomic_load(&ran_a) + atomic_load(&ran_b), (uint64_t)T * N);
  /* The last registration wins for later launches. */
  uint64_t a = atomic_load(&ran_a);
  assert_ok(test_launch(dev, 0, "k", NULL, 0));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&ran_a), a + 1); /* i = 299 registered kernel_a */
  assert_ok(test_launch(dev, 1, "extra_150", NULL, 0));
  assert_ok(ruda_sync(dev, 1, NULL));
  test_close(dev);
}

typedef struct two_devices {
  ruda_device *dev[2];
  int index;
  int rc;
} two_devices;

/* Alternates between two devices on the same stream id: the per-thread
 * stream cache must never hand one device's stream to the other. */
static void *alternate(void *p) {
  two_devices *td = p;
  ruda_stream_id s = (ruda_stream_id)td->index;
  for (int i = 0; i < 2000 && td->rc == 0; i++) {
    ruda_device *dev = td->dev[i % 2];
    td->rc = test_launch(dev, (i % 3 == 0) ? RUDA_STREAM_CURRENT : s, i % 2 ? "b" : "a", NULL, 0);
  }
  for (int d = 0; d < 2 && td->rc == 0; d++) td->rc = ruda_sync(td->dev[d], s, NULL);
  for (int d = 0; d < 2 && td->rc == 0; d++) td->rc = ruda_sync(td->dev[d], RUDA_STREAM_CURRENT, NULL);
  return NULL;
}

static void threads_use_two_devices(void **state) {
  (void)state;
  atomic_store(&ran_a, 0);
  atomic_store(&ran_b, 0);
  two_devices td[4];
  ruda_device *d0 = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK), *d1 = test_open(3, 1024, RUDA_BACKPRESSURE_BLOCK);
  /* Only device 0 knows "a", only device 1 knows "b": a launch routed to
   * the wrong device fails with RUDA_EKERNEL. */
  assert_ok(ruda_host_kernel_register(d0, "a", kernel_a));
  assert_ok(ruda_host_kernel_register(d1, "b", kernel_b));
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    td[i] = (two_devices){{d0, d1}, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, alternate, &td[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) assert_int_equal(td[i].rc, 0);
  assert_int_equal(atomic_load(&ran_a), 4 * 1000);
  assert_int_equal(atomic_load(&ran_b), 4 * 1000);
  /* Each device saw 4 explicit and 4 thread streams (+ none from here);
   * the threads exited with their streams synced, so theirs are retired. */
  assert_int_equal(ruda_stream_ids(d0, NULL, 0), 4);
  assert_int_equal(ruda_stream_ids(d1, NULL, 0), 4);
  test_close(d0);
  test_close(d1);
}

static int add_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t *x = args[0];
  *x += *(const uint64_t *)args[1];
  return 0;
}

typedef struct churner {
  ruda_device *dev;
  ruda_stream_id stream;
  uint64_t sum;
  int rc;
} churner;

/* Each thread creates a buffer, launches into it, reads it, frees it, on
 * its own stream; handle slots are shared and reused across threads. */
static void *churn(void *p) {
  churner *c = p;
  for (uint64_t i = 1; i <= 500 && c->rc == 0; i++) {
    ruda_handle h;
    uint64_t zero = 0, got = 0;
    if ((c->rc = ruda_buffer_create(c->dev, c->stream, 8, &h)) != 0) break;
    ruda_copy_desc zd = ruda_copy_contiguous(ruda_bind(h));
    if ((c->rc = ruda_write(c->dev, c->stream, &zd, &zero, 8)) != 0) break; /* no cmocka off the main thread */
    ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&i, sizeof i)};
    for (int k = 0; k < 3 && c->rc == 0; k++) c->rc = test_launch(c->dev, c->stream, "add", a, 2);
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
    ruda_future *f = NULL;
    if (c->rc == 0) c->rc = ruda_read(c->dev, c->stream, &d, &got, 8, &f);
    if (c->rc == 0) c->rc = ruda_buffer_free(c->dev, c->stream, h); /* before the read completes */
    if (c->rc == 0) c->rc = ruda_future_wait(f, NULL);
    ruda_future_free(f);
    if (c->rc == 0 && got != 3 * i) c->rc = -1000;
    c->sum += got;
  }
  return NULL;
}

static void buffers_churn_across_threads(void **state) {
  (void)state;
  ruda_device *dev = test_open(3, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "add", add_kernel));
  enum { T = 5 };
  churner c[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    c[i] = (churner){dev, (ruda_stream_id)(i + 10), 0, 0};
    assert_int_equal(pthread_create(&t[i], NULL, churn, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) {
    if (c[i].rc != 0) fail_msg("thread %d: %s (%s)", i, ruda_err_name(c[i].rc), c[i].rc == -1000 ? "wrong sum" : "");
    assert_int_equal(c[i].sum, 3 * 500 * 501 / 2);
  }
  test_close(dev);
}

typedef struct brief {
  ruda_device *dev;
  int index;
  int rc;
} brief;

/* Enqueues and exits at once: its commands are still in flight (and
 * their memory still out) when the thread is gone. */
static void *brief_life(void *p) {
  brief *b = p;
  for (int i = 0; i < 300 && b->rc == 0; i++)
    b->rc = test_launch(b->dev, (ruda_stream_id)(b->index % 4), b->index % 2 ? "a" : "b", NULL, 0);
  return NULL;
}

static void short_lived_threads(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&ran_a, 0);
  atomic_store(&ran_b, 0);
  assert_ok(ruda_host_kernel_register(dev, "a", kernel_a));
  assert_ok(ruda_host_kernel_register(dev, "b", kernel_b));
  enum { WAVES = 10, T = 6 };
  for (int w = 0; w < WAVES; w++) {
    brief b[T];
    pthread_t t[T];
    for (int i = 0; i < T; i++) {
      b[i] = (brief){dev, i, 0};
      assert_int_equal(pthread_create(&t[i], NULL, brief_life, &b[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < T; i++) assert_int_equal(b[i].rc, 0);
  }
  for (ruda_stream_id s = 0; s < 4; s++) assert_ok(ruda_sync(dev, s, NULL));
  assert_int_equal(atomic_load(&ran_a), WAVES * (T / 2) * 300);
  assert_int_equal(atomic_load(&ran_b), WAVES * (T / 2) * 300);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(kernels_replaced_while_launching),
      cmocka_unit_test(threads_use_two_devices),
      cmocka_unit_test(buffers_churn_across_threads),
      cmocka_unit_test(short_lived_threads),
  };
  return test_main("integration_concurrency", tests, sizeof tests / sizeof tests[0], argc, argv);
}

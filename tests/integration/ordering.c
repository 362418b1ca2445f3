/* ordering.c - a buffer written on one stream and used on another is
 * ordered without the caller syncing (public API only, host backend).
 *
 * The writer kernels sleep before they write, so a reader that ran on its
 * own worker as soon as it was queued would see the old contents. Streams
 * are chosen on different workers (stream id i runs on worker i % n). */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define WORKERS 4

/* slow_fill(buf, n, base, delay_us): buf[i] = base + i, after the delay. */
static int slow_fill(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t *buf = args[0];
  uint32_t n = *(const uint32_t *)args[1], base = *(const uint32_t *)args[2];
  uint32_t delay = *(const uint32_t *)args[3];
  if (delay) usleep(delay);
  for (uint32_t i = 0; i < n; i++) buf[i] = base + i;
  return 0;
}

/* slow_add(dst, src, n, k, delay_us): dst[i] = src[i] + k, the source read
 * after the delay. */
static int slow_add(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t *dst = args[0];
  const uint32_t *src = args[1];
  uint32_t n = *(const uint32_t *)args[2], k = *(const uint32_t *)args[3];
  uint32_t delay = *(const uint32_t *)args[4];
  if (delay) usleep(delay);
  for (uint32_t i = 0; i < n; i++) dst[i] = src[i] + k;
  return 0;
}

static ruda_device *open_dev(void) {
  ruda_device *dev = test_open(WORKERS, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "slow_fill", slow_fill));
  assert_ok(ruda_host_kernel_register(dev, "slow_add", slow_add));
  return dev;
}

static void fill(ruda_device *dev, ruda_stream_id s, ruda_handle h, uint32_t n, uint32_t base, uint32_t delay) {
  ruda_arg a[4] = {ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&n, 4), ruda_arg_scalar(&base, 4),
                   ruda_arg_scalar(&delay, 4)};
  assert_ok(test_launch(dev, s, "slow_fill", a, 4));
}

static void add(ruda_device *dev, ruda_stream_id s, ruda_handle dst, ruda_handle src, uint32_t n, uint32_t k,
                uint32_t delay) {
  ruda_arg a[5] = {ruda_arg_buffer(ruda_bind(dst)), ruda_arg_buffer(ruda_bind(src)), ruda_arg_scalar(&n, 4),
                   ruda_arg_scalar(&k, 4), ruda_arg_scalar(&delay, 4)};
  assert_ok(test_launch(dev, s, "slow_add", a, 5));
}

static void expect(ruda_device *dev, ruda_stream_id s, ruda_handle h, uint32_t n, uint32_t base, const char *what,
                   int trial) {
  uint32_t *got = malloc(n * sizeof *got);
  test_read(dev, s, ruda_bind_range(h, 0, (uint64_t)n * 4), got, (size_t)n * 4);
  for (uint32_t i = 0; i < n; i++)
    if (got[i] != base + i) fail_msg("%s, trial %d: element %u is %u, expected %u", what, trial, i, got[i], base + i);
  free(got);
}

/* Two different streams on two different workers. */
static void pick_streams(unsigned *seed, ruda_stream_id *a, ruda_stream_id *b) {
  *a = (ruda_stream_id)(rand_r(seed) % 16);
  do *b = (ruda_stream_id)(rand_r(seed) % 16);
  while (*b % WORKERS == *a % WORKERS);
}

/* A slow writer on A, then at once a reader on B: launch, copy or read. */
static void reader_on_another_stream_sees_the_write(void **state) {
  (void)state;
  ruda_device *dev = open_dev();
  unsigned seed = 12345;
  for (int trial = 0; trial < 150; trial++) {
    ruda_stream_id a, b;
    pick_streams(&seed, &a, &b);
    uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 4096);
    uint32_t delay = (uint32_t)(rand_r(&seed) % 3000);
    uint32_t base = (uint32_t)rand_r(&seed);
    ruda_handle x, y;
    /* The buffer's home stream varies too: A, B, or a third one. */
    ruda_stream_id home = trial % 3 == 0 ? a : trial % 3 == 1 ? b : (a + 1) % 16;
    assert_ok(ruda_buffer_create(dev, home, (uint64_t)n * 4, &x));
    assert_ok(ruda_buffer_create(dev, b, (uint64_t)n * 4, &y));
    fill(dev, a, x, n, base, delay);
    switch (trial % 3) {
      case 0: /* a kernel on B reads x */
        add(dev, b, y, x, n, 0, 0);
        expect(dev, b, y, n, base, "launch", trial);
        break;
      case 1: /* a device copy on B */
        assert_ok(ruda_copy(dev, b, ruda_bind(y), ruda_bind(x)));
        expect(dev, b, y, n, base, "copy", trial);
        break;
      default: /* a read on B */
        expect(dev, b, x, n, base, "read", trial);
        break;
    }
    assert_ok(ruda_buffer_free(dev, b, x));
    assert_ok(ruda_buffer_free(dev, b, y));
  }
  test_close(dev);
}

/* x written on A; B computes y = x + 1 (slowly); C computes z = y + 1. */
static void chain_across_three_streams(void **state) {
  (void)state;
  ruda_device *dev = open_dev();
  unsigned seed = 777;
  for (int trial = 0; trial < 60; trial++) {
    ruda_stream_id s[3];
    s[0] = (ruda_stream_id)(rand_r(&seed) % 16);
    do s[1] = (ruda_stream_id)(rand_r(&seed) % 16);
    while (s[1] % WORKERS == s[0] % WORKERS);
    do s[2] = (ruda_stream_id)(rand_r(&seed) % 16);
    while (s[2] % WORKERS == s[0] % WORKERS || s[2] % WORKERS == s[1] % WORKERS);
    uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 2048);
    uint32_t base = (uint32_t)rand_r(&seed) % 100000;
    ruda_handle x, y, z;
    assert_ok(ruda_buffer_create(dev, s[0], (uint64_t)n * 4, &x));
    assert_ok(ruda_buffer_create(dev, s[0], (uint64_t)n * 4, &y));
    assert_ok(ruda_buffer_create(dev, s[0], (uint64_t)n * 4, &z));
    fill(dev, s[0], x, n, base, (uint32_t)(rand_r(&seed) % 2000));
    add(dev, s[1], y, x, n, 1, (uint32_t)(rand_r(&seed) % 2000));
    add(dev, s[2], z, y, n, 1, 0);
    expect(dev, s[2], z, n, base + 2, "chain", trial);
    for (int i = 0; i < 3; i++) assert_ok(ruda_sync(dev, s[i], NULL));
    assert_ok(ruda_buffer_free(dev, s[0], x));
    assert_ok(ruda_buffer_free(dev, s[0], y));
    assert_ok(ruda_buffer_free(dev, s[0], z));
  }
  test_close(dev);
}

/* Write after read: a slow reader on B must copy x before a writer on A
 * overwrites it. */
static void writer_waits_for_a_reader_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_dev();
  const uint32_t n = 1024;
  for (int trial = 0; trial < 40; trial++) {
    ruda_stream_id a = (ruda_stream_id)(trial % WORKERS), b = (ruda_stream_id)((trial + 1) % WORKERS);
    ruda_handle x, y;
    assert_ok(ruda_buffer_create(dev, a, n * 4, &x));
    assert_ok(ruda_buffer_create(dev, b, n * 4, &y));
    fill(dev, a, x, n, 1000, 0);
    add(dev, b, y, x, n, 0, (uint32_t)(500 + trial * 50)); /* reads x late */
    fill(dev, a, x, n, 5000, 0);                            /* must wait for it */
    expect(dev, b, y, n, 1000, "reader", trial);
    expect(dev, a, x, n, 5000, "writer", trial);
    assert_ok(ruda_buffer_free(dev, a, x));
    assert_ok(ruda_buffer_free(dev, b, y));
  }
  test_close(dev);
}

/* A large write (staged in pieces pushed in any order) after a slow
 * kernel on another stream that reads the same buffer. */
static void large_write_follows_a_reader_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_dev();
  const uint32_t n = (uint32_t)((40u << 20) / 4); /* 40 MiB: five pieces */
  uint32_t *src = malloc((size_t)n * 4);
  for (uint32_t i = 0; i < n; i++) src[i] = 7 + i;
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &x));
  assert_ok(ruda_buffer_create(dev, 1, (uint64_t)n * 4, &y));
  fill(dev, 0, x, n, 3, 0);
  add(dev, 1, y, x, n, 0, 20000);
  test_write(dev, 0, ruda_bind(x), src, (size_t)n * 4);
  expect(dev, 1, y, n, 3, "reader before the large write", 0);
  expect(dev, 0, x, n, 7, "large write", 0);
  /* And a reader after it, on a third stream. */
  ruda_handle z;
  assert_ok(ruda_buffer_create(dev, 2, (uint64_t)n * 4, &z));
  test_write(dev, 0, ruda_bind(x), src, (size_t)n * 4);
  add(dev, 2, z, x, n, 1, 0);
  expect(dev, 2, z, n, 8, "reader after the large write", 0);
  free(src);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  assert_ok(ruda_buffer_free(dev, 2, z));
  test_close(dev);
}

/* Producer threads, each with its own pair of streams on different
 * workers, hand buffers across with no syncs in between. */
typedef struct prod {
  ruda_device *dev;
  int index;
  int failures;
} prod;

static void *producer(void *p) {
  prod *pr = p;
  ruda_device *dev = pr->dev;
  unsigned seed = 99u + (unsigned)pr->index;
  const uint32_t n = 256;
  uint32_t got[256];
  for (int round = 0; round < 40; round++) {
    ruda_stream_id a = (ruda_stream_id)(pr->index * WORKERS + round % WORKERS);
    ruda_stream_id b = a + 1 + (ruda_stream_id)(rand_r(&seed) % (WORKERS - 1));
    ruda_handle x, y;
    if (ruda_buffer_create(dev, a, n * 4, &x) != 0 || ruda_buffer_create(dev, b, n * 4, &y) != 0) {
      pr->failures++;
      return NULL;
    }
    uint32_t base = (uint32_t)(pr->index * 100000 + round * 1000);
    uint32_t delay = (uint32_t)(rand_r(&seed) % 1500), zero = 0, one = 1, nn = n;
    ruda_arg f[4] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&nn, 4), ruda_arg_scalar(&base, 4),
                     ruda_arg_scalar(&delay, 4)};
    ruda_arg g[5] = {ruda_arg_buffer(ruda_bind(y)), ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&nn, 4),
                     ruda_arg_scalar(&one, 4), ruda_arg_scalar(&zero, 4)};
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(y));
    ruda_future *fut = NULL;
    if (test_launch(dev, a, "slow_fill", f, 4) != 0 || test_launch(dev, b, "slow_add", g, 5) != 0 ||
        ruda_read(dev, b, &d, got, sizeof got, &fut) != 0 || ruda_future_wait(fut, NULL) != 0) {
      pr->failures++;
      ruda_future_free(fut);
      return NULL;
    }
    ruda_future_free(fut);
    for (uint32_t i = 0; i < n; i++)
      if (got[i] != base + i + 1) pr->failures++;
    ruda_buffer_free(dev, a, x);
    ruda_buffer_free(dev, b, y);
  }
  return NULL;
}

static void concurrent_producers_hand_buffers_across(void **state) {
  (void)state;
  ruda_device *dev = open_dev();
  enum { P = 6 };
  prod p[P];
  pthread_t t[P];
  for (int i = 0; i < P; i++) {
    p[i] = (prod){dev, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, producer, &p[i]), 0);
  }
  for (int i = 0; i < P; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < P; i++)
    if (p[i].failures) fail_msg("producer %d: %d failures", i, p[i].failures);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reader_on_another_stream_sees_the_write),
      cmocka_unit_test(chain_across_three_streams),
      cmocka_unit_test(writer_waits_for_a_reader_on_another_stream),
      cmocka_unit_test(large_write_follows_a_reader_on_another_stream),
      cmocka_unit_test(concurrent_producers_hand_buffers_across),
  };
  return test_main("integration_ordering", tests, sizeof tests / sizeof tests[0], argc, argv);
}

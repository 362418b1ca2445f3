/* gpu_detach.c - reads whose futures are dropped before they were waited.
 *
 * The staging block a dropped read holds goes back once the device is
 * done with it, and whoever drops the last reference - often the worker,
 * when the client freed the future first - does not wait for the device
 * meanwhile: a worker that did would stall every stream it serves. The
 * cases keep the device's events pending with the mock driver's hooks, so
 * they are skipped on a real device. */
#include "gpu_common.h"

typedef void (*hook_fn)(int on);
static hook_fn hold_streams; /* recorded events stay pending while on */
static hook_fn gate_records; /* cuEventRecord blocks (the worker) while on */

static hook_fn find_hook(ruda_device *dev, const char *name) {
  hook_fn fn = NULL;
  void *p = gpu_mock_hook(dev, name);
  memcpy(&fn, &p, sizeof fn);
  return fn;
}

/* One stream, so one worker: every command below goes through it. */
static ruda_device *open_with_hooks(void) {
  ruda_device *dev = gpu_open_cfg(1, "", 0);
  hold_streams = find_hook(dev, "ruda_mock_hold_streams");
  gate_records = find_hook(dev, "ruda_mock_gate_records");
  if (hold_streams == NULL || gate_records == NULL) {
    test_close(dev);
    gpu_skip("needs the mock driver's hooks to keep events pending");
  }
  /* These cases are about what the worker does with a dropped read: the
   * client must not run the read itself (the default for a stream that
   * waits for each request), or the gated record would hold the client. */
  assert_ok(ruda_stream_set_in_place(dev, 0, 0));
  return dev;
}

/* Should the code under test block anyway, the watchdog lets the device
 * go after a while, so the case fails instead of hanging. */
typedef struct watchdog {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t thread;
  int done, fired;
} watchdog;

static void *watchdog_main(void *p) {
  watchdog *wd = p;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 10;
  pthread_mutex_lock(&wd->lock);
  while (!wd->done && pthread_cond_timedwait(&wd->cond, &wd->lock, &dl) == 0) {
  }
  if (!wd->done) {
    wd->fired = 1;
    gate_records(0);
    hold_streams(0);
  }
  pthread_mutex_unlock(&wd->lock);
  return NULL;
}

static void watchdog_start(watchdog *wd) {
  memset(wd, 0, sizeof *wd);
  pthread_mutex_init(&wd->lock, NULL);
  pthread_cond_init(&wd->cond, NULL);
  assert_int_equal(pthread_create(&wd->thread, NULL, watchdog_main, wd), 0);
}

/* Stops the watchdog; fails if it had to step in. */
static void watchdog_stop(watchdog *wd, const char *what) {
  pthread_mutex_lock(&wd->lock);
  wd->done = 1;
  pthread_cond_signal(&wd->cond);
  pthread_mutex_unlock(&wd->lock);
  pthread_join(wd->thread, NULL);
  pthread_cond_destroy(&wd->cond);
  pthread_mutex_destroy(&wd->lock);
  if (wd->fired) fail_msg("%s blocked until the device's events completed", what);
}

static uint64_t staging_in_use(ruda_device *dev) {
  ruda_staging_stats st;
  assert_ok(ruda_staging_usage(dev, &st));
  return st.in_use_bytes;
}

/* The worker returns staging when its progress() sees the event done; it
 * polls on a short timer, so wait a little. */
static void wait_staging_back(ruda_device *dev, uint64_t baseline) {
  uint64_t used = 0;
  for (int i = 0; i < 30000; i++) { /* up to 30 s: a loaded machine (sanitizers, -j) is slow */
    if ((used = staging_in_use(dev)) <= baseline) return;
    usleep(1000);
  }
  fail_msg("staging in use stayed at %llu bytes (baseline %llu)", (unsigned long long)used,
           (unsigned long long)baseline);
}

#define N ((size_t)1 << 20)

/* A buffer of N known bytes, written and synced; *baseline: staging in
 * use afterwards. */
static ruda_handle filled_buffer(ruda_device *dev, uint64_t *baseline) {
  unsigned char *src = malloc(N);
  for (size_t i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 1);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, N, &h));
  const uint64_t before = staging_in_use(dev);
  test_write(dev, 0, ruda_bind(h), src, N);
  gpu_sync_ok(dev, 0);
  free(src);
  /* The write's staging goes back once its copy ran, at the sync's wait or
   * the worker's next look at the lane: the baseline excludes it. */
  wait_staging_back(dev, before);
  *baseline = staging_in_use(dev);
  return h;
}

static void assert_untouched(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0x5a) fail_msg("a dropped read wrote its destination (byte %zu)", i);
}

/* The client frees the future while the worker is still inside the read,
 * so the worker drops the last reference with the copy still pending. The
 * worker must go on to the next command (the flush returns) while the
 * device holds the event; the staging comes back once it completes. */
static void worker_drops_read_without_waiting(void **state) {
  (void)state;
  ruda_device *dev = open_with_hooks();
  uint64_t base;
  ruda_handle h = filled_buffer(dev, &base);
  unsigned char *got = malloc(N);
  memset(got, 0x5a, N);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  hold_streams(1);
  gate_records(1);
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, got, N, &f));
  ruda_future_free(f); /* the worker cannot be past the read's record */
  watchdog wd;
  watchdog_start(&wd);
  gate_records(0);
  int rc = ruda_flush(dev, 0, NULL);
  /* A later command on the same worker runs too. */
  unsigned char small[64];
  memset(small, 3, sizeof small);
  if (rc == 0) test_write(dev, 0, ruda_bind_range(h, 0, sizeof small), small, sizeof small);
  if (rc == 0) rc = ruda_flush(dev, 0, NULL);
  watchdog_stop(&wd, "the worker dropping a detached read");
  assert_ok(rc);
  /* The device still holds the event: the block is still out. */
  assert_true(staging_in_use(dev) >= base + N);
  hold_streams(0);
  wait_staging_back(dev, base);
  assert_untouched(got, N);
  gpu_sync_ok(dev, 0);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
  free(got);
}

/* The worker already submitted the read; the client drops the last
 * reference itself. That returns at once too, and the idle worker is woken
 * to return the staging once the event completes. */
static void client_drops_submitted_read_without_waiting(void **state) {
  (void)state;
  ruda_device *dev = open_with_hooks();
  uint64_t base;
  ruda_handle h = filled_buffer(dev, &base);
  unsigned char *got = malloc(N);
  memset(got, 0x5a, N);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  hold_streams(1);
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, got, N, &f));
  watchdog wd;
  watchdog_start(&wd);
  int rc = ruda_flush(dev, 0, NULL); /* the worker is past the read */
  assert_int_equal(ruda_future_poll(f), 0);
  ruda_future_free(f);
  if (rc == 0) rc = ruda_flush(dev, 0, NULL);
  watchdog_stop(&wd, "freeing a submitted read's future");
  assert_ok(rc);
  assert_true(staging_in_use(dev) >= base + N);
  /* The worker asleep in its idle wait before the event completes: the
   * completion must wake it. */
  pid_t w0 = test_thread_named("ruda-w0");
  assert_true(w0 != 0);
  test_wait_blocked(w0);
  hold_streams(0);
  wait_staging_back(dev, base);
  assert_untouched(got, N);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
  free(got);
}

/* Releases the held streams once the closing thread waits for them (a
 * bounded wait: 10 s, then released anyway, and the test's checks still
 * run). No cmocka: not the main thread. */
static void *release_later(void *arg) {
  pid_t closer = *(const pid_t *)arg;
  for (int i = 0; i < 100000 && !test_in_futex(closer); i++) usleep(100);
  hold_streams(0);
  return NULL;
}

/* Dropped reads still pending when the device closes: close waits for
 * them and returns their staging (ASan sees any leak). */
static void close_with_dropped_reads_pending(void **state) {
  (void)state;
  ruda_device *dev = open_with_hooks();
  uint64_t base;
  ruda_handle h = filled_buffer(dev, &base);
  unsigned char *got = malloc(N);
  memset(got, 0x5a, N);
  hold_streams(1);
  for (int i = 0; i < 8; i++) {
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, (uint64_t)i * (N / 8), N / 8));
    ruda_future *f = NULL;
    assert_ok(ruda_read(dev, 0, &d, got + (size_t)i * (N / 8), N / 8, &f));
    ruda_future_free(f);
  }
  watchdog wd;
  watchdog_start(&wd);
  int rc = ruda_flush(dev, 0, NULL);
  watchdog_stop(&wd, "the worker dropping detached reads");
  assert_ok(rc);
  assert_true(staging_in_use(dev) >= base + N);
  pthread_t t;
  pid_t me = test_tid();
  assert_int_equal(pthread_create(&t, NULL, release_later, &me), 0);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev); /* waits for the held stream, then retires the reads */
  pthread_join(t, NULL);
  assert_untouched(got, N);
  free(got);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worker_drops_read_without_waiting),
      cmocka_unit_test(client_drops_submitted_read_without_waiting),
      cmocka_unit_test(close_with_dropped_reads_pending),
  };
  return gpu_main("gpu_detach", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* gpu_events.c - the event pool makes events off the workers.
 *
 * On a busy device cuEventCreate blocks its caller for milliseconds; a
 * worker blocked there stalls every stream it serves. So each lane's
 * events are made when its worker starts, and a lane running low is
 * topped up by the refiller thread ("ruda-events"). The cases count the
 * events each thread made through the mock driver's hook, so they are
 * skipped on a real device (tools/gpu_run.sh runs them on the mock). */
#include "gpu_common.h"

typedef unsigned long (*creates_fn)(const char *prefix);
static creates_fn creates;
typedef void (*hold_fn)(int on);
static hold_fn hold_streams;

/* Two stream ids of one worker (and lane): stream 0 and stream nworkers *
 * nlanes. */
static ruda_device *open_counted(void) {
  ruda_device *dev = gpu_open_cfg(1, "", 0);
  void *p = gpu_mock_hook(dev, "ruda_mock_event_creates");
  memcpy(&creates, &p, sizeof creates);
  p = gpu_mock_hook(dev, "ruda_mock_hold_streams");
  memcpy(&hold_streams, &p, sizeof hold_streams);
  if (creates == NULL || hold_streams == NULL) {
    test_close(dev);
    gpu_skip("needs the mock driver's count of the events each thread made");
  }
  /* The worker, not the client, runs every command here. */
  assert_ok(ruda_stream_set_in_place(dev, 0, 0));
  return dev;
}

enum { DEPTH = 4, REQUESTS = 2000, BYTES = 512 };

/* Requests as a serving loop makes them, DEPTH in flight: a write, a read
 * of what it wrote, a wait on the oldest. Each read's bytes are checked. */
static void serve(ruda_device *dev, ruda_handle h, size_t n) {
  unsigned char in[DEPTH][BYTES], out[DEPTH][BYTES];
  ruda_future *f[DEPTH] = {0};
  for (size_t i = 0; i < n + DEPTH; i++) {
    const size_t slot = i % DEPTH;
    if (i >= DEPTH) {
      assert_ok(ruda_future_wait(f[slot], NULL));
      ruda_future_free(f[slot]);
      if (memcmp(in[slot], out[slot], BYTES) != 0) fail_msg("request %zu read back other bytes", i - DEPTH);
    }
    if (i >= n) continue;
    memset(in[slot], (int)(i * 13 + 1), BYTES);
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, slot * BYTES, BYTES));
    assert_ok(ruda_write(dev, 0, &d, in[slot], BYTES));
    assert_ok(ruda_read(dev, 0, &d, out[slot], BYTES, &f[slot]));
  }
}

/* In the steady state of a serving loop no worker makes an event: every
 * event it records was made when it started. */
static void serving_loop_makes_no_events_on_workers(void **state) {
  (void)state;
  ruda_device *dev = open_counted();
  const unsigned long at_open = creates("ruda-w");
  assert_true(at_open > 0); /* the lanes' events, made as their workers started */
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, DEPTH * BYTES, &h));
  serve(dev, h, REQUESTS);
  gpu_sync_ok(dev, 0);
  assert_int_equal(creates("ruda-w"), at_open);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* More reads in flight than a lane holds events for: the refiller tops the
 * lane up, and once the pool has grown to the depth in use, the same depth
 * again makes no event on the worker. */
static void refiller_grows_a_lane_off_the_worker(void **state) {
  (void)state;
  ruda_device *dev = open_counted();
  enum { WIDE = 200 };
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, BYTES, &h));
  unsigned char src[BYTES];
  memset(src, 0x3c, sizeof src);
  test_write(dev, 0, ruda_bind(h), src, BYTES);
  gpu_sync_ok(dev, 0);
  unsigned char(*out)[BYTES] = calloc(WIDE, BYTES);
  ruda_future **f = calloc(WIDE, sizeof *f);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  for (int wave = 0; wave < 2; wave++) {
    const unsigned long on_workers = creates("ruda-w");
    hold_streams(1); /* every read's event stays pending */
    for (int i = 0; i < WIDE; i++) assert_ok(ruda_read(dev, 0, &d, out[i], BYTES, &f[i]));
    assert_ok(ruda_flush(dev, 0, NULL)); /* the worker recorded them all */
    hold_streams(0);
    for (int i = 0; i < WIDE; i++) {
      assert_ok(ruda_future_wait(f[i], NULL));
      ruda_future_free(f[i]);
      if (memcmp(out[i], src, BYTES) != 0) fail_msg("wave %d read %d read back other bytes", wave, i);
    }
    if (wave == 0) {
      /* The lane ran dry: the refiller was asked (and made some). */
      for (int i = 0; i < 10000 && creates("ruda-events") == 0; i++) usleep(1000);
      assert_true(creates("ruda-events") > 0);
    } else {
      assert_int_equal(creates("ruda-w"), on_workers);
    }
  }
  free(out);
  free(f);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(serving_loop_makes_no_events_on_workers),
      cmocka_unit_test(refiller_grows_a_lane_off_the_worker),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

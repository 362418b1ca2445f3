/* pool_reuse.c - stream-ordered reuse against a backend whose device work
 * completes only when the test says, as a GPU's does.
 *
 * The host backend finishes everything a worker submits, so there every
 * fence passes as soon as its worker reaches it. Here the host table is
 * copied with record/event hooks whose events complete on demand: memory
 * freed on one worker must then stay out of other workers' reach until the
 * test completes the fence, and the same code path (fences polled, never
 * waited on) is what runs on the host and on the GPU. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

#include "fake_events.h"

static ruda__backend_ops fake;

static int fake_event_wait(void *state, void *ev, ruda_error **err) {
  (void)state;
  (void)err;
  while (!atomic_load(&((fake_event *)ev)->done)) usleep(100);
  return 0;
}

/* Waits until the workers recorded at least n events. */
static void wait_events(int n) {
  for (int i = 0; atomic_load(&nevents) < n; i++) {
    assert_true(i < 20000 * (int)test_patience());
    usleep(100);
  }
}

static _Atomic int gate_open;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(100);
  return 0;
}

static int fill_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  memset(args[0], 0x77, 64);
  return 0;
}

static ruda_device *open_deferred(uint32_t streams) {
  ruda_device *dev = test_open(streams, 4096, RUDA_BACKPRESSURE_BLOCK);
  free_events();
  atomic_store(&nevents, 0);
  atomic_store(&gate_open, 1);
  fake = ruda__host_backend;
  fake.record = fake_record;
  fake.event_query = fake_event_query;
  fake.event_wait = fake_event_wait;
  fake.event_release = fake_event_release;
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "fill", fill_kernel));
  ruda__workers_stop(&dev->sched); /* idle workers read the table too */
  dev->sched.backend.ops = &fake; /* every layer reads this one field */
  assert_ok(ruda__workers_start(&dev->sched));
  return dev;
}

static void close_deferred(ruda_device *dev) {
  complete_all(); /* syncs in close wait for their events */
  test_close(dev);
  free_events();
}

static uint64_t addr_of(ruda_device *dev, ruda_handle h) {
  uint64_t addr, size;
  assert_ok(ruda__handles_pin(&dev->handles, h, &addr, &size));
  ruda__handles_unpin(&dev->handles, h.slot, NULL);
  return addr;
}

static uint64_t alloc_addr(ruda_device *dev, ruda_stream_id s, uint64_t size, ruda_handle *h) {
  assert_ok(ruda_buffer_create(dev, s, size, h));
  return addr_of(dev, *h);
}

/* Stream 0 and 1 run on workers 0 and 1. */

static void home_reuse_records_nothing(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle h;
  const uint64_t sizes[] = {100, 200 * KiB, 9 * MiB};
  for (int k = 0; k < 3; k++) {
    uint64_t a = alloc_addr(dev, 0, sizes[k], &h);
    /* Pages that change hands through the arena get fences; reuse on the
     * home stream needs none: no event is recorded in the loop. */
    assert_ok(ruda_flush(dev, 0, NULL)); /* a fence queued before is recorded now */
    int n = atomic_load(&nevents);
    for (int i = 0; i < 100; i++) {
      assert_ok(ruda_buffer_free(dev, 0, h));
      assert_int_equal(alloc_addr(dev, 0, sizes[k], &h), a);
    }
    assert_int_equal(atomic_load(&nevents), n);
    assert_ok(ruda_buffer_free(dev, 0, h));
  }
  close_deferred(dev);
}

static void other_worker_waits_for_the_fence(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y, w, z, z2;
  const uint64_t big = 8 * MiB;
  uint64_t ax = alloc_addr(dev, 0, big, &x);
  assert_ok(ruda_buffer_free(dev, 0, x));
  /* Cleanup hands the page to the arena; the device has not passed
   * worker 0's fence, so the page cannot go back to the backend either. */
  assert_ok(ruda_memory_cleanup(dev, 0));
  ruda_memory_stats d;
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.bytes_reserved, big);
  wait_events(1);
  /* Another worker must not get it yet. */
  assert_true(alloc_addr(dev, 1, big, &y) != ax);
  /* Its own worker may, at once: its later commands follow the free. */
  assert_int_equal(alloc_addr(dev, 0, big, &w), ax);
  /* The first fence completes, but it was issued before the next free:
   * that free's page needs a newer fence. */
  complete_all();
  assert_ok(ruda_buffer_free(dev, 0, w));
  assert_ok(ruda_memory_cleanup(dev, 0)); /* back in the arena, needing a newer fence */
  assert_ok(ruda_flush(dev, 0, NULL));    /* the worker recorded it; it is not complete */
  assert_true(alloc_addr(dev, 1, big, &z) != ax);
  complete_all();
  assert_int_equal(alloc_addr(dev, 1, big, &z2), ax);
  assert_ok(ruda_buffer_free(dev, 1, y));
  assert_ok(ruda_buffer_free(dev, 1, z));
  assert_ok(ruda_buffer_free(dev, 1, z2));
  close_deferred(dev);
}

static void record_stream_keeps_memory(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y, y2;
  uint64_t ax = alloc_addr(dev, 0, 4 * KiB, &x);
  /* Used on stream 1 (worker 1): the buffer records that user. */
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(test_launch(dev, 1, "fill", &a, 1));
  assert_ok(ruda_flush(dev, 1, NULL)); /* submitted; its device work is not done */
  int n = atomic_load(&nevents);
  assert_ok(ruda_buffer_free(dev, 0, x));
  /* Freed on its home stream, but worker 1's use may still run: the
   * memory stays out of the pool until worker 1's fence completes. */
  ruda_memory_stats u;
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_int_equal(u.nallocs, 1);
  assert_int_equal(u.bytes_in_use, 4 * KiB);
  assert_true(alloc_addr(dev, 0, 4 * KiB, &y) != ax);
  wait_events(n + 1);
  complete_all();
  /* The worker records the fence's event, then marks the fence reached:
   * a loaded machine can run this between the two, so wait for the
   * release, not only for the record. */
  for (int i = 0;; i++) {
    assert_ok(ruda_memory_usage(dev, 0, &u));
    if (u.nallocs == 1) break; /* only y */
    assert_true(i < 20000 * (int)test_patience());
    usleep(100);
  }
  assert_int_equal(alloc_addr(dev, 0, 4 * KiB, &y2), ax);
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_ok(ruda_buffer_free(dev, 0, y2));
  close_deferred(dev);
}

static void queued_foreign_use_is_not_overwritten(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y;
  uint64_t ax = alloc_addr(dev, 0, 1 * KiB, &x);
  /* Worker 1 is held; a kernel that writes x waits behind the gate. */
  atomic_store(&gate_open, 0);
  assert_ok(test_launch(dev, 1, "gate", NULL, 0));
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(test_launch(dev, 1, "fill", &a, 1));
  assert_ok(ruda_buffer_free(dev, 0, x));
  /* x's memory is not handed out while that write is pending. */
  uint64_t ay = alloc_addr(dev, 0, 1 * KiB, &y);
  assert_true(ay != ax);
  unsigned char mine[64], back[64];
  memset(mine, 0x11, sizeof mine);
  test_write(dev, 0, ruda_bind_range(y, 0, 64), mine, 64);
  atomic_store(&gate_open, 1);
  ruda_future *f;
  assert_ok(ruda_sync_async(dev, 1, &f));
  /* Worker 1 may record the fence for x's memory before this sync's
   * event: complete events until the sync's own one is among them. */
  for (int i = 0; ruda_future_poll(f) != 1; i++) {
    assert_true(i < 20000 * (int)test_patience());
    complete_all();
    usleep(100);
  }
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  test_read(dev, 0, ruda_bind_range(y, 0, 64), back, 64);
  assert_memory_equal(back, mine, 64);
  /* Once worker 1's fence completes, x's slot returns to stream 0. */
  for (int i = 0; i < 1000; i++) {
    complete_all();
    ruda_memory_stats u;
    assert_ok(ruda_memory_usage(dev, 0, &u));
    if (u.nallocs == 1) break;
    usleep(200);
  }
  ruda_handle z;
  assert_int_equal(alloc_addr(dev, 0, 1 * KiB, &z), ax);
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_ok(ruda_buffer_free(dev, 0, z));
  close_deferred(dev);
}

static void freed_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y;
  uint64_t ax = alloc_addr(dev, 0, 300, &x);
  /* Freed on stream 1, never used there: nothing of worker 1 can touch
   * it, so it goes home to stream 0 at once. */
  assert_ok(ruda_buffer_free(dev, 1, x));
  assert_int_equal(alloc_addr(dev, 0, 300, &y), ax);
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_int_equal(atomic_load(&nevents), 0);
  close_deferred(dev);
}

/* The address without pinning: a pin counts as a use. */
static uint64_t untouched_addr(ruda_device *dev, ruda_handle h) {
  return ruda__handles_slot(&dev->handles, h.slot)->addr;
}

static void untouched_page_moves_at_once(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y, z;
  const uint64_t big = 8 * MiB;
  assert_ok(ruda_buffer_create(dev, 0, big, &x));
  assert_ok(ruda_buffer_create(dev, 0, big, &y));
  uint64_t ax = untouched_addr(dev, x);
  /* Freed untouched: the stream keeps y's page, x's goes to the arena
   * needing no fence (no command ever touched it). */
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_ok(ruda_buffer_create(dev, 1, big, &z));
  assert_int_equal(untouched_addr(dev, z), ax);
  assert_int_equal(atomic_load(&nevents), 0);
  assert_ok(ruda_buffer_free(dev, 1, z));
  /* Cleanup returns untouched pages to the backend at once. */
  assert_ok(ruda_memory_cleanup(dev, 0));
  assert_ok(ruda_memory_cleanup(dev, 1));
  ruda_memory_stats d;
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.bytes_reserved, 0);
  assert_int_equal(atomic_load(&nevents), 0);
  close_deferred(dev);
}

static void retaken_page_stays_fenced(void **state) {
  (void)state;
  ruda_device *dev = open_deferred(2);
  ruda_handle x, y, y2, z, w, w2;
  const uint64_t big = 8 * MiB;
  assert_ok(ruda_buffer_create(dev, 0, big, &x));
  assert_ok(ruda_buffer_create(dev, 0, big, &y));
  uint64_t ax = untouched_addr(dev, x);
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  assert_ok(test_launch(dev, 0, "fill", &a, 1));
  assert_ok(ruda_flush(dev, 0, NULL)); /* ran; its device work is not complete */
  /* x (used) goes to the arena behind a fence, y stays with the stream. */
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  assert_ok(ruda_buffer_create(dev, 0, big, &y2)); /* y's page, from the stream */
  /* Worker 0 takes x's page back before the fence passed... */
  assert_ok(ruda_buffer_create(dev, 0, big, &z));
  assert_int_equal(untouched_addr(dev, z), ax);
  /* ...and returns it with z untouched: the fill may still run, so it
   * needs a fence all the same. */
  assert_ok(ruda_buffer_free(dev, 0, z));
  assert_ok(ruda_buffer_free(dev, 0, y2)); /* z's page to the arena */
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_ok(ruda_buffer_create(dev, 1, big, &w));
  assert_true(untouched_addr(dev, w) != ax);
  complete_all();
  assert_ok(ruda_buffer_create(dev, 1, big, &w2));
  assert_int_equal(untouched_addr(dev, w2), ax);
  assert_ok(ruda_buffer_free(dev, 1, w));
  assert_ok(ruda_buffer_free(dev, 1, w2));
  close_deferred(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(home_reuse_records_nothing),
      cmocka_unit_test(other_worker_waits_for_the_fence),
      cmocka_unit_test(record_stream_keeps_memory),
      cmocka_unit_test(queued_foreign_use_is_not_overwritten),
      cmocka_unit_test(freed_on_another_stream),
      cmocka_unit_test(untouched_page_moves_at_once),
      cmocka_unit_test(retaken_page_stays_fenced),
  };
  return test_main("unit_pool_reuse", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* stream_exit.c - what an exited thread's stream leaves behind once it is
 * retired (scheduler/stream_exit.c): its empty pools serve the next
 * stream, so the device's pool bookkeeping does not grow with the number
 * of threads that came and went. */
#include <pthread.h>

#include "common.h"
#include "src/device.h"

#define THREADS 512
#define AT_ONCE 8

static ruda_device *dev;

static void *connection(void *unused) {
  (void)unused;
  ruda_handle h;
  if (ruda_buffer_create(dev, RUDA_STREAM_CURRENT, 4096, &h) != 0) return (void *)1;
  if (ruda_buffer_free(dev, RUDA_STREAM_CURRENT, h) != 0) return (void *)1;
  if (ruda_sync(dev, RUDA_STREAM_CURRENT, NULL) != 0) return (void *)1;
  return NULL;
}

static size_t pools_made(void) {
  size_t n = 0;
  pthread_mutex_lock(&dev->memory.all_lock);
  for (ruda__pools *p = dev->memory.all; p != NULL; p = p->all_next) n++;
  pthread_mutex_unlock(&dev->memory.all_lock);
  return n;
}

static void exited_threads_pools_serve_new_streams(void **state) {
  (void)state;
  dev = test_open_default();
  for (int done = 0; done < THREADS; done += AT_ONCE) {
    test_threads_run(connection, NULL, AT_ONCE);
    ruda_stream_ids(dev, NULL, 0); /* reaps: each thread synced its stream */
  }
  /* At most the threads alive at once and those not yet reaped, not one
   * per thread that ever ran. */
  assert_true(pools_made() <= 2 * AT_ONCE);
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exited_threads_pools_serve_new_streams),
  };
  return test_main("unit_stream_exit", tests, sizeof tests / sizeof tests[0], argc, argv);
}

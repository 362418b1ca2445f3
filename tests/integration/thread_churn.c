/* thread_churn.c - a thread-per-connection server: threads come, use
 * their own stream (RUDA_STREAM_CURRENT) and exit. What they leave behind
 * must go back without the program doing anything: their streams' pages
 * and their stream ids. */
#include <pthread.h>

#include "common.h"

#define THREADS 2000
#define AT_ONCE 8
#define BUF_BYTES (16 * 1024)

static ruda_device *dev;

static void *connection(void *unused) {
  (void)unused;
  static const char data[BUF_BYTES];
  ruda_handle h;
  if (ruda_buffer_create(dev, RUDA_STREAM_CURRENT, BUF_BYTES, &h) != 0) return (void *)1;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  if (ruda_write(dev, RUDA_STREAM_CURRENT, &d, data, BUF_BYTES) != 0) return (void *)1;
  if (ruda_buffer_free(dev, RUDA_STREAM_CURRENT, h) != 0) return (void *)1;
  return NULL; /* exits with its commands possibly still queued */
}

static uint64_t device_reserved(void) {
  ruda_memory_stats u;
  assert_ok(ruda_memory_device_usage(dev, &u));
  return u.bytes_reserved;
}

static void exited_threads_give_back_pages_and_ids(void **state) {
  (void)state;
  dev = test_open_default();
  const uint64_t baseline = device_reserved();
  size_t most_listed = 0;
  for (int done = 0; done < THREADS; done += AT_ONCE) {
    test_threads_run(connection, NULL, AT_ONCE);
    size_t listed = ruda_stream_ids(dev, NULL, 0);
    if (listed > most_listed) most_listed = listed;
  }
  /* The list never grows with the number of threads that came and went:
   * at most the streams of threads whose work is still queued. */
  assert_true(most_listed < 200);

  /* Once every stream's work ran, none of the exited threads' streams is
   * listed, and every page they held is back: after the arena is trimmed
   * the device reserves what it did before the first thread. */
  ruda_error *err = NULL;
  assert_ok(ruda_device_sync(dev, &err));
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
  ruda_memory_stats u;
  assert_ok(ruda_memory_device_usage(dev, &u));
  assert_int_equal(u.nallocs, 0);
  /* A cleanup frees the arena's pages whose fences the workers reached,
   * giving them a millisecond; on a loaded machine a worker may need more
   * (they only have to go idle), so it is asked again, a bounded number of
   * times. */
  uint64_t reserved = 0;
  int asked = 0;
  do assert_ok(ruda_memory_cleanup(dev, RUDA_STREAM_CURRENT));
  while ((reserved = device_reserved()) != baseline && ++asked < 5000);
  assert_int_equal(reserved, baseline);
  /* The caller's own stream (made by the cleanup) is the one listed. */
  ruda_stream_id ids[2];
  assert_int_equal(ruda_stream_ids(dev, ids, 2), 1);
  assert_true(ids[0] == ruda_stream_current());
  test_close(dev);
}

/* A thread that exits with an error waiting on its stream keeps the stream
 * listed until someone drains it by id. */
static void *failing_connection(void *unused) {
  (void)unused;
  ruda_handle h;
  if (ruda_buffer_create(dev, RUDA_STREAM_CURRENT, 64, &h) != 0) return (void *)1;
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  /* The kernel fails on the worker: its error waits on this stream. */
  if (test_launch(dev, RUDA_STREAM_CURRENT, "churn_fail", &a, 1) != 0) return (void *)1;
  if (ruda_buffer_free(dev, RUDA_STREAM_CURRENT, h) != 0) return (void *)1;
  return NULL;
}

static int fail_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EINVAL;
}

static void an_exited_stream_with_errors_stays_until_drained(void **state) {
  (void)state;
  dev = test_open_default();
  assert_ok(ruda_host_kernel_register(dev, "churn_fail", fail_kernel));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, failing_connection, NULL), 0);
  void *rc = (void *)1;
  assert_int_equal(pthread_join(t, &rc), 0);
  assert_null(rc);
  ruda_stream_id id;
  assert_int_equal(ruda_stream_ids(dev, &id, 1), 1);
  ruda_error *err = NULL;
  assert_rc(ruda_sync(dev, id, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  /* The id ruda_stream_ids gave is the stream the message names. */
  char name[64];
  assert_ok(ruda_stream_name(id, name, sizeof name));
  assert_contains(name, "thread stream #");
  assert_contains(ruda_error_message(err), name);
  ruda_error_free(err);
  assert_rc(ruda_stream_name(id, NULL, 4), RUDA_EINVAL);
  assert_ok(ruda_stream_name(5, name, 4));
  assert_string_equal(name, "str"); /* cut to fit */
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
  /* Its id is refused once retired, like any id never handed out. */
  assert_rc(ruda_flush(dev, id, NULL), RUDA_EINVAL);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exited_threads_give_back_pages_and_ids),
      cmocka_unit_test(an_exited_stream_with_errors_stays_until_drained),
  };
  return test_main("integration_thread_churn", tests, sizeof tests / sizeof tests[0], argc, argv);
}

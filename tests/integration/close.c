/* close.c - closing with commands in flight runs or reports every one of
 * them, hands back the errors still queued, and leaks nothing (the ASan
 * build's LeakSanitizer checks the last part). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static _Atomic uint64_t runs;
static _Atomic int gate_open;

/* Counts the runs; fails with the code given, if any. */
static int work_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  int code = *(const int *)args[0];
  uint64_t *cell = args[1];
  (*cell)++;
  atomic_fetch_add(&runs, 1);
  return code;
}

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(200);
  return 0;
}

static ruda_device *open_counting(uint32_t streams) {
  ruda_device *dev = test_open(streams, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&runs, 0);
  atomic_store(&gate_open, 0);
  assert_ok(ruda_host_kernel_register(dev, "work", work_kernel));
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  return dev;
}

static void launch_work(ruda_device *dev, ruda_stream_id s, ruda_handle cells, int code) {
  ruda_arg a[2] = {ruda_arg_scalar(&code, sizeof code),
                   ruda_arg_buffer(ruda_bind_range(cells, s * 64, 8))};
  assert_ok(test_launch(dev, s, "work", a, 2));
}

/* Counts the errors of close's list: one unhealthy summary per stream,
 * each with its stream's errors as the cause chain. */
static uint64_t count_errors(const ruda_error *list, uint64_t *streams) {
  uint64_t n = 0;
  *streams = 0;
  for (const ruda_error *s = list; s != NULL; s = ruda_error_next(s)) {
    assert_int_equal(ruda_error_code(s), RUDA_EUNHEALTHY);
    (*streams)++;
    for (const ruda_error *e = ruda_error_cause(s); e != NULL; e = ruda_error_next(e)) {
      assert_int_equal(ruda_error_code(e), RUDA_EVALIDATION);
      assert_int_equal(ruda_error_stream(e), ruda_error_stream(s));
      n++;
    }
  }
  return n;
}

typedef struct close_race {
  ruda_device *dev;
  ruda_handle cells;
  _Atomic int started;
  _Atomic pid_t tid;
  int rc;
  ruda_error *errs;
} close_race;

static void *blocked_producer(void *p) {
  close_race *r = p;
  int code = 0;
  ruda_arg a[2] = {ruda_arg_scalar(&code, sizeof code), ruda_arg_buffer(ruda_bind_range(r->cells, 0, 8))};
  atomic_store(&r->tid, test_tid());
  atomic_store(&r->started, 1);
  r->rc = test_launch(r->dev, 0, "work", a, 2); /* blocks: the queue is full */
  return NULL;
}

static void *closer(void *p) {
  close_race *r = p;
  r->rc = ruda_device_close(r->dev, &r->errs);
  return NULL;
}

/* A call in progress when close starts (here one blocked on a full queue)
 * is waited for and its command runs; a call that starts after close began
 * is refused with RUDA_ECLOSED. */
static void close_waits_for_calls_in_progress(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 2, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&runs, 0);
  atomic_store(&gate_open, 0);
  assert_ok(ruda_host_kernel_register(dev, "work", work_kernel));
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  ruda_handle cells;
  assert_ok(ruda_buffer_create(dev, 0, 64, &cells));
  assert_ok(test_launch(dev, 0, "gate", NULL, 0)); /* runs, holds the worker */
  launch_work(dev, 0, cells, 0);                   /* queued: the queue is full */

  close_race prod = {.dev = dev, .cells = cells}, clo = {.dev = dev};
  pthread_t tp, tc;
  assert_int_equal(pthread_create(&tp, NULL, blocked_producer, &prod), 0);
  while (!atomic_load(&prod.started)) usleep(100);
  test_wait_blocked(atomic_load(&prod.tid)); /* the producer waits for queue space */
  assert_int_equal(pthread_create(&tc, NULL, closer, &clo), 0);
  /* Close has begun once a call is refused as closed (registering is
   * harmless before); it then waits for the producer. */
  int probe;
  for (int i = 0; (probe = ruda_host_kernel_register(dev, "probe", work_kernel)) == 0; i++) {
    if (i == 100000 * (int)test_patience()) fail_msg("the device never reported itself closed");
    usleep(100);
  }
  assert_int_equal(probe, RUDA_ECLOSED);

  int code = 0;
  ruda_arg a[2] = {ruda_arg_scalar(&code, sizeof code), ruda_arg_buffer(ruda_bind_range(cells, 0, 8))};
  assert_rc(test_launch(dev, 0, "work", a, 2), RUDA_ECLOSED);
  assert_int_equal(atomic_load(&runs), 0);

  atomic_store(&gate_open, 1);
  assert_int_equal(pthread_join(tp, NULL), 0);
  assert_int_equal(pthread_join(tc, NULL), 0);
  assert_rc(prod.rc, 0);
  assert_rc(clo.rc, 0);
  assert_null(clo.errs);
  assert_int_equal(atomic_load(&runs), 2); /* the queued launch and the producer's */
}

/* Minor page faults of thread tid so far (/proc/self/task/TID/stat). */
static long thread_minor_faults(pid_t tid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[n] = '\0';
  const char *p = strrchr(line, ')'); /* the name may hold spaces */
  long minflt = -1;
  if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %ld", &minflt) != 1) return -1;
  return minflt;
}

typedef struct slow_call {
  ruda_device *dev;
  ruda_handle buf;
  const void *src;
  size_t len;
  _Atomic int started, returned;
  _Atomic pid_t tid;
  int rc;
} slow_call;

static void *slow_writer(void *p) {
  slow_call *w = p;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(w->buf));
  atomic_store(&w->tid, test_tid());
  atomic_store(&w->started, 1);
  w->rc = ruda_write(w->dev, 0, &d, w->src, w->len); /* copies len bytes first */
  atomic_store(&w->returned, 1);
  return NULL;
}

/* A close that starts while a call is still copying its input returns only
 * after that call: before close waited for calls in progress, it freed the
 * device under the copying call (a use-after-free, and a write that never
 * ran). */
static void close_waits_for_a_call_copying_its_input(void **state) {
  (void)state;
  enum { LEN = 256 << 20 };
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  char *src = malloc(LEN);
  assert_non_null(src);
  memset(src, 7, LEN);
  slow_call w = {.dev = dev, .src = src, .len = LEN};
  assert_ok(ruda_buffer_create(dev, 0, LEN, &w.buf));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, slow_writer, &w), 0);
  while (!atomic_load(&w.started)) usleep(50);
  /* Inside ruda_write, copying: the writer thread faults in fresh staging
   * pages (the kernel counts them in its minflt). */
  long faults0 = thread_minor_faults(atomic_load(&w.tid));
  for (int i = 0; thread_minor_faults(atomic_load(&w.tid)) < faults0 + 16; i++) {
    if (i == 1000000 || atomic_load(&w.returned)) fail_msg("never saw the writer copying");
    sched_yield();
  }
  int rc = ruda_device_close(dev, NULL);
  /* The writer's call has returned, or is returning now: allow it 100 ms,
   * far less than the copy close would otherwise have overtaken. */
  for (int i = 0; i < 100 && !atomic_load(&w.returned); i++) usleep(1000);
  int returned = atomic_load(&w.returned);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_true(returned);
  assert_rc(rc, 0);
  assert_rc(w.rc, 0); /* in progress when close began: waited for, and run */
  free(src);
}

static void close_runs_everything_enqueued(void **state) {
  (void)state;
  enum { STREAMS = 4, PER_STREAM = 20000 };
  ruda_device *dev = open_counting(STREAMS);
  ruda_handle cells;
  assert_ok(ruda_buffer_create(dev, 0, STREAMS * 64, &cells));
  for (int i = 0; i < PER_STREAM; i++)
    for (ruda_stream_id s = 0; s < STREAMS; s++) launch_work(dev, s, cells, 0);
  /* No flush, no sync, the buffer still live: close at once. */
  ruda_error *errs = (ruda_error *)&errs;
  assert_rc(ruda_device_close(dev, &errs), 0);
  assert_null(errs);
  assert_int_equal(atomic_load(&runs), STREAMS * PER_STREAM);
}

static void close_reports_queued_errors(void **state) {
  (void)state;
  enum { STREAMS = 3, PER_STREAM = 5000 };
  ruda_device *dev = open_counting(STREAMS);
  ruda_handle cells;
  assert_ok(ruda_buffer_create(dev, 0, 8 * 64, &cells));
  /* Hold the workers so that everything is still queued at close. */
  for (ruda_stream_id s = 0; s < STREAMS; s++) assert_ok(test_launch(dev, s, "gate", NULL, 0));
  uint64_t failing = 0;
  for (int i = 0; i < PER_STREAM; i++)
    for (ruda_stream_id s = 0; s < 6; s++) { /* streams 3..5 share workers 0..2 */
      int fail = (s == 1 || s == 4) && i % 1000 == 7;
      launch_work(dev, s, cells, fail ? RUDA_EVALIDATION : 0);
      failing += (uint64_t)fail;
    }
  /* Buffers freed with their uses still queued, and reads whose futures
   * were dropped. */
  ruda_handle tmp;
  assert_ok(ruda_buffer_create(dev, 2, 4096, &tmp));
  char dst[4096] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(tmp));
  ruda_future *f = NULL;
  assert_ok(ruda_write(dev, 2, &d, dst, sizeof dst));
  assert_ok(ruda_read(dev, 2, &d, dst, sizeof dst, &f));
  ruda_future_free(f);
  assert_ok(ruda_buffer_free(dev, 2, tmp));
  atomic_store(&gate_open, 1);

  ruda_error *errs = NULL;
  assert_int_equal(ruda_device_close(dev, &errs), RUDA_EUNHEALTHY);
  uint64_t streams = 0;
  assert_int_equal(count_errors(errs, &streams), failing);
  assert_int_equal(streams, 2); /* streams 1 and 4 only */
  ruda_error_free(errs);
  assert_int_equal(atomic_load(&runs), 6 * PER_STREAM);
}

static void close_without_error_list(void **state) {
  (void)state;
  ruda_device *dev = open_counting(2);
  ruda_handle cells;
  assert_ok(ruda_buffer_create(dev, 0, 64, &cells));
  for (int i = 0; i < 100; i++) launch_work(dev, 0, cells, i == 50 ? RUDA_EVALIDATION : 0);
  /* The errors are discarded, but the code still says they were there. */
  assert_int_equal(ruda_device_close(dev, NULL), RUDA_EUNHEALTHY);
  assert_int_equal(atomic_load(&runs), 100);
}

static void close_right_after_open(void **state) {
  (void)state;
  for (int i = 0; i < 20; i++) {
    ruda_device *dev = test_open((uint32_t)(1 + i % 8), 16, RUDA_BACKPRESSURE_BLOCK);
    test_close(dev);
  }
}

/* Staging buffers the application never gave back die with the device
 * (the sanitizer run's leak check fails otherwise). */
static void close_frees_unreturned_staging(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  void *p = NULL, *q = NULL;
  assert_ok(ruda_staging_alloc(dev, 1 << 20, &p));
  assert_ok(ruda_staging_alloc(dev, 4096, &q));
  memset(p, 1, 1 << 20);
  assert_ok(ruda_staging_free(dev, q));
  test_close(dev);
}

static void close_with_many_live_buffers(void **state) {
  (void)state;
  /* Live buffers, freed buffers, and buffers freed on one stream while
   * another stream's work still uses them: all go at close. */
  ruda_device *dev = open_counting(4);
  ruda_handle cells;
  assert_ok(ruda_buffer_create(dev, 0, 8 * 64, &cells));
  assert_ok(test_launch(dev, 3, "gate", NULL, 0));
  for (int i = 0; i < 3000; i++) {
    ruda_handle h;
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)(i % 4), 1 + (uint64_t)i * 7 % 5000, &h));
    if (i % 3 == 0) {
      /* "work" ignores its third argument; the launch pins h behind the
       * gate while stream 0 frees it. */
      int code = 0;
      ruda_arg a[3] = {ruda_arg_scalar(&code, sizeof code), ruda_arg_buffer(ruda_bind_range(cells, 3 * 64, 8)),
                       ruda_arg_buffer(ruda_bind(h))};
      assert_ok(test_launch(dev, 3, "work", a, 3));
      assert_ok(ruda_buffer_free(dev, 0, h));
    } else if (i % 3 == 1) {
      assert_ok(ruda_buffer_free(dev, (ruda_stream_id)(i % 4), h));
    }
  }
  atomic_store(&gate_open, 1);
  test_close(dev);
  assert_int_equal(atomic_load(&runs), 1000);
}

/* A future still held when close is called: freeing it afterwards would
 * touch the freed device, so close refuses, saying what to do, and
 * succeeds once the future is freed (ASan: no double free, no leak). */
static void close_refuses_while_futures_are_held(void **state) {
  (void)state;
  ruda_device *dev = open_counting(2);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  char out[64];
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *read = NULL, *sync = NULL;
  assert_ok(ruda_read(dev, 0, &d, out, sizeof out, &read));
  assert_ok(ruda_sync_async(dev, 1, &sync));
  assert_rc(ruda_device_close(dev, NULL), RUDA_EBUSY);
  assert_last_error_contains("2 futures");
  assert_last_error_contains("ruda_future_free them first (the device stays open)");
  /* Still open: the futures complete and can be waited. */
  assert_ok(ruda_future_wait(read, NULL));
  ruda_future_free(read);
  assert_rc(ruda_device_close(dev, NULL), RUDA_EBUSY);
  assert_last_error_contains("1 future from");
  ruda_future_free(sync); /* never waited: detached, still counted as freed */
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(close_runs_everything_enqueued),
      cmocka_unit_test(close_waits_for_calls_in_progress),
      cmocka_unit_test(close_waits_for_a_call_copying_its_input),
      cmocka_unit_test(close_reports_queued_errors),
      cmocka_unit_test(close_without_error_list),
      cmocka_unit_test(close_right_after_open),
      cmocka_unit_test(close_with_many_live_buffers),
      cmocka_unit_test(close_frees_unreturned_staging),
      cmocka_unit_test(close_refuses_while_futures_are_held),
  };
  return test_main("integration_close", tests, sizeof tests / sizeof tests[0], argc, argv);
}

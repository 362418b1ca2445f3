/* stream_exit.c - what an exited thread's stream leaves behind once it is
 * retired (scheduler/stream_exit.c): its empty pools serve the next
 * stream, and its record and table slot are freed after a grace period,
 * so neither the device's pool bookkeeping nor the stream table grows
 * with the number of threads that came and went, also while other
 * threads name the retiring ids. */
#include <pthread.h>
#include <stdatomic.h>

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

static void *writing_connection(void *unused) {
  (void)unused;
  static const char data[4096];
  ruda_handle h;
  if (ruda_buffer_create(dev, RUDA_STREAM_CURRENT, sizeof data, &h) != 0) return (void *)1;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  if (ruda_write(dev, RUDA_STREAM_CURRENT, &d, data, sizeof data) != 0) return (void *)1;
  if (ruda_buffer_free(dev, RUDA_STREAM_CURRENT, h) != 0) return (void *)1;
  return NULL; /* its write possibly still queued */
}

static uint64_t records(void) { return atomic_load(&dev->sched.streams.records); }

/* Runs n threads, AT_ONCE at a time, reaping between batches the way
 * ruda_stream_ids does. */
static void churn(int n, void *(*fn)(void *)) {
  for (int done = 0; done < n; done += AT_ONCE) {
    pthread_t t[AT_ONCE];
    for (int i = 0; i < AT_ONCE; i++) assert_int_equal(pthread_create(&t[i], NULL, fn, NULL), 0);
    for (int i = 0; i < AT_ONCE; i++) {
      void *rc = (void *)1;
      assert_int_equal(pthread_join(t[i], &rc), 0);
      assert_null(rc);
    }
    ruda_stream_ids(dev, NULL, 0);
  }
}

/* Reaps until at most n records are left, or 10 s times test_patience()
 * passed: each reap completes about half a grace period and finds pages
 * behind fences the workers may not have run yet (one a lane), so how
 * many reaps it takes depends on the machine's load, not on ruda. */
static void reap_until(uint64_t n) {
  const int limit = 10000 * (int)test_patience();
  for (int i = 0; i < limit && records() > n; i++) {
    ruda_stream_ids(dev, NULL, 0);
    if (i >= 8) usleep(1000);
  }
}

/* The records left once the workers ran what the churn queued and a few
 * reaps had their chance: a loaded machine's workers lag behind the
 * threads, so records are counted after that, not mid-flight. */
static uint64_t settled_records(void) {
  assert_ok(ruda_device_sync(dev, NULL));
  reap_until(8 * AT_ONCE);
  return records();
}

static void exited_threads_records_are_freed(void **state) {
  (void)state;
  dev = test_open_default();
  churn(2000, writing_connection);
  const uint64_t at_2000 = settled_records(), cap_2000 = ruda__streams_capacity(&dev->sched.streams);
  churn(2000, writing_connection);
  const uint64_t at_4000 = settled_records(), cap_4000 = ruda__streams_capacity(&dev->sched.streams);
  /* Bounded by the streams not reaped yet, not by the threads that ran.
   * The table's size is set at its last rebuild, for 4x the streams live
   * then, mid-churn: on a loaded machine the reaps lag a few batches
   * behind (a CI run saw 512 slots once). Kept records of the 4000 threads
   * would need 16384. */
  assert_true(at_2000 <= 8 * AT_ONCE);
  assert_true(at_4000 <= 8 * AT_ONCE);
  assert_true(cap_4000 <= 1024 && cap_2000 <= 1024);
  /* Once the workers ran everything, a few reaps (each completes about
   * one half of a grace period) free every exited thread's record. */
  assert_ok(ruda_device_sync(dev, NULL));
  reap_until(0);
  assert_int_equal(records(), 0);
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
  /* An explicit stream keeps its record: ids the user names are not
   * threads' own and never retire. */
  assert_ok(ruda_sync(dev, 7, NULL));
  for (int i = 0; i < 8; i++) ruda_stream_ids(dev, NULL, 0);
  assert_int_equal(records(), 1);
  ruda_stream_id id = 0;
  assert_int_equal(ruda_stream_ids(dev, &id, 1), 1);
  assert_int_equal(id, 7);
  test_close(dev);
}

/* Threads publish their own stream's id and exit, while racers name those
 * ids (sync, list, name) as they retire and their records are freed. */
#define RACE_THREADS 1200
#define RACERS 3
static _Atomic ruda_stream_id published[64];
static _Atomic int race_over;

static void *publishing_connection(void *unused) {
  (void)unused;
  if (ruda_sync(dev, RUDA_STREAM_CURRENT, NULL) != 0) return (void *)1;
  const ruda_stream_id id = ruda_stream_current();
  atomic_store(&published[id % 64], id);
  return NULL;
}

static void *racer(void *arg) {
  uintptr_t bad = 0;
  unsigned k = (unsigned)(uintptr_t)arg;
  ruda_stream_id ids[16];
  char name[64];
  while (!atomic_load(&race_over)) {
    const ruda_stream_id id = atomic_load(&published[k++ % 64]);
    if (id == 0) continue;
    ruda_error *err = NULL;
    const int rc = ruda_sync(dev, id, &err);
    /* Its stream, or refused as retired: never another outcome. */
    if (rc != 0 && rc != RUDA_EINVAL) bad++;
    ruda_error_free(err);
    const size_t n = ruda_stream_ids(dev, ids, 16);
    for (size_t i = 0; i < n && i < 16; i++)
      if (ruda_stream_name(ids[i], name, sizeof name) != 0) bad++;
  }
  return (void *)bad;
}

static void calls_naming_retiring_ids_race_the_reaper(void **state) {
  (void)state;
  dev = test_open_default();
  for (int i = 0; i < 64; i++) atomic_store(&published[i], 0);
  atomic_store(&race_over, 0);
  pthread_t r[RACERS];
  for (uintptr_t i = 0; i < RACERS; i++) assert_int_equal(pthread_create(&r[i], NULL, racer, (void *)(i * 21)), 0);
  churn(RACE_THREADS, publishing_connection);
  atomic_store(&race_over, 1);
  for (int i = 0; i < RACERS; i++) {
    void *bad = (void *)1;
    assert_int_equal(pthread_join(r[i], &bad), 0);
    assert_null(bad);
  }
  /* Racers' syncs may have kept some busy past their first retirement;
   * once quiet they retire and are freed like the rest. */
  assert_ok(ruda_device_sync(dev, NULL));
  for (int i = 0; i < 16 && records() != 0; i++) ruda_stream_ids(dev, NULL, 0);
  assert_int_equal(records(), 0);
  /* A freed stream's id is refused like any id never handed out. */
  const ruda_stream_id gone = atomic_load(&published[0]) ? atomic_load(&published[0]) : atomic_load(&published[1]);
  assert_rc(ruda_sync(dev, gone, NULL), RUDA_EINVAL);
  test_close(dev);
}

static void *syncing_connection(void *idp) {
  if (ruda_sync(dev, RUDA_STREAM_CURRENT, NULL) != 0) return (void *)1;
  *(ruda_stream_id *)idp = ruda_stream_current();
  return NULL;
}

/* A call that found the record before it left the table (played here by
 * the test thread, counted in its call slot): the record outlives every
 * reap until that call leaves, and what the call did to the stream (an
 * error) brings it back into the table rather than being lost. */
static void a_call_holding_a_retiring_record_keeps_it(void **state) {
  (void)state;
  dev = test_open_default();
  ruda_stream_id id = 0;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, syncing_connection, &id), 0);
  void *rc = (void *)1;
  assert_int_equal(pthread_join(t, &rc), 0);
  assert_null(rc);
  assert_int_equal(records(), 1);
  {
    RUDA__IN_CALL(dev);
    int err = 0;
    ruda__stream *st = ruda__stream_for(&dev->sched, id, "test", &err);
    assert_non_null(st);
    for (int i = 0; i < 8; i++) ruda__streams_reap(&dev->sched);
    /* Retired (refused by id, not listed) but not freed under this call. */
    assert_int_equal(records(), 1);
    assert_int_equal(ruda_stream_ids(dev, NULL, 0), 0);
    assert_rc(ruda_sync(dev, id, NULL), RUDA_EINVAL);
    assert_int_equal(st->id, id);
    ruda__stream_push_error(st, ruda__error_new(RUDA_EINVAL, 0, "left by a racing call"));
  }
  for (int i = 0; i < 8; i++) ruda__streams_reap(&dev->sched);
  /* Back, with its error, until drained. */
  ruda_stream_id listed = 0;
  assert_int_equal(ruda_stream_ids(dev, &listed, 1), 1);
  assert_int_equal(listed, id);
  ruda_error *err = NULL;
  assert_rc(ruda_sync(dev, id, &err), RUDA_EUNHEALTHY);
  assert_non_null(err);
  ruda_error_free(err);
  reap_until(0);
  assert_int_equal(records(), 0);
  test_close(dev);
}

static _Atomic int reaping;

static void *reaper(void *unused) {
  (void)unused;
  while (atomic_load(&reaping)) ruda_stream_ids(dev, NULL, 0);
  return NULL;
}

/* An exited thread's id that accepted a begin (capture, profile) accepts
 * its end, however the reaper races them: a begin that found the record
 * as it retired makes it busy, and the end finds it (no "reserved" for
 * the few milliseconds until the reaper would put it back). */
static void an_id_that_accepted_a_begin_accepts_its_end(void **state) {
  (void)state;
  dev = test_open_default();
  atomic_store(&reaping, 1);
  pthread_t r;
  assert_int_equal(pthread_create(&r, NULL, reaper, NULL), 0);
  int accepted = 0, refused_end = 0;
  for (int round = 0; round < 1500; round++) {
    ruda_stream_id id = 0;
    pthread_t t;
    void *trc = (void *)1;
    assert_int_equal(pthread_create(&t, NULL, syncing_connection, &id), 0);
    assert_int_equal(pthread_join(t, &trc), 0);
    assert_null(trc);
    if (round & 1) {
      if (ruda_graph_begin_capture(dev, id) != 0) continue; /* retired first: refused, fine */
      accepted++;
      if (ruda_graph_abort_capture(dev, id) != 0 && ++refused_end == 1)
        fprintf(stderr, "first refusal: %s\n", ruda_error_message(ruda_last_error()));
    } else {
      ruda_profile_token tok;
      if (ruda_profile_begin(dev, id, &tok) != 0) continue;
      accepted++;
      uint64_t ns = 0;
      if (ruda_profile_end(dev, id, tok, &ns, NULL) != 0 && ++refused_end == 1)
        fprintf(stderr, "first refusal: %s\n", ruda_error_message(ruda_last_error()));
    }
  }
  atomic_store(&reaping, 0);
  assert_int_equal(pthread_join(r, NULL), 0);
  if (refused_end != 0) fail_msg("%d of %d accepted begins had their end refused", refused_end, accepted);
  assert_true(accepted > 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exited_threads_pools_serve_new_streams),
      cmocka_unit_test(exited_threads_records_are_freed),
      cmocka_unit_test(calls_naming_retiring_ids_race_the_reaper),
      cmocka_unit_test(a_call_holding_a_retiring_record_keeps_it),
      cmocka_unit_test(an_id_that_accepted_a_begin_accepts_its_end),
  };
  return test_main("unit_stream_exit", tests, sizeof tests / sizeof tests[0], argc, argv);
}

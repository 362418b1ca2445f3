/* streams.c - the stream table: stable id -> worker mapping, one stream
 * per id under concurrent first use, per-device thread-local caching, and
 * queue depth accounting. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

static void ids_map_to_workers(void **state) {
  (void)state;
  ruda_device *dev = test_open(3, 64, RUDA_BACKPRESSURE_BLOCK);
  for (ruda_stream_id id = 0; id < 50; id++) {
    ruda__stream *s = ruda__stream_get(&dev->sched, id);
    assert_non_null(s);
    assert_int_equal(s->id, id);
    assert_ptr_equal(s->worker, &dev->sched.workers[id % 3]);
    assert_ptr_equal(ruda__stream_get(&dev->sched, id), s);
  }
  ruda__stream *big = ruda__stream_get(&dev->sched, RUDA_STREAM_EXPLICIT_MAX);
  assert_ptr_equal(big->worker, &dev->sched.workers[RUDA_STREAM_EXPLICIT_MAX % 3]);
  /* The calling thread's stream: its id with the top bit cleared. */
  ruda_stream_id me = ruda_stream_current();
  assert_true(me >> 63);
  ruda__stream *cur = ruda__stream_get(&dev->sched, RUDA_STREAM_CURRENT);
  assert_int_equal(cur->id, me);
  assert_ptr_equal(cur->worker, &dev->sched.workers[(me & ~(UINT64_C(1) << 63)) % 3]);
  assert_ptr_equal(ruda__stream_get(&dev->sched, me), cur);
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), 52);
  test_close(dev);
}

static void caches_are_per_device(void **state) {
  (void)state;
  ruda_device *a = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda_device *b = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
  for (int i = 0; i < 4; i++) {
    ruda__stream *sa = ruda__stream_get(&a->sched, 1), *sb = ruda__stream_get(&b->sched, 1);
    assert_ptr_not_equal(sa, sb);
    assert_ptr_equal(sa->worker, &a->sched.workers[1]);
    assert_ptr_equal(sb->worker, &b->sched.workers[1]);
  }
  test_close(a);
  test_close(b);
  /* A device opened after a close (perhaps at the same address) never
   * sees the closed one's cached stream. */
  for (int i = 0; i < 5; i++) {
    ruda_device *d = test_open(2, 64, RUDA_BACKPRESSURE_BLOCK);
    ruda__stream *s = ruda__stream_get(&d->sched, 1);
    assert_ptr_equal(s->worker, &d->sched.workers[1]);
    assert_int_equal(ruda_stream_ids(d, NULL, 0), 1);
    test_close(d);
  }
}

enum { LOOKERS = 8, IDS = 701 }; /* prime: every odd step visits every id */
static ruda__stream *seen[LOOKERS][IDS];
static pthread_barrier_t go;

typedef struct looker {
  ruda_device *dev;
  int index;
} looker;

static void *look(void *p) {
  looker *l = p;
  pthread_barrier_wait(&go);
  /* Each thread walks the ids in its own order, so first uses collide
   * and the table grows while others probe it. */
  for (int k = 0; k < IDS; k++) {
    int id = (k * (2 * l->index + 1) + l->index * 97) % IDS;
    seen[l->index][id] = ruda__stream_get(&l->dev->sched, (ruda_stream_id)id);
  }
  return NULL;
}

static void concurrent_first_use(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 64, RUDA_BACKPRESSURE_BLOCK);
  looker ls[LOOKERS];
  pthread_t t[LOOKERS];
  assert_int_equal(pthread_barrier_init(&go, NULL, LOOKERS), 0);
  for (int i = 0; i < LOOKERS; i++) {
    ls[i] = (looker){dev, i};
    assert_int_equal(pthread_create(&t[i], NULL, look, &ls[i]), 0);
  }
  for (int i = 0; i < LOOKERS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&go);
  for (int id = 0; id < IDS; id++) {
    assert_non_null(seen[0][id]);
    assert_int_equal(seen[0][id]->id, id);
    for (int i = 1; i < LOOKERS; i++) assert_ptr_equal(seen[i][id], seen[0][id]);
  }
  assert_int_equal(ruda_stream_ids(dev, NULL, 0), IDS);
  test_close(dev);
}

static _Atomic int gate_open;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(200);
  return 0;
}

static void queue_depth_accounting(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1000, RUDA_BACKPRESSURE_ERROR);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  atomic_store(&gate_open, 0);
  ruda__worker *w0 = &dev->sched.workers[0], *w1 = &dev->sched.workers[1];
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  for (int i = 0; i < 9; i++) assert_ok(test_launch(dev, 2, "gate", NULL, 0)); /* stream 2: worker 0 */
  assert_int_equal(ruda__queue_depth(w0), 10);
  assert_int_equal(ruda__queue_depth(w1), 0);
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_sync(dev, 2, NULL));
  /* The last batch retires just after its futures complete. */
  for (int i = 0; ruda__queue_depth(w0) != 0; i++) {
    assert_true(i < 5000 * (int)test_patience());
    usleep(1000);
  }
  test_close(dev);
}

/* Messages name streams so a person can tell them apart. */
static void stream_names_are_readable(void **state) {
  (void)state;
  char b[RUDA__STREAM_NAME_MAX];
  assert_string_equal(ruda__stream_name(5, b), "stream 5");
  assert_string_equal(ruda__stream_name((UINT64_C(1) << 63) | 3, b), "thread stream #3");
  assert_string_equal(ruda__stream_name(UINT64_MAX - 1 - 2, b), "internal stream (memory fences, worker 2)");
  assert_string_equal(ruda__stream_name(UINT64_MAX - (UINT64_C(1) << 32) - 7, b), "internal stream (collectives)");
  /* And the error of a thread's own stream says so. */
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  assert_rc(ruda_graph_end_capture(dev, RUDA_STREAM_CURRENT, &(ruda_graph *){NULL}), RUDA_EGRAPHSTATE);
  assert_last_error_contains("thread stream #");
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ids_map_to_workers),
      cmocka_unit_test(caches_are_per_device),
      cmocka_unit_test(concurrent_first_use),
      cmocka_unit_test(stream_names_are_readable),
      cmocka_unit_test(queue_depth_accounting),
  };
  return test_main("unit_streams", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* backpressure.c - a full stream queue either refuses (RUDA_EQUEUEFULL)
 * or makes the producer wait, as configured; nothing is ever lost.
 *
 * A gate kernel holds the worker, so the queue fills deterministically:
 * the bound counts every command enqueued and not yet retired, including
 * the batch the worker is running. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static _Atomic int gate_open;
static _Atomic int gate_entered;
static _Atomic uint64_t incs;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_store(&gate_entered, 1);
  while (!atomic_load(&gate_open)) usleep(200);
  return 0;
}

/* args[0]: producer id (u32), args[1]: seq (u64), args[2]: u64 last+1 per
 * producer, args[3]: u64 violations. Runs on one worker only. */
static int seq_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t p = *(const uint32_t *)args[0];
  uint64_t seq = *(const uint64_t *)args[1];
  uint64_t *next = args[2];
  uint64_t *violations = args[3];
  if (seq != next[p]) (*violations)++;
  next[p] = seq + 1;
  atomic_fetch_add(&incs, 1);
  return 0;
}

static ruda_device *open_bounded(uint32_t bound, ruda_backpressure bp) {
  ruda_device *dev = test_open(1, bound, bp);
  atomic_store(&gate_open, 0);
  atomic_store(&gate_entered, 0);
  atomic_store(&incs, 0);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "seq", seq_kernel));
  return dev;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int launch_seq(ruda_device *dev, ruda_stream_id s, ruda_handle next, ruda_handle viol, uint32_t p,
                      uint64_t seq) {
  ruda_arg a[4] = {ruda_arg_scalar(&p, sizeof p), ruda_arg_scalar(&seq, sizeof seq),
                   ruda_arg_buffer(ruda_bind(next)), ruda_arg_buffer(ruda_bind(viol))};
  return test_launch(dev, s, "seq", a, 4);
}

/* next (u64 per producer, zeroed) and viol (one u64, zeroed), written and
 * synced on stream 0 before the queue is filled. */
static void make_counters(ruda_device *dev, ruda_handle *next, ruda_handle *viol) {
  uint64_t zeros[4] = {0};
  assert_ok(ruda_buffer_create(dev, 0, sizeof zeros, next));
  assert_ok(ruda_buffer_create(dev, 0, sizeof zeros[0], viol));
  test_write(dev, 0, ruda_bind(*next), zeros, sizeof zeros);
  test_write(dev, 0, ruda_bind(*viol), zeros, sizeof zeros[0]);
  assert_ok(ruda_sync(dev, 0, NULL));
}

static void error_policy_refuses_past_the_bound(void **state) {
  (void)state;
  enum { BOUND = 8 };
  ruda_device *dev = open_bounded(BOUND, RUDA_BACKPRESSURE_ERROR);
  ruda_handle next, viol;
  make_counters(dev, &next, &viol);
  /* The sync's batch may still be retiring; wait until the queue takes a
   * command, which the gate then holds. */
  int rc;
  while ((rc = test_launch(dev, 0, "gate", NULL, 0)) == RUDA_EQUEUEFULL) sleep_ms(1);
  assert_int_equal(rc, 0);
  while (!atomic_load(&gate_entered)) sleep_ms(1);

  /* Exactly BOUND - 1 more fit behind the gate; the next is refused, and
   * so is every other kind of bounded command. */
  uint64_t seq = 0;
  for (; seq < BOUND - 1; seq++) assert_ok(launch_seq(dev, 0, next, viol, 0, seq));
  assert_rc(launch_seq(dev, 0, next, viol, 0, seq), RUDA_EQUEUEFULL);
  char msg[32];
  snprintf(msg, sizeof msg, "bound %d", BOUND);
  assert_last_error_contains(msg);
  assert_last_error_contains("stream 0");
  const uint64_t zeros[1] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(viol));
  assert_rc(ruda_write(dev, 0, &d, zeros, 8), RUDA_EQUEUEFULL);
  ruda_future *f = NULL;
  uint64_t out;
  assert_rc(ruda_read(dev, 0, &d, &out, 8, &f), RUDA_EQUEUEFULL);
  assert_null(f);
  assert_rc(ruda_copy(dev, 0, ruda_bind(viol), ruda_bind_range(next, 0, 8)), RUDA_EQUEUEFULL);
  /* Another stream on the same worker shares the queue and its bound. */
  assert_rc(launch_seq(dev, 1, next, viol, 1, 0), RUDA_EQUEUEFULL);

  /* Control commands are not refused: a flush of a full stream returns
   * once the gate opens. */
  atomic_store(&gate_open, 1);
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), BOUND - 1);

  /* Drained, the queue takes commands again; the refused one is retried
   * and the producer's order is intact. */
  for (int tries = 0; (rc = launch_seq(dev, 0, next, viol, 0, seq)) == RUDA_EQUEUEFULL && tries < 5000 * (int)test_patience(); tries++)
    sleep_ms(1);
  assert_int_equal(rc, 0);
  assert_ok(ruda_sync(dev, 0, NULL));
  uint64_t nexts[4], v;
  test_read(dev, 0, ruda_bind(next), nexts, sizeof nexts);
  test_read(dev, 0, ruda_bind(viol), &v, sizeof v);
  assert_int_equal(nexts[0], BOUND);
  assert_int_equal(v, 0);
  assert_ok(ruda_buffer_free(dev, 0, next));
  assert_ok(ruda_buffer_free(dev, 0, viol));
  test_close(dev);
}

typedef struct producer {
  ruda_device *dev;
  ruda_handle next, viol;
  uint32_t id;
  uint64_t count;
  _Atomic uint64_t pushed;
  int rc;
} producer;

static void *produce(void *arg) {
  producer *p = arg;
  for (uint64_t s = 0; s < p->count; s++) {
    if ((p->rc = launch_seq(p->dev, p->id, p->next, p->viol, p->id, s)) != 0) return NULL;
    atomic_fetch_add(&p->pushed, 1);
  }
  return NULL;
}

static void block_policy_waits_and_loses_nothing(void **state) {
  (void)state;
  enum { BOUND = 4, P = 4, COUNT = 3000 };
  ruda_device *dev = open_bounded(BOUND, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle next, viol;
  make_counters(dev, &next, &viol);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));

  producer p[P];
  pthread_t t[P];
  for (uint32_t i = 0; i < P; i++) {
    p[i] = (producer){.dev = dev, .next = next, .viol = viol, .id = i, .count = COUNT};
    assert_int_equal(pthread_create(&t[i], NULL, produce, &p[i]), 0);
  }
  /* Behind the closed gate at most BOUND - 1 launches can be queued, so
   * the producers must be waiting, not failing and not running ahead. */
  sleep_ms(100);
  uint64_t pushed = 0;
  for (int i = 0; i < P; i++) pushed += atomic_load(&p[i].pushed);
  assert_true(pushed <= BOUND - 1);
  assert_int_equal(atomic_load(&incs), 0);
  atomic_store(&gate_open, 1);
  for (int i = 0; i < P; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < P; i++) assert_int_equal(p[i].rc, 0);
  for (ruda_stream_id s = 0; s < P; s++) assert_ok(ruda_sync(dev, s, NULL));
  assert_int_equal(atomic_load(&incs), P * COUNT);
  uint64_t nexts[P], v;
  test_read(dev, 0, ruda_bind(next), nexts, sizeof nexts);
  test_read(dev, 0, ruda_bind(viol), &v, sizeof v);
  for (int i = 0; i < P; i++) assert_int_equal(nexts[i], COUNT);
  assert_int_equal(v, 0);
  assert_ok(ruda_buffer_free(dev, 0, next));
  assert_ok(ruda_buffer_free(dev, 0, viol));
  test_close(dev);
}

/* RUDA_LAUNCH_NOWAIT under the block policy: a full queue refuses that
 * launch at once (RUDA_EQUEUEFULL, nothing queued, the stream unharmed),
 * while a launch without the flag still waits for room; the refused
 * launch never runs and every accepted one runs once, in order. */
static void nowait_launch_is_refused_by_a_full_queue(void **state) {
  (void)state;
  enum { BOUND = 4 };
  ruda_device *dev = open_bounded(BOUND, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle next, viol;
  make_counters(dev, &next, &viol);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  while (!atomic_load(&gate_entered)) sleep_ms(1);
  /* Behind the gate: fill the queue with NOWAIT launches until one is
   * refused; it must be refused within BOUND of them. */
  uint64_t seq = 0;
  int rc = 0;
  for (int i = 0; i < BOUND + 2 && rc == 0; i++) {
    uint32_t p = 0;
    ruda_arg a[4] = {ruda_arg_scalar(&p, sizeof p), ruda_arg_scalar(&seq, sizeof seq),
                     ruda_arg_buffer(ruda_bind(next)), ruda_arg_buffer(ruda_bind(viol))};
    ruda_launch_desc l = {.kernel = "seq", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = a, .nargs = 4,
                          .flags = RUDA_LAUNCH_NOWAIT};
    if ((rc = ruda_launch(dev, 0, &l)) == 0) seq++;
  }
  assert_rc(rc, RUDA_EQUEUEFULL);
  assert_last_error_contains("bound 4");
  assert_true(seq >= 1 && seq <= BOUND);
  assert_int_equal(atomic_load(&incs), 0);
  /* Without the flag the same launch waits until the gate opens. */
  atomic_store(&gate_open, 1);
  assert_ok(launch_seq(dev, 0, next, viol, 0, seq));
  seq++;
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(atomic_load(&incs), (int)seq);
  uint64_t nexts[4], v;
  test_read(dev, 0, ruda_bind(next), nexts, sizeof nexts);
  test_read(dev, 0, ruda_bind(viol), &v, sizeof v);
  assert_int_equal(nexts[0], seq);
  assert_int_equal(v, 0);
  /* An unknown flag beside it is still refused. */
  ruda_launch_desc bad = {.kernel = "gate", .grid = {1, 1, 1}, .block = {1, 1, 1}, .flags = RUDA_LAUNCH_NOWAIT | 0x80u};
  assert_rc(ruda_launch(dev, 0, &bad), RUDA_EINVAL);
  assert_ok(ruda_buffer_free(dev, 0, next));
  assert_ok(ruda_buffer_free(dev, 0, viol));
  test_close(dev);
}

static void frees_are_never_refused(void **state) {
  (void)state;
  /* The handle dies at the call; refusing its release would leak it. */
  enum { BOUND = 2 };
  ruda_device *dev = open_bounded(BOUND, RUDA_BACKPRESSURE_ERROR);
  ruda_handle h[10];
  for (int i = 0; i < 10; i++) assert_ok(ruda_buffer_create(dev, 0, 64, &h[i]));
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  while (!atomic_load(&gate_entered)) sleep_ms(1);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  assert_rc(test_launch(dev, 0, "gate", NULL, 0), RUDA_EQUEUEFULL);
  for (int i = 0; i < 10; i++) assert_ok(ruda_buffer_free(dev, 0, h[i]));
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  test_close(dev); /* LeakSanitizer checks the buffers went */
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(error_policy_refuses_past_the_bound),
      cmocka_unit_test(block_policy_waits_and_loses_nothing),
      cmocka_unit_test(nowait_launch_is_refused_by_a_full_queue),
      cmocka_unit_test(frees_are_never_refused),
  };
  return test_main("integration_backpressure", tests, sizeof tests / sizeof tests[0], argc, argv);
}

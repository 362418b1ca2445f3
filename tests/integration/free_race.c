/* free_race.c - a free racing another thread's use of the buffer never
 * lets the use touch memory handed out again.
 *
 * Thread A launches a kernel that fills buffer X with its marker, over and
 * over, on X's home stream; thread B frees X meanwhile, then creates Y on
 * the same stream (the pool hands out X's memory again when it may), fills
 * Y and checks it after a sync. A launch that pinned X before the free but
 * reached the queue after it would overwrite Y. Host backend. */
#include <pthread.h>
#include <sched.h>

#include "common.h"

enum { ROUNDS = 400, SIZE = 4096, MARK = 0x5a };

static _Atomic(void *) fill_ptr;

static int fill_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  atomic_store(&fill_ptr, args[0]);
  memset(args[0], MARK, SIZE);
  return 0;
}

/* ---- the window made wide: a launch pinned, then held on a full queue ---- */

typedef struct blocked_arg {
  ruda_device *dev;
  ruda_handle x;
  _Atomic pid_t tid; /* A's thread, once it runs */
  int rc;
} blocked_arg;

static void *blocked_launch(void *p) {
  blocked_arg *a = p;
  atomic_store(&a->tid, test_tid());
  ruda_arg arg = ruda_arg_buffer(ruda_bind(a->x));
  a->rc = test_launch(a->dev, 0, "fill", &arg, 1);
  return NULL;
}

/* Thread A's launch of X pins X and then waits for room in the queue
 * (queue bound 2, the worker held by a gate). Meanwhile X is freed and Y
 * created on the same stream. X's memory must not go to Y while A's
 * launch, which will run, still holds it. */
static void free_waits_for_a_pinned_launch(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 2, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "fill", fill_kernel));
  assert_ok(ruda_host_kernel_register(dev, "gate", test_gate_kernel));
  blocked_arg a = {.dev = dev};
  assert_ok(ruda_buffer_create(dev, 0, SIZE, &a.x));
  atomic_store(&test_gate_open, 0);
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  assert_ok(test_launch(dev, 0, "gate", NULL, 0)); /* the queue is full now */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, blocked_launch, &a), 0);
  /* A has pinned X and waits for room: its thread sleeps in the queue's
   * futex. */
  while (atomic_load(&a.tid) == 0) sched_yield();
  test_wait_blocked(atomic_load(&a.tid));
  assert_ok(ruda_buffer_free(dev, 0, a.x));
  ruda_handle y;
  assert_ok(ruda_buffer_create(dev, 0, SIZE, &y));
  uint64_t yaddr = 0;
  assert_ok(ruda_binding_device_ptr(dev, ruda_bind(y), &yaddr));
  atomic_store(&test_gate_open, 1);
  pthread_join(t, NULL);
  assert_ok(a.rc);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_non_null(atomic_load(&fill_ptr));
  if ((uint64_t)(uintptr_t)atomic_load(&fill_ptr) == yaddr)
    fail_msg("the launch pinned before the free ran on memory handed out again (buffer Y at 0x%llx)",
             (unsigned long long)yaddr);
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

typedef struct round_arg {
  ruda_device *dev;
  ruda_handle x;
  _Atomic int go, launched, done;
  int refused;
  int bad_rc; /* a launch's code other than 0 or ENOTFOUND, for the main thread to fail on */
} round_arg;

static void *launcher(void *p) {
  round_arg *a = p;
  while (!atomic_load(&a->go)) {
  }
  /* Many arguments naming X: the launch pins them one by one before it
   * queues, which widens the window a free can fall into. */
  ruda_arg args[48];
  for (int k = 0; k < 48; k++) args[k] = ruda_arg_buffer(ruda_bind(a->x));
  for (int i = 0; i < 64; i++) {
    int rc = test_launch(a->dev, 0, "fill", args, 48);
    if (rc == 0) atomic_fetch_add(&a->launched, 1);
    else if (rc == RUDA_ENOTFOUND) a->refused++; /* freed: refused at the call, as it must */
    else {
      a->bad_rc = rc;
      break;
    }
  }
  atomic_store(&a->done, 1);
  return NULL;
}

static void free_racing_launches_never_hits_new_buffers(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "fill", fill_kernel));
  unsigned char pattern[SIZE], got[SIZE];
  int corrupted = 0;
  for (int round = 0; round < ROUNDS; round++) {
    round_arg a = {.dev = dev};
    assert_ok(ruda_buffer_create(dev, 0, SIZE, &a.x));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, launcher, &a), 0);
    atomic_store(&a.go, 1);
    /* Free somewhere in the middle of A's launches. */
    while (atomic_load(&a.launched) < 1 + round % 32 && !atomic_load(&a.done)) {
    }
    for (volatile int spin = 0; spin < (round % 7) * 100; spin++) {
    }
    assert_ok(ruda_buffer_free(dev, 0, a.x));
    ruda_handle y;
    assert_ok(ruda_buffer_create(dev, 0, SIZE, &y));
    memset(pattern, round & 0x3f, sizeof pattern); /* never MARK */
    test_write(dev, 0, ruda_bind(y), pattern, sizeof pattern);
    pthread_join(t, NULL);
    if (a.bad_rc != 0) fail_msg("round %d: launch: %s", round, ruda_err_name(a.bad_rc));
    assert_ok(ruda_sync(dev, 0, NULL));
    test_read(dev, 0, ruda_bind(y), got, sizeof got);
    if (memcmp(got, pattern, sizeof got) != 0) corrupted++;
    if (getenv("FREE_RACE_DEBUG")) fprintf(stderr, "round %d: launched %d refused %d\n", round, atomic_load(&a.launched), a.refused);
    assert_ok(ruda_buffer_free(dev, 0, y));
  }
  assert_int_equal(corrupted, 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(free_racing_launches_never_hits_new_buffers),
      cmocka_unit_test(free_waits_for_a_pinned_launch),
  };
  return test_main("integration_free_race", tests, sizeof tests / sizeof tests[0], argc, argv);
}

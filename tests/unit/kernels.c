/* kernels.c - the kernel registry behind ruda_launch, and the per-thread
 * cache in front of it: a replaced kernel is seen at once, a name rewritten
 * behind the same pointer finds its own kernel, devices never share cached
 * entries (also across a close and a reopen), and more kernels than the
 * cache holds still resolve. */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

/* Each kernel adds its own weight to one counter, so the total says which
 * kernels ran and how often. */
static _Atomic uint64_t total;

#define WEIGHT_KERNEL(w) \
  static int k##w(const ruda_host_ctx *c, void *const *a) { \
    (void)c;                                                 \
    (void)a;                                                 \
    atomic_fetch_add(&total, w);                             \
    return 0;                                                \
  }
WEIGHT_KERNEL(1)
WEIGHT_KERNEL(10)
WEIGHT_KERNEL(100)
WEIGHT_KERNEL(1000)

static uint64_t ran(ruda_device *dev) {
  assert_ok(ruda_sync(dev, 0, NULL));
  return atomic_exchange(&total, 0);
}

static void replacement_is_seen_at_once(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  assert_ok(ruda_host_kernel_register(dev, "k", k1));
  for (int i = 0; i < 3; i++) assert_ok(test_launch(dev, 0, "k", NULL, 0));
  assert_int_equal(ran(dev), 3);
  ruda__kernel *before = ruda__kernel_find(dev, "k");
  assert_ok(ruda_host_kernel_register(dev, "k", k10)); /* same name: replaces */
  assert_ptr_not_equal(ruda__kernel_find(dev, "k"), before);
  for (int i = 0; i < 3; i++) assert_ok(test_launch(dev, 0, "k", NULL, 0));
  assert_int_equal(ran(dev), 30);
  test_close(dev);
}

static void rewritten_name_finds_its_kernel(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  assert_ok(ruda_host_kernel_register(dev, "alpha", k1));
  assert_ok(ruda_host_kernel_register(dev, "bravo", k10));
  char name[16];
  strcpy(name, "alpha");
  assert_ok(test_launch(dev, 0, name, NULL, 0));
  assert_ok(test_launch(dev, 0, name, NULL, 0));
  strcpy(name, "bravo"); /* same pointer, another kernel */
  assert_ok(test_launch(dev, 0, name, NULL, 0));
  strcpy(name, "charlie"); /* same pointer, no kernel */
  assert_rc(test_launch(dev, 0, name, NULL, 0), RUDA_EKERNEL);
  assert_last_error_contains("charlie");
  assert_int_equal(ran(dev), 12);
  test_close(dev);
}

static void devices_never_share_entries(void **state) {
  (void)state;
  ruda_device *a = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_device *b = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  assert_ok(ruda_host_kernel_register(a, "k", k1));
  assert_ok(ruda_host_kernel_register(b, "k", k100));
  static const char name[] = "k";
  for (int i = 0; i < 4; i++) {
    assert_ok(test_launch(a, 0, name, NULL, 0));
    assert_ok(test_launch(b, 0, name, NULL, 0));
  }
  assert_int_equal(ran(a) + ran(b), 404);
  test_close(a);
  test_close(b);
  /* A device opened after a close, perhaps at the same address, finds
   * nothing the closed one cached. */
  for (int i = 0; i < 5; i++) {
    ruda_device *d = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
    assert_rc(test_launch(d, 0, name, NULL, 0), RUDA_EKERNEL);
    assert_ok(ruda_host_kernel_register(d, name, k1000));
    assert_ok(test_launch(d, 0, name, NULL, 0));
    assert_int_equal(ran(d), 1000);
    test_close(d);
  }
}

static void more_kernels_than_cache_slots(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 4096, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  enum { K = 40 };
  char names[K][16];
  ruda_host_kernel_fn fns[4] = {k1, k10, k100, k1000};
  uint64_t weight[4] = {1, 10, 100, 1000}, want = 0;
  for (int i = 0; i < K; i++) {
    snprintf(names[i], sizeof names[i], "kernel_%d", i);
    assert_ok(ruda_host_kernel_register(dev, names[i], fns[i % 4]));
  }
  for (int round = 0; round < 5; round++)
    for (int i = 0; i < K; i++) {
      int j = (i * 7 + round) % K; /* an order that revisits slots */
      assert_ok(test_launch(dev, 0, names[j], NULL, 0));
      assert_ptr_equal(ruda__kernel_find(dev, names[j])->host_fn, fns[j % 4]);
      want += weight[j % 4];
    }
  assert_int_equal(ran(dev), want);
  test_close(dev);
}

/* Launchers on their own streams while the main thread keeps replacing
 * the kernel: every launch runs one of the two versions (TSan checks the
 * entry's publication and the kernel pointer's swap). */
enum { LAUNCHERS = 4, LAUNCHES = 2000 };
static ruda_device *shared_dev;

/* Returns the first failing code (as a pointer-sized integer), for the
 * main thread to assert on: no cmocka off the main thread. */
static void *launcher(void *arg) {
  ruda_stream_id s = (ruda_stream_id)(uintptr_t)arg;
  intptr_t rc = 0;
  for (int i = 0; i < LAUNCHES && rc == 0; i++) rc = test_launch(shared_dev, s, "swapped", NULL, 0);
  if (rc == 0) rc = ruda_sync(shared_dev, s, NULL);
  return (void *)rc;
}

static void replacement_under_concurrent_launches(void **state) {
  (void)state;
  shared_dev = test_open(2, 65536, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  assert_ok(ruda_host_kernel_register(shared_dev, "swapped", k1));
  pthread_t t[LAUNCHERS];
  for (uintptr_t i = 0; i < LAUNCHERS; i++) assert_int_equal(pthread_create(&t[i], NULL, launcher, (void *)i), 0);
  for (int i = 0; i < 50; i++) assert_ok(ruda_host_kernel_register(shared_dev, "swapped", i % 2 ? k1 : k10));
  for (int i = 0; i < LAUNCHERS; i++) {
    void *rc = NULL;
    pthread_join(t[i], &rc);
    if (rc != NULL) fail_msg("launcher %d: %s", i, ruda_err_name((int)(intptr_t)rc));
  }
  uint64_t got = atomic_load(&total), n = (uint64_t)LAUNCHERS * LAUNCHES;
  /* got = ones + 10 * tens with ones + tens = n */
  assert_true(got >= n && got <= 10 * n && (got - n) % 9 == 0);
  test_close(shared_dev);
}

/* A launch by reference: resolved once, follows a replacement, refused on
 * another device, and messages still name the kernel. */
static int launch_ref(ruda_device *dev, const ruda_kernel_ref *ref, uint32_t block) {
  ruda_launch_desc l = {.ref = ref, .grid = {1, 1, 1}, .block = {block, 1, 1}};
  return ruda_launch(dev, 0, &l);
}

static void launches_by_reference(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_device *other = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&total, 0);
  const ruda_kernel_ref *ref = NULL, *ref2 = NULL;
  assert_rc(ruda_kernel_lookup(dev, "k", &ref), RUDA_EKERNEL);
  assert_null(ref);
  assert_last_error_contains("\"k\"");
  assert_rc(ruda_kernel_lookup(dev, NULL, &ref), RUDA_EINVAL);
  assert_rc(ruda_kernel_lookup(dev, "k", NULL), RUDA_EINVAL);
  assert_ok(ruda_host_kernel_register(dev, "k", k1));
  assert_ok(ruda_kernel_lookup(dev, "k", &ref));
  assert_ok(ruda_kernel_lookup(dev, "k", &ref2));
  assert_ptr_equal(ref, ref2);
  for (int i = 0; i < 3; i++) assert_ok(launch_ref(dev, ref, 1));
  assert_int_equal(ran(dev), 3);
  assert_ok(ruda_host_kernel_register(dev, "k", k10)); /* a replacement is what the ref launches */
  assert_ok(launch_ref(dev, ref, 1));
  assert_int_equal(ran(dev), 10);
  /* Checks at the call name the kernel the reference holds. */
  assert_rc(launch_ref(dev, ref, 0), RUDA_EINVAL); /* a zero block */
  assert_last_error_contains("\"k\"");
  /* Another device's reference is refused, and nothing runs. */
  assert_ok(ruda_host_kernel_register(other, "k", k100));
  assert_rc(launch_ref(other, ref, 1), RUDA_EINVAL);
  assert_last_error_contains("not one of this device's");
  assert_int_equal(ran(other), 0);
  /* Neither name nor reference. */
  ruda_launch_desc none = {.grid = {1, 1, 1}, .block = {1, 1, 1}};
  assert_rc(ruda_launch(dev, 0, &none), RUDA_EINVAL);
  test_close(other);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(replacement_is_seen_at_once),
      cmocka_unit_test(rewritten_name_finds_its_kernel),
      cmocka_unit_test(devices_never_share_entries),
      cmocka_unit_test(more_kernels_than_cache_slots),
      cmocka_unit_test(replacement_under_concurrent_launches),
      cmocka_unit_test(launches_by_reference),
  };
  return test_main("unit_kernels", tests, sizeof tests / sizeof tests[0], argc, argv);
}

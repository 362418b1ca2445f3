/* handles.c - the handle table's state word: generations, the live bit
 * and the pin count that keeps a freed buffer's memory until its last
 * queued use has run. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define REFS(st) ((uint32_t)((st)&0xffffffffu))
#define LIVE_BIT (UINT64_C(1) << 32)

static _Atomic int gate_open;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(200);
  return 0;
}

static int noop(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static uint64_t state_of(ruda_device *dev, ruda_handle h) {
  ruda__slot *chunk = atomic_load(&dev->handles.chunks[h.slot / RUDA__SLOTS_PER_CHUNK]);
  return atomic_load(&chunk[h.slot % RUDA__SLOTS_PER_CHUNK].state);
}

static ruda_device *open_gated(void) {
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&gate_open, 0);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "noop", noop));
  return dev;
}

static void generations_and_reuse(void **state) {
  (void)state;
  ruda_device *dev = open_gated();
  ruda_handle a, b;
  assert_ok(ruda_buffer_create(dev, 0, 32, &a));
  uint64_t st = state_of(dev, a);
  assert_true(st & LIVE_BIT);
  assert_int_equal(REFS(st), 1); /* the owner's reference */
  assert_int_equal(ruda__handles_live_count(&dev->handles), 1);
  assert_int_equal(ruda__handles_live_bytes(&dev->handles), 32);

  assert_ok(ruda_buffer_free(dev, 0, a));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  assert_int_equal(ruda__handles_live_bytes(&dev->handles), 0);
  /* The freed slot is the next one handed out, one generation on. */
  assert_ok(ruda_buffer_create(dev, 0, 48, &b));
  assert_int_equal(b.slot, a.slot);
  assert_int_equal(b.gen, a.gen + 1);
  uint64_t addr, size;
  assert_rc(ruda__handles_pin(&dev->handles, a, &addr, &size), RUDA_ENOTFOUND);
  assert_ok(ruda__handles_pin(&dev->handles, b, &addr, &size));
  assert_int_equal(size, 48);
  assert_int_equal(REFS(state_of(dev, b)), 2);
  ruda__handles_unpin(&dev->handles, b.slot, NULL);
  assert_int_equal(REFS(state_of(dev, b)), 1);
  /* kill: dead at once, memory kept by the owner's reference. */
  assert_ok(ruda__handles_kill(&dev->handles, b, NULL));
  assert_false(state_of(dev, b) & LIVE_BIT);
  assert_rc(ruda__handles_kill(&dev->handles, b, NULL), RUDA_EFREE);
  assert_rc(ruda__handles_pin(&dev->handles, b, &addr, &size), RUDA_ENOTFOUND);
  assert_int_equal(ruda__handles_live_count(&dev->handles), 1);
  ruda__handles_unpin(&dev->handles, b.slot, NULL);
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  test_close(dev);
}

/* Generations are 31 bits and wrap past 0: a handle freed before the wrap
 * is still "already freed" (RUDA_EFREE) after it, never unknown, and
 * stale for every use. */
static void generation_wrap(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle a, b, c;
  assert_ok(ruda_buffer_create(dev, 0, 32, &a));
  assert_ok(ruda_buffer_free(dev, 0, a));
  /* Age the free slot to just below the wrap. */
  ruda__slot *sl = ruda__handles_slot(&dev->handles, a.slot);
  atomic_store(&sl->state, (uint64_t)0x7ffffffeu << 33);
  assert_ok(ruda_buffer_create(dev, 0, 32, &b));
  assert_int_equal(b.slot, a.slot);
  assert_int_equal(b.gen, 0x7fffffffu);
  assert_ok(ruda_buffer_free(dev, 0, b));
  assert_ok(ruda_buffer_create(dev, 0, 32, &c));
  assert_int_equal(c.slot, b.slot);
  assert_int_equal(c.gen, 1); /* 0 is skipped */
  uint64_t size;
  assert_rc(ruda_buffer_size(dev, b, &size), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, b), RUDA_EFREE);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){c.slot, 2}), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){c.slot, 0x80000001u}), RUDA_ENOTFOUND);
  assert_ok(ruda_buffer_size(dev, c, &size));
  assert_ok(ruda_buffer_free(dev, 0, c));
  assert_rc(ruda_buffer_free(dev, 0, c), RUDA_EFREE);
  test_close(dev);
}

static void queued_uses_pin_a_freed_buffer(void **state) {
  (void)state;
  ruda_device *dev = open_gated();
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  for (int i = 0; i < 5; i++) assert_ok(test_launch(dev, 0, "noop", &a, 1));
  assert_int_equal(REFS(state_of(dev, h)), 6);
  /* Freed on another stream while the uses wait: dead, not released. */
  assert_ok(ruda_buffer_free(dev, 1, h));
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_false(state_of(dev, h) & LIVE_BIT);
  assert_int_equal(REFS(state_of(dev, h)), 5);
  assert_int_equal(ruda__handles_live_count(&dev->handles), 1);
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  test_close(dev);
}

static void refused_calls_release_their_pins(void **state) {
  (void)state;
  ruda_device *dev = test_open(1, 2, RUDA_BACKPRESSURE_ERROR);
  atomic_store(&gate_open, 0);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "noop", noop));
  ruda_handle h, small;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  assert_ok(ruda_buffer_create(dev, 0, 8, &small));
  char buf[64] = {0};
  /* Range errors after a pin. */
  ruda_arg two[2] = {ruda_arg_buffer(ruda_bind(h)), ruda_arg_buffer(ruda_bind_range(small, 4, 8))};
  assert_rc(test_launch(dev, 0, "noop", two, 2), RUDA_ERANGE);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  assert_rc(ruda_write(dev, 0, &d, buf, 63), RUDA_EINVAL);
  ruda_future *f = NULL;
  assert_rc(ruda_read(dev, 0, &d, buf, 65, &f), RUDA_EINVAL);
  assert_rc(ruda_copy(dev, 0, ruda_bind(small), ruda_bind(h)), RUDA_ERANGE);
  ruda_launch_desc ind = {.kernel = "noop", .block = {1, 1, 1}, .args = two, .nargs = 1,
                          .flags = RUDA_LAUNCH_INDIRECT, .indirect_grid = ruda_bind_range(small, 0, 8)};
  assert_rc(ruda_launch(dev, 0, &ind), RUDA_ERANGE);
  /* A dry run pins to validate, then lets go. */
  ruda_launch_desc dry = {.kernel = "noop", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = two, .nargs = 1,
                          .flags = RUDA_LAUNCH_DRY_RUN};
  assert_ok(ruda_launch(dev, 0, &dry));
  /* Queue-full refusals. */
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  assert_ok(test_launch(dev, 0, "gate", NULL, 0));
  assert_rc(test_launch(dev, 0, "noop", two, 1), RUDA_EQUEUEFULL);
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_EQUEUEFULL);
  assert_rc(ruda_read(dev, 0, &d, buf, 64, &f), RUDA_EQUEUEFULL);
  assert_rc(ruda_copy(dev, 0, ruda_bind(h), ruda_bind(small)), RUDA_EQUEUEFULL);
  assert_int_equal(REFS(state_of(dev, h)), 1);
  assert_int_equal(REFS(state_of(dev, small)), 1);
  atomic_store(&gate_open, 1);
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_ok(ruda_buffer_free(dev, 0, small));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  test_close(dev);
}

typedef struct churn {
  ruda_device *dev;
  uint32_t id;
  int rc;
} churn;

/* Creates, uses and frees buffers; slots are reused across threads. */
static void *churn_thread(void *p) {
  churn *c = p;
  for (int i = 0; i < 2000 && c->rc == 0; i++) {
    ruda_handle h;
    uint64_t v = ((uint64_t)c->id << 32) | (uint64_t)i, back = 0;
    if ((c->rc = ruda_buffer_create(c->dev, c->id, 8, &h)) != 0) break;
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
    ruda_future *f = NULL;
    if ((c->rc = ruda_write(c->dev, c->id, &d, &v, 8)) != 0) break;
    if ((c->rc = ruda_read(c->dev, c->id, &d, &back, 8, &f)) != 0) break;
    if ((c->rc = ruda_buffer_free(c->dev, c->id, h)) != 0) break;
    c->rc = ruda_future_wait(f, NULL);
    ruda_future_free(f);
    if (c->rc == 0 && back != v) c->rc = -1000;
  }
  return NULL;
}

static void concurrent_churn(void **state) {
  (void)state;
  ruda_device *dev = test_open(4, 1024, RUDA_BACKPRESSURE_BLOCK);
  enum { T = 6 };
  churn c[T];
  pthread_t t[T];
  for (uint32_t i = 0; i < T; i++) {
    c[i] = (churn){dev, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(c[i].rc, 0);
  for (ruda_stream_id s = 0; s < T; s++) assert_ok(ruda_sync(dev, s, NULL));
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  /* Slots were reused rather than carved anew for each buffer. */
  assert_true(dev->handles.nslots <= 64);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(generations_and_reuse),
      cmocka_unit_test(generation_wrap),
      cmocka_unit_test(queued_uses_pin_a_freed_buffer),
      cmocka_unit_test(refused_calls_release_their_pins),
      cmocka_unit_test(concurrent_churn),
  };
  return test_main("unit_handles", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* order.c - cross-stream ordering internals (scheduler/order.c): when a
 * MARK and a WAIT are pushed, and when not; sharing of MARKs; the ticket
 * counter; the slot's last-use record.
 *
 * Counts come from dev->sched.order (MARKs pushed, MARKs shared, WAITs pushed).
 * A "gate" kernel holds a worker so the test decides what it has run. The
 * device-backend cases copy the host table with events that complete when
 * the test says and a stream_wait that records its calls, as cuda's
 * cuStreamWaitEvent would. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define WORKERS 4

static _Atomic int gate[WORKERS];

/* gate(k): blocks until gate[k] opens. */
static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t k = *(const uint32_t *)args[0];
  while (!atomic_load(&gate[k])) usleep(100);
  return 0;
}

/* set(buf, n, v): buf[i] = v. */
static int set_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t *buf = args[0];
  uint32_t n = *(const uint32_t *)args[1], v = *(const uint32_t *)args[2];
  for (uint32_t i = 0; i < n; i++) buf[i] = v;
  return 0;
}

/* sum(out, a, b, n): out[i] = a[i] + b[i]. */
static int sum_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t *out = args[0];
  const uint32_t *a = args[1], *b = args[2];
  uint32_t n = *(const uint32_t *)args[3];
  for (uint32_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  return 0;
}

static int nop_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return 0;
}

static void register_kernels(ruda_device *dev) {
  for (int i = 0; i < WORKERS; i++) atomic_store(&gate[i], 1);
  assert_ok(ruda_host_kernel_register(dev, "nop", nop_kernel));
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  assert_ok(ruda_host_kernel_register(dev, "set", set_kernel));
  assert_ok(ruda_host_kernel_register(dev, "sum", sum_kernel));
}

static ruda_device *open_host(void) {
  ruda_device *dev = test_open(WORKERS, 65536, RUDA_BACKPRESSURE_BLOCK);
  register_kernels(dev);
  return dev;
}

static void close_gate(ruda_device *dev, ruda_stream_id s) {
  uint32_t k = (uint32_t)(s % WORKERS);
  atomic_store(&gate[k], 0);
  ruda_arg a = ruda_arg_scalar(&k, 4);
  assert_ok(test_launch(dev, s, "gate", &a, 1));
}

static void open_gate(ruda_stream_id s) { atomic_store(&gate[s % WORKERS], 1); }

static void set(ruda_device *dev, ruda_stream_id s, ruda_handle h, uint32_t n, uint32_t v) {
  ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&n, 4), ruda_arg_scalar(&v, 4)};
  assert_ok(test_launch(dev, s, "set", a, 3));
}

static void sum(ruda_device *dev, ruda_stream_id s, ruda_handle out, ruda_handle a, ruda_handle b, uint32_t n) {
  ruda_arg g[4] = {ruda_arg_buffer(ruda_bind(out)), ruda_arg_buffer(ruda_bind(a)), ruda_arg_buffer(ruda_bind(b)),
                   ruda_arg_scalar(&n, 4)};
  assert_ok(test_launch(dev, s, "sum", g, 4));
}

static void expect_all(ruda_device *dev, ruda_stream_id s, ruda_handle h, uint32_t n, uint32_t v) {
  uint32_t got[64];
  assert_true(n <= 64);
  test_read(dev, s, ruda_bind_range(h, 0, n * 4), got, n * 4);
  for (uint32_t i = 0; i < n; i++)
    if (got[i] != v) fail_msg("element %u is %u, expected %u", i, got[i], v);
}

static uint64_t marks(ruda_device *dev) { return atomic_load(&dev->sched.order.marks); }
static uint64_t shared(ruda_device *dev) { return atomic_load(&dev->sched.order.shared); }
static uint64_t waits(ruda_device *dev) { return atomic_load(&dev->sched.order.waits); }

static ruda_handle buffer(ruda_device *dev, ruda_stream_id s, uint32_t n) {
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, s, n * 4, &h));
  return h;
}

/* ---- no ordering needed: nothing pushed ---- */

static void same_worker_pushes_nothing(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16), y = buffer(dev, 4, 16), z = buffer(dev, 8, 16);
  close_gate(dev, 0); /* worker 0 busy: a MARK would be needed if ordering were */
  set(dev, 0, x, 16, 1);
  set(dev, 4, y, 16, 2); /* stream 4: worker 0 too */
  sum(dev, 8, z, x, y, 16);
  test_write(dev, 12, ruda_bind(x), (uint32_t[16]){0}, 64);
  assert_ok(ruda_copy(dev, 4, ruda_bind(y), ruda_bind(z)));
  assert_int_equal(marks(dev), 0);
  assert_int_equal(waits(dev), 0);
  open_gate(0);
  expect_all(dev, 0, y, 16, 3);
  expect_all(dev, 4, x, 16, 0);
  assert_int_equal(marks(dev), 0);
  assert_int_equal(waits(dev), 0);
  test_close(dev);
}

static void finished_work_pushes_nothing(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16), y = buffer(dev, 1, 16);
  set(dev, 0, x, 16, 7);
  assert_ok(ruda_sync(dev, 0, NULL));
  /* Worker 0 ran the write: on the host its work is done. */
  set(dev, 1, y, 16, 1);
  sum(dev, 1, y, x, y, 16);
  expect_all(dev, 1, y, 16, 8);
  /* A buffer made on stream 0 while worker 0 had run everything: its
   * first use elsewhere needs nothing either. */
  ruda_handle z = buffer(dev, 0, 16);
  set(dev, 3, z, 16, 5);
  assert_ok(ruda_flush(dev, 3, NULL));
  assert_int_equal(marks(dev), 0);
  assert_int_equal(waits(dev), 0);
  test_close(dev);
}

/* ---- ordering needed ---- */

static void unfinished_writer_gets_one_mark_per_worker(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16), y = buffer(dev, 0, 16), z = buffer(dev, 1, 16), w = buffer(dev, 2, 16);
  assert_ok(ruda_sync(dev, 0, NULL));
  close_gate(dev, 0);
  set(dev, 0, x, 16, 10);
  set(dev, 0, y, 16, 20);
  /* Both last used on worker 0, not run yet: one MARK, one WAIT. */
  sum(dev, 1, z, x, y, 16);
  assert_int_equal(marks(dev), 1);
  assert_int_equal(waits(dev), 1);
  /* x's last use is now worker 1's: again on 1, nothing. */
  sum(dev, 1, z, x, z, 16);
  assert_int_equal(marks(dev), 1);
  assert_int_equal(waits(dev), 1);
  /* On worker 2: after worker 1, which waits behind the gate. */
  sum(dev, 2, w, z, z, 16);
  assert_int_equal(marks(dev), 2);
  assert_int_equal(waits(dev), 2);
  open_gate(0);
  expect_all(dev, 2, w, 16, 2 * (10 + 20 + 10));
  test_close(dev);
}

static void refused_command_leaves_no_mark(void **state) {
  (void)state;
  ruda_device *dev = test_open(WORKERS, 4, RUDA_BACKPRESSURE_ERROR);
  register_kernels(dev);
  ruda_handle x = buffer(dev, 0, 16), y = buffer(dev, 1, 16);
  close_gate(dev, 0);
  close_gate(dev, 1);
  set(dev, 0, x, 16, 3);
  uint32_t n = 16, v = 4;
  ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(y)), ruda_arg_scalar(&n, 4), ruda_arg_scalar(&v, 4)};
  int queued = 1; /* the gate */
  while (queued < 4) {
    assert_ok(test_launch(dev, 1, "set", a, 3));
    queued++;
  }
  /* Worker 1's queue is full: the command needing worker 0's MARK is
   * refused whole, and no MARK or WAIT is left behind. */
  assert_rc(test_launch(dev, 1, "sum", (ruda_arg[4]){ruda_arg_buffer(ruda_bind(y)), ruda_arg_buffer(ruda_bind(x)),
                                                      ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&n, 4)}, 4),
            RUDA_EQUEUEFULL);
  assert_int_equal(marks(dev), 0);
  assert_int_equal(waits(dev), 0);
  open_gate(1);
  assert_ok(ruda_sync(dev, 1, NULL));
  sum(dev, 1, y, x, x, 16);
  assert_int_equal(marks(dev), 1);
  open_gate(0);
  expect_all(dev, 1, y, 16, 6);
  test_close(dev);
}

static void stale_record_orders_after_every_busy_worker(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16), out = buffer(dev, 3, 16);
  set(dev, 0, x, 16, 9);
  assert_ok(ruda_sync(dev, 0, NULL));
  close_gate(dev, 1);
  close_gate(dev, 2);
  /* A record left by a freed buffer of this slot is not trusted: the use
   * orders after every worker that has not run everything. */
  _Atomic uint64_t *slot = ruda__handles_last(&dev->handles, x.slot);
  atomic_store(slot, ruda__use_pack(0, x.gen + 1, 0));
  sum(dev, 3, out, x, x, 16);
  /* Workers 1 and 2 are busy, worker 0 has run everything. */
  assert_int_equal(marks(dev), 2);
  assert_int_equal(waits(dev), 1);
  open_gate(1);
  open_gate(2);
  expect_all(dev, 3, out, 16, 18);
  test_close(dev);
}

/* A client in the middle of issuing a use of x on worker wi (between
 * ruda__order_lock and ruda__order_publish), as another thread would be. */
static void begin_issue(ruda_device *dev, ruda__order *o, ruda_handle x, uint32_t wi, uint32_t write) {
  ruda__order_init(o);
  ruda__order_note(o, ruda__handles_last(&dev->handles, x.slot), x.slot, x.gen, ruda__lane_of(&dev->sched, wi), write);
  ruda__order_lock(o, ruda__lane_of(&dev->sched, wi));
}

/* Another client thread issuing one call on x; `issued` once it returned. */
typedef struct {
  ruda_device *dev;
  ruda_handle x;
  _Atomic int issued;
  int rc, wait_rc; /* asserted by the main thread */
} issuer;

static void *write_x(void *p) {
  issuer *a = p;
  uint32_t v[16] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(a->x));
  a->rc = ruda_write(a->dev, 0, &d, v, sizeof v);
  atomic_store(&a->issued, 1);
  return NULL;
}

/* Waits (10 s at most) until x's use lock shows a writer that claimed it
 * and waits for the readers issuing now. */
static void wait_for_claimed_write(ruda_device *dev, ruda_handle x) {
  _Atomic uint64_t *lk = ruda__handles_last(&dev->handles, x.slot) + RUDA__USE_LOCK;
  for (int i = 0; !(atomic_load(lk) & RUDA__USE_LOCK_WRITER); i++) {
    if (i == 100000 * (int)test_patience()) fail_msg("the write never claimed the use lock");
    usleep(100);
  }
}

/* Waits (10 s at most) until a use of x is pinned and not yet queued: a
 * call past its pin, at or before the use lock. */
static void wait_for_pending_use(ruda_device *dev, ruda_handle x) {
  ruda__slot *sl = ruda__handles_slot(&dev->handles, x.slot);
  for (int i = 0; atomic_load(&sl->pending) == 0; i++) {
    if (i == 100000 * (int)test_patience()) fail_msg("no use of the buffer was ever pending");
    usleep(100);
  }
}

static void write_waits_for_reads_being_issued(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16);
  assert_ok(ruda_sync(dev, 0, NULL));
  close_gate(dev, 1);
  close_gate(dev, 2);
  /* Two reads of x being issued at once, on workers 1 and 2: both get in. */
  ruda__order r1, r2;
  begin_issue(dev, &r1, x, 1, RUDA__USE_READ);
  begin_issue(dev, &r2, x, 2, RUDA__USE_READ);
  issuer a = {.dev = dev, .x = x};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, write_x, &a), 0);
  wait_for_claimed_write(dev, x);
  /* The write cannot look at x's readers while reads are mid-issue. */
  assert_int_equal(atomic_load(&a.issued), 0);
  ruda__order_publish(&r1, ruda__lane_of(&dev->sched, 1));
  assert_int_equal(atomic_load(&a.issued), 0); /* r2 still holds it */
  ruda__order_publish(&r2, ruda__lane_of(&dev->sched, 2));
  pthread_join(t, NULL);
  assert_ok(a.rc);
  /* It saw both: ordered after workers 1 and 2 (both still gated). */
  assert_int_equal(marks(dev), 2);
  assert_int_equal(waits(dev), 1);
  open_gate(1);
  open_gate(2);
  expect_all(dev, 0, x, 16, 0);
  test_close(dev);
}

static void *read_x(void *p) {
  issuer *a = p;
  uint32_t v[16];
  ruda_future *f = NULL;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(a->x));
  a->rc = ruda_read(a->dev, 3, &d, v, sizeof v, &f);
  atomic_store(&a->issued, 1);
  if (a->rc == 0) a->wait_rc = ruda_future_wait(f, NULL);
  ruda_future_free(f);
  return NULL;
}

static void read_waits_for_a_write_being_issued(void **state) {
  (void)state;
  ruda_device *dev = open_host();
  ruda_handle x = buffer(dev, 0, 16);
  assert_ok(ruda_sync(dev, 0, NULL));
  close_gate(dev, 1);
  /* A write of x mid-issue on worker 1 (gated): a read on worker 3 waits
   * for its publish, then orders after it. */
  ruda__order w;
  begin_issue(dev, &w, x, 1, RUDA__USE_WRITE);
  issuer a = {.dev = dev, .x = x};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, read_x, &a), 0);
  wait_for_pending_use(dev, x); /* the read pinned x: at the lock the write holds */
  assert_int_equal(atomic_load(&a.issued), 0);
  ruda__order_publish(&w, ruda__lane_of(&dev->sched, 1));
  test_wait_count(&a.issued, 1);
  /* It waited for the publish: ordered after worker 1's write. */
  assert_int_equal(marks(dev), 1);
  assert_int_equal(waits(dev), 1);
  open_gate(1);
  pthread_join(t, NULL);
  assert_ok(a.rc);
  assert_ok(a.wait_rc);
  test_close(dev);
}

static void tickets_count_enqueued_commands(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 8, RUDA_BACKPRESSURE_ERROR);
  register_kernels(dev);
  ruda__worker *w = &dev->sched.workers[0];
  close_gate(dev, 0);
  uint32_t ok = 1, refused = 0;
  for (int i = 0; i < 20; i++) {
    if (test_launch(dev, 0, "nop", NULL, 0) == 0) ok++;
    else refused++;
  }
  assert_int_equal(ok, 8);
  assert_int_equal(refused, 13);
  /* Refused admissions take no ticket and leave no place taken. */
  assert_int_equal(atomic_load(&w->tickets), 8);
  assert_int_equal(ruda__queue_depth(w), 8);
  open_gate(0);
  assert_ok(ruda_flush(dev, 0, NULL));
  /* The flush's FENCE counts too; the worker has run all of them. */
  assert_int_equal(atomic_load(&w->tickets), 9);
  assert_int_equal(atomic_load(&w->done), 9);
  test_close(dev);
}

/* ---- a backend that orders streams on the device ---- */

#include "fake_events.h"

static _Atomic int nstream_waits;
static void *_Atomic last_waited;
static ruda__backend_ops fake;

/* The work ran on the host already: waiting completes the event. Until
 * someone waits, queries say it is pending. */
static int fake_event_wait(void *state, void *ev, ruda_error **err) {
  (void)state;
  (void)err;
  atomic_store(&((fake_event *)ev)->done, 1);
  return 0;
}

static int fake_stream_wait(void *ws, void *ev, ruda_error **err) {
  (void)ws;
  (void)err;
  atomic_store(&last_waited, ev);
  atomic_fetch_add(&nstream_waits, 1);
  return 0;
}

static ruda_device *open_device_backend(void) {
  ruda_device *dev = test_open(WORKERS, 65536, RUDA_BACKPRESSURE_BLOCK);
  register_kernels(dev);
  free_events();
  atomic_store(&nevents, 0);
  atomic_store(&nstream_waits, 0);
  fake = ruda__host_backend;
  fake.record = fake_record;
  fake.event_query = fake_event_query;
  fake.event_wait = fake_event_wait;
  fake.event_release = fake_event_release;
  fake.stream_wait = fake_stream_wait;
  ruda__workers_stop(&dev->sched); /* idle workers read the table too */
  dev->sched.backend.ops = &fake; /* every layer reads this one field */
  assert_ok(ruda__workers_start(&dev->sched));
  return dev;
}

static void close_device_backend(ruda_device *dev) {
  test_close(dev);
  free_events();
}

static void device_backend_waits_on_the_marks_event(void **state) {
  (void)state;
  ruda_device *dev = open_device_backend();
  ruda_handle x = buffer(dev, 0, 16), y = buffer(dev, 0, 16), u = buffer(dev, 0, 16);
  ruda_handle a = buffer(dev, 1, 16), b = buffer(dev, 2, 16);
  set(dev, 0, x, 16, 1);
  set(dev, 0, y, 16, 2);
  set(dev, 0, u, 16, 3);
  /* Worker 0 ran all three, but nothing says the device finished them. */
  assert_ok(ruda_flush(dev, 0, NULL));
  int ev0 = atomic_load(&nevents);
  sum(dev, 1, a, x, x, 16);
  assert_int_equal(marks(dev), 1);
  assert_int_equal(waits(dev), 1);
  assert_ok(ruda_flush(dev, 1, NULL));
  /* Worker 0 recorded an event at the MARK; worker 1's stream waits on it. */
  assert_int_equal(atomic_load(&nevents), ev0 + 1);
  assert_int_equal(atomic_load(&nstream_waits), 1);
  assert_ptr_equal(atomic_load(&last_waited), atomic_load(&events));
  /* y was run before that MARK was pushed: worker 2 shares it. */
  sum(dev, 2, b, y, y, 16);
  assert_int_equal(marks(dev), 1);
  assert_int_equal(shared(dev), 1);
  assert_int_equal(waits(dev), 2);
  /* Worker 1 already waits for that MARK: u needs nothing more there. */
  sum(dev, 1, a, u, a, 16);
  assert_int_equal(marks(dev), 1);
  assert_int_equal(waits(dev), 2);
  assert_ok(ruda_flush(dev, 2, NULL));
  assert_int_equal(atomic_load(&nstream_waits), 2);
  expect_all(dev, 1, a, 16, 5);
  expect_all(dev, 2, b, 16, 4);
  close_device_backend(dev);
}

static void completed_sync_spares_the_mark(void **state) {
  (void)state;
  ruda_device *dev = open_device_backend();
  ruda_handle x = buffer(dev, 0, 16), a = buffer(dev, 1, 16);
  set(dev, 0, x, 16, 5);
  assert_ok(ruda_flush(dev, 0, NULL));
  /* Run but not known finished: ordering would need a MARK now. */
  assert_false(ruda__ticket_ge((uint32_t)atomic_load(&ruda__lane_of(&dev->sched, 0)->completed),
                               ruda__queue_ticket(&dev->sched.workers[0])));
  assert_ok(ruda_sync(dev, 0, NULL));
  /* The sync's event covered the write and was seen complete. */
  set(dev, 1, a, 16, 0);
  sum(dev, 1, a, x, a, 16);
  assert_int_equal(marks(dev), 0);
  assert_int_equal(waits(dev), 0);
  expect_all(dev, 1, a, 16, 5);
  close_device_backend(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_worker_pushes_nothing),
      cmocka_unit_test(finished_work_pushes_nothing),
      cmocka_unit_test(unfinished_writer_gets_one_mark_per_worker),
      cmocka_unit_test(refused_command_leaves_no_mark),
      cmocka_unit_test(stale_record_orders_after_every_busy_worker),
      cmocka_unit_test(write_waits_for_reads_being_issued),
      cmocka_unit_test(read_waits_for_a_write_being_issued),
      cmocka_unit_test(tickets_count_enqueued_commands),
      cmocka_unit_test(device_backend_waits_on_the_marks_event),
      cmocka_unit_test(completed_sync_spares_the_mark),
  };
  return test_main("unit_order", tests, sizeof tests / sizeof tests[0], argc, argv);
}

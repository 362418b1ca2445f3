/* gpu_order.c - cross-stream ordering on the cuda backend: a long kernel
 * writes a buffer on one stream and a kernel, copy or read on another
 * stream uses it at once, with no sync in between.
 *
 * The writers spin for tens of milliseconds before they write (the mock
 * driver sleeps as long), so a reader that did not wait on the device for
 * the writer's event (cuStreamWaitEvent after the writer's MARK) would
 * see the old contents. Streams 0..3 run on four different workers. */
#include "gpu_common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

/* About 20 ms at the H200's ~2 GHz (the mock sleeps spin / 2000 us). */
#define SPIN 40000000LL

static ruda_device *open_order_gpu(void) {
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "order_fill", SRC_ORDER, NULL));
  assert_ok(ruda_kernel_source(dev, "order_add", SRC_ORDER, NULL));
  return dev;
}

static void launch(ruda_device *dev, ruda_stream_id s, const char *k, const ruda_arg *a, uint32_t n) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = k;
  l.grid = (ruda_dim3){132, 1, 1};
  l.block = (ruda_dim3){256, 1, 1};
  l.args = a;
  l.nargs = n;
  assert_ok(ruda_launch(dev, s, &l));
}

static void fill(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned v, long long spin) {
  ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&v, 4),
                   ruda_arg_scalar(&spin, 8)};
  launch(dev, s, "order_fill", a, 4);
}

static void add(ruda_device *dev, ruda_stream_id s, ruda_handle dst, ruda_handle src, unsigned n, unsigned k,
                long long spin) {
  ruda_arg a[5] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(src)), ruda_arg_buffer(ruda_bind(dst)),
                   ruda_arg_scalar(&k, 4), ruda_arg_scalar(&spin, 8)};
  launch(dev, s, "order_add", a, 5);
}

/* Four streams on four workers launch access_meet on one counter, as a
 * reader (IN) or as a read-write use; returns how many met the others. */
static int meeting(ruda_arg (*use)(ruda_binding)) {
  ruda_device *dev = gpu_open();
  assert_ok(ruda_kernel_source(dev, "access_meet", SRC_ACCESS, NULL));
  ruda_handle counter, met[4];
  int zero = 0, want = 4;
  long long timeout = 400000000LL; /* ~200 ms */
  assert_ok(ruda_buffer_create(dev, 0, sizeof zero, &counter));
  test_write(dev, 0, ruda_bind(counter), &zero, sizeof zero);
  assert_ok(ruda_sync(dev, 0, NULL));
  for (int s = 0; s < 4; s++) {
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)s, sizeof zero, &met[s]));
    test_write(dev, (ruda_stream_id)s, ruda_bind(met[s]), &zero, sizeof zero);
    assert_ok(ruda_sync(dev, (ruda_stream_id)s, NULL));
  }
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "access_meet";
  l.grid = (ruda_dim3){1, 1, 1};
  l.block = (ruda_dim3){32, 1, 1};
  l.nargs = 4;
  for (int s = 0; s < 4; s++) {
    ruda_arg a[4] = {use(ruda_bind(counter)), ruda_arg_scalar(&want, sizeof want),
                     ruda_arg_scalar(&timeout, sizeof timeout), ruda_arg_out(ruda_bind(met[s]))};
    l.args = a;
    assert_ok(ruda_launch(dev, (ruda_stream_id)s, &l));
  }
  int sum = 0;
  for (int s = 0; s < 4; s++) {
    int m = 0;
    test_read(dev, (ruda_stream_id)s, ruda_bind(met[s]), &m, sizeof m);
    sum += m;
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)s, met[s]));
  }
  assert_ok(ruda_buffer_free(dev, 0, counter));
  test_close(dev);
  return sum;
}

/* Kernels that only read one buffer run at the same time on the device. */
static void readers_of_one_buffer_run_at_once(void **state) {
  (void)state;
  assert_int_equal(meeting(ruda_arg_in), 4);
}

/* The control: as read-write uses they run one after another. */
static void read_write_uses_run_one_after_another(void **state) {
  (void)state;
  assert_int_equal(meeting(ruda_arg_buffer), 1);
}

static void expect(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned base, const char *what,
                   int round) {
  unsigned *got = malloc((size_t)n * 4);
  test_read(dev, s, ruda_bind_range(h, 0, (uint64_t)n * 4), got, (size_t)n * 4);
  for (unsigned i = 0; i < n; i++)
    if (got[i] != base + i) {
      unsigned g = got[i];
      free(got);
      fail_msg("%s, round %d: element %u is %#x, expected %#x", what, round, i, g, base + i);
    }
  free(got);
}

static void long_writer_then_reader_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_order_gpu();
  uint64_t seed = gpu_seed();
  for (int round = 0; round < 12; round++) {
    const unsigned n = 1024 + (unsigned)(gpu_rand(&seed) % (1u << 20));
    const unsigned v = (unsigned)(gpu_rand(&seed) >> 40);
    ruda_stream_id a = (ruda_stream_id)(round % 4), b = (ruda_stream_id)((round + 1 + gpu_rand(&seed) % 3) % 4);
    ruda_handle x, y;
    assert_ok(ruda_buffer_create(dev, a, (uint64_t)n * 4, &x));
    assert_ok(ruda_buffer_create(dev, b, (uint64_t)n * 4, &y));
    fill(dev, a, x, n, 0, 0); /* an old value, overwritten slowly below */
    gpu_sync_ok(dev, a);
    fill(dev, a, x, n, v, SPIN);
    switch (round % 3) {
      case 0: /* a kernel on B reads x */
        add(dev, b, y, x, n, 1, 0);
        expect(dev, b, y, n, v + 1, "kernel", round);
        break;
      case 1: /* a device copy on B */
        assert_ok(ruda_copy(dev, b, ruda_bind(y), ruda_bind(x)));
        expect(dev, b, y, n, v, "copy", round);
        break;
      default: /* a read on B */
        expect(dev, b, x, n, v, "read", round);
        break;
    }
    assert_ok(ruda_buffer_free(dev, b, x));
    assert_ok(ruda_buffer_free(dev, b, y));
  }
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

static void chain_across_three_streams(void **state) {
  (void)state;
  ruda_device *dev = open_order_gpu();
  const unsigned n = 1u << 20;
  for (int round = 0; round < 4; round++) {
    ruda_stream_id s0 = (ruda_stream_id)round % 4, s1 = (s0 + 1) % 4, s2 = (s0 + 2) % 4;
    ruda_handle x, y, z;
    assert_ok(ruda_buffer_create(dev, s0, (uint64_t)n * 4, &x));
    assert_ok(ruda_buffer_create(dev, s1, (uint64_t)n * 4, &y));
    assert_ok(ruda_buffer_create(dev, s2, (uint64_t)n * 4, &z));
    fill(dev, s0, x, n, 100u * (unsigned)round, SPIN);
    add(dev, s1, y, x, n, 1, SPIN);
    add(dev, s2, z, y, n, 1, 0);
    expect(dev, s2, z, n, 100u * (unsigned)round + 2, "chain", round);
    assert_ok(ruda_buffer_free(dev, s2, x));
    assert_ok(ruda_buffer_free(dev, s2, y));
    assert_ok(ruda_buffer_free(dev, s2, z));
  }
  gpu_sync_ok(dev, 0);
  gpu_sync_ok(dev, 1);
  test_close(dev);
}

/* The same on one worker: streams 0, 4 and 8 share worker 0, each on a
 * lane (CUstream) of its own, so only the MARKs and WAITs order them. */
static void chain_across_lanes_of_one_worker(void **state) {
  (void)state;
  ruda_device *dev = open_order_gpu();
  const unsigned n = 1u << 20;
  for (int round = 0; round < 4; round++) {
    ruda_stream_id s0 = 4 * (ruda_stream_id)(round % 3), s1 = 4 * ((round + 1) % 3), s2 = 4 * ((round + 2) % 3);
    ruda_handle x, y, z;
    assert_ok(ruda_buffer_create(dev, s0, (uint64_t)n * 4, &x));
    assert_ok(ruda_buffer_create(dev, s1, (uint64_t)n * 4, &y));
    assert_ok(ruda_buffer_create(dev, s2, (uint64_t)n * 4, &z));
    fill(dev, s0, x, n, 100u * (unsigned)round, SPIN);
    add(dev, s1, y, x, n, 1, SPIN);
    add(dev, s2, z, y, n, 1, 0);
    expect(dev, s2, z, n, 100u * (unsigned)round + 2, "chain", round);
    /* A slow reader on one lane, then a writer on another. */
    add(dev, s1, y, x, n, 0, SPIN);
    fill(dev, s0, x, n, 77777u, 0);
    expect(dev, s1, y, n, 100u * (unsigned)round, "reader", round);
    expect(dev, s0, x, n, 77777u, "writer", round);
    assert_ok(ruda_buffer_free(dev, s2, x));
    assert_ok(ruda_buffer_free(dev, s2, y));
    assert_ok(ruda_buffer_free(dev, s2, z));
  }
  for (ruda_stream_id s = 0; s <= 8; s += 4) gpu_sync_ok(dev, s);
  test_close(dev);
}

/* A slow reader on B, then a writer on A: the reader sees the old data. */
static void writer_waits_for_a_reader_on_another_stream(void **state) {
  (void)state;
  ruda_device *dev = open_order_gpu();
  const unsigned n = 1u << 18;
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, (uint64_t)n * 4, &x));
  assert_ok(ruda_buffer_create(dev, 1, (uint64_t)n * 4, &y));
  for (int round = 0; round < 4; round++) {
    fill(dev, 0, x, n, 1000u * (unsigned)round, 0);
    add(dev, 1, y, x, n, 0, SPIN); /* reads x ~20 ms late */
    fill(dev, 0, x, n, 77777u, 0); /* must wait for that read */
    expect(dev, 1, y, n, 1000u * (unsigned)round, "reader", round);
    expect(dev, 0, x, n, 77777u, "writer", round);
  }
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  test_close(dev);
}

/* What is pushed: nothing on one lane, nothing after a sync was waited,
 * one MARK and one WAIT for an unfinished writer on another worker or on
 * another lane of the same worker. */
static void marks_only_where_needed(void **state) {
  (void)state;
  ruda_device *dev = open_order_gpu();
  const unsigned n = 4096;
  ruda_handle x, y, z;
  assert_ok(ruda_buffer_create(dev, 0, n * 4, &x));
  assert_ok(ruda_buffer_create(dev, 1, n * 4, &y));
  assert_ok(ruda_buffer_create(dev, 1, n * 4, &z));
  gpu_sync_ok(dev, 0);
  gpu_sync_ok(dev, 1);
  const ruda_stream_id lanes = ruda_device_num_lanes(dev); /* stream 0's lane again */
  uint64_t m0 = atomic_load(&dev->sched.order.marks), w0 = atomic_load(&dev->sched.order.waits);
  fill(dev, 0, x, n, 5, 0);
  add(dev, lanes, x, x, n, 1, 0); /* stream 0's lane too */
  gpu_sync_ok(dev, 0);
  add(dev, 1, y, x, n, 1, 0); /* the sync's event covered the writes */
  expect(dev, 1, y, n, 7, "after sync", 0);
  assert_int_equal(atomic_load(&dev->sched.order.marks), m0);
  assert_int_equal(atomic_load(&dev->sched.order.waits), w0);
  fill(dev, 0, x, n, 9, SPIN);
  add(dev, 1, z, x, n, 0, 0);
  assert_int_equal(atomic_load(&dev->sched.order.marks), m0 + 1);
  assert_int_equal(atomic_load(&dev->sched.order.waits), w0 + 1);
  expect(dev, 1, z, n, 9, "after mark", 0);
  /* Stream 4: worker 0's next lane, its own CUstream, so a MARK too. */
  fill(dev, 0, x, n, 11, SPIN);
  add(dev, 4, y, x, n, 1, 0);
  assert_int_equal(atomic_load(&dev->sched.order.marks), m0 + 2);
  assert_int_equal(atomic_load(&dev->sched.order.waits), w0 + 2);
  expect(dev, 4, y, n, 12, "after a mark on the same worker", 0);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  assert_ok(ruda_buffer_free(dev, 1, z));
  gpu_sync_ok(dev, 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(long_writer_then_reader_on_another_stream),
      cmocka_unit_test(chain_across_three_streams),
      cmocka_unit_test(chain_across_lanes_of_one_worker),
      cmocka_unit_test(writer_waits_for_a_reader_on_another_stream),
      cmocka_unit_test(marks_only_where_needed),
      cmocka_unit_test(readers_of_one_buffer_run_at_once),
      cmocka_unit_test(read_write_uses_run_one_after_another),
  };
  return gpu_main("gpu_order", tests, sizeof tests / sizeof tests[0], argc, argv);
}

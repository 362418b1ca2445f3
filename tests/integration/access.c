/* access.c - access modes: streams that only read a buffer run at once;
 * a write waits for every earlier read and write on other streams; reads
 * see the last write. Host backend; the same rules hold on cuda
 * (tests/gpu/gpu_order.c). */
#include <pthread.h>
#include <time.h>

#include "common.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(unsigned us) {
  struct timespec ts = {0, (long)us * 1000};
  nanosleep(&ts, NULL);
}

static ruda_device *open_dev(uint32_t workers) {
  ruda_device *dev = test_open(workers, 65536, RUDA_BACKPRESSURE_BLOCK);
  return dev;
}

static void sync_all(ruda_device *dev, int nstreams) {
  for (int s = 0; s < nstreams; s++) assert_ok(ruda_sync(dev, (ruda_stream_id)s, NULL));
}

/* ---- readers overlap ---- */

/* Every reader arrives, then waits (up to 300 ms times test_patience())
 * until all `want` have arrived: only readers running at the same time can
 * all meet. */
static _Atomic int arrived, met;

static int meet_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  int want = *(const int *)args[1];
  atomic_fetch_add(&arrived, 1);
  uint64_t until = now_ns() + 300000000ull * test_patience();
  while (atomic_load(&arrived) < want && now_ns() < until) sleep_us(50);
  if (atomic_load(&arrived) >= want) atomic_fetch_add(&met, 1);
  return 0;
}

static int run_meeting(ruda_arg (*make)(ruda_binding)) {
  enum { N = 4 };
  ruda_device *dev = open_dev(N);
  assert_ok(ruda_host_kernel_register(dev, "meet", meet_kernel));
  ruda_handle w;
  assert_ok(ruda_buffer_create(dev, 0, 4096, &w));
  static char zeros[4096];
  test_write(dev, 0, ruda_bind(w), zeros, sizeof zeros);
  assert_ok(ruda_sync(dev, 0, NULL));
  atomic_store(&arrived, 0);
  atomic_store(&met, 0);
  int want = N;
  for (int s = 0; s < N; s++) {
    ruda_arg a[2] = {make(ruda_bind(w)), ruda_arg_scalar(&want, sizeof want)};
    assert_ok(test_launch(dev, (ruda_stream_id)s, "meet", a, 2));
  }
  sync_all(dev, N);
  assert_ok(ruda_buffer_free(dev, 0, w));
  test_close(dev);
  return atomic_load(&met);
}

static void readers_of_one_buffer_run_at_once(void **state) {
  (void)state;
  assert_int_equal(run_meeting(ruda_arg_in), 4);
}

/* The control: declared read-write, the same kernels run one after
 * another, so only the last, which finds the others arrived, meets. This
 * is what makes the test above able to fail. */
static void read_write_uses_run_one_after_another(void **state) {
  (void)state;
  assert_int_equal(run_meeting(ruda_arg_buffer), 1);
}

/* ---- a write after reads ---- */

static _Atomic int readers_done, seen_by_writer;

static int slow_reader_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  sleep_us(20000);
  atomic_fetch_add(&readers_done, 1);
  return 0;
}

static int writer_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  atomic_store(&seen_by_writer, atomic_load(&readers_done));
  *(int *)args[0] = *(const int *)args[1];
  return 0;
}

static void write_waits_for_every_reader(void **state) {
  (void)state;
  enum { R = 4 };
  ruda_device *dev = open_dev(R + 1);
  assert_ok(ruda_host_kernel_register(dev, "slow_reader", slow_reader_kernel));
  assert_ok(ruda_host_kernel_register(dev, "writer", writer_kernel));
  ruda_handle w;
  assert_ok(ruda_buffer_create(dev, 0, sizeof(int), &w));
  int v = 1;
  test_write(dev, 0, ruda_bind(w), &v, sizeof v);
  assert_ok(ruda_sync(dev, 0, NULL));
  atomic_store(&readers_done, 0);
  atomic_store(&seen_by_writer, -1);
  for (int s = 1; s <= R; s++) {
    ruda_arg a = ruda_arg_in(ruda_bind(w));
    assert_ok(test_launch(dev, (ruda_stream_id)s, "slow_reader", &a, 1));
  }
  /* A read through ruda_read on one more stream is a reader too. */
  int got = 0;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(w));
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, R, &d, &got, sizeof got, &f));
  v = 2;
  ruda_arg wa[2] = {ruda_arg_out(ruda_bind(w)), ruda_arg_scalar(&v, sizeof v)};
  assert_ok(test_launch(dev, 0, "writer", wa, 2));
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  sync_all(dev, R + 1);
  assert_int_equal(atomic_load(&seen_by_writer), R);
  assert_int_equal(got, 1); /* the read saw the value before the write */
  int after = 0;
  test_read(dev, 3, ruda_bind(w), &after, sizeof after);
  assert_int_equal(after, 2);
  assert_ok(ruda_buffer_free(dev, 0, w));
  test_close(dev);
}

/* ---- reads after a write ---- */

static int slow_fill_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  sleep_us(20000);
  int *p = args[0];
  for (int i = 0; i < 16; i++) p[i] = *(const int *)args[1] + i;
  return 0;
}

static int copy16_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  memcpy(args[1], args[0], 16 * sizeof(int));
  return 0;
}

static void readers_see_the_last_write(void **state) {
  (void)state;
  enum { R = 3 };
  ruda_device *dev = open_dev(R + 1);
  assert_ok(ruda_host_kernel_register(dev, "slow_fill", slow_fill_kernel));
  assert_ok(ruda_host_kernel_register(dev, "copy16", copy16_kernel));
  ruda_handle w, out[R];
  assert_ok(ruda_buffer_create(dev, 0, 16 * sizeof(int), &w));
  for (int r = 0; r < R; r++) assert_ok(ruda_buffer_create(dev, (ruda_stream_id)(r + 1), 16 * sizeof(int), &out[r]));
  int base = 42;
  ruda_arg fa[2] = {ruda_arg_out(ruda_bind(w)), ruda_arg_scalar(&base, sizeof base)};
  assert_ok(test_launch(dev, 0, "slow_fill", fa, 2));
  for (int r = 0; r < R; r++) {
    ruda_arg ca[2] = {ruda_arg_in(ruda_bind(w)), ruda_arg_out(ruda_bind(out[r]))};
    assert_ok(test_launch(dev, (ruda_stream_id)(r + 1), "copy16", ca, 2));
  }
  for (int r = 0; r < R; r++) {
    int got[16];
    test_read(dev, (ruda_stream_id)(r + 1), ruda_bind(out[r]), got, sizeof got);
    for (int i = 0; i < 16; i++) assert_int_equal(got[i], 42 + i);
    assert_ok(ruda_buffer_free(dev, (ruda_stream_id)(r + 1), out[r]));
  }
  assert_ok(ruda_buffer_free(dev, 0, w));
  test_close(dev);
}

/* ---- a model: random reads and writes from one client ---- */

/* Each buffer holds a version. The client issues operations in one order
 * and keeps the version every operation must find: a read finds the last
 * write issued before it, a write finds the last write too, and while a
 * write runs no other use of its buffer may run. Kernels check both. */
enum { MB = 6, MS = 7 };
static _Atomic int active_readers[MB], active_writers[MB], violations;

static int model_read_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  int b = *(const int *)args[1];
  int64_t want = *(const int64_t *)args[2];
  atomic_fetch_add(&active_readers[b], 1);
  if (atomic_load(&active_writers[b]) != 0) atomic_fetch_add(&violations, 1);
  if (*(const volatile int64_t *)args[0] != want) atomic_fetch_add(&violations, 1);
  sleep_us((unsigned)(want % 3) * 50);
  atomic_fetch_sub(&active_readers[b], 1);
  return 0;
}

static int model_write_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  int b = *(const int *)args[1];
  int64_t want = *(const int64_t *)args[2], next = *(const int64_t *)args[3];
  if (atomic_fetch_add(&active_writers[b], 1) != 0) atomic_fetch_add(&violations, 1);
  if (atomic_load(&active_readers[b]) != 0) atomic_fetch_add(&violations, 1);
  volatile int64_t *p = args[0];
  if (*p != want) atomic_fetch_add(&violations, 1);
  sleep_us((unsigned)(next % 3) * 50);
  *p = next;
  atomic_fetch_sub(&active_writers[b], 1);
  return 0;
}

static void random_reads_and_writes_match_the_model(void **state) {
  (void)state;
  ruda_device *dev = open_dev(4); /* 7 streams on 4 workers: some share */
  assert_ok(ruda_host_kernel_register(dev, "mread", model_read_kernel));
  assert_ok(ruda_host_kernel_register(dev, "mwrite", model_write_kernel));
  ruda_handle buf[MB];
  int64_t version[MB];
  for (int b = 0; b < MB; b++) {
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)(b % MS), sizeof(int64_t), &buf[b]));
    version[b] = b + 1;
    test_write(dev, (ruda_stream_id)(b % MS), ruda_bind(buf[b]), &version[b], sizeof version[b]);
  }
  atomic_store(&violations, 0);
  enum { OPS = 1500, PENDING = 32 };
  struct {
    ruda_future *f;
    int64_t got, want;
  } pend[PENDING];
  int npend = 0;
  unsigned seed = 12345;
  int64_t next_version = 1000;
  for (int op = 0; op < OPS; op++) {
    seed = seed * 1103515245u + 12345u;
    int b = (int)((seed >> 8) % MB), s = (int)((seed >> 16) % MS), kind = (int)((seed >> 24) % 10);
    ruda_stream_id sid = (ruda_stream_id)s;
    if (kind < 5) { /* a kernel that reads */
      ruda_arg a[3] = {ruda_arg_in(ruda_bind(buf[b])), ruda_arg_scalar(&b, sizeof b),
                       ruda_arg_scalar(&version[b], sizeof version[b])};
      assert_ok(test_launch(dev, sid, "mread", a, 3));
    } else if (kind < 8) { /* a kernel that writes (read-write or write-only) */
      int64_t next = next_version++;
      ruda_arg a[4] = {kind == 5 ? ruda_arg_out(ruda_bind(buf[b])) : ruda_arg_buffer(ruda_bind(buf[b])),
                       ruda_arg_scalar(&b, sizeof b), ruda_arg_scalar(&version[b], sizeof version[b]),
                       ruda_arg_scalar(&next, sizeof next)};
      assert_ok(test_launch(dev, sid, "mwrite", a, 4));
      version[b] = next;
    } else if (kind == 8) { /* ruda_write: a write from the host */
      int64_t next = next_version++;
      test_write(dev, sid, ruda_bind(buf[b]), &next, sizeof next);
      version[b] = next;
    } else { /* ruda_read: must see the version when it was issued */
      if (npend == PENDING) {
        for (int i = 0; i < npend; i++) {
          assert_ok(ruda_future_wait(pend[i].f, NULL));
          if (pend[i].got != pend[i].want) atomic_fetch_add(&violations, 1);
          ruda_future_free(pend[i].f);
        }
        npend = 0;
      }
      ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(buf[b]));
      pend[npend].want = version[b];
      assert_ok(ruda_read(dev, sid, &d, &pend[npend].got, sizeof(int64_t), &pend[npend].f));
      npend++;
    }
  }
  for (int i = 0; i < npend; i++) {
    assert_ok(ruda_future_wait(pend[i].f, NULL));
    if (pend[i].got != pend[i].want) atomic_fetch_add(&violations, 1);
    ruda_future_free(pend[i].f);
  }
  sync_all(dev, MS);
  for (int b = 0; b < MB; b++) {
    int64_t got = 0;
    test_read(dev, 0, ruda_bind(buf[b]), &got, sizeof got);
    assert_int_equal(got, version[b]);
    assert_ok(ruda_buffer_free(dev, 0, buf[b]));
  }
  assert_int_equal(atomic_load(&violations), 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(readers_of_one_buffer_run_at_once),
      cmocka_unit_test(read_write_uses_run_one_after_another),
      cmocka_unit_test(write_waits_for_every_reader),
      cmocka_unit_test(readers_see_the_last_write),
      cmocka_unit_test(random_reads_and_writes_match_the_model),
  };
  return test_main("integration_access", tests, sizeof tests / sizeof tests[0], argc, argv);
}

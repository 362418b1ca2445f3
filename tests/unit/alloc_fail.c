/* alloc_fail.c - every host allocation of open, buffers, writes, reads,
 * launches, graphs, collectives and close failing in turn (once, then
 * from some point on for good): each call returns 0 or an error - above
 * all RUDA_ENOMEM -, nothing crashes or hangs, the library stays usable
 * and the sanitizer run finds no leak.
 *
 * The test binary links ruda's objects with -Wl,--wrap for malloc and its
 * kin (tests/CMakeLists.txt), so ruda's own allocations pass through the
 * countdown below; the test code allocates nothing while it is armed. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "common.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);

static _Atomic long countdown = -1; /* allocations left before failing; -1: off */
static _Atomic int persistent;      /* keep failing once the countdown hit 0 */
static _Atomic long counted;        /* allocations seen while armed */
static _Thread_local int failed_here; /* an allocation of this thread failed */

static int fail_now(void) {
  long c = atomic_load_explicit(&countdown, memory_order_relaxed);
  if (c < 0) return 0;
  atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed);
  if (c == 0) {
    if (!atomic_load_explicit(&persistent, memory_order_relaxed)) atomic_store(&countdown, -1);
    failed_here = 1;
    return 1;
  }
  long seen = c;
  while (seen > 0 && !atomic_compare_exchange_weak(&countdown, &seen, seen - 1)) {
  }
  return 0;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return fail_now() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return fail_now() ? NULL : __real_aligned_alloc(a, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  if (!fail_now()) return __real_posix_memalign(p, a, n);
  failed_here = 0; /* device pages (host backend): retried after a release */
  return 12; /* ENOMEM */
}

static void arm(long at, int forever) {
  atomic_store(&counted, 0);
  atomic_store(&persistent, forever);
  atomic_store(&countdown, at);
}
static void disarm(void) { atomic_store(&countdown, -1); }

static int k_add1(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  ((unsigned char *)args[0])[0]++;
  return 0;
}

/* Evaluates the call rc and fails the test unless it returned 0 or one
 * of the codes a failed allocation may cause on that call. 0 from a call
 * whose own thread had an allocation fail is a failure too: an error
 * swallowed, or work silently not done. */
#define ALLOWED(rc, ...) CHECKED(0, rc, __VA_ARGS__)
/* The same for a call that recovers from a failed allocation by design
 * and may return 0 after one (each use says how). */
#define RECOVERS(rc, ...) CHECKED(1, rc, __VA_ARGS__)
#define CHECKED(recovers, rc, ...)                                                        \
  do {                                                                                    \
    failed_here = 0;                                                                      \
    int r_ = (rc), ok_ = r_ == 0;                                                         \
    if (r_ == 0 && failed_here && !(recovers))                                            \
      fail_msg("%s returned 0 though an allocation of its failed (allocation %ld%s)", #rc, at, \
               forever ? " failing for good" : "");                                      \
    const int allowed_[] = {RUDA_ENOMEM, __VA_ARGS__};                                    \
    for (size_t i_ = 0; i_ < sizeof allowed_ / sizeof *allowed_; i_++) ok_ |= r_ == allowed_[i_]; \
    if (!ok_) fail_msg("%s returned %s (allocation %ld failing%s): %s", #rc, ruda_err_name(r_), at, \
                       forever ? " for good" : "", ruda_error_message(ruda_last_error()));  \
  } while (0)

static ruda_device *open_host(void) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  cfg.queue_bound = 256;
  cfg.log_level = RUDA_LOG_OFF;
  cfg.spin_us = 0;
  ruda_device *dev = NULL;
  return ruda_device_open(&cfg, &dev) == 0 ? dev : NULL;
}

/* One pass over the API with allocation `at` failing; returns how many
 * allocations the armed part made. */
static long one_pass(long at, int forever) {
  arm(at, forever);
  ruda_device *dev = NULL, *peer = NULL;
  {
    ruda_config cfg;
    ruda_config_init(&cfg);
    cfg.backend = RUDA_BACKEND_HOST;
    cfg.num_streams = 2;
    cfg.queue_bound = 256;
    cfg.log_level = RUDA_LOG_OFF;
    cfg.spin_us = 0;
    int rc;
    ALLOWED(rc = ruda_device_open(&cfg, &dev), RUDA_ENOMEM);
    if (rc != 0) {
      disarm();
      return atomic_load(&counted);
    }
  }
  int have_kernel = ruda_host_kernel_register(dev, "add1", k_add1) == 0;
  ruda_handle x;
  int rc;
  /* On the host backend device pages are host memory: when their
   * allocation fails, the device is out of memory. */
  ALLOWED(rc = ruda_buffer_create(dev, 0, 256, &x), RUDA_EOUTOFMEMORY);
  if (rc == 0) {
    unsigned char bytes[256] = {0}, back[256];
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
    ALLOWED(ruda_write(dev, 0, &d, bytes, sizeof bytes));
    ruda_arg a = ruda_arg_buffer(ruda_bind(x));
    ruda_launch_desc l = {.kernel = "add1", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
    if (have_kernel) ALLOWED(ruda_launch(dev, 1, &l));
    else ALLOWED(ruda_launch(dev, 1, &l), RUDA_EKERNEL);
    ruda_future *f = NULL;
    ALLOWED(rc = ruda_read(dev, 1, &d, back, sizeof back, &f));
    if (rc == 0) {
      ALLOWED(ruda_future_wait(f, NULL), RUDA_EUNHEALTHY);
      ruda_future_free(f);
    }
    /* A graph of the launch, replayed on the other stream. */
    if (ruda_graph_begin_capture(dev, 0) == 0) {
      rc = ruda_launch(dev, 0, &l);
      ruda_graph *g = NULL;
      if (ruda_graph_end_capture(dev, 0, &g) == 0) {
        ALLOWED(ruda_graph_replay(dev, 1, g));
        ALLOWED(ruda_graph_destroy(dev, g));
      }
    }
    /* Without memory to note what its reuse waits for, the buffer's bytes
     * stay reserved with their page until close (memory/pool.c,
     * ruda__memory_retire): freed late, never early. */
    RECOVERS(ruda_buffer_free(dev, 0, x));
  }
  /* Collectives between two devices. */
  {
    ruda_config cfg;
    ruda_config_init(&cfg);
    cfg.backend = RUDA_BACKEND_HOST;
    cfg.num_streams = 1;
    cfg.log_level = RUDA_LOG_OFF;
    cfg.spin_us = 0;
    if (ruda_device_open(&cfg, &peer) == 0) {
      ruda_device *both[2] = {dev, peer};
      ruda_comm *c = NULL;
      ALLOWED(rc = ruda_comm_init(both, 2, &c));
      if (rc == 0) {
        ruda_handle v[2];
        int made = 0;
        for (int k = 0; k < 2; k++) made += ruda_buffer_create(both[k], 0, 64, &v[k]) == 0;
        if (made == 2)
          for (int k = 0; k < 2; k++)
            ALLOWED(ruda_all_reduce(c, both[k], ruda_bind(v[k]), ruda_bind(v[k]), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
        long used = atomic_load(&counted);
        disarm(); /* a half-issued all-reduce needs its peer: finish without failures */
        if (made == 2) {
          for (int k = 0; k < 2; k++) ruda_buffer_free(both[k], 0, v[k]);
        } else {
          for (int k = 0; k < made; k++) ruda_buffer_free(both[k], 0, v[k]);
        }
        ALLOWED(ruda_comm_destroy(c), RUDA_EUNHEALTHY);
        atomic_store(&counted, used);
      }
    }
  }
  long used = atomic_load(&counted);
  disarm();
  if (peer != NULL) ALLOWED(ruda_device_close(peer, NULL), RUDA_EUNHEALTHY);
  ALLOWED(ruda_device_sync(dev, NULL), RUDA_EUNHEALTHY);
  ALLOWED(ruda_device_close(dev, NULL), RUDA_EUNHEALTHY);
  return used;
}

static void every_allocation_failing_once(void **state) {
  (void)state;
  long total = one_pass(1L << 40, 0); /* nothing fails: counts the allocations */
  if (getenv("ALLOC_FAIL_DEBUG")) fprintf(stderr, "allocations in a pass: %ld\n", total);
  assert_true(total > 20);
  /* Minutes under ASan: progress on stderr every tenth of the passes. */
  for (long at = 0; at < total + 10; at++) {
    if (at % ((total + 10) / 10 + 1) == 0) fprintf(stderr, "failing allocation %ld of %ld\n", at, total + 10);
    one_pass(at, 0);
  }
  /* Still usable afterwards. */
  ruda_device *dev = open_host();
  assert_non_null(dev);
  test_close(dev);
}

static void allocations_failing_for_good(void **state) {
  (void)state;
  long total = one_pass(1L << 40, 0);
  if (getenv("ALLOC_FAIL_DEBUG")) fprintf(stderr, "allocations in a pass: %ld\n", total);
  assert_true(total > 20);
  for (long at = 0; at < total + 10; at += 3) {
    if (at % (3 * ((total + 10) / 30 + 1)) == 0) fprintf(stderr, "failing from allocation %ld of %ld on\n", at, total + 10);
    one_pass(at, 1);
  }
  ruda_device *dev = open_host();
  assert_non_null(dev);
  test_close(dev);
}

/* ruda_trace_start, or ruda_trace_stop, with allocation `at` of that call
 * failing (once, or for good): each succeeds or fails with RUDA_ENOMEM
 * having changed nothing, and the workers then run traced (or untraced)
 * commands. A start used to hand the first workers their buffers, fail on
 * a later worker's command, fail again taking them back, and free buffers
 * those workers went on writing (ASan: heap-use-after-free; a crash
 * without it). */
enum { TRACE_WORKERS = 10, MAX_STARTERS = 1024 };

/* Each start runs on a thread of its own that stays parked until the test
 * ends: a thread that exits leaves its command cache to the next one, so
 * only a new thread starts from an empty cache, and start's commands take
 * fresh slabs (failure points) part way through the workers. */
typedef struct starter {
  ruda_device *dev;
  const char *path;
  int rc;
  atomic_int go, done;
} starter;
static pthread_t starters[MAX_STARTERS];
static int nstarters;
static atomic_int starters_release;

static void *start_and_park(void *p) {
  starter *st = p;
  while (!atomic_load(&st->go)) sched_yield();
  st->rc = ruda_trace_start(st->dev, st->path);
  atomic_store(&st->done, 1);
  while (!atomic_load(&starters_release)) sched_yield();
  return NULL;
}

static int start_on_fresh_thread(ruda_device *dev, const char *path) {
  starter st = {dev, path, 1, 0, 0};
  assert_true(nstarters < MAX_STARTERS);
  long left = atomic_exchange(&countdown, -1); /* pthread_create allocates */
  assert_int_equal(pthread_create(&starters[nstarters++], NULL, start_and_park, &st), 0);
  atomic_store(&countdown, left);
  atomic_store(&st.go, 1);
  while (!atomic_load(&st.done)) sched_yield();
  return st.rc;
}

static void release_starters(void) {
  atomic_store(&starters_release, 1);
  for (int i = 0; i < nstarters; i++) pthread_join(starters[i], NULL);
  nstarters = 0;
  atomic_store(&starters_release, 0);
}

static void launch_everywhere(ruda_device *dev, const ruda_launch_desc *l) {
  for (ruda_stream_id s = 0; s < TRACE_WORKERS; s++) assert_ok(ruda_launch(dev, s, l));
  assert_ok(ruda_device_sync(dev, NULL));
}

/* at fails in start (stop_phase 0) or in stop (1); returns how many
 * allocations that call made. */
static long trace_pass(long at, int forever, int stop_phase) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/ruda_alloc_fail_trace.%d.json", (int)getpid());
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  /* More workers than a fresh command slab has blocks (cmd_alloc.c). */
  cfg.num_streams = TRACE_WORKERS;
  cfg.log_level = RUDA_LOG_OFF;
  cfg.spin_us = 0;
  ruda_device *dev = NULL;
  assert_ok(ruda_device_open(&cfg, &dev));
  assert_ok(ruda_host_kernel_register(dev, "add1", k_add1));
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, 64, &x));
  ruda_arg a = ruda_arg_buffer(ruda_bind(x));
  ruda_launch_desc l = {.kernel = "add1", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
  launch_everywhere(dev, &l); /* the streams exist before the countdown */
  if (!stop_phase) arm(at, forever);
  int rc = start_on_fresh_thread(dev, path);
  long used = atomic_load(&counted);
  disarm();
  if (stop_phase) assert_ok(rc);
  else ALLOWED(rc);
  int tracing = rc == 0;
  launch_everywhere(dev, &l); /* every worker writes its trace buffer, if it has one */
  if (tracing) {
    if (stop_phase) arm(at, forever);
    rc = ruda_trace_stop(dev);
    if (stop_phase) used = atomic_load(&counted);
    disarm();
    if (stop_phase) ALLOWED(rc);
    else assert_ok(rc);
    tracing = rc != 0;
    launch_everywhere(dev, &l);
  }
  /* Nothing half done: a failed stop still traces, a failed start does
   * not, and either way the next start and stop work. */
  if (tracing) {
    assert_rc(ruda_trace_start(dev, path), RUDA_EBUSY);
    assert_ok(ruda_trace_stop(dev));
  } else {
    assert_rc(ruda_trace_stop(dev), RUDA_EINVAL);
  }
  assert_ok(ruda_trace_start(dev, path));
  launch_everywhere(dev, &l);
  assert_ok(ruda_trace_stop(dev));
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_device_close(dev, NULL));
  unlink(path);
  return used;
}

static void trace_start_and_stop_failing_at_every_allocation(void **state) {
  (void)state;
  for (int stop_phase = 0; stop_phase < 2; stop_phase++) {
    long total = trace_pass(1L << 40, 0, stop_phase);
    if (getenv("ALLOC_FAIL_DEBUG"))
      fprintf(stderr, "allocations in ruda_trace_%s: %ld\n", stop_phase ? "stop" : "start", total);
    assert_true(total > TRACE_WORKERS);
    for (long at = 0; at < total + 2; at++) {
      trace_pass(at, 0, stop_phase);
      trace_pass(at, 1, stop_phase);
    }
  }
  release_starters();
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_allocation_failing_once),
      cmocka_unit_test(allocations_failing_for_good),
      cmocka_unit_test(trace_start_and_stop_failing_at_every_allocation),
  };
  return test_main("unit_alloc_fail", tests, sizeof tests / sizeof tests[0], argc, argv);
}

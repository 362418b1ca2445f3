/* common.h - what every ruda test shares: cmocka, assertions that print
 * ruda's last error, device set-up, and a main that runs one test per
 * process when ctest names it. */
#ifndef RUDA_TESTS_COMMON_H
#define RUDA_TESTS_COMMON_H

#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "ruda/ruda.h"

/* A call that must succeed; on failure the message carries ruda's
 * explanation, which is what one needs to read a red test. */
#define assert_ok(call)                                                                  \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != 0)                                                                        \
      fail_msg("%s returned %s: %s", #call, ruda_err_name(rc_),                          \
               ruda_error_message(ruda_last_error()));                                   \
  } while (0)

/* A call that must fail with exactly code, leaving that code in the
 * thread's last error. */
#define assert_rc(call, code)                                                            \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != (code))                                                                   \
      fail_msg("%s returned %s, expected %s (last error: %s)", #call, ruda_err_name(rc_),  \
               ruda_err_name(code), ruda_error_message(ruda_last_error()));              \
    if (rc_ != 0 && ruda_error_code(ruda_last_error()) != rc_)                           \
      fail_msg("%s: last error holds %s, not the returned %s", #call,                    \
               ruda_err_name(ruda_error_code(ruda_last_error())), ruda_err_name(rc_));   \
  } while (0)

/* The text must appear in s. */
#define assert_contains(s, text)                                                         \
  do {                                                                                   \
    const char *s_ = (s);                                                                \
    if (s_ == NULL || strstr(s_, (text)) == NULL)                                        \
      fail_msg("\"%s\" does not contain \"%s\"", s_ ? s_ : "(null)", (text));            \
  } while (0)

#define assert_last_error_contains(text) \
  assert_contains(ruda_error_message(ruda_last_error()), text)

/* Exit code of a skipped case: every test is registered with
 * SKIP_RETURN_CODE 77, so ctest counts it as skipped, not passed. */
#define TEST_SKIP 77

static int test_single_case __attribute__((unused)); /* set by test_main: ctest runs one case per process */

/* Skips the current case. Only for what this machine lacks (no device, no
 * driver library, no MPI, no tool): any other failure is a failure, with
 * its message. Exits 77 when the case runs alone (as under ctest), and is
 * cmocka's skip when a whole group runs in one process. */
#define test_skip(...)                   \
  do {                                   \
    fprintf(stderr, "skipped: ");        \
    fprintf(stderr, __VA_ARGS__);        \
    fprintf(stderr, "\n");               \
    if (test_single_case) exit(TEST_SKIP); \
    skip();                              \
  } while (0)

/* A whole file as a string (malloc'd), for tests that read what ruda
 * wrote (trace files). */
static inline char *test_slurp(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

/* The number after `"key":` in the JSON text at ev. */
static inline double test_json_number(const char *ev, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(ev, pat);
  assert_non_null(p);
  return strtod(p + strlen(pat), NULL);
}

/* Lanes per worker for n workers in tests: 64 device streams in all, at
 * most 16 a worker, 1 from 64 workers on. */
static inline uint32_t test_lanes(uint32_t n) { return n >= 64 ? 1 : 64 / n > 16 ? 16 : 64 / n; }

/* A host device with explicit settings, so the tester's RUDA_*
 * environment cannot change what a test exercises. */
static inline ruda_device *test_open(uint32_t streams, uint32_t queue_bound, ruda_backpressure bp) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = streams;
  /* Lanes: 64 device streams in all up to 64 workers, so every path that
   * crosses lanes of one worker runs (a worker's lanes share one order on
   * the host backend; memory keeps them apart). */
  cfg.lanes = test_lanes(streams);
  cfg.queue_bound = queue_bound;
  cfg.backpressure = bp;
  cfg.log_level = RUDA_LOG_ERROR;
  ruda_device *dev = NULL;
  int rc = ruda_device_open(&cfg, &dev);
  if (rc != 0)
    fail_msg("ruda_device_open: %s: %s", ruda_err_name(rc), ruda_error_message(ruda_last_error()));
  return dev;
}

static inline ruda_device *test_open_default(void) {
  return test_open(4, 65536, RUDA_BACKPRESSURE_BLOCK);
}

/* Closes a device that must hold no errors. */
static inline void test_close(ruda_device *dev) {
  ruda_error *errs = NULL;
  int rc = ruda_device_close(dev, &errs);
  if (rc != 0) {
    ruda_error_print(errs, stderr, 0);
    ruda_error_free(errs);
    fail_msg("ruda_device_close returned %s", ruda_err_name(rc));
  }
  assert_null(errs);
}

/* A one-thread launch of kernel with args. */
static inline int test_launch(ruda_device *dev, ruda_stream_id s, const char *kernel, const ruda_arg *args,
                              uint32_t nargs) {
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = kernel;
  l.grid = (ruda_dim3){1, 1, 1};
  l.block = (ruda_dim3){1, 1, 1};
  l.args = args;
  l.nargs = nargs;
  return ruda_launch(dev, s, &l);
}

/* Reads len contiguous bytes of b on stream s and waits for them. */
static inline void test_read(ruda_device *dev, ruda_stream_id s, ruda_binding b, void *dst, size_t len) {
  ruda_copy_desc d = ruda_copy_contiguous(b);
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, s, &d, dst, len, &f));
  ruda_error *err = NULL;
  int rc = ruda_future_wait(f, &err);
  if (rc != 0) {
    ruda_error_print(err, stderr, 0);
    ruda_error_free(err);
    ruda_future_free(f);
    fail_msg("read: future returned %s", ruda_err_name(rc));
  }
  ruda_future_free(f);
}

static inline void test_write(ruda_device *dev, ruda_stream_id s, ruda_binding b, const void *src, size_t len) {
  ruda_copy_desc d = ruda_copy_contiguous(b);
  assert_ok(ruda_write(dev, s, &d, src, len));
}

/* A host kernel that holds its worker until the test opens the gate:
 * register it with ruda_host_kernel_register(dev, "gate", test_gate_kernel),
 * close with atomic_store(&test_gate_open, 0), open with 1.
 * test_gate_entered counts the gate kernels that started: wait for it
 * (test_wait_count) to know a worker is inside, rather than sleeping. */
static _Atomic int test_gate_open __attribute__((unused)) = 1;
static _Atomic int test_gate_entered __attribute__((unused));

static inline int test_gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&test_gate_entered, 1);
  while (!atomic_load(&test_gate_open)) usleep(100);
  return 0;
}

/* How many times longer than on an idle machine a test waits for
 * progress before it calls the lack of it a hang: the sanitizer's slowdown
 * (1; 4 under ASan; 10 under TSan) times the load per CPU (at least 1),
 * or RUDA_TEST_PATIENCE when set. Bounds on waits for progress (a count,
 * a thread asleep, an event) are multiplied by it, so a slow or loaded
 * machine is never a failure; what a test asserts is progress, not speed.
 * Computed once per process (the load then), so a bound does not move
 * while a loop tests it. Thread-safe (an atomic; racing first calls agree
 * closely enough); does not block. */
static inline unsigned test_patience(void) {
  static _Atomic unsigned known;
  unsigned k = atomic_load(&known);
  if (k != 0) return k;
  const char *v = getenv("RUDA_TEST_PATIENCE");
  if (v != NULL && atoi(v) > 0) {
    atomic_store(&known, (unsigned)atoi(v));
    return (unsigned)atoi(v);
  }
  unsigned slow = 1;
#if defined(__SANITIZE_THREAD__)
  slow = 10;
#elif defined(__SANITIZE_ADDRESS__)
  slow = 4;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  slow = 10;
#elif __has_feature(address_sanitizer)
  slow = 4;
#endif
#endif
  double load = 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (getloadavg(&load, 1) == 1 && cpus > 0 && load > (double)cpus) slow = (unsigned)(slow * (load / (double)cpus) + 1);
  atomic_store(&known, slow);
  return slow;
}

/* Waits until *counter reaches at least n; fails after 10 s times
 * test_patience(). */
static inline void test_wait_count(_Atomic int *counter, int n) {
  const int limit = 100000 * (int)test_patience();
  for (int i = 0; atomic_load(counter) < n; i++) {
    if (i == limit) fail_msg("waited %d s for a count of %d (it is %d)", limit / 10000, n, atomic_load(counter));
    usleep(100);
  }
}

/* Starts n threads (at most 64) running fn(arg) and joins them all;
 * each must return NULL. */
static inline void test_threads_run(void *(*fn)(void *), void *arg, int n) {
  pthread_t t[64];
  assert_true(n >= 0 && n <= 64);
  for (int i = 0; i < n; i++) assert_int_equal(pthread_create(&t[i], NULL, fn, arg), 0);
  for (int i = 0; i < n; i++) {
    void *rc = (void *)1;
    assert_int_equal(pthread_join(t[i], &rc), 0);
    assert_null(rc);
  }
}

/* The calling thread's kernel id, for test_wait_blocked. */
static inline pid_t test_tid(void) { return (pid_t)syscall(SYS_gettid); }

/* Whether thread tid (of this process) sleeps in a futex now. Linux:
 * reads /proc/self/task/TID/syscall. No cmocka: any thread may ask. */
static inline int test_in_futex(pid_t tid) {
  char path[64], line[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  int got = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  return got && line[0] != 'r' && atol(line) == SYS_futex;
}

/* Waits until thread tid sleeps in a futex: positive evidence that a
 * call blocked (on a full queue, on close), not merely that it had time
 * to. Call it once the thread is known to have entered the call; fails
 * after 10 s times test_patience(). */
static inline void test_wait_blocked(pid_t tid) {
  const int limit = 100000 * (int)test_patience();
  for (int i = 0; !test_in_futex(tid); i++) {
    if (i == limit) fail_msg("thread %d never blocked in a futex", (int)tid);
    usleep(100);
  }
}

/* The id of this process's thread named name (pthread_setname_np), or 0
 * when none is. Linux: /proc/self/task/TID/comm. */
static inline pid_t test_thread_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return 0;
  pid_t found = 0;
  for (struct dirent *e; found == 0 && (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    if (fgets(comm, sizeof comm, f) != NULL) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
    if (strcmp(comm, name) == 0) found = (pid_t)atoi(e->d_name);
  }
  closedir(d);
  return found;
}

/* Runs the group, or only the test named by argv[1]: ctest starts every
 * test as its own process, so a crash or a hang is charged to that test
 * alone and the per-test timeout applies. A name matching nothing is an
 * error, not a silent pass. */
static inline int test_main(const char *group, const struct CMUnitTest *tests, size_t n, int argc,
                            char **argv) {
  test_single_case = argc > 1;
  if (argc > 1) {
    size_t i = 0;
    while (i < n && strcmp(tests[i].name, argv[1]) != 0) i++;
    if (i == n) {
      fprintf(stderr, "%s: no test named \"%s\"\n", group, argv[1]);
      return 2;
    }
    cmocka_set_test_filter(argv[1]);
  }
  return _cmocka_run_group_tests(group, tests, n, NULL, NULL);
}

#define TEST_MAIN(group, tests) \
  int main(int argc, char **argv) { return test_main(group, tests, sizeof(tests) / sizeof(tests[0]), argc, argv); }

#endif /* RUDA_TESTS_COMMON_H */

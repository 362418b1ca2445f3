/* rendezvous_hostile.c - the tcp and file rendezvous against hostile or
 * broken peers, on 127.0.0.1 only: rank 0 listens on the address given
 * and nothing else; a silent connection neither holds rank 0 nor outlasts
 * RUDA_COMM_TIMEOUT; a flood of strangers (silent, garbage, the old
 * unauthenticated hello) takes no rank's place and stops nobody; a
 * process with another key is refused and told why; every rank reports
 * the same outcome, also when a rank gave up while rank 0 was busy or
 * while it waited for the others; a FIFO named by file: and timeouts out
 * of range are refused at once.
 *
 * Processes with an environment of their own (another RUDA_COMM_SECRET,
 * a shorter RUDA_COMM_TIMEOUT) are this binary run again as one rank:
 * `rendezvous_hostile --rank WHERE NRANKS RANK TIMEOUT SECRET`, whose
 * exit status is the negated return code. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static uint64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int free_port(void) {
  static int next;
  if (next == 0) next = 21000 + (int)(getpid() % 20000);
  return next++;
}

typedef struct peer {
  char where[64];
  uint32_t nranks, rank;
  ruda_comm_id id;
  int rc;
  uint64_t ms; /* how long the call took */
  char msg[512];
  pthread_t t;
} peer;

static void *join(void *p) {
  peer *r = p;
  uint64_t t0 = ms_now();
  r->rc = ruda_comm_rendezvous(r->where, r->nranks, r->rank, &r->id);
  r->ms = ms_now() - t0;
  if (r->rc != 0) snprintf(r->msg, sizeof r->msg, "%s", ruda_error_message(ruda_last_error()));
  return NULL;
}

static void start(peer *r, int port, uint32_t nranks, uint32_t rank) {
  memset(r, 0, sizeof *r);
  snprintf(r->where, sizeof r->where, "tcp:127.0.0.1:%d", port);
  r->nranks = nranks;
  r->rank = rank;
  if (rank == 0)
    for (size_t i = 0; i < sizeof r->id.bytes; i++) r->id.bytes[i] = (unsigned char)(i * 5 + 1);
  assert_int_equal(pthread_create(&r->t, NULL, join, r), 0);
}

static void finish(peer *r) { pthread_join(r->t, NULL); }

/* A connection to addr:port, retried until rank 0 listens (bounded). */
static int connect_to(const char *addr, int port, int retry) {
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, addr, &sa.sin_addr);
  for (int i = 0;; i++) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) return s;
    int e = errno;
    close(s);
    if (!retry || i >= 2000) {
      errno = e;
      return -1;
    }
    usleep(1000); /* rank 0 is not listening yet: poll for it */
  }
}

/* Runs this binary as one rank with its own environment; returns its
 * pid. */
static pid_t spawn_rank(const char *where, uint32_t nranks, uint32_t rank, const char *timeout, const char *secret) {
  char n[16], r[16];
  snprintf(n, sizeof n, "%u", nranks);
  snprintf(r, sizeof r, "%u", rank);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "rendezvous_hostile", "--rank", where, n, r, timeout, secret, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* The spawned rank's return code. */
static int rank_rc(pid_t pid) {
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return -WEXITSTATUS(st);
}

static int child_main(char **argv) {
  setenv("RUDA_COMM_TIMEOUT", argv[5], 1);
  if (strcmp(argv[6], "-") != 0) setenv("RUDA_COMM_SECRET", argv[6], 1);
  ruda_comm_id id;
  memset(&id, 0, sizeof id);
  int rc = ruda_comm_rendezvous(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]), &id);
  if (rc != 0) fprintf(stderr, "rank %s: %s\n", argv[4], ruda_error_message(ruda_last_error()));
  return -rc;
}

static void expect_id(const peer *r) {
  if (r->rc != 0) fail_msg("rank %u: %s", r->rank, r->msg);
  for (size_t i = 0; i < sizeof r->id.bytes; i++) assert_int_equal(r->id.bytes[i], (unsigned char)(i * 5 + 1));
}

static void rank_0_listens_on_the_given_address_only(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "5000", 1);
  int port = free_port();
  peer r0, r1;
  start(&r0, port, 2, 0);
  close(connect_to("127.0.0.1", port, 1)); /* listening now */
  /* 127.0.0.2 is this machine too, but not the address rank 0 was given. */
  assert_int_equal(connect_to("127.0.0.2", port, 0), -1);
  assert_int_equal(errno, ECONNREFUSED);
  start(&r1, port, 2, 1);
  finish(&r1);
  finish(&r0);
  expect_id(&r0);
  expect_id(&r1);
  unsetenv("RUDA_COMM_TIMEOUT");
}

/* A connection that says nothing: rank 0 serves the ranks meanwhile, and
 * alone it still ends at RUDA_COMM_TIMEOUT (it held rank 0 5 s). */
static void a_silent_connection_holds_nothing(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "3000", 1);
  int port = free_port();
  peer r0, r1;
  start(&r0, port, 2, 0);
  int silent = connect_to("127.0.0.1", port, 1);
  assert_true(silent >= 0);
  start(&r1, port, 2, 1);
  finish(&r1);
  finish(&r0);
  expect_id(&r0);
  expect_id(&r1);
  close(silent);
  setenv("RUDA_COMM_TIMEOUT", "300", 1);
  port = free_port();
  start(&r0, port, 2, 0);
  silent = connect_to("127.0.0.1", port, 1);
  finish(&r0);
  close(silent);
  assert_int_equal(r0.rc, RUDA_ETIMEDOUT);
  assert_contains(r0.msg, "heard from 1 of 2 ranks");
  if (r0.ms > 2000ull * test_patience())
    fail_msg("rank 0 waited %llu ms for a 300 ms timeout", (unsigned long long)r0.ms);
  unsetenv("RUDA_COMM_TIMEOUT");
}

/* Strangers in numbers before the ranks come: silent ones, garbage, and
 * the unauthenticated hello of the old wire format claiming rank 1. */
static void a_flood_of_strangers_stops_nobody(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "8000", 1);
  int port = free_port();
  enum { SILENT = 100, GARBAGE = 100, FAKE = 20 };
  static int fds[SILENT + GARBAGE + FAKE];
  peer r[3];
  start(&r[0], port, 3, 0);
  for (int i = 0; i < SILENT + GARBAGE + FAKE; i++) {
    fds[i] = connect_to("127.0.0.1", port, 1);
    assert_true(fds[i] >= 0);
    if (i >= SILENT && i < SILENT + GARBAGE) {
      unsigned char junk[200];
      for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)(k * 31 + (size_t)i);
      (void)send(fds[i], junk, sizeof junk, MSG_NOSIGNAL);
    } else if (i >= SILENT + GARBAGE) {
      const uint32_t old_hello[3] = {0x41445552u, 3, 1 + (uint32_t)(i % 2)};
      (void)send(fds[i], old_hello, sizeof old_hello, MSG_NOSIGNAL);
    }
  }
  start(&r[1], port, 3, 1);
  start(&r[2], port, 3, 2);
  for (int k = 0; k < 3; k++) finish(&r[k]);
  for (int k = 0; k < 3; k++) expect_id(&r[k]);
  for (int i = 0; i < SILENT + GARBAGE + FAKE; i++) close(fds[i]);
  unsetenv("RUDA_COMM_TIMEOUT");
}

/* A process speaking the protocol under another key is refused, told
 * why, and the real rank 1 takes the place afterwards. */
static void a_process_with_another_key_takes_no_place(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "8000", 1);
  setenv("RUDA_COMM_SECRET", "the job's secret", 1);
  int port = free_port();
  peer r0, r1;
  start(&r0, port, 2, 0);
  close(connect_to("127.0.0.1", port, 1));
  pid_t other = spawn_rank(r0.where, 2, 1, "8000", "another secret");
  assert_int_equal(rank_rc(other), RUDA_EINVAL);
  start(&r1, port, 2, 1);
  finish(&r1);
  finish(&r0);
  expect_id(&r0);
  expect_id(&r1);
  unsetenv("RUDA_COMM_SECRET");
  unsetenv("RUDA_COMM_TIMEOUT");
}

/* Rank 1 (a process with a 1 s timeout) asks while a silent connection
 * is ahead of it, or joins and then gives up while rank 0 waits for rank
 * 2: whatever happens, the ranks agree. It used to be that rank 0 read
 * the hello rank 1 had left before giving up, and returned 0. */
static void every_rank_sees_the_same_outcome(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "8000", 1);
  int port = free_port();
  peer r0;
  start(&r0, port, 2, 0);
  int silent = connect_to("127.0.0.1", port, 1);
  int rc1 = rank_rc(spawn_rank(r0.where, 2, 1, "1000", "-"));
  finish(&r0);
  close(silent);
  if ((r0.rc == 0) != (rc1 == 0)) fail_msg("rank 0 returned %s, rank 1 %s", ruda_err_name(r0.rc), ruda_err_name(rc1));
  /* Three ranks: rank 1 joins, gives up at 300 ms; rank 2 joins after. */
  setenv("RUDA_COMM_TIMEOUT", "1500", 1);
  port = free_port();
  peer r2;
  start(&r0, port, 3, 0);
  close(connect_to("127.0.0.1", port, 1));
  rc1 = rank_rc(spawn_rank(r0.where, 3, 1, "300", "-"));
  assert_int_equal(rc1, RUDA_ETIMEDOUT);
  start(&r2, port, 3, 2);
  finish(&r2);
  finish(&r0);
  assert_int_equal(r0.rc, RUDA_ETIMEDOUT);
  assert_contains(r0.msg, "heard from 2 of 3 ranks"); /* rank 1's place was given back */
  assert_int_equal(r2.rc, RUDA_ETIMEDOUT);
  assert_contains(r2.msg, "rank 0 at 127.0.0.1");
  unsetenv("RUDA_COMM_TIMEOUT");
}

/* file: naming a FIFO nobody writes: refused at once (open() used to wait
 * for a writer for ever: the ctest timeout reports that). */
static void a_fifo_is_no_rendezvous_file(void **state) {
  (void)state;
  char dir[] = "/tmp/ruda-fifo-XXXXXX", path[128], where[160];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/id", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  snprintf(where, sizeof where, "file:%s", path);
  setenv("RUDA_COMM_TIMEOUT", "2000", 1);
  ruda_comm_id id;
  assert_rc(ruda_comm_rendezvous(where, 2, 1, &id), RUDA_EINVAL);
  assert_last_error_contains("is not a regular file");
  unsetenv("RUDA_COMM_TIMEOUT");
  unlink(path);
  rmdir(dir);
}

/* RUDA_COMM_TIMEOUT out of range is refused, not wrapped into a deadline
 * already past (-1 made every wait fail at once). */
static void timeouts_out_of_range_are_refused(void **state) {
  (void)state;
  static const char *const bad[] = {"-1", "18446744073709551615", "2147483648", "5s", " 5", "+5", "1e3"};
  ruda_comm_id id;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("RUDA_COMM_TIMEOUT", bad[i], 1);
    assert_rc(ruda_comm_rendezvous("file:/tmp/ruda-no-such-dir-rdv/id", 2, 1, &id), RUDA_EINVAL);
    assert_last_error_contains("RUDA_COMM_TIMEOUT=");
    assert_last_error_contains("is not a whole number of ms from 0");
    ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
    ruda_comm *c = NULL;
    assert_rc(ruda_comm_init(&dev, 1, &c), RUDA_EINVAL);
    assert_null(c);
    assert_last_error_contains("RUDA_COMM_TIMEOUT=");
    test_close(dev);
  }
  /* The largest accepted: a wait of 24 days, not one already over. */
  setenv("RUDA_COMM_TIMEOUT", "2147483647", 1);
  char dir[] = "/tmp/ruda-rdv-XXXXXX", where[128];
  assert_non_null(mkdtemp(dir));
  snprintf(where, sizeof where, "file:%s/id", dir);
  memset(&id, 7, sizeof id);
  assert_ok(ruda_comm_rendezvous(where, 2, 0, &id));
  ruda_comm_id got;
  assert_ok(ruda_comm_rendezvous(where, 2, 1, &got));
  assert_memory_equal(&got, &id, sizeof id);
  snprintf(where, sizeof where, "%s/id", dir);
  unlink(where);
  rmdir(dir);
  unsetenv("RUDA_COMM_TIMEOUT");
}

int main(int argc, char **argv) {
  if (argc == 7 && strcmp(argv[1], "--rank") == 0) return child_main(argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rank_0_listens_on_the_given_address_only),
      cmocka_unit_test(a_silent_connection_holds_nothing),
      cmocka_unit_test(a_flood_of_strangers_stops_nobody),
      cmocka_unit_test(a_process_with_another_key_takes_no_place),
      cmocka_unit_test(every_rank_sees_the_same_outcome),
      cmocka_unit_test(a_fifo_is_no_rendezvous_file),
      cmocka_unit_test(timeouts_out_of_range_are_refused),
  };
  return test_main("integration_rendezvous_hostile", tests, sizeof tests / sizeof tests[0], argc, argv);
}

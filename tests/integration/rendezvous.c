/* rendezvous.c - ranks finding each other without MPI: rank 0's id reaches
 * every rank through a TCP port or a file, whoever starts first; ranks
 * started for different sizes, a rank 0 that never comes and malformed
 * addresses fail with what went wrong; RANK/WORLD_SIZE/LOCAL_RANK are read
 * and checked; the host backend refuses ruda_comm_init_env, naming MPI. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

typedef struct peer {
  const char *where;
  uint32_t nranks, rank;
  unsigned delay_ms; /* before joining: rank 0 may come last */
  ruda_comm_id id;
  int rc;
  char msg[512];
} peer;

static void *join(void *p) {
  peer *r = p;
  usleep(r->delay_ms * 1000u);
  r->rc = ruda_comm_rendezvous(r->where, r->nranks, r->rank, &r->id);
  if (r->rc != 0) snprintf(r->msg, sizeof r->msg, "%s", ruda_error_message(ruda_last_error()));
  return NULL;
}

/* Runs n ranks as threads; rank 0's id is a pattern, the others' zero. */
static void run_ranks(peer *r, uint32_t n) {
  pthread_t t[8];
  for (uint32_t k = 0; k < n; k++) {
    memset(&r[k].id, 0, sizeof r[k].id);
    if (r[k].rank == 0)
      for (size_t i = 0; i < sizeof r[k].id.bytes; i++) r[k].id.bytes[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(pthread_create(&t[k], NULL, join, &r[k]), 0);
  }
  for (uint32_t k = 0; k < n; k++) pthread_join(t[k], NULL);
}

/* A port nobody listens on now: bound and released (a small race with
 * other programs, which the caller's retry covers). */
static int free_port(void) {
  static int next;
  if (next == 0) next = 20000 + (int)(getpid() % 20000);
  return next++;
}

/* Rank 0 could not listen because another program holds the port: the
 * one failure a test retries on another port (five times at most). Any
 * other failure of rank 0 is a failure of the test. */
static int port_taken(const peer *r, int attempt) {
  if (r->rc != RUDA_EIO || strstr(r->msg, strerror(EADDRINUSE)) == NULL) return 0;
  if (attempt >= 5) fail_msg("rank 0 found every port taken: %s", r->msg);
  return 1;
}

static void ids_reach_every_rank_by_tcp(void **state) {
  (void)state;
  for (int attempt = 0;; attempt++) {
    char where[64];
    snprintf(where, sizeof where, "tcp:127.0.0.1:%d", free_port());
    /* The others ask before rank 0 listens: they retry until it does. */
    peer r[4] = {{.where = where, .nranks = 4, .rank = 1, .delay_ms = 0}, {.where = where, .nranks = 4, .rank = 2, .delay_ms = 0}, {.where = where, .nranks = 4, .rank = 3, .delay_ms = 0}, {.where = where, .nranks = 4, .rank = 0, .delay_ms = 100}};
    run_ranks(r, 4);
    if (port_taken(&r[3], attempt)) continue;
    for (int k = 0; k < 4; k++) {
      if (r[k].rc != 0) fail_msg("rank %u: %s", r[k].rank, r[k].msg);
      assert_memory_equal(&r[k].id, &r[3].id, sizeof r[k].id);
    }
    assert_int_equal(r[0].id.bytes[1], 10);
    break;
  }
}

static void ids_reach_every_rank_by_file(void **state) {
  (void)state;
  char dir[] = "/tmp/ruda-rdv-XXXXXX", where[128];
  assert_non_null(mkdtemp(dir));
  snprintf(where, sizeof where, "file:%s/id", dir);
  peer r[3] = {{.where = where, .nranks = 3, .rank = 1, .delay_ms = 0}, {.where = where, .nranks = 3, .rank = 2, .delay_ms = 0}, {.where = where, .nranks = 3, .rank = 0, .delay_ms = 50}};
  run_ranks(r, 3);
  for (int k = 0; k < 3; k++) {
    if (r[k].rc != 0) fail_msg("rank %u: %s", r[k].rank, r[k].msg);
    assert_memory_equal(&r[k].id, &r[2].id, sizeof r[k].id);
  }
  /* A rank started for another size is told so. */
  peer odd = {.where = where, .nranks = 5, .rank = 4, .delay_ms = 0};
  run_ranks(&odd, 1);
  assert_int_equal(odd.rc, RUDA_EINVAL);
  assert_contains(odd.msg, "for 3 ranks, rank 4 was started for 5");
  char path[160];
  snprintf(path, sizeof path, "%s/id", dir);
  unlink(path);
  rmdir(dir);
}

static void sizes_that_differ_fail_both_sides(void **state) {
  (void)state;
  for (int attempt = 0;; attempt++) {
    char where[64];
    snprintf(where, sizeof where, "tcp:localhost:%d", free_port());
    setenv("RUDA_COMM_TIMEOUT", "3000", 1);
    peer r[2] = {{.where = where, .nranks = 2, .rank = 0, .delay_ms = 0}, {.where = where, .nranks = 3, .rank = 1, .delay_ms = 20}};
    run_ranks(r, 2);
    unsetenv("RUDA_COMM_TIMEOUT");
    if (port_taken(&r[0], attempt)) continue;
    assert_int_equal(r[0].rc, RUDA_EINVAL);
    assert_contains(r[0].msg, "rank 1 was started for 3 ranks, rank 0 for 2");
    assert_int_equal(r[1].rc, RUDA_EINVAL);
    assert_contains(r[1].msg, "refused rank 1 of 3 (it expects 2 ranks");
    break;
  }
}

static void a_missing_rank_0_times_out(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "200", 1);
  char where[64];
  snprintf(where, sizeof where, "tcp:127.0.0.1:%d", free_port());
  peer r = {.where = where, .nranks = 2, .rank = 1, .delay_ms = 0};
  run_ranks(&r, 1);
  assert_int_equal(r.rc, RUDA_ETIMEDOUT);
  assert_contains(r.msg, "rank 1 could not reach rank 0 at 127.0.0.1:");
  peer f = {.where = "file:/tmp/ruda-no-such-dir-rdv/id", .nranks = 2, .rank = 1, .delay_ms = 0};
  run_ranks(&f, 1);
  assert_int_equal(f.rc, RUDA_ETIMEDOUT);
  assert_contains(f.msg, "rank 0 did not write /tmp/ruda-no-such-dir-rdv/id within 200 ms");
  /* Rank 0 alone, waiting for a rank that never asks. */
  peer z;
  for (int attempt = 0;; attempt++) {
    snprintf(where, sizeof where, "tcp:127.0.0.1:%d", free_port());
    z = (peer){.where = where, .nranks = 2, .rank = 0, .delay_ms = 0};
    run_ranks(&z, 1);
    if (!port_taken(&z, attempt)) break;
  }
  if (z.rc != RUDA_ETIMEDOUT) fail_msg("rank 0 alone: %s, expected RUDA_ETIMEDOUT: %s", ruda_err_name(z.rc), z.msg);
  assert_contains(z.msg, "rank 0 heard from 1 of 2 ranks");
  unsetenv("RUDA_COMM_TIMEOUT");
}

static void bad_addresses_are_refused(void **state) {
  (void)state;
  ruda_comm_id id;
  assert_rc(ruda_comm_rendezvous(NULL, 1, 0, &id), RUDA_EINVAL);
  assert_rc(ruda_comm_rendezvous("tcp:h:1", 1, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_comm_rendezvous("udp:h:1", 2, 0, &id), RUDA_EINVAL);
  assert_last_error_contains("neither file:PATH nor tcp:HOST:PORT");
  assert_rc(ruda_comm_rendezvous("file:", 2, 0, &id), RUDA_EINVAL);
  assert_rc(ruda_comm_rendezvous("tcp:1.2.3.4:5", 2, 2, &id), RUDA_EINVAL);
  assert_rc(ruda_comm_rendezvous("tcp:1.2.3.4:5", 0, 0, &id), RUDA_EINVAL);
  assert_rc(ruda_comm_rendezvous("tcp:nocolon", 2, 1, &id), RUDA_EINVAL);
  assert_last_error_contains("is not HOST:PORT");
  /* One rank has nobody to tell: no socket is opened. */
  assert_ok(ruda_comm_rendezvous("tcp:unresolvable.invalid:1", 1, 0, &id));
}

static void the_environment_names_the_rank(void **state) {
  (void)state;
  uint32_t rank = 9, n = 9, local = 9;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  assert_rc(ruda_comm_env(&rank, &n, &local), RUDA_EINVAL);
  assert_last_error_contains("RANK is not set");
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "x4", 1);
  assert_rc(ruda_comm_env(&rank, &n, &local), RUDA_EINVAL);
  assert_last_error_contains("WORLD_SIZE=\"x4\" is not a number");
  setenv("WORLD_SIZE", "2", 1);
  assert_rc(ruda_comm_env(&rank, &n, &local), RUDA_EINVAL);
  assert_last_error_contains("RANK=2 with WORLD_SIZE=2");
  setenv("WORLD_SIZE", "4", 1);
  assert_ok(ruda_comm_env(&rank, &n, &local));
  assert_int_equal(rank, 2);
  assert_int_equal(n, 4);
  assert_int_equal(local, 0);
  setenv("LOCAL_RANK", "1", 1);
  assert_ok(ruda_comm_env(&rank, &n, &local));
  assert_int_equal(local, 1);
  assert_rc(ruda_comm_env(NULL, &n, &local), RUDA_EINVAL);
  /* The host backend needs a transport across processes. */
  ruda_device *dev = test_open(1, 64, RUDA_BACKPRESSURE_BLOCK);
  ruda_comm *c = (ruda_comm *)dev;
  assert_rc(ruda_comm_init_env(dev, &c), RUDA_ENOBACKEND);
  assert_null(c);
  assert_last_error_contains("ruda_mpi_comm_init");
  assert_rc(ruda_comm_init_env(dev, NULL), RUDA_EINVAL);
  test_close(dev);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ids_reach_every_rank_by_tcp),
      cmocka_unit_test(ids_reach_every_rank_by_file),
      cmocka_unit_test(sizes_that_differ_fail_both_sides),
      cmocka_unit_test(a_missing_rank_0_times_out),
      cmocka_unit_test(bad_addresses_are_refused),
      cmocka_unit_test(the_environment_names_the_rank),
  };
  return test_main("integration_rendezvous", tests, sizeof tests / sizeof tests[0], argc, argv);
}

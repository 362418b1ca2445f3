/* gpu_comm.c - collectives through NCCL on two GPUs: an all-reduce in
 * place after long writer kernels on user streams, a mean in f64, a
 * send/recv each way, an all-gather, a reduce-scatter and a broadcast,
 * all checked element by element; on one GPU, every collective and type
 * through a one-rank communicator. Skipped with fewer
 * than two GPUs, without NCCL, and under the mock driver. */
#include <time.h>

#include "gpu_common.h"

static void two_gpus(void **state) {
  (void)state;
  ruda_device *d[2] = {gpu_open(), NULL};
  if (gpu_is_mock(d[0])) {
    test_close(d[0]);
    gpu_skip("the mock driver has no NCCL");
  }
  /* Only "there is no second GPU" skips; any other failure to open it
   * fails, with its code and message. */
  int rc = gpu_try_open_ordinal(1, 4, "", 0, &d[1]);
  if (rc != 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", ruda_error_message(ruda_last_error()));
    const char *absent = gpu_absent(rc, 1);
    test_close(d[0]);
    if (absent != NULL) gpu_skip("needs two GPUs (%s): %s", absent, why);
    fail_msg("ruda_device_open(cuda, ordinal 1): %s: %s", ruda_err_name(rc), why);
  }
  ruda_comm *comm;
  rc = ruda_comm_init(d, 2, &comm);
  if (rc == RUDA_ENOBACKEND) {
    test_close(d[0]);
    test_close(d[1]);
    gpu_skip("%s", ruda_error_message(ruda_last_error()));
  }
  assert_ok(rc);
  const unsigned n = 1u << 20;
  ruda_handle x[2], m[2], p[2];
  long long spin = 40000000LL; /* ~20 ms */
  for (int r = 0; r < 2; r++) {
    assert_ok(ruda_kernel_source(d[r], "order_fill", SRC_ORDER, NULL));
    assert_ok(ruda_buffer_create(d[r], 1, (uint64_t)n * 4, &x[r]));
    unsigned v = 1000u * (unsigned)(r + 1);
    ruda_arg a[4] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(x[r])), ruda_arg_scalar(&v, 4),
                     ruda_arg_scalar(&spin, 8)};
    ruda_launch_desc l = {.kernel = "order_fill", .grid = {132, 1, 1}, .block = {256, 1, 1}, .args = a, .nargs = 4};
    assert_ok(ruda_launch(d[r], 1, &l));
    /* Right behind the writer, on another stream: ordered by the buffer. */
    assert_ok(ruda_all_reduce(comm, d[r], ruda_bind(x[r]), ruda_bind(x[r]), RUDA_DTYPE_I32, RUDA_REDUCE_SUM));
  }
  unsigned *got = malloc((size_t)n * 4);
  for (int r = 0; r < 2; r++) {
    test_read(d[r], 2, ruda_bind(x[r]), got, (size_t)n * 4);
    for (unsigned i = 0; i < n; i++)
      if (got[i] != 3000u + 2 * i) fail_msg("rank %d element %u: %u, expected %u", r, i, got[i], 3000u + 2 * i);
  }
  /* Mean of f64: rank r holds r + i / 4. */
  double *dv = malloc((size_t)n * 8);
  for (int r = 0; r < 2; r++) {
    for (unsigned i = 0; i < n; i++) dv[i] = r + i / 4.0;
    assert_ok(ruda_buffer_create(d[r], 0, (uint64_t)n * 8, &m[r]));
    test_write(d[r], 0, ruda_bind(m[r]), dv, (size_t)n * 8);
    assert_ok(ruda_all_reduce(comm, d[r], ruda_bind(m[r]), ruda_bind(m[r]), RUDA_DTYPE_F64, RUDA_REDUCE_MEAN));
  }
  for (int r = 0; r < 2; r++) {
    test_read(d[r], 0, ruda_bind(m[r]), dv, (size_t)n * 8);
    for (unsigned i = 0; i < n; i++)
      if (dv[i] != 0.5 + i / 4.0) fail_msg("mean, rank %d element %u: %g", r, i, dv[i]);
  }
  /* 0 -> 1, then 1 -> 0 back into another buffer. */
  for (int r = 0; r < 2; r++) assert_ok(ruda_buffer_create(d[r], 0, (uint64_t)n * 4, &p[r]));
  assert_ok(ruda_send(comm, d[0], ruda_bind(x[0]), 1));
  assert_ok(ruda_recv(comm, d[1], ruda_bind(p[1]), 0));
  assert_ok(ruda_send(comm, d[1], ruda_bind(p[1]), 0));
  assert_ok(ruda_recv(comm, d[0], ruda_bind(p[0]), 1));
  for (int r = 0; r < 2; r++) assert_ok(ruda_comm_sync(comm, d[r], NULL));
  test_read(d[0], 0, ruda_bind(p[0]), got, (size_t)n * 4);
  for (unsigned i = 0; i < n; i++)
    if (got[i] != 3000u + 2 * i) fail_msg("round trip element %u: %u", i, got[i]);
  /* All-gather of rank r's r * 10^6 + i, reduce-scatter (sum) of that,
   * then a broadcast from rank 1 in place. */
  ruda_handle sv[2], ag[2], rs[2];
  for (int r = 0; r < 2; r++) {
    for (unsigned i = 0; i < n; i++) got[i] = (unsigned)r * 1000000u + i;
    assert_ok(ruda_buffer_create(d[r], 0, (uint64_t)n * 4, &sv[r]));
    assert_ok(ruda_buffer_create(d[r], 0, (uint64_t)n * 8, &ag[r]));
    assert_ok(ruda_buffer_create(d[r], 0, (uint64_t)n * 4, &rs[r]));
    test_write(d[r], 0, ruda_bind(sv[r]), got, (size_t)n * 4);
  }
  for (int r = 0; r < 2; r++) assert_ok(ruda_all_gather(comm, d[r], ruda_bind(sv[r]), ruda_bind(ag[r]), RUDA_DTYPE_I32));
  for (int r = 0; r < 2; r++)
    assert_ok(ruda_reduce_scatter(comm, d[r], ruda_bind(ag[r]), ruda_bind(rs[r]), RUDA_DTYPE_I32, RUDA_REDUCE_SUM));
  for (int r = 0; r < 2; r++) assert_ok(ruda_broadcast(comm, d[r], ruda_bind(sv[r]), ruda_bind(sv[r]), RUDA_DTYPE_I32, 1));
  unsigned *all = malloc((size_t)n * 8);
  for (int r = 0; r < 2; r++) {
    test_read(d[r], 0, ruda_bind(ag[r]), all, (size_t)n * 8);
    for (unsigned j = 0; j < 2; j++)
      for (unsigned i = 0; i < n; i++)
        if (all[j * n + i] != j * 1000000u + i) fail_msg("all-gather, rank %d part %u element %u: %u", r, j, i, all[j * n + i]);
    test_read(d[r], 0, ruda_bind(rs[r]), got, (size_t)n * 4);
    for (unsigned i = 0; i < n; i++)
      if (got[i] != 2 * ((unsigned)r * 1000000u + i)) fail_msg("reduce-scatter, rank %d element %u: %u", r, i, got[i]);
    test_read(d[r], 0, ruda_bind(sv[r]), got, (size_t)n * 4);
    for (unsigned i = 0; i < n; i++)
      if (got[i] != 1000000u + i) fail_msg("broadcast, rank %d element %u: %u", r, i, got[i]);
    assert_ok(ruda_buffer_free(d[r], 0, sv[r]));
    assert_ok(ruda_buffer_free(d[r], 0, ag[r]));
    assert_ok(ruda_buffer_free(d[r], 0, rs[r]));
  }
  free(all);
  free(got);
  free(dv);
  assert_ok(ruda_comm_destroy(comm));
  for (int r = 0; r < 2; r++) {
    assert_ok(ruda_buffer_free(d[r], 1, x[r]));
    assert_ok(ruda_buffer_free(d[r], 0, m[r]));
    assert_ok(ruda_buffer_free(d[r], 0, p[r]));
    gpu_sync_ok(d[r], 0);
    test_close(d[r]);
  }
}

/* ruda_comm_init_rank through NCCL's unique id: one GPU allows a
 * communicator of one rank, which still goes through ncclCommInitRank. */
/* The GPU, or a skip under the mock driver (it has no NCCL). */
static ruda_device *open_nccl_gpu(void) {
  ruda_device *dev = gpu_open();
  if (gpu_is_mock(dev)) {
    test_close(dev);
    gpu_skip("the mock driver has no NCCL");
  }
  return dev;
}

/* NCCL's unique id, or a skip where NCCL cannot be loaded. */
static void unique_id_or_skip(ruda_device *dev, ruda_comm_id *id) {
  int rc = ruda_comm_unique_id(dev, id);
  if (rc == RUDA_ENOBACKEND) {
    test_close(dev);
    gpu_skip("%s", ruda_error_message(ruda_last_error()));
  }
  assert_ok(rc);
}

static void one_rank_by_unique_id(void **state) {
  (void)state;
  ruda_device *dev = open_nccl_gpu();
  ruda_comm_id id;
  unique_id_or_skip(dev, &id);
  ruda_comm *comm = NULL;
  ruda_comm_transport t = {0};
  assert_rc(ruda_comm_init_rank(dev, 1, 0, &id, &t, &comm), RUDA_EINVAL); /* NCCL carries the data */
  assert_ok(ruda_comm_init_rank(dev, 1, 0, &id, NULL, &comm));
  assert_int_equal(ruda_comm_size(comm), 1);
  float in[256], out[256];
  for (int i = 0; i < 256; i++) in[i] = (float)i - 100.0f;
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, sizeof in, &x));
  assert_ok(ruda_buffer_create(dev, 0, sizeof out, &y));
  test_write(dev, 0, ruda_bind(x), in, sizeof in);
  assert_ok(ruda_all_reduce(comm, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, RUDA_REDUCE_MAX));
  assert_ok(ruda_comm_sync(comm, dev, NULL));
  test_read(dev, 0, ruda_bind(y), out, sizeof out);
  assert_memory_equal(in, out, sizeof in);
  /* NCCL's other collectives and narrow types: with one rank each is a
   * copy of its source, in whatever type (the bytes as given: 1024 of
   * them are 512 f16, 512 bf16 or 1024 i8/u8 elements). */
  static const ruda_dtype types[] = {RUDA_DTYPE_F16, RUDA_DTYPE_BF16, RUDA_DTYPE_I8, RUDA_DTYPE_U8, RUDA_DTYPE_F64};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
    for (int kind = 0; kind < 5; kind++) {
      const ruda_dtype dt = types[ti];
      memset(out, 0, sizeof out);
      test_write(dev, 0, ruda_bind(y), out, sizeof out);
      if (kind == 0) assert_ok(ruda_reduce(comm, dev, ruda_bind(x), ruda_bind(y), dt, RUDA_REDUCE_SUM, 0));
      if (kind == 1) assert_ok(ruda_broadcast(comm, dev, ruda_bind(x), ruda_bind(y), dt, 0));
      if (kind == 2) assert_ok(ruda_all_gather(comm, dev, ruda_bind(x), ruda_bind(y), dt));
      if (kind == 3) assert_ok(ruda_reduce_scatter(comm, dev, ruda_bind(x), ruda_bind(y), dt, RUDA_REDUCE_MIN));
      if (kind == 4) assert_ok(ruda_all_reduce(comm, dev, ruda_bind(x), ruda_bind(y), dt, RUDA_REDUCE_MEAN));
      ruda_error *errs = NULL;
      int src = ruda_comm_sync(comm, dev, &errs);
      if (src != 0) fail_msg("type %d collective %d: %s", (int)dt, kind, ruda_error_message(ruda_error_cause(errs)));
      test_read(dev, 0, ruda_bind(y), out, sizeof out);
      if (memcmp(in, out, sizeof in) != 0) fail_msg("type %d collective %d: not a copy of the source", (int)dt, kind);
    }
  assert_ok(ruda_comm_destroy(comm));
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

/* ruda_comm_init_env as a launcher leaves it for one process (RANK 0 of
 * WORLD_SIZE 1): NCCL's id made, the rendezvous skipped, one rank. */
static void one_rank_from_the_environment(void **state) {
  (void)state;
  ruda_device *dev = open_nccl_gpu();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("RUDA_COMM_RENDEZVOUS", "tcp:127.0.0.1:29999", 1);
  ruda_comm *comm = NULL;
  int rc = ruda_comm_init_env(dev, &comm);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("RUDA_COMM_RENDEZVOUS");
  if (rc == RUDA_ENOBACKEND) {
    test_close(dev);
    gpu_skip("%s", ruda_error_message(ruda_last_error()));
  }
  assert_ok(rc);
  assert_int_equal(ruda_comm_size(comm), 1);
  assert_int_equal(ruda_comm_rank(comm, dev), 0);
  int8_t in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = (int8_t)(i - 32);
  ruda_handle x;
  assert_ok(ruda_buffer_create(dev, 0, sizeof in, &x));
  test_write(dev, 0, ruda_bind(x), in, sizeof in);
  assert_ok(ruda_all_reduce(comm, dev, ruda_bind(x), ruda_bind(x), RUDA_DTYPE_I8, RUDA_REDUCE_SUM));
  assert_ok(ruda_comm_sync(comm, dev, NULL));
  test_read(dev, 0, ruda_bind(x), out, sizeof out);
  assert_memory_equal(in, out, sizeof in);
  assert_ok(ruda_comm_destroy(comm));
  assert_ok(ruda_buffer_free(dev, 0, x));
  test_close(dev);
}

/* Rank 0 of 2 whose peer never comes: the join times out after
 * RUDA_COMM_TIMEOUT (NCCL non-blocking, then aborted) instead of hanging. */
static void a_rank_that_never_joins_times_out(void **state) {
  (void)state;
  ruda_device *dev = open_nccl_gpu();
  ruda_comm_id id;
  unique_id_or_skip(dev, &id);
  setenv("RUDA_COMM_TIMEOUT", "1500", 1);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ruda_comm *comm = (ruda_comm *)dev;
  int rc = ruda_comm_init_rank(dev, 2, 0, &id, NULL, &comm);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  unsetenv("RUDA_COMM_TIMEOUT");
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  assert_null(comm);
  if (rc != RUDA_ETIMEDOUT)
    fail_msg("expected RUDA_ETIMEDOUT, got %s: %s", ruda_err_name(rc), ruda_error_message(ruda_last_error()));
  assert_last_error_contains("did not join within 1500 ms");
  assert_true(s >= 1.4 && s < 30.0);
  test_close(dev); /* nothing left open: the device closes */
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_gpus),
      cmocka_unit_test(one_rank_by_unique_id),
      cmocka_unit_test(one_rank_from_the_environment),
      cmocka_unit_test(a_rank_that_never_joins_times_out),
  };
  return gpu_main("gpu_comm", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* comm_rank.c - ruda_comm_init_rank on the host backend with a transport
 * of the test's own: the arguments are checked, the transport is called
 * on the worker in the order the rank issued its collectives, its failures
 * come back on the rank's collective stream with its message, and it is
 * released with the communicator. (tests/mpi/ runs the MPI transport
 * across processes.) */
#include <pthread.h>

#include "common.h"

typedef struct loop {
  int calls, released, fail;
  uint64_t last_count;
  ruda_dtype last_type;
  pthread_t caller;
} loop;

/* One rank: an all-reduce of one rank's data is the data. */
static int lo_all_reduce(void *ctx, const void *src, void *dst, uint64_t count, ruda_dtype t, ruda_reduce_op op,
                         char *why, size_t n) {
  loop *l = ctx;
  (void)op;
  l->calls++;
  l->last_count = count;
  l->caller = pthread_self();
  if (l->fail) {
    snprintf(why, n, "the test's transport refused");
    return RUDA_EGENERIC;
  }
  l->last_type = t;
  memmove(dst, src, count * ruda_dtype_size(t));
  return 0;
}

static int lo_send(void *ctx, const void *src, uint64_t bytes, uint32_t peer, char *why, size_t n) {
  (void)ctx, (void)src, (void)bytes, (void)peer, (void)why, (void)n;
  return RUDA_EINVAL;
}

static int lo_recv(void *ctx, void *dst, uint64_t bytes, uint32_t peer, char *why, size_t n) {
  (void)ctx, (void)dst, (void)bytes, (void)peer, (void)why, (void)n;
  return RUDA_EINVAL;
}

static void lo_release(void *ctx) { ((loop *)ctx)->released++; }

static void init_rank_with_a_transport(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  loop l = {0};
  const ruda_comm_transport t = {&l, lo_all_reduce, lo_send, lo_recv, lo_release};
  const ruda_comm_transport half = {&l, lo_all_reduce, NULL, lo_recv, lo_release};
  ruda_comm *c = (ruda_comm *)&l;
  ruda_comm_id id;
  assert_ok(ruda_comm_unique_id(dev, &id)); /* host: not needed, zeroed */
  assert_rc(ruda_comm_init_rank(dev, 1, 0, NULL, NULL, &c), RUDA_ENOBACKEND);
  assert_null(c);
  assert_last_error_contains("transport");
  assert_rc(ruda_comm_init_rank(dev, 2, 2, NULL, &t, &c), RUDA_EINVAL);
  assert_rc(ruda_comm_init_rank(dev, 1, 0, NULL, &half, &c), RUDA_EINVAL);
  assert_rc(ruda_comm_init_rank(NULL, 1, 0, NULL, &t, &c), RUDA_EINVAL);
  assert_ok(ruda_comm_init_rank(dev, 1, 0, &id, &t, &c));
  assert_int_equal(ruda_comm_size(c), 1);
  assert_int_equal(ruda_comm_rank(c, dev), 0);

  float in[16], out[16];
  for (int i = 0; i < 16; i++) in[i] = (float)i * 0.5f;
  ruda_handle x, y;
  assert_ok(ruda_buffer_create(dev, 0, sizeof in, &x));
  assert_ok(ruda_buffer_create(dev, 0, sizeof out, &y));
  test_write(dev, 0, ruda_bind(x), in, sizeof in);
  assert_ok(ruda_all_reduce(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  assert_ok(ruda_comm_sync(c, dev, NULL));
  assert_int_equal(l.calls, 1);
  assert_int_equal(l.last_count, 16);
  assert_false(pthread_equal(l.caller, pthread_self())); /* on the worker */
  test_read(dev, 0, ruda_bind(y), out, sizeof out);
  assert_memory_equal(in, out, sizeof in);
  /* The newer collectives go through the transport's all-reduce: a check
   * that the ranks agree, then reduce and reduce-scatter in their type,
   * broadcast and all-gather as bytes. */
  const struct {
    int kind;
    ruda_dtype sent;
    uint64_t count;
  } via[4] = {{0, RUDA_DTYPE_F32, 16}, {1, RUDA_DTYPE_U8, sizeof in}, {2, RUDA_DTYPE_U8, sizeof in},
              {3, RUDA_DTYPE_F32, 16}};
  for (int v = 0; v < 4; v++) {
    memset(out, 0, sizeof out);
    test_write(dev, 0, ruda_bind(y), out, sizeof out);
    int calls = l.calls;
    if (via[v].kind == 0) assert_ok(ruda_reduce(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, RUDA_REDUCE_MAX, 0));
    if (via[v].kind == 1) assert_ok(ruda_broadcast(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, 0));
    if (via[v].kind == 2) assert_ok(ruda_all_gather(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32));
    if (via[v].kind == 3)
      assert_ok(ruda_reduce_scatter(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
    assert_ok(ruda_comm_sync(c, dev, NULL));
    assert_int_equal(l.calls, calls + 2); /* the agreement check, then the data */
    assert_int_equal(l.last_type, via[v].sent);
    assert_int_equal(l.last_count, via[v].count);
    test_read(dev, 0, ruda_bind(y), out, sizeof out);
    assert_memory_equal(in, out, sizeof in);
  }
  /* Sends to oneself are refused at the call; the transport is not asked. */
  assert_rc(ruda_send(c, dev, ruda_bind(x), 0), RUDA_EINVAL);
  /* A transport failure comes back on the rank's stream with its words. */
  l.fail = 1;
  assert_ok(ruda_all_reduce(c, dev, ruda_bind(x), ruda_bind(y), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  ruda_error *errs = NULL;
  assert_rc(ruda_comm_sync(c, dev, &errs), RUDA_EUNHEALTHY);
  const ruda_error *e = ruda_error_cause(errs);
  assert_non_null(e);
  assert_int_equal(ruda_error_code(e), RUDA_EGENERIC);
  assert_contains(ruda_error_message(e), "the test's transport refused");
  ruda_error_free(errs);
  /* Closing under a live communicator is refused; destroy releases it. */
  assert_rc(ruda_device_close(dev, NULL), RUDA_EBUSY);
  assert_int_equal(l.released, 0);
  assert_ok(ruda_comm_destroy(c));
  assert_int_equal(l.released, 1);
  assert_ok(ruda_buffer_free(dev, 0, x));
  assert_ok(ruda_buffer_free(dev, 0, y));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(init_rank_with_a_transport),
  };
  return test_main("integration_comm_rank", tests, sizeof tests / sizeof tests[0], argc, argv);
}

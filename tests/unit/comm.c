/* comm.c - collectives on the host backend: all-reduce of every type and
 * reduction across 1..4 devices, in place too; reduce, broadcast,
 * all-gather and reduce-scatter against the CPU; ordered after the kernels
 * that wrote the sources; send and recv; every bad input; ranks that
 * disagree, a recv too small; destroy waits for what is queued. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common.h"
#include "base/half.h"

#define N 64


/* fill(x, v): x[i] = v + i as f64, for the ordering test. */
static int k_fill(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  double *x = args[0], v = *(const double *)args[1];
  for (int i = 0; i < N; i++) x[i] = v + i;
  return 0;
}

typedef struct ranks {
  uint32_t n;
  ruda_device *dev[4];
  ruda_comm *comm;
} ranks;

static void open_ranks(ranks *r, uint32_t n) {
  r->n = n;
  for (uint32_t i = 0; i < n; i++) {
    r->dev[i] = test_open(2, 4096, RUDA_BACKPRESSURE_BLOCK);
    assert_ok(ruda_host_kernel_register(r->dev[i], "gate", test_gate_kernel));
    assert_ok(ruda_host_kernel_register(r->dev[i], "fill", k_fill));
  }
  atomic_store(&test_gate_open, 1);
  atomic_store(&test_gate_entered, 0);
  assert_ok(ruda_comm_init(r->dev, n, &r->comm));
  assert_int_equal(ruda_comm_size(r->comm), n);
  for (uint32_t i = 0; i < n; i++) assert_int_equal(ruda_comm_rank(r->comm, r->dev[i]), (int)i);
}

static void close_ranks(ranks *r) {
  assert_ok(ruda_comm_destroy(r->comm));
  for (uint32_t i = 0; i < r->n; i++) test_close(r->dev[i]);
}

static const size_t esize[] = {4, 8, 4, 8, 2, 2, 1, 1};

static int is_int(ruda_dtype t) {
  return t == RUDA_DTYPE_I32 || t == RUDA_DTYPE_I64 || t == RUDA_DTYPE_I8 || t == RUDA_DTYPE_U8;
}

/* Inputs every type holds exactly, whose sums over 4 ranks stay exact
 * (bf16 keeps 8 significant bits: small integers); i8 and u8 sums wrap.
 * A source longer than N (reduce-scatter's) adds its block number. */
static double value(ruda_dtype t, uint32_t rank, int i) {
  const double block = (double)(i / N);
  i %= N;
  if (t == RUDA_DTYPE_BF16) return (double)(rank + 1) * 2.0 + (double)(i % 8) + block;
  double v = (double)(rank + 1) * 10.0 + (double)i + block;
  return is_int(t) ? v : v + 0.25;
}

static void put(void *p, ruda_dtype t, int i, double v) {
  switch (t) {
    case RUDA_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case RUDA_DTYPE_F64: ((double *)p)[i] = v; break;
    case RUDA_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case RUDA_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case RUDA_DTYPE_F16: ((uint16_t *)p)[i] = ruda__f32_to_f16((float)v); break;
    case RUDA_DTYPE_BF16: ((uint16_t *)p)[i] = ruda__f32_to_bf16((float)v); break;
    case RUDA_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

static double get(const void *p, ruda_dtype t, int i) {
  switch (t) {
    case RUDA_DTYPE_F32: return ((const float *)p)[i];
    case RUDA_DTYPE_F64: return ((const double *)p)[i];
    case RUDA_DTYPE_I32: return ((const int32_t *)p)[i];
    case RUDA_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case RUDA_DTYPE_F16: return ruda__f16_to_f32(((const uint16_t *)p)[i]);
    case RUDA_DTYPE_BF16: return ruda__bf16_to_f32(((const uint16_t *)p)[i]);
    case RUDA_DTYPE_I8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

/* v as type t stores it: rounded (floats) or wrapped (i8, u8). */
static double as_type(ruda_dtype t, double v) {
  unsigned char b[8];
  put(b, t, 0, v);
  return get(b, t, 0);
}

/* The reduction over ranks of value(), as the type computes it. */
static double expect(ruda_dtype t, ruda_reduce_op op, uint32_t n, int i) {
  double acc = value(t, 0, i);
  for (uint32_t r = 1; r < n; r++) {
    double v = value(t, r, i);
    if (op == RUDA_REDUCE_MIN) acc = v < acc ? v : acc;
    else if (op == RUDA_REDUCE_MAX) acc = v > acc ? v : acc;
    else acc += v;
  }
  /* Integer sums wrap: i8 and u8 through their type, i32/i64 never
   * reach it here. */
  if (t == RUDA_DTYPE_I8) acc = (double)(int8_t)(uint8_t)(int64_t)acc;
  if (t == RUDA_DTYPE_U8) acc = (double)(uint8_t)(int64_t)acc;
  if (op == RUDA_REDUCE_MEAN) {
    if (is_int(t)) return (double)((int64_t)acc / (int64_t)n);
    return as_type(t, acc / n);
  }
  return as_type(t, acc);
}

static void every_type_and_reduction(void **state) {
  (void)state;
  for (uint32_t n = 1; n <= 4; n++) {
    ranks r;
    open_ranks(&r, n);
    for (int t = RUDA_DTYPE_F32; t <= RUDA_DTYPE_U8; t++)
      for (int op = RUDA_REDUCE_SUM; op <= RUDA_REDUCE_MAX; op++) {
        const size_t bytes = N * esize[t];
        ruda_handle src[4], dst[4];
        unsigned char buf[N * 8];
        for (uint32_t k = 0; k < n; k++) {
          for (int i = 0; i < N; i++) put(buf, (ruda_dtype)t, i, value((ruda_dtype)t, k, i));
          assert_ok(ruda_buffer_create(r.dev[k], 0, bytes, &src[k]));
          test_write(r.dev[k], 0, ruda_bind(src[k]), buf, bytes);
          /* Odd ranks reduce in place. */
          if (k % 2) dst[k] = src[k];
          else assert_ok(ruda_buffer_create(r.dev[k], 0, bytes, &dst[k]));
          assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(src[k]), ruda_bind(dst[k]), (ruda_dtype)t,
                                    (ruda_reduce_op)op));
        }
        for (uint32_t k = 0; k < n; k++) {
          test_read(r.dev[k], 1, ruda_bind(dst[k]), buf, bytes);
          for (int i = 0; i < N; i++) {
            double want = expect((ruda_dtype)t, (ruda_reduce_op)op, n, i), got = get(buf, (ruda_dtype)t, i);
            if (got != want)
              fail_msg("n %u type %d op %d rank %u element %d: %g, expected %g", n, t, op, k, i, got, want);
          }
          if (k % 2 == 0) assert_ok(ruda_buffer_free(r.dev[k], 0, dst[k]));
          assert_ok(ruda_buffer_free(r.dev[k], 0, src[k]));
        }
      }
    close_ranks(&r);
  }
}

/* Sources written by kernels held behind a gate on user streams: the
 * all-reduce waits for them, and reads on a third stream wait for it. */
/* Reduce (to the last rank), broadcast (from rank 1 % n), all-gather and
 * reduce-scatter across 1..4 ranks, in several types, against the CPU;
 * a reduce leaves the other ranks' dst alone. */
static void rooted_and_gathering_collectives(void **state) {
  (void)state;
  static const ruda_dtype types[] = {RUDA_DTYPE_F32, RUDA_DTYPE_F64, RUDA_DTYPE_I64,
                                     RUDA_DTYPE_F16, RUDA_DTYPE_BF16, RUDA_DTYPE_I8, RUDA_DTYPE_U8};
  for (uint32_t n = 1; n <= 4; n++) {
    ranks r;
    open_ranks(&r, n);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
      const ruda_dtype t = types[ti];
      const size_t es = esize[t], part = N * es;
      const uint32_t root = n - 1, from = 1 % n;
      ruda_handle src[4], all[4], dst[4];
      unsigned char buf[4 * N * 8];
      for (uint32_t k = 0; k < n; k++) {
        /* src: N elements; all: n * N elements; dst: room for n * N. */
        for (int i = 0; i < (int)(n * N); i++) put(buf, t, i, value(t, k, i));
        assert_ok(ruda_buffer_create(r.dev[k], 0, part, &src[k]));
        assert_ok(ruda_buffer_create(r.dev[k], 0, part * n, &all[k]));
        assert_ok(ruda_buffer_create(r.dev[k], 0, part * n, &dst[k]));
        test_write(r.dev[k], 0, ruda_bind(src[k]), buf, part);
        test_write(r.dev[k], 0, ruda_bind(all[k]), buf, part * n);
      }
      /* Reduce: sentinel in every dst, only the root's changes. */
      for (uint32_t k = 0; k < n; k++) {
        memset(buf, 0x5a, part);
        test_write(r.dev[k], 0, ruda_bind_range(dst[k], 0, part), buf, part);
        assert_ok(ruda_reduce(r.comm, r.dev[k], ruda_bind(src[k]), ruda_bind_range(dst[k], 0, part), t,
                              RUDA_REDUCE_SUM, root));
      }
      for (uint32_t k = 0; k < n; k++) {
        test_read(r.dev[k], 1, ruda_bind_range(dst[k], 0, part), buf, part);
        for (int i = 0; i < N; i++) {
          if (k != root) {
            if (buf[i * es] != 0x5a) fail_msg("reduce type %d: rank %u (not root) was written", t, k);
            continue;
          }
          double want = expect(t, RUDA_REDUCE_SUM, n, i), got = get(buf, t, i);
          if (got != want) fail_msg("reduce n %u type %d element %d: %g, expected %g", n, t, i, got, want);
        }
      }
      /* Broadcast from rank `from`. */
      for (uint32_t k = 0; k < n; k++)
        assert_ok(ruda_broadcast(r.comm, r.dev[k], ruda_bind(src[k]), ruda_bind_range(dst[k], 0, part), t, from));
      for (uint32_t k = 0; k < n; k++) {
        test_read(r.dev[k], 1, ruda_bind_range(dst[k], 0, part), buf, part);
        for (int i = 0; i < N; i++)
          if (get(buf, t, i) != as_type(t, value(t, from, i)))
            fail_msg("broadcast n %u type %d rank %u element %d: %g", n, t, k, i, get(buf, t, i));
      }
      /* All-gather: rank j's source at j * N. */
      for (uint32_t k = 0; k < n; k++)
        assert_ok(ruda_all_gather(r.comm, r.dev[k], ruda_bind(src[k]), ruda_bind(dst[k]), t));
      for (uint32_t k = 0; k < n; k++) {
        test_read(r.dev[k], 1, ruda_bind(dst[k]), buf, part * n);
        for (uint32_t j = 0; j < n; j++)
          for (int i = 0; i < N; i++)
            if (get(buf, t, (int)j * N + i) != as_type(t, value(t, j, i)))
              fail_msg("all-gather n %u type %d rank %u part %u element %d", n, t, k, j, i);
      }
      /* Reduce-scatter of n * N elements: rank k keeps part k. */
      for (uint32_t k = 0; k < n; k++)
        assert_ok(ruda_reduce_scatter(r.comm, r.dev[k], ruda_bind(all[k]), ruda_bind_range(dst[k], 0, part), t,
                                      RUDA_REDUCE_MAX));
      for (uint32_t k = 0; k < n; k++) {
        test_read(r.dev[k], 1, ruda_bind_range(dst[k], 0, part), buf, part);
        for (int i = 0; i < N; i++) {
          double want = expect(t, RUDA_REDUCE_MAX, n, (int)k * N + i), got = get(buf, t, i);
          if (got != want) fail_msg("reduce-scatter n %u type %d rank %u element %d: %g, expected %g", n, t, k, i, got, want);
        }
      }
      for (uint32_t k = 0; k < n; k++) {
        assert_ok(ruda_comm_sync(r.comm, r.dev[k], NULL));
        assert_ok(ruda_buffer_free(r.dev[k], 0, src[k]));
        assert_ok(ruda_buffer_free(r.dev[k], 0, all[k]));
        assert_ok(ruda_buffer_free(r.dev[k], 0, dst[k]));
      }
    }
    close_ranks(&r);
  }
}

/* Bad sizes and roots of the newer collectives are refused at the call;
 * ranks that bring different collectives to one round all fail it, with
 * what each brought. */
static void newer_collectives_refuse_and_disagree(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle x, y, big;
  assert_ok(ruda_buffer_create(r.dev[0], 0, 64, &x));
  assert_ok(ruda_buffer_create(r.dev[0], 0, 60, &y));
  assert_ok(ruda_buffer_create(r.dev[1], 0, 128, &big));
  assert_rc(ruda_reduce(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32, RUDA_REDUCE_SUM, 2), RUDA_EINVAL);
  assert_last_error_contains("root 2 is no rank");
  assert_rc(ruda_broadcast(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32, 7), RUDA_EINVAL);
  assert_rc(ruda_all_gather(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32), RUDA_EINVAL);
  assert_last_error_contains("dst holds 64 bytes, 128 needed");
  /* 60 bytes of f16: 30 elements, not a multiple of... 2 ranks is fine;
   * 15 f32 elements are not. */
  assert_rc(ruda_reduce_scatter(r.comm, r.dev[0], ruda_bind(y), ruda_bind(x), RUDA_DTYPE_F32, RUDA_REDUCE_SUM),
            RUDA_EINVAL);
  assert_last_error_contains("not a multiple of the 2 ranks");
  assert_rc(ruda_all_gather(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), (ruda_dtype)8), RUDA_EINVAL);
  assert_int_equal(ruda_dtype_size(RUDA_DTYPE_BF16), 2);
  assert_int_equal(ruda_dtype_size((ruda_dtype)8), 0);
  /* Rank 0 broadcasts, rank 1 all-gathers: both fail, naming both. */
  assert_ok(ruda_broadcast(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_I8, 0));
  assert_ok(ruda_all_gather(r.comm, r.dev[1], ruda_bind_range(big, 0, 64), ruda_bind(big), RUDA_DTYPE_I8));
  for (uint32_t k = 0; k < 2; k++) {
    ruda_error *errs = NULL;
    assert_rc(ruda_comm_sync(r.comm, r.dev[k], &errs), RUDA_EUNHEALTHY);
    const ruda_error *e = ruda_error_cause(errs);
    assert_non_null(e);
    assert_int_equal(ruda_error_code(e), RUDA_EINVAL);
    assert_contains(ruda_error_message(e), "ranks disagree (rank 0: broadcast 64 x i8 to root 0, rank 1: all-gather 64 x i8)");
    ruda_error_free(errs);
  }
  /* The communicator goes on working. */
  for (uint32_t k = 0; k < 2; k++) {
    ruda_handle h = k ? big : x;
    assert_ok(ruda_broadcast(r.comm, r.dev[k], ruda_bind_range(h, 0, 64), ruda_bind_range(h, 0, 64), RUDA_DTYPE_U8, 1));
  }
  for (uint32_t k = 0; k < 2; k++) assert_ok(ruda_comm_sync(r.comm, r.dev[k], NULL));
  assert_ok(ruda_buffer_free(r.dev[0], 0, x));
  assert_ok(ruda_buffer_free(r.dev[0], 0, y));
  assert_ok(ruda_buffer_free(r.dev[1], 0, big));
  close_ranks(&r);
}

static void ordered_after_the_writers(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle x[2];
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  for (uint32_t k = 0; k < 2; k++) {
    assert_ok(ruda_buffer_create(r.dev[k], 7, N * sizeof(double), &x[k]));
    double v = 1000.0 * (k + 1);
    ruda_arg a[2] = {ruda_arg_buffer(ruda_bind(x[k])), ruda_arg_scalar(&v, sizeof v)};
    assert_ok(test_launch(r.dev[k], 7, "gate", NULL, 0));
    assert_ok(test_launch(r.dev[k], 7, "fill", a, 2));
    assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(x[k]), ruda_bind(x[k]), RUDA_DTYPE_F64, RUDA_REDUCE_SUM));
  }
  test_wait_count(&test_gate_entered, 2); /* both ranks held before their fills */
  atomic_store(&test_gate_open, 1);
  for (uint32_t k = 0; k < 2; k++) {
    double got[N];
    test_read(r.dev[k], 3, ruda_bind(x[k]), got, sizeof got);
    for (int i = 0; i < N; i++) assert_true(got[i] == 3000.0 + 2 * i);
    assert_ok(ruda_buffer_free(r.dev[k], 7, x[k]));
  }
  close_ranks(&r);
}

static void send_and_recv(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 3);
  ruda_handle a, b, c;
  uint32_t out[N], in[N];
  for (int i = 0; i < N; i++) out[i] = 0xab000000u + (uint32_t)i;
  assert_ok(ruda_buffer_create(r.dev[0], 0, sizeof out, &a));
  assert_ok(ruda_buffer_create(r.dev[2], 0, 2 * sizeof in, &b)); /* room to spare */
  assert_ok(ruda_buffer_create(r.dev[1], 0, sizeof in, &c));
  test_write(r.dev[0], 0, ruda_bind(a), out, sizeof out);
  /* 0 -> 2, then 2 -> 1 with what it got (receive first, then send). */
  assert_ok(ruda_send(r.comm, r.dev[0], ruda_bind(a), 2));
  assert_ok(ruda_recv(r.comm, r.dev[2], ruda_bind_range(b, 0, sizeof in), 0));
  assert_ok(ruda_send(r.comm, r.dev[2], ruda_bind_range(b, 0, sizeof in), 1));
  assert_ok(ruda_recv(r.comm, r.dev[1], ruda_bind(c), 2));
  for (uint32_t k = 0; k < 3; k++) assert_ok(ruda_comm_sync(r.comm, r.dev[k], NULL));
  test_read(r.dev[1], 0, ruda_bind(c), in, sizeof in);
  assert_memory_equal(in, out, sizeof out);
  assert_ok(ruda_buffer_free(r.dev[0], 0, a));
  assert_ok(ruda_buffer_free(r.dev[2], 0, b));
  assert_ok(ruda_buffer_free(r.dev[1], 0, c));
  close_ranks(&r);
}

static void bad_inputs(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_device *other = test_open(1, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle x, small, odd;
  assert_ok(ruda_buffer_create(r.dev[0], 0, 64, &x));
  assert_ok(ruda_buffer_create(r.dev[0], 0, 32, &small));
  assert_ok(ruda_buffer_create(r.dev[0], 0, 30, &odd));
  ruda_comm *c = NULL;
  ruda_device *dup[2] = {r.dev[0], r.dev[0]};
  assert_rc(ruda_comm_init(dup, 2, &c), RUDA_EINVAL);
  assert_null(c);
  assert_rc(ruda_comm_init(r.dev, 0, &c), RUDA_EINVAL);
  assert_rc(ruda_comm_init(NULL, 2, &c), RUDA_EINVAL);
  assert_rc(ruda_comm_init(r.dev, 2, NULL), RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, other, ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32, RUDA_REDUCE_SUM), RUDA_EINVAL);
  assert_last_error_contains("not a rank");
  assert_rc(ruda_all_reduce(NULL, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32, RUDA_REDUCE_SUM), RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), (ruda_dtype)9, RUDA_REDUCE_SUM), RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(x), ruda_bind(x), RUDA_DTYPE_F32, (ruda_reduce_op)9), RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(x), ruda_bind(small), RUDA_DTYPE_F32, RUDA_REDUCE_SUM),
            RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(odd), ruda_bind(x), RUDA_DTYPE_F64, RUDA_REDUCE_SUM),
            RUDA_EINVAL);
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind_range(x, 60, 8), ruda_bind(x), RUDA_DTYPE_F32,
                            RUDA_REDUCE_SUM), RUDA_ERANGE);
  /* Elements are loaded as their type: a binding off their alignment is
   * refused, not read misaligned. */
  assert_rc(ruda_all_reduce(r.comm, r.dev[0], ruda_bind_range(x, 2, 8), ruda_bind(x), RUDA_DTYPE_F32,
                            RUDA_REDUCE_SUM), RUDA_EINVAL);
  assert_last_error_contains("not a multiple of the 4-byte element");
  ruda_handle stale = x;
  stale.gen++;
  assert_rc(ruda_send(r.comm, r.dev[0], ruda_bind(stale), 1), RUDA_ENOTFOUND);
  assert_rc(ruda_send(r.comm, r.dev[0], ruda_bind(x), 0), RUDA_EINVAL);
  assert_rc(ruda_recv(r.comm, r.dev[0], ruda_bind(x), 5), RUDA_EINVAL);
  assert_int_equal(ruda_comm_rank(r.comm, other), -1);
  assert_rc(ruda_comm_destroy(NULL), RUDA_EINVAL);
  /* Nothing was queued: every buffer is free to go. */
  assert_ok(ruda_buffer_free(r.dev[0], 0, x));
  assert_ok(ruda_buffer_free(r.dev[0], 0, small));
  assert_ok(ruda_buffer_free(r.dev[0], 0, odd));
  test_close(other);
  close_ranks(&r);
}

/* Ranks that disagree on the element count both fail the round, and a
 * recv with too little room fails on the receiver; the failures come back
 * from ruda_comm_sync, and the communicator goes on working. */
static void failures_reach_the_ranks(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle a, b, tiny;
  assert_ok(ruda_buffer_create(r.dev[0], 0, 64, &a));
  assert_ok(ruda_buffer_create(r.dev[1], 0, 32, &b));
  assert_ok(ruda_buffer_create(r.dev[1], 0, 16, &tiny));
  assert_ok(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(a), ruda_bind(a), RUDA_DTYPE_I32, RUDA_REDUCE_SUM));
  assert_ok(ruda_all_reduce(r.comm, r.dev[1], ruda_bind(b), ruda_bind(b), RUDA_DTYPE_I32, RUDA_REDUCE_SUM));
  for (uint32_t k = 0; k < 2; k++) {
    ruda_error *errs = NULL;
    assert_rc(ruda_comm_sync(r.comm, r.dev[k], &errs), RUDA_EUNHEALTHY);
    assert_non_null(ruda_error_cause(errs));
    assert_int_equal(ruda_error_code(ruda_error_cause(errs)), RUDA_EINVAL);
    assert_contains(ruda_error_message(ruda_error_cause(errs)), "ranks disagree");
    assert_contains(ruda_error_message(ruda_error_cause(errs)), "ruda_collective");
    ruda_error_free(errs);
  }
  assert_ok(ruda_send(r.comm, r.dev[0], ruda_bind(a), 1));
  assert_ok(ruda_recv(r.comm, r.dev[1], ruda_bind(tiny), 0));
  assert_ok(ruda_comm_sync(r.comm, r.dev[0], NULL));
  ruda_error *errs = NULL;
  assert_rc(ruda_comm_sync(r.comm, r.dev[1], &errs), RUDA_EUNHEALTHY);
  assert_int_equal(ruda_error_code(ruda_error_cause(errs)), RUDA_ERANGE);
  ruda_error_free(errs);
  /* Still usable. */
  assert_ok(ruda_all_reduce(r.comm, r.dev[0], ruda_bind_range(a, 0, 32), ruda_bind_range(a, 0, 32), RUDA_DTYPE_I32,
                            RUDA_REDUCE_MAX));
  assert_ok(ruda_all_reduce(r.comm, r.dev[1], ruda_bind(b), ruda_bind(b), RUDA_DTYPE_I32, RUDA_REDUCE_MAX));
  for (uint32_t k = 0; k < 2; k++) assert_ok(ruda_comm_sync(r.comm, r.dev[k], NULL));
  assert_ok(ruda_buffer_free(r.dev[0], 0, a));
  assert_ok(ruda_buffer_free(r.dev[1], 0, b));
  assert_ok(ruda_buffer_free(r.dev[1], 0, tiny));
  close_ranks(&r);
}

/* Destroy waits for queued rounds: rank 1's sources are behind a gate. */
static void destroy_waits_for_queued_rounds(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle x[2];
  for (uint32_t k = 0; k < 2; k++) assert_ok(ruda_buffer_create(r.dev[k], 0, 256, &x[k]));
  atomic_store(&test_gate_open, 0);
  atomic_store(&test_gate_entered, 0);
  assert_ok(test_launch(r.dev[1], 0, "gate", NULL, 0));
  ruda_arg a = ruda_arg_buffer(ruda_bind(x[1]));
  double v = 1;
  ruda_arg fa[2] = {a, ruda_arg_scalar(&v, sizeof v)};
  assert_ok(test_launch(r.dev[1], 0, "fill", fa, 2));
  for (int round = 0; round < 5; round++)
    for (uint32_t k = 0; k < 2; k++)
      assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(x[k]), ruda_bind(x[k]), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  test_wait_count(&test_gate_entered, 1); /* rank 1 held before its fill */
  atomic_store(&test_gate_open, 1);
  assert_ok(ruda_comm_destroy(r.comm));
  for (uint32_t k = 0; k < 2; k++) {
    assert_ok(ruda_buffer_free(r.dev[k], 0, x[k]));
    test_close(r.dev[k]);
  }
}

/* Integer sums wrap around, as on the GPU (NCCL's two's complement), and
 * are not undefined behaviour on the host: UBSan stops the sanitizer
 * build at a signed overflow. */
static void integer_sums_wrap(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle a[2], b[2];
  const int32_t a_in[2] = {INT32_MAX, INT32_MIN};
  const int64_t b_in[2] = {INT64_MAX, INT64_MIN};
  for (uint32_t k = 0; k < 2; k++) {
    assert_ok(ruda_buffer_create(r.dev[k], 0, sizeof a_in, &a[k]));
    assert_ok(ruda_buffer_create(r.dev[k], 0, sizeof b_in, &b[k]));
    test_write(r.dev[k], 0, ruda_bind(a[k]), a_in, sizeof a_in);
    test_write(r.dev[k], 0, ruda_bind(b[k]), b_in, sizeof b_in);
    assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(a[k]), ruda_bind(a[k]), RUDA_DTYPE_I32, RUDA_REDUCE_SUM));
    assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(b[k]), ruda_bind(b[k]), RUDA_DTYPE_I64, RUDA_REDUCE_MEAN));
  }
  for (uint32_t k = 0; k < 2; k++) {
    int32_t ga[2];
    int64_t gb[2];
    test_read(r.dev[k], 0, ruda_bind(a[k]), ga, sizeof ga);
    test_read(r.dev[k], 0, ruda_bind(b[k]), gb, sizeof gb);
    assert_int_equal(ga[0], -2); /* 2 * INT32_MAX mod 2^32 */
    assert_int_equal(ga[1], 0);
    assert_int_equal(gb[0], -1); /* (2 * INT64_MAX mod 2^64) / 2 */
    assert_int_equal(gb[1], 0);
    assert_ok(ruda_buffer_free(r.dev[k], 0, a[k]));
    assert_ok(ruda_buffer_free(r.dev[k], 0, b[k]));
  }
  close_ranks(&r);
}

/* The error of a collective that failed on rank r's collective stream. */
static const ruda_error *rank_error(ranks *r, uint32_t k, ruda_error **owned) {
  *owned = NULL;
  assert_int_equal(ruda_comm_sync(r->comm, r->dev[k], owned), RUDA_EUNHEALTHY);
  const ruda_error *cause = ruda_error_cause(*owned);
  assert_non_null(cause);
  return cause;
}

/* A rank that never joins does not hang its peers: after RUDA_COMM_TIMEOUT
 * the waiting rank's collective fails naming who did not arrive, the
 * communicator is broken for later collectives, destroy still works. */
static void absent_rank_times_out(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "200", 1);
  ranks r;
  open_ranks(&r, 3);
  unsetenv("RUDA_COMM_TIMEOUT");
  ruda_handle x[3];
  for (uint32_t k = 0; k < 3; k++) assert_ok(ruda_buffer_create(r.dev[k], 0, 64, &x[k]));
  /* Ranks 0 and 1 join, rank 2 never does. */
  for (uint32_t k = 0; k < 2; k++)
    assert_ok(ruda_all_reduce(r.comm, r.dev[k], ruda_bind(x[k]), ruda_bind(x[k]), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  ruda_error *owned;
  const ruda_error *cause = rank_error(&r, 0, &owned);
  assert_int_equal(ruda_error_code(cause), RUDA_ETIMEDOUT);
  assert_contains(ruda_error_message(cause), "all-reduce #1 timed out after 200 ms");
  assert_contains(ruda_error_message(cause), "rank 2 did not arrive");
  ruda_error_free(owned);
  cause = rank_error(&r, 1, &owned);
  assert_int_equal(ruda_error_code(cause), RUDA_ETIMEDOUT);
  ruda_error_free(owned);
  /* Broken for good: the next round fails at once, on every rank. */
  assert_ok(ruda_all_reduce(r.comm, r.dev[2], ruda_bind(x[2]), ruda_bind(x[2]), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  cause = rank_error(&r, 2, &owned);
  assert_contains(ruda_error_message(cause), "the communicator is broken");
  ruda_error_free(owned);
  /* A recv whose sender never sends times out as well, naming it. */
  for (uint32_t k = 0; k < 3; k++) assert_ok(ruda_buffer_free(r.dev[k], 0, x[k]));
  close_ranks(&r);
}

static void recv_without_send_times_out(void **state) {
  (void)state;
  setenv("RUDA_COMM_TIMEOUT", "100", 1);
  ranks r;
  open_ranks(&r, 2);
  unsetenv("RUDA_COMM_TIMEOUT");
  ruda_handle x;
  assert_ok(ruda_buffer_create(r.dev[1], 0, 64, &x));
  assert_ok(ruda_recv(r.comm, r.dev[1], ruda_bind(x), 0));
  ruda_error *owned;
  const ruda_error *cause = rank_error(&r, 1, &owned);
  assert_int_equal(ruda_error_code(cause), RUDA_ETIMEDOUT);
  assert_contains(ruda_error_message(cause), "recv on rank 1 from rank 0 timed out after 100 ms: rank 0 did not send");
  ruda_error_free(owned);
  assert_ok(ruda_buffer_free(r.dev[1], 0, x));
  close_ranks(&r);
}

/* Ranks that disagree are told what each brought. */
static void mismatch_names_the_values(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  ruda_handle a, b;
  assert_ok(ruda_buffer_create(r.dev[0], 0, 1024, &a));
  assert_ok(ruda_buffer_create(r.dev[1], 0, 512, &b));
  assert_ok(ruda_all_reduce(r.comm, r.dev[0], ruda_bind(a), ruda_bind(a), RUDA_DTYPE_F32, RUDA_REDUCE_SUM));
  assert_ok(ruda_all_reduce(r.comm, r.dev[1], ruda_bind(b), ruda_bind(b), RUDA_DTYPE_F64, RUDA_REDUCE_MAX));
  ruda_error *owned;
  const ruda_error *cause = rank_error(&r, 0, &owned);
  assert_int_equal(ruda_error_code(cause), RUDA_EINVAL);
  assert_contains(ruda_error_message(cause), "rank 0: 256 x f32 sum, rank 1: 64 x f64 max");
  ruda_error_free(owned);
  cause = rank_error(&r, 1, &owned);
  ruda_error_free(owned);
  assert_ok(ruda_buffer_free(r.dev[0], 0, a));
  assert_ok(ruda_buffer_free(r.dev[1], 0, b));
  close_ranks(&r);
}

/* A device that is a rank of a live communicator is not closed. */
static void close_is_refused_while_a_rank(void **state) {
  (void)state;
  ranks r;
  open_ranks(&r, 2);
  assert_rc(ruda_device_close(r.dev[0], NULL), RUDA_EBUSY);
  assert_last_error_contains("ruda_comm_destroy it first");
  ruda_handle x; /* still open and working */
  assert_ok(ruda_buffer_create(r.dev[0], 0, 64, &x));
  assert_ok(ruda_buffer_free(r.dev[0], 0, x));
  close_ranks(&r); /* destroy, then close succeeds */
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_type_and_reduction),
      cmocka_unit_test(rooted_and_gathering_collectives),
      cmocka_unit_test(newer_collectives_refuse_and_disagree),
      cmocka_unit_test(ordered_after_the_writers),
      cmocka_unit_test(send_and_recv),
      cmocka_unit_test(bad_inputs),
      cmocka_unit_test(failures_reach_the_ranks),
      cmocka_unit_test(destroy_waits_for_queued_rounds),
      cmocka_unit_test(integer_sums_wrap),
      cmocka_unit_test(absent_rank_times_out),
      cmocka_unit_test(recv_without_send_times_out),
      cmocka_unit_test(mismatch_names_the_values),
      cmocka_unit_test(close_is_refused_while_a_rank),
  };
  return test_main("unit_comm", tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* errors.c - every bad input fails at the call with its exact code and a
 * message naming the call and the values, and never reaches a worker. */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

static _Atomic uint64_t runs;

static int count_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  atomic_fetch_add(&runs, 1);
  return 0;
}

/* A device with a "count" kernel and a 128-byte buffer. */
typedef struct fixture {
  ruda_device *dev;
  ruda_handle buf;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dev = test_open_default();
  atomic_store(&runs, 0);
  assert_ok(ruda_host_kernel_register(f->dev, "count", count_kernel));
  assert_ok(ruda_buffer_create(f->dev, 0, 128, &f->buf));
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  test_close(f->dev);
  free(f);
  return 0;
}

/* ---- the code table ---- */

static void errno_table_round_trip(void **state) {
  (void)state;
  static const struct {
    int code;
    const char *name, *text;
  } table[] = {
#define XX(name, value, text) {RUDA_##name, "RUDA_" #name, text},
      RUDA_ERRNO_MAP(XX)
#undef XX
  };
  const size_t n = sizeof table / sizeof table[0];
  assert_true(n >= 36); /* every code of the table */
  for (size_t i = 0; i < n; i++) {
    assert_true(table[i].code < 0);
    assert_string_equal(ruda_err_name(table[i].code), table[i].name);
    assert_string_equal(ruda_strerror(table[i].code), table[i].text);
    /* Name back to code: names and codes are unique. */
    for (size_t j = 0; j < n; j++) {
      if (j == i) continue;
      assert_int_not_equal(table[i].code, table[j].code);
      assert_string_not_equal(table[i].name, table[j].name);
    }
  }
  assert_string_equal(ruda_err_name(0), "RUDA_OK");
  assert_string_equal(ruda_strerror(0), "success");
  assert_string_equal(ruda_err_name(-1000), "RUDA_UNKNOWN");
  assert_string_equal(ruda_strerror(-1000), "unknown error");
  assert_string_equal(ruda_err_name(5), "RUDA_UNKNOWN");
  /* The variants the design names, by their ruda codes. */
  assert_int_equal(RUDA_EUNHEALTHY, -42);
  assert_string_equal(ruda_err_name(RUDA_ENOTFOUND), "RUDA_ENOTFOUND");
  assert_string_equal(ruda_err_name(RUDA_EFREE), "RUDA_EFREE");
  assert_string_equal(ruda_err_name(RUDA_EPOOLSINUSE), "RUDA_EPOOLSINUSE");
  assert_string_equal(ruda_err_name(RUDA_EPROFILETOKEN), "RUDA_EPROFILETOKEN");
}

static void error_accessors_accept_null(void **state) {
  (void)state;
  assert_int_equal(ruda_error_code(NULL), 0);
  assert_string_equal(ruda_error_message(NULL), "");
  assert_null(ruda_error_cause(NULL));
  assert_null(ruda_error_next(NULL));
  assert_int_equal(ruda_error_backend_code(NULL), 0);
  assert_int_equal(ruda_error_stream(NULL), 0);
  size_t n = 99;
  assert_null(ruda_error_backtrace(NULL, &n));
  assert_int_equal(n, 0);
  ruda_error_free(NULL);
  ruda_error_print(NULL, stderr, 1);
}

static void *last_error_in_thread(void *arg) {
  int *code = arg;
  *code = ruda_error_code(ruda_last_error()); /* nothing failed here yet */
  ruda_buffer_create(NULL, 0, 1, NULL);
  return NULL;
}

static void last_error_is_per_thread(void **state) {
  (void)state;
  assert_non_null(ruda_last_error());
  assert_rc(ruda_device_open(NULL, NULL), RUDA_EINVAL);
  assert_last_error_contains("ruda_device_open");
  int other = -1;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, last_error_in_thread, &other), 0);
  pthread_join(t, NULL);
  assert_int_equal(other, 0);
  /* The other thread's failure left this thread's error alone. */
  assert_int_equal(ruda_error_code(ruda_last_error()), RUDA_EINVAL);
  assert_last_error_contains("ruda_device_open");
  /* The last error carries a backtrace and prints with its name. */
  size_t frames = 0;
  assert_non_null(ruda_error_backtrace(ruda_last_error(), &frames));
  assert_true(frames > 0);
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  ruda_error_print(ruda_last_error(), out, 0);
  fclose(out);
  assert_contains(text, "RUDA_EINVAL");
  assert_contains(text, "ruda_device_open");
  free(text);
}

/* ---- NULL device and NULL pointers ---- */

static void null_device(void **state) {
  (void)state;
  ruda_handle h = {1, 1};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  char buf[4];
  ruda_future *f = (ruda_future *)&f;
  ruda_error *e = (ruda_error *)&e;
  uint64_t size;
  ruda_launch_desc l = {.kernel = "count", .grid = {1, 1, 1}, .block = {1, 1, 1}};

  assert_rc(ruda_buffer_create(NULL, 0, 16, &h), RUDA_EINVAL);
  assert_last_error_contains("ruda_buffer_create");
  assert_last_error_contains("NULL");
  assert_rc(ruda_buffer_free(NULL, 0, h), RUDA_EINVAL);
  assert_last_error_contains("ruda_buffer_free");
  assert_rc(ruda_buffer_size(NULL, h, &size), RUDA_EINVAL);
  assert_rc(ruda_write(NULL, 0, &d, buf, 4), RUDA_EINVAL);
  assert_last_error_contains("ruda_write");
  assert_rc(ruda_read(NULL, 0, &d, buf, 4, &f), RUDA_EINVAL);
  assert_last_error_contains("ruda_read");
  assert_rc(ruda_copy(NULL, 0, ruda_bind(h), ruda_bind(h)), RUDA_EINVAL);
  assert_rc(ruda_launch(NULL, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("ruda_launch");
  assert_rc(ruda_flush(NULL, 0, &e), RUDA_EINVAL);
  assert_null(e); /* the out-parameter is cleared, never left dangling */
  assert_rc(ruda_sync(NULL, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_sync_async(NULL, 0, &f), RUDA_EINVAL);
  assert_null(f);
  assert_rc(ruda_host_kernel_register(NULL, "k", count_kernel), RUDA_EINVAL);
  assert_rc(ruda_kernel_source(NULL, "k", "src", NULL), RUDA_EINVAL);
  assert_rc(ruda_device_close(NULL, &e), RUDA_EINVAL);
  assert_null(e);
  assert_rc(ruda_device_open(NULL, NULL), RUDA_EINVAL);
  assert_int_equal(ruda_stream_ids(NULL, NULL, 0), 0);
  assert_int_equal(ruda_device_num_streams(NULL), 0);
  assert_rc(ruda_future_poll(NULL), RUDA_EINVAL);
  assert_rc(ruda_future_wait(NULL, &e), RUDA_EINVAL);
  assert_null(e);
  ruda_future_free(NULL);
}

static void null_pointers(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(fx->buf));
  char buf[128] = {0};
  ruda_future *f = (ruda_future *)&f;

  assert_rc(ruda_buffer_create(dev, 0, 16, NULL), RUDA_EINVAL);
  assert_last_error_contains("out is NULL");
  assert_rc(ruda_buffer_size(dev, fx->buf, NULL), RUDA_EINVAL);
  assert_rc(ruda_write(dev, 0, NULL, buf, 128), RUDA_EINVAL);
  assert_last_error_contains("dst is NULL");
  assert_rc(ruda_write(dev, 0, &d, NULL, 128), RUDA_EINVAL);
  assert_last_error_contains("src is NULL");
  assert_rc(ruda_read(dev, 0, NULL, buf, 128, &f), RUDA_EINVAL);
  assert_null(f);
  assert_last_error_contains("src is NULL");
  f = (ruda_future *)&f;
  assert_rc(ruda_read(dev, 0, &d, NULL, 128, &f), RUDA_EINVAL);
  assert_null(f);
  assert_last_error_contains("dst is NULL");
  assert_rc(ruda_read(dev, 0, &d, buf, 128, NULL), RUDA_EINVAL);
  assert_last_error_contains("fut is NULL");
  assert_rc(ruda_launch(dev, 0, NULL), RUDA_EINVAL);
  ruda_launch_desc l = {.kernel = NULL, .grid = {1, 1, 1}, .block = {1, 1, 1}};
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("kernel name is NULL");
  assert_rc(ruda_sync_async(dev, 0, NULL), RUDA_EINVAL);
  assert_rc(ruda_host_kernel_register(dev, NULL, count_kernel), RUDA_EINVAL);
  assert_rc(ruda_host_kernel_register(dev, "", count_kernel), RUDA_EINVAL);
  assert_rc(ruda_host_kernel_register(dev, "k", NULL), RUDA_EINVAL);
  assert_last_error_contains("\"k\"");
  assert_rc(ruda_kernel_source(dev, "k", NULL, NULL), RUDA_EINVAL);
  /* The host backend runs C functions only. */
  assert_rc(ruda_kernel_source(dev, "k", "extern \"C\" __global__ void k() {}", NULL), RUDA_ENOBACKEND);
  assert_last_error_contains("host");
  /* Nothing of this reached a worker. */
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&runs), 0);
}

/* ---- sizes and ranges ---- */

static void buffer_sizes(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  ruda_handle h = {7, 7};
  assert_rc(ruda_buffer_create(dev, 0, 0, &h), RUDA_EINVAL);
  assert_int_equal(h.gen, 0); /* never a usable handle on failure */
  assert_last_error_contains("size is 0");
  assert_rc(ruda_buffer_create(dev, 0, (UINT64_C(1) << 40) + 1, &h), RUDA_EBUFFERTOOBIG);
  assert_last_error_contains("1099511627777");
  assert_rc(ruda_buffer_create(dev, 0, UINT64_MAX, &h), RUDA_EBUFFERTOOBIG);
  uint64_t size = 0;
  assert_ok(ruda_buffer_size(dev, fx->buf, &size));
  assert_int_equal(size, 128);
}

static void binding_out_of_range(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  char buf[256] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 100, 50));
  assert_rc(ruda_write(dev, 0, &d, buf, 50), RUDA_ERANGE);
  assert_last_error_contains("ruda_write");
  assert_last_error_contains("offset 100");
  assert_last_error_contains("size 50");
  assert_last_error_contains("128 bytes");
  /* An offset at the end leaves nothing to bind. */
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 128, 0));
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_ERANGE);
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 129, 0));
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_ERANGE);
  /* offset + size must not wrap around. */
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, UINT64_MAX, 2));
  assert_rc(ruda_write(dev, 0, &d, buf, 2), RUDA_ERANGE);
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 64, UINT64_MAX - 10));
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ERANGE);
  /* Reads check the same way. */
  ruda_future *f = NULL;
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 0, 129));
  assert_rc(ruda_read(dev, 0, &d, buf, 129, &f), RUDA_ERANGE);
  assert_last_error_contains("ruda_read");
  assert_null(f);
  /* The exact fit is fine: the last byte. */
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 127, 1));
  assert_ok(ruda_write(dev, 0, &d, "x", 1));
  d = ruda_copy_contiguous(ruda_bind_range(fx->buf, 127, 0));
  char x = 0;
  assert_ok(ruda_read(dev, 0, &d, &x, 1, &f));
  assert_ok(ruda_future_wait(f, NULL));
  ruda_future_free(f);
  assert_int_equal(x, 'x');
}

static void length_mismatch(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  char buf[256] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(fx->buf));
  assert_rc(ruda_write(dev, 0, &d, buf, 0), RUDA_EINVAL);
  assert_last_error_contains("len is 0");
  assert_rc(ruda_write(dev, 0, &d, buf, 10), RUDA_EINVAL);
  assert_last_error_contains("len 10");
  assert_last_error_contains("128 bytes");
  assert_rc(ruda_write(dev, 0, &d, buf, 129), RUDA_EINVAL);
  ruda_future *f = NULL;
  assert_rc(ruda_read(dev, 0, &d, buf, 0, &f), RUDA_EINVAL);
  assert_rc(ruda_read(dev, 0, &d, buf, 127, &f), RUDA_EINVAL);
  assert_last_error_contains("len 127");
  assert_null(f);
  /* A strided descriptor: 4 x 3 floats = 48 bytes. */
  d.rank = 2;
  d.shape[0] = 4, d.shape[1] = 3;
  d.strides[0] = 8, d.strides[1] = 1;
  d.elem_size = 4;
  assert_rc(ruda_write(dev, 0, &d, buf, 47), RUDA_EINVAL);
  assert_last_error_contains("48 bytes");
  assert_ok(ruda_write(dev, 0, &d, buf, 48));
}

static void bad_descriptors(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  char buf[256] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(fx->buf));
  /* Reserved words must be zero, for a contiguous descriptor too. */
  d.reserved[1] = 2;
  assert_rc(ruda_write(dev, 0, &d, buf, 128), RUDA_EINVAL);
  assert_last_error_contains("ruda_write: descriptor reserved[1] is not zero");
  ruda_future *f = NULL;
  assert_rc(ruda_read(dev, 0, &d, buf, 128, &f), RUDA_EINVAL);
  assert_last_error_contains("ruda_read: descriptor reserved[1] is not zero");
  assert_null(f);
  d.reserved[1] = 0;
  assert_ok(ruda_write(dev, 0, &d, buf, 128));

  d.rank = RUDA_MAX_RANK + 1;
  d.elem_size = 1;
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_EINVAL);
  assert_last_error_contains("rank 9");

  d = ruda_copy_contiguous(ruda_bind(fx->buf));
  d.rank = 1;
  d.shape[0] = 4;
  d.strides[0] = 1;
  d.elem_size = 0;
  assert_rc(ruda_write(dev, 0, &d, buf, 4), RUDA_EINVAL);
  assert_last_error_contains("elem_size is 0");

  d.elem_size = 1;
  d.rank = 2;
  d.shape[0] = 2, d.shape[1] = 0;
  d.strides[0] = 4, d.strides[1] = 1;
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_EINVAL);
  assert_last_error_contains("shape[1] is 0");

  /* (shape - 1) * stride overflows 64 bits. */
  d.shape[0] = 3, d.shape[1] = 1;
  d.strides[0] = UINT64_MAX / 2 + 1, d.strides[1] = 1;
  assert_rc(ruda_write(dev, 0, &d, buf, 3), RUDA_ERANGE);
  assert_last_error_contains("overflow");
  assert_last_error_contains("dim 0");
  /* The element count overflows. */
  d.shape[0] = UINT64_C(1) << 32, d.shape[1] = UINT64_C(1) << 32;
  d.strides[0] = 0, d.strides[1] = 0;
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_ERANGE);
  assert_last_error_contains("dim 1");
  /* The byte count overflows. */
  d.rank = 1;
  d.shape[0] = UINT64_C(1) << 62;
  d.strides[0] = 0;
  d.elem_size = 8;
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_ERANGE);
  /* The region spans more than the binding: 4 rows of pitch 44 bytes
   * end at byte (3 * 11 + 1 + 1) * 4 = 140. */
  d.rank = 2;
  d.shape[0] = 4, d.shape[1] = 2;
  d.strides[0] = 11, d.strides[1] = 1;
  d.elem_size = 4;
  assert_rc(ruda_write(dev, 0, &d, buf, 32), RUDA_ERANGE);
  assert_last_error_contains("spans 140 bytes");
  assert_last_error_contains("holds 128");
  d.binding = ruda_bind_range(fx->buf, 4, 0);
  assert_rc(ruda_write(dev, 0, &d, buf, 32), RUDA_ERANGE);
  assert_last_error_contains("holds 124");
  /* Non-unit inner stride, past the end by one element. */
  d.binding = ruda_bind(fx->buf);
  d.rank = 1;
  d.shape[0] = 17;
  d.strides[0] = 2;
  d.elem_size = 4;
  assert_rc(ruda_write(dev, 0, &d, buf, 68), RUDA_ERANGE);
  d.shape[0] = 16;
  assert_ok(ruda_write(dev, 0, &d, buf, 64));
}

/* A tensor map descriptor's reserved words are checked before the backend
 * is asked, so the host backend refuses them as the cuda one does. */
static void tensor_map_reserved(void **state) {
  fixture *fx = *state;
  ruda_tensor_map_desc d = {.rank = 1, .data_type = 7, .shape = {16}, .strides = {1}, .box = {16}};
  ruda_tensor_map m;
  d.reserved[2] = 9;
  assert_rc(ruda_tensor_map_encode(fx->dev, ruda_bind(fx->buf), &d, &m), RUDA_EINVAL);
  assert_last_error_contains("ruda_tensor_map_encode: desc reserved[2] is not zero");
  d.reserved[2] = 0;
  assert_rc(ruda_tensor_map_encode(fx->dev, ruda_bind(fx->buf), &d, &m), RUDA_ENOBACKEND); /* host */
}

static void copy_ranges(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  ruda_handle small;
  assert_ok(ruda_buffer_create(dev, 0, 64, &small));
  assert_rc(ruda_copy(dev, 0, ruda_bind(small), ruda_bind(fx->buf)), RUDA_ERANGE);
  assert_last_error_contains("128 bytes");
  assert_last_error_contains("64");
  assert_rc(ruda_copy(dev, 0, ruda_bind(small), ruda_bind_range(fx->buf, 0, 65)), RUDA_ERANGE);
  assert_rc(ruda_copy(dev, 0, ruda_bind_range(small, 60, 8), ruda_bind_range(fx->buf, 0, 8)), RUDA_ERANGE);
  assert_ok(ruda_copy(dev, 0, ruda_bind(small), ruda_bind_range(fx->buf, 64, 0)));
  assert_ok(ruda_buffer_free(dev, 0, small));
  assert_rc(ruda_copy(dev, 0, ruda_bind(small), ruda_bind_range(fx->buf, 64, 0)), RUDA_ENOTFOUND);
  assert_last_error_contains("dst");
  assert_rc(ruda_copy(dev, 0, ruda_bind(fx->buf), ruda_bind(small)), RUDA_ENOTFOUND);
  assert_last_error_contains("src");
}

/* ---- handles ---- */

static void stale_and_freed_handles(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  char buf[64] = {0};
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h));
  assert_true(h.gen != 0);
  assert_ok(ruda_buffer_free(dev, 0, h));
  /* The handle is dead at once for every call. */
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_EFREE);
  assert_last_error_contains("already freed");
  uint64_t size;
  assert_rc(ruda_buffer_size(dev, h, &size), RUDA_ENOTFOUND);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ENOTFOUND);
  char msg[64];
  snprintf(msg, sizeof msg, "{slot %u, gen %u}", h.slot, h.gen);
  assert_last_error_contains(msg);
  assert_last_error_contains("ruda_write");
  ruda_future *f = NULL;
  assert_rc(ruda_read(dev, 0, &d, buf, 64, &f), RUDA_ENOTFOUND);
  assert_null(f);
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  assert_rc(test_launch(dev, 0, "count", &a, 1), RUDA_ENOTFOUND);
  assert_last_error_contains("argument 0");

  /* Handles that never existed. */
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){0, 0}), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){4000000, 1}), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){UINT32_MAX, 1}), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){fx->buf.slot, fx->buf.gen + 5}), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_size(dev, (ruda_handle){fx->buf.slot, fx->buf.gen + 1}, &size), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_size(dev, (ruda_handle){99999, 1}, &size), RUDA_ENOTFOUND);

  /* Once the free ran, the slot is reused under a new generation; the old
   * handle still fails and never reaches the new buffer. */
  assert_ok(ruda_sync(dev, 0, NULL));
  ruda_handle h2;
  assert_ok(ruda_buffer_create(dev, 0, 64, &h2));
  if (h2.slot == h.slot) assert_true(h2.gen != h.gen);
  char ones[64];
  memset(ones, 1, sizeof ones);
  test_write(dev, 0, ruda_bind(h2), ones, 64);
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_EFREE);
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ENOTFOUND);
  char back[64];
  test_read(dev, 0, ruda_bind(h2), back, 64);
  assert_memory_equal(back, ones, 64);
  assert_ok(ruda_buffer_free(dev, 0, h2));
  assert_int_equal(atomic_load(&runs), 0);
}

/* ---- launches ---- */

static void unknown_kernel(void **state) {
  fixture *fx = *state;
  assert_rc(test_launch(fx->dev, 0, "no_such_kernel", NULL, 0), RUDA_EKERNEL);
  assert_last_error_contains("\"no_such_kernel\"");
  assert_rc(test_launch(fx->dev, 0, "Count", NULL, 0), RUDA_EKERNEL); /* names are exact */
  assert_rc(test_launch(fx->dev, 0, "", NULL, 0), RUDA_EKERNEL);
  assert_ok(test_launch(fx->dev, 0, "count", NULL, 0));
  assert_ok(ruda_flush(fx->dev, 0, NULL));
  assert_int_equal(atomic_load(&runs), 1);
}

static int launch_dims(ruda_device *dev, ruda_dim3 grid, ruda_dim3 block, uint32_t shared) {
  ruda_launch_desc l = {.kernel = "count", .grid = grid, .block = block, .shared_mem = shared};
  return ruda_launch(dev, 0, &l);
}

static void launch_limits(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  const ruda_dim3 one = {1, 1, 1};
  assert_rc(launch_dims(dev, one, (ruda_dim3){0, 1, 1}, 0), RUDA_EINVAL);
  assert_last_error_contains("block (0,1,1)");
  assert_rc(launch_dims(dev, (ruda_dim3){1, 0, 1}, one, 0), RUDA_EINVAL);
  assert_last_error_contains("grid (1,0,1)");

  assert_rc(launch_dims(dev, one, (ruda_dim3){1025, 1, 1}, 0), RUDA_EBLOCKDIM);
  assert_last_error_contains("\"count\"");
  assert_last_error_contains("(1025,1,1)");
  assert_last_error_contains("(1024,1024,64)");
  assert_rc(launch_dims(dev, one, (ruda_dim3){1, 1, 65}, 0), RUDA_EBLOCKDIM);
  assert_rc(launch_dims(dev, one, (ruda_dim3){1, 1025, 1}, 0), RUDA_EBLOCKDIM);

  assert_rc(launch_dims(dev, one, (ruda_dim3){32, 32, 2}, 0), RUDA_EBLOCKTHREADS);
  assert_last_error_contains("2048 threads");
  assert_last_error_contains("1024");
  assert_rc(launch_dims(dev, one, (ruda_dim3){1024, 2, 1}, 0), RUDA_EBLOCKTHREADS);

  assert_rc(launch_dims(dev, (ruda_dim3){1, 65536, 1}, one, 0), RUDA_EGRIDDIM);
  assert_last_error_contains("(1,65536,1)");
  assert_rc(launch_dims(dev, (ruda_dim3){1, 1, 65536}, one, 0), RUDA_EGRIDDIM);
  assert_rc(launch_dims(dev, (ruda_dim3){(uint32_t)INT32_MAX + 1u, 1, 1}, one, 0), RUDA_EGRIDDIM);

  assert_rc(launch_dims(dev, one, one, 48 * 1024 + 1), RUDA_ESHAREDMEM);
  assert_last_error_contains("49153 bytes");
  assert_last_error_contains("49152");

  /* Each limit itself is allowed. */
  atomic_store(&runs, 0);
  assert_ok(launch_dims(dev, one, (ruda_dim3){1024, 1, 1}, 0));
  assert_ok(launch_dims(dev, one, (ruda_dim3){16, 1, 64}, 0));
  assert_ok(launch_dims(dev, one, one, 48 * 1024));
  assert_ok(launch_dims(dev, (ruda_dim3){1, 3, 2}, one, 0));
  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&runs), 1024 + 1024 + 1 + 6);
}

static void launch_arguments(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  uint32_t v = 5;
  ruda_arg args[RUDA_MAX_ARGS + 1];
  for (int i = 0; i <= RUDA_MAX_ARGS; i++) args[i] = ruda_arg_scalar(&v, sizeof v);
  ruda_launch_desc l = {.kernel = "count", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = args};

  l.nargs = RUDA_MAX_ARGS + 1;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("65 arguments");
  l.nargs = RUDA_MAX_ARGS; /* the maximum is fine */
  assert_ok(ruda_launch(dev, 0, &l));

  l.args = NULL;
  l.nargs = 1;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("args is NULL");
  l.args = args;

  l.flags = 0x80;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("0x80");
  l.flags = 0;

  l.reserved[2] = 1;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("ruda_launch \"count\": reserved[2] is not zero");
  l.reserved[2] = 0;

  args[0] = ruda_arg_scalar(NULL, 4);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("NULL data");
  args[0] = ruda_arg_scalar(&v, 0);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("scalar argument 0");
  static const unsigned char big[RUDA_MAX_SCALAR_BYTES + 1];
  args[0] = ruda_arg_scalar(big, RUDA_MAX_SCALAR_BYTES + 1);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  args[0] = ruda_arg_scalar(big, RUDA_MAX_SCALAR_BYTES);
  assert_ok(ruda_launch(dev, 0, &l));
  args[0].kind = (ruda_arg_kind)7;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_EINVAL);
  assert_last_error_contains("unknown kind 7");

  /* A bad buffer after a good one: the good one's pin must be released
   * (LeakSanitizer sees it if the buffer then never goes away). */
  ruda_handle tmp;
  assert_ok(ruda_buffer_create(dev, 0, 32, &tmp));
  args[0] = ruda_arg_buffer(ruda_bind(tmp));
  args[1] = ruda_arg_buffer(ruda_bind_range(fx->buf, 120, 16));
  l.nargs = 2;
  assert_rc(ruda_launch(dev, 0, &l), RUDA_ERANGE);
  assert_last_error_contains("argument 1");
  assert_last_error_contains("offset 120");
  assert_ok(ruda_buffer_free(dev, 0, tmp));

  /* Indirect grids need 12 bytes and a live buffer. */
  l.nargs = 0;
  l.flags = RUDA_LAUNCH_INDIRECT;
  l.indirect_grid = ruda_bind_range(fx->buf, 0, 8);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_ERANGE);
  assert_last_error_contains("needs 12");
  l.indirect_grid = ruda_bind(tmp);
  assert_rc(ruda_launch(dev, 0, &l), RUDA_ENOTFOUND);
  assert_last_error_contains("indirect grid");

  assert_ok(ruda_flush(dev, 0, NULL));
  assert_int_equal(atomic_load(&runs), 2);
}

/* A typed host kernel is checked at the call as a CUDA kernel is. */
static _Atomic int typed_runs;
static int typed_kernel(const ruda_host_ctx *c, void *const *args) {
  if (c->nargs != 2) return RUDA_EINVAL;
  ((unsigned char *)args[0])[0] = (unsigned char)*(const uint32_t *)args[1];
  atomic_fetch_add(&typed_runs, 1);
  return 0;
}

static void typed_host_kernels_are_checked(void **state) {
  fixture *fx = *state;
  const ruda_host_param sig[2] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}};
  assert_ok(ruda_host_kernel_register_typed(fx->dev, "typed", typed_kernel, sig, 2));
  const ruda_host_param bad_sig[1] = {{RUDA_ARG_SCALAR, 0}};
  assert_rc(ruda_host_kernel_register_typed(fx->dev, "bad", typed_kernel, bad_sig, 1), RUDA_EINVAL);
  uint32_t v = 7;
  uint64_t w = 7;
  ruda_arg good[2] = {ruda_arg_out(ruda_bind(fx->buf)), ruda_arg_scalar(&v, 4)};
  ruda_arg swapped[2] = {ruda_arg_scalar(&v, 4), ruda_arg_buffer(ruda_bind(fx->buf))};
  ruda_arg wide[2] = {ruda_arg_buffer(ruda_bind(fx->buf)), ruda_arg_scalar(&w, 8)};
  assert_rc(test_launch(fx->dev, 0, "typed", good, 1), RUDA_EINVAL);
  assert_last_error_contains("1 arguments given, the kernel takes 2");
  assert_rc(test_launch(fx->dev, 0, "typed", swapped, 2), RUDA_EINVAL);
  assert_last_error_contains("argument 0 is a scalar of 4 bytes, the kernel's parameter 0 is a buffer pointer");
  assert_rc(test_launch(fx->dev, 0, "typed", wide, 2), RUDA_EINVAL);
  assert_last_error_contains("argument 1 is a scalar of 8 bytes, the kernel's parameter 1 is a scalar of 4 bytes");
  assert_ok(test_launch(fx->dev, 0, "typed", good, 2));
  assert_ok(ruda_sync(fx->dev, 0, NULL));
  assert_int_equal(atomic_load(&typed_runs), 1);
}

/* A host kernel's positive return is not a ruda code: reported as
 * RUDA_EINVAL saying what was returned, not as an unknown code. */
static int returns_seven(const ruda_host_ctx *c, void *const *args) {
  (void)c, (void)args;
  return 7;
}

static void positive_kernel_return(void **state) {
  fixture *fx = *state;
  assert_ok(ruda_host_kernel_register(fx->dev, "seven", returns_seven));
  assert_ok(test_launch(fx->dev, 0, "seven", NULL, 0));
  ruda_error *err = NULL;
  assert_int_equal(ruda_sync(fx->dev, 0, &err), RUDA_EUNHEALTHY);
  const ruda_error *cause = ruda_error_cause(err);
  assert_int_equal(ruda_error_code(cause), RUDA_EINVAL);
  assert_contains(ruda_error_message(cause), "kernel returned 7");
  ruda_error_free(err);
}

static void bad_stream_ids(void **state) {
  fixture *fx = *state;
  ruda_device *dev = fx->dev;
  const ruda_stream_id bad[] = {UINT64_C(1) << 63, (UINT64_C(1) << 63) | 5, UINT64_MAX - 1};
  char buf[128] = {0};
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(fx->buf));
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ruda_stream_id s = bad[i];
    ruda_handle h;
    ruda_future *f = NULL;
    assert_rc(ruda_buffer_create(dev, s, 16, &h), RUDA_EINVAL);
    assert_last_error_contains("reserved");
    assert_rc(ruda_buffer_free(dev, s, fx->buf), RUDA_EINVAL);
    assert_rc(ruda_write(dev, s, &d, buf, 128), RUDA_EINVAL);
    assert_last_error_contains("ruda_write: stream id");
    assert_rc(ruda_read(dev, s, &d, buf, 128, &f), RUDA_EINVAL);
    assert_rc(ruda_copy(dev, s, ruda_bind(fx->buf), ruda_bind(fx->buf)), RUDA_EINVAL);
    assert_rc(test_launch(dev, s, "count", NULL, 0), RUDA_EINVAL);
    assert_rc(ruda_flush(dev, s, NULL), RUDA_EINVAL);
    assert_rc(ruda_sync(dev, s, NULL), RUDA_EINVAL);
    assert_rc(ruda_sync_async(dev, s, &f), RUDA_EINVAL);
    assert_null(f);
  }
  /* The buffer survived the refused free, and no stream was created for
   * the bad ids. */
  uint64_t size;
  assert_ok(ruda_buffer_size(dev, fx->buf, &size));
  ruda_stream_id ids[16];
  size_t n = ruda_stream_ids(dev, ids, 16);
  for (size_t i = 0; i < n && i < 16; i++) assert_true(ids[i] <= RUDA_STREAM_EXPLICIT_MAX);
  assert_int_equal(atomic_load(&runs), 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(errno_table_round_trip),
      cmocka_unit_test(error_accessors_accept_null),
      cmocka_unit_test(last_error_is_per_thread),
      cmocka_unit_test(null_device),
      cmocka_unit_test_setup_teardown(null_pointers, setup, teardown),
      cmocka_unit_test_setup_teardown(buffer_sizes, setup, teardown),
      cmocka_unit_test_setup_teardown(binding_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(length_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_descriptors, setup, teardown),
      cmocka_unit_test_setup_teardown(tensor_map_reserved, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_ranges, setup, teardown),
      cmocka_unit_test_setup_teardown(stale_and_freed_handles, setup, teardown),
      cmocka_unit_test_setup_teardown(unknown_kernel, setup, teardown),
      cmocka_unit_test_setup_teardown(positive_kernel_return, setup, teardown),
      cmocka_unit_test_setup_teardown(typed_host_kernels_are_checked, setup, teardown),
      cmocka_unit_test_setup_teardown(launch_limits, setup, teardown),
      cmocka_unit_test_setup_teardown(launch_arguments, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_stream_ids, setup, teardown),
  };
  return test_main("integration_errors", tests, sizeof tests / sizeof tests[0], argc, argv);
}

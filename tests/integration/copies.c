/* copies.c - strided writes and reads against a CPU model of the buffer,
 * and ruda_copy between buffers. */
#include <pthread.h>

#include "common.h"

/* The model: what the buffer's bytes must be. */
typedef struct model {
  ruda_device *dev;
  ruda_handle h;
  size_t size;
  unsigned char *bytes;
} model;

static void model_open(model *m, size_t size) {
  m->dev = test_open_default();
  m->size = size;
  m->bytes = malloc(size);
  assert_non_null(m->bytes);
  for (size_t i = 0; i < size; i++) m->bytes[i] = (unsigned char)(0xA5 ^ (i * 13));
  assert_ok(ruda_buffer_create(m->dev, 0, size, &m->h));
  test_write(m->dev, 0, ruda_bind(m->h), m->bytes, size);
}

static void model_close(model *m) {
  assert_ok(ruda_buffer_free(m->dev, 0, m->h));
  test_close(m->dev);
  free(m->bytes);
}

static uint64_t elements(const ruda_copy_desc *d) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < d->rank; i++) n *= d->shape[i];
  return n;
}

/* Byte offset in the buffer of the k-th element in row-major order: the
 * definition of the descriptor, computed independently of ruda's walk. */
static uint64_t offset_of(const ruda_copy_desc *d, uint64_t k) {
  uint64_t off = 0;
  for (int i = (int)d->rank - 1; i >= 0; i--) {
    off += (k % d->shape[i]) * d->strides[i];
    k /= d->shape[i];
  }
  return d->binding.offset + off * d->elem_size;
}

/* Writes dense src through d, applies the same to the model, then checks
 * the whole buffer and the strided read-back. */
static void round_trip(model *m, const ruda_copy_desc *d, ruda_stream_id s) {
  const uint64_t n = elements(d), es = d->elem_size, len = n * es;
  unsigned char *src = malloc(len), *back = malloc(len), *all = malloc(m->size);
  static unsigned seed = 1;
  for (uint64_t i = 0; i < len; i++) src[i] = (unsigned char)(rand_r(&seed) & 0xff);
  assert_ok(ruda_write(m->dev, s, d, src, len));
  for (uint64_t k = 0; k < n; k++) memcpy(m->bytes + offset_of(d, k), src + k * es, es);

  test_read(m->dev, s, ruda_bind(m->h), all, m->size);
  for (size_t i = 0; i < m->size; i++)
    if (all[i] != m->bytes[i])
      fail_msg("rank %u elem %u: buffer byte %zu is %u, model says %u", d->rank, d->elem_size, i, all[i],
               m->bytes[i]);
  ruda_future *f = NULL;
  assert_ok(ruda_read(m->dev, s, d, back, len, &f));
  assert_rc(ruda_future_wait(f, NULL), 0);
  ruda_future_free(f);
  assert_memory_equal(back, src, len);
  free(src);
  free(back);
  free(all);
}

static ruda_copy_desc desc(ruda_handle h, uint64_t offset, uint32_t elem, uint32_t rank,
                           const uint64_t *shape, const uint64_t *strides) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, offset, 0));
  d.rank = rank;
  d.elem_size = elem;
  for (uint32_t i = 0; i < rank; i++) d.shape[i] = shape[i], d.strides[i] = strides[i];
  return d;
}

static void pitched_2d(void **state) {
  (void)state;
  model m;
  model_open(&m, 16 * 24 * 4);
  /* 16 rows of 20 floats in rows of 24: the cuMemcpy2D case. */
  ruda_copy_desc d = desc(m.h, 0, 4, 2, (uint64_t[]){16, 20}, (uint64_t[]){24, 1});
  round_trip(&m, &d, 0);
  /* The same at an offset, a narrower window. */
  d = desc(m.h, 4 * 4 * 24 + 8, 4, 2, (uint64_t[]){5, 3}, (uint64_t[]){24, 1});
  round_trip(&m, &d, 1);
  model_close(&m);
}

static void pitched_3d(void **state) {
  (void)state;
  model m;
  model_open(&m, 4 * 6 * 8 * 2 + 64);
  /* A 3 x 4 x 5 box of 2-byte elements in a 4 x 6 x 8 volume. */
  ruda_copy_desc d = desc(m.h, 64, 2, 3, (uint64_t[]){3, 4, 5}, (uint64_t[]){48, 8, 1});
  round_trip(&m, &d, 0);
  d = desc(m.h, 2, 2, 3, (uint64_t[]){4, 6, 8}, (uint64_t[]){48, 8, 1}); /* dense: one memcpy */
  round_trip(&m, &d, 0);
  model_close(&m);
}

static void non_unit_inner_stride(void **state) {
  (void)state;
  model m;
  model_open(&m, 1024);
  ruda_copy_desc d = desc(m.h, 8, 8, 2, (uint64_t[]){6, 5}, (uint64_t[]){16, 3});
  round_trip(&m, &d, 0);
  /* Rank 1, every third 4-byte element. */
  d = desc(m.h, 0, 4, 1, (uint64_t[]){20}, (uint64_t[]){3});
  round_trip(&m, &d, 0);
  /* Column-major: a transpose on the way in and out. */
  d = desc(m.h, 0, 4, 2, (uint64_t[]){5, 7}, (uint64_t[]){1, 5});
  round_trip(&m, &d, 0);
  /* Odd element size. */
  d = desc(m.h, 1, 3, 2, (uint64_t[]){4, 4}, (uint64_t[]){9, 2});
  round_trip(&m, &d, 2);
  model_close(&m);
}

static void rank_8(void **state) {
  (void)state;
  model m;
  model_open(&m, 4096);
  uint64_t shape[8] = {2, 2, 2, 2, 2, 2, 2, 3}, strides[8];
  strides[7] = 2;
  for (int i = 6; i >= 0; i--) strides[i] = strides[i + 1] * shape[i + 1] + 1;
  ruda_copy_desc d = desc(m.h, 0, 4, 8, shape, strides);
  round_trip(&m, &d, 0);
  model_close(&m);
}

static void random_layouts(void **state) {
  (void)state;
  model m;
  model_open(&m, 64 * 1024);
  unsigned seed = 12345;
  static const uint32_t elems[] = {1, 2, 3, 4, 8, 16};
  for (int c = 0; c < 300; c++) {
    uint64_t shape[RUDA_MAX_RANK], strides[RUDA_MAX_RANK];
    uint32_t rank = 1 + (uint32_t)(rand_r(&seed) % 4);
    uint32_t es = elems[rand_r(&seed) % 6];
    for (uint32_t i = 0; i < rank; i++) shape[i] = 1 + (uint64_t)(rand_r(&seed) % 6);
    /* Row-major with random padding (sometimes none, which is dense), so
     * no two elements share bytes. */
    strides[rank - 1] = 1 + (uint64_t)(rand_r(&seed) % 3 == 0 ? rand_r(&seed) % 3 : 0);
    for (int i = (int)rank - 2; i >= 0; i--)
      strides[i] = strides[i + 1] * shape[i + 1] + (uint64_t)(rand_r(&seed) % 2 ? rand_r(&seed) % 4 : 0);
    uint64_t extent = 1;
    for (uint32_t i = 0; i < rank; i++) extent += (shape[i] - 1) * strides[i];
    extent *= es;
    uint64_t offset = (uint64_t)rand_r(&seed) % (m.size - extent + 1);
    ruda_copy_desc d = desc(m.h, offset, es, rank, shape, strides);
    round_trip(&m, &d, (ruda_stream_id)(c % 3));
  }
  model_close(&m);
}

static void copy_between_buffers(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  unsigned char a[256], zero[512] = {0}, got[512];
  for (int i = 0; i < 256; i++) a[i] = (unsigned char)i;
  ruda_handle ha, hb, hc;
  assert_ok(ruda_buffer_create(dev, 0, 256, &ha));
  assert_ok(ruda_buffer_create(dev, 0, 256, &hb));
  assert_ok(ruda_buffer_create(dev, 0, 512, &hc));
  /* All on one stream, no waiting between: stream order carries it. */
  test_write(dev, 0, ruda_bind(ha), a, 256);
  test_write(dev, 0, ruda_bind(hb), zero, 256);
  test_write(dev, 0, ruda_bind(hc), zero, 512);
  assert_ok(ruda_copy(dev, 0, ruda_bind_range(hb, 64, 64), ruda_bind_range(ha, 0, 64)));
  assert_ok(ruda_copy(dev, 0, ruda_bind_range(hc, 100, 0), ruda_bind(ha))); /* whole source */
  assert_ok(ruda_copy(dev, 0, ruda_bind_range(hc, 400, 0), ruda_bind_range(hb, 64, 64)));
  /* Within one buffer, disjoint ranges. */
  assert_ok(ruda_copy(dev, 0, ruda_bind_range(ha, 0, 16), ruda_bind_range(ha, 240, 16)));

  unsigned char want[512];
  test_read(dev, 0, ruda_bind(hb), got, 256);
  memset(want, 0, sizeof want);
  memcpy(want + 64, a, 64);
  assert_memory_equal(got, want, 256);

  test_read(dev, 0, ruda_bind(hc), got, 512);
  memset(want, 0, sizeof want);
  memcpy(want + 100, a, 256);
  memcpy(want + 400, a, 64);
  assert_memory_equal(got, want, 512);

  test_read(dev, 0, ruda_bind(ha), got, 256);
  memcpy(want, a, 256);
  memcpy(want, a + 240, 16);
  assert_memory_equal(got, want, 256);

  /* Across streams, once the source's stream was synced. */
  test_write(dev, 1, ruda_bind(hb), a, 256);
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_ok(ruda_copy(dev, 2, ruda_bind_range(hc, 0, 256), ruda_bind(hb)));
  test_read(dev, 2, ruda_bind_range(hc, 0, 256), got, 256);
  assert_memory_equal(got, a, 256);

  assert_ok(ruda_buffer_free(dev, 0, ha));
  assert_ok(ruda_buffer_free(dev, 0, hb));
  assert_ok(ruda_buffer_free(dev, 0, hc));
  test_close(dev);
}

typedef struct writer {
  ruda_device *dev;
  ruda_handle h;
  uint32_t index;
  int rc;
} writer;

static void *write_rows(void *p) {
  writer *w = p;
  uint32_t row[64];
  for (int round = 0; round < 200 && w->rc == 0; round++) {
    for (int i = 0; i < 64; i++) row[i] = w->index * 1000000u + (uint32_t)round * 1000u + (uint32_t)i;
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(w->h, (uint64_t)w->index * sizeof row, sizeof row));
    w->rc = ruda_write(w->dev, w->index, &d, row, sizeof row);
  }
  if (w->rc == 0) w->rc = ruda_sync(w->dev, w->index, NULL);
  return NULL;
}

static void concurrent_disjoint_writes(void **state) {
  (void)state;
  ruda_device *dev = test_open_default();
  enum { T = 6 };
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, T * 64 * sizeof(uint32_t), &h));
  writer w[T];
  pthread_t t[T];
  for (uint32_t i = 0; i < T; i++) {
    w[i] = (writer){dev, h, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, write_rows, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(w[i].rc, 0);
  uint32_t got[T * 64];
  test_read(dev, 0, ruda_bind(h), got, sizeof got);
  /* Each row holds its writer's last round. */
  for (uint32_t i = 0; i < T; i++)
    for (uint32_t j = 0; j < 64; j++) assert_int_equal(got[i * 64 + j], i * 1000000u + 199u * 1000u + j);
  assert_ok(ruda_buffer_free(dev, 0, h));
  test_close(dev);
}

/* Contiguous writes past 8 MiB are staged in pieces, by helper threads
 * when there are any; RUDA_COPY_THREADS asks for helpers even on a small
 * machine (read once, at the first large write of the process). */
static void large_writes_in_pieces(void **state) {
  (void)state;
  setenv("RUDA_COPY_THREADS", "3", 1);
  ruda_device *dev = test_open_default();
  const size_t len = ((size_t)16 << 20) + 12345; /* 3 pieces, the last short */
  unsigned char *src = malloc(len), *back = malloc(len);
  assert_non_null(src);
  assert_non_null(back);
  for (size_t i = 0; i < len; i++) src[i] = (unsigned char)((i * 2654435761u) >> 13);
  ruda_handle h;
  assert_ok(ruda_buffer_create(dev, 0, len + 100, &h));
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, 100, len));
  assert_ok(ruda_write(dev, 0, &d, src, len));
  memset(src, 0, 4096); /* the caller may reuse src once ruda_write returned */
  /* Commands after the write see all of it. */
  ruda_future *f = NULL;
  assert_ok(ruda_read(dev, 0, &d, back, len, &f));
  assert_rc(ruda_future_wait(f, NULL), 0);
  ruda_future_free(f);
  for (size_t i = 0; i < 4096; i++) src[i] = (unsigned char)((i * 2654435761u) >> 13);
  assert_memory_equal(back, src, len);
  assert_ok(ruda_buffer_free(dev, 0, h));
  free(src);
  free(back);
  test_close(dev);
}

typedef struct big_writer {
  ruda_device *dev;
  uint32_t index;
  size_t len;
  int rc;
} big_writer;

static void *write_big(void *p) {
  big_writer *w = p;
  unsigned char *src = malloc(w->len), *back = malloc(w->len);
  ruda_handle h;
  ruda_stream_id s = w->index;
  for (size_t i = 0; i < w->len; i++) src[i] = (unsigned char)(i * 31 + w->index);
  if ((w->rc = ruda_buffer_create(w->dev, s, w->len, &h)) == 0) {
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
    ruda_future *f = NULL;
    if ((w->rc = ruda_write(w->dev, s, &d, src, w->len)) == 0 &&
        (w->rc = ruda_read(w->dev, s, &d, back, w->len, &f)) == 0)
      w->rc = ruda_future_wait(f, NULL);
    ruda_future_free(f);
    if (w->rc == 0 && memcmp(src, back, w->len) != 0) w->rc = -1000;
    ruda_buffer_free(w->dev, s, h);
  }
  free(src);
  free(back);
  return NULL;
}

static void concurrent_large_writes(void **state) {
  (void)state;
  setenv("RUDA_COPY_THREADS", "2", 1);
  ruda_device *dev = test_open_default();
  enum { T = 3 };
  big_writer w[T];
  pthread_t t[T];
  for (uint32_t i = 0; i < T; i++) {
    w[i] = (big_writer){dev, i, ((size_t)9 << 20) + i * 4099, 0};
    assert_int_equal(pthread_create(&t[i], NULL, write_big, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(w[i].rc, 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pitched_2d),
      cmocka_unit_test(pitched_3d),
      cmocka_unit_test(non_unit_inner_stride),
      cmocka_unit_test(rank_8),
      cmocka_unit_test(random_layouts),
      cmocka_unit_test(copy_between_buffers),
      cmocka_unit_test(concurrent_disjoint_writes),
      cmocka_unit_test(large_writes_in_pieces),
      cmocka_unit_test(concurrent_large_writes),
  };
  return test_main("integration_copies", tests, sizeof tests / sizeof tests[0], argc, argv);
}

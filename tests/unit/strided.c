/* strided.c - the CPU strided copy (src/copy.c) against the definition of
 * a layout, for every rank and for dense, padded, transposed and
 * non-unit-inner-stride layouts. */
#include "common.h"
#include "base/backend.h"

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Fills the derived fields as ruda_write's validation does: bytes, extent
 * and whether the region is dense row-major. */
static void finish(ruda__layout *l) {
  uint64_t count = 1, span = 0, expect = 1;
  for (uint32_t i = 0; i < l->rank; i++) {
    count *= l->shape[i];
    span += (l->shape[i] - 1) * l->strides[i];
  }
  l->bytes = count * l->elem_size;
  l->extent = (span + 1) * l->elem_size;
  l->contiguous = 1;
  for (int i = (int)l->rank - 1; i >= 0; i--) {
    if (l->shape[i] > 1 && l->strides[i] != expect) l->contiguous = 0;
    expect *= l->shape[i];
  }
}

static uint64_t offset_of(const ruda__layout *l, uint64_t k) {
  if (l->rank == 0) return k * l->elem_size; /* plain bytes */
  uint64_t off = 0;
  for (int i = (int)l->rank - 1; i >= 0; i--) {
    off += (k % l->shape[i]) * l->strides[i];
    k /= l->shape[i];
  }
  return off * l->elem_size;
}

/* Copies dense -> strided and back; checks every byte of the strided
 * buffer (written elements, and untouched gaps) and the round trip. */
static void check(const ruda__layout *l) {
  const uint64_t n = l->bytes / l->elem_size, es = l->elem_size;
  unsigned char *dense = malloc(l->bytes), *back = malloc(l->bytes);
  unsigned char *buf = malloc(l->extent), *model = malloc(l->extent);
  for (uint64_t i = 0; i < l->bytes; i++) dense[i] = (unsigned char)(i * 7 + 1);
  memset(buf, 0xEE, l->extent);
  memset(model, 0xEE, l->extent);
  for (uint64_t k = 0; k < n; k++) memcpy(model + offset_of(l, k), dense + k * es, es);
  ruda__copy_to_strided(buf, l, dense);
  if (memcmp(buf, model, l->extent) != 0) {
    for (uint64_t i = 0; i < l->extent; i++)
      if (buf[i] != model[i])
        fail_msg("rank %u elem %u contiguous %d: byte %llu is %u, want %u", l->rank, l->elem_size,
                 l->contiguous, (unsigned long long)i, buf[i], model[i]);
  }
  memset(back, 0, l->bytes);
  ruda__copy_from_strided(back, l, buf);
  assert_memory_equal(back, dense, l->bytes);
  free(dense);
  free(back);
  free(buf);
  free(model);
}

static ruda__layout make(uint32_t rank, uint32_t es, const uint64_t *shape, const uint64_t *strides) {
  ruda__layout l;
  memset(&l, 0, sizeof l);
  l.rank = rank;
  l.elem_size = es;
  for (uint32_t i = 0; i < rank; i++) l.shape[i] = shape[i], l.strides[i] = strides[i];
  finish(&l);
  return l;
}

static void fixed_layouts(void **state) {
  (void)state;
  ruda__layout l = make(2, 4, (uint64_t[]){3, 5}, (uint64_t[]){5, 1});
  assert_true(l.contiguous);
  check(&l);
  l = make(2, 4, (uint64_t[]){3, 5}, (uint64_t[]){8, 1}); /* pitched rows */
  assert_false(l.contiguous);
  check(&l);
  l = make(2, 2, (uint64_t[]){3, 5}, (uint64_t[]){1, 3}); /* transposed */
  check(&l);
  l = make(1, 8, (uint64_t[]){9}, (uint64_t[]){4}); /* every 4th element */
  check(&l);
  l = make(3, 1, (uint64_t[]){2, 1, 4}, (uint64_t[]){100, 7, 1}); /* size-1 dim: any stride */
  assert_false(l.contiguous);
  check(&l);
  l = make(3, 1, (uint64_t[]){1, 3, 4}, (uint64_t[]){999, 4, 1}); /* dense despite the odd outer stride */
  assert_true(l.contiguous);
  check(&l);
  /* rank 0: plain bytes. */
  memset(&l, 0, sizeof l);
  l.elem_size = 1;
  l.bytes = l.extent = 37;
  l.contiguous = 1;
  check(&l);
}

static void random_layouts(void **state) {
  (void)state;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  static const uint32_t sizes[] = {1, 2, 4, 8, 3, 12};
  for (int c = 0; c < 3000; c++) {
    uint64_t shape[RUDA_MAX_RANK], strides[RUDA_MAX_RANK];
    uint32_t rank = 1 + (uint32_t)(rnd(&seed) % RUDA_MAX_RANK);
    uint32_t es = sizes[rnd(&seed) % 6];
    for (uint32_t i = 0; i < rank; i++) shape[i] = 1 + rnd(&seed) % (rank > 4 ? 3 : 6);
    /* A random permutation of the dims gets row-major strides with
     * random padding: covers transposes and gaps, never overlaps. */
    uint32_t perm[RUDA_MAX_RANK];
    for (uint32_t i = 0; i < rank; i++) perm[i] = i;
    if (rnd(&seed) % 3 == 0)
      for (uint32_t i = rank - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd(&seed) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
    uint64_t stride = 1 + (rnd(&seed) % 4 == 0 ? rnd(&seed) % 3 : 0);
    for (int i = (int)rank - 1; i >= 0; i--) {
      strides[perm[i]] = stride;
      stride = stride * shape[perm[i]] + (rnd(&seed) % 2 ? rnd(&seed) % 3 : 0);
    }
    ruda__layout l = make(rank, es, shape, strides);
    check(&l);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fixed_layouts),
      cmocka_unit_test(random_layouts),
  };
  return test_main("unit_strided", tests, sizeof tests / sizeof tests[0], argc, argv);
}

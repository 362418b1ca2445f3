/* gpu_staging_arena.c - the page-locked staging arena (staging/arena.c)
 * over a stand-in provider (mmap), so it runs anywhere: blocks come from
 * provider chunks, the limit turns into pageable fallbacks, usage figures
 * are exact, concurrent users never share bytes, and destroy returns every
 * chunk. Freed small blocks are kept for the next allocation of their size
 * (staging/cache.c). The parallel staging helper is checked here too. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "staging/staging.h"
#include "staging/cache.h"
#include "base/error.h"

typedef struct provider {
  _Atomic int allocs, frees, refuse;
  _Atomic int allocs_by_test; /* calls made on the thread that made the arena */
  pthread_t test;
  _Atomic uint64_t bytes;
  struct {
    void *p;
    size_t n;
  } live[256];
  pthread_mutex_t lock;
} provider;

static void *prov_alloc(void *ctx, size_t n) {
  provider *pv = ctx;
  if (atomic_load(&pv->refuse)) return NULL;
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  pthread_mutex_lock(&pv->lock);
  for (int i = 0; i < 256; i++)
    if (pv->live[i].p == NULL) {
      pv->live[i].p = p;
      pv->live[i].n = n;
      break;
    }
  pthread_mutex_unlock(&pv->lock);
  atomic_fetch_add(&pv->allocs, 1);
  if (pthread_equal(pthread_self(), pv->test)) atomic_fetch_add(&pv->allocs_by_test, 1);
  atomic_fetch_add(&pv->bytes, n);
  return p;
}

static void prov_free(void *ctx, void *p) {
  provider *pv = ctx;
  pthread_mutex_lock(&pv->lock);
  for (int i = 0; i < 256; i++)
    if (pv->live[i].p == p) {
      munmap(p, pv->live[i].n);
      atomic_fetch_sub(&pv->bytes, pv->live[i].n);
      pv->live[i].p = NULL;
      break;
    }
  pthread_mutex_unlock(&pv->lock);
  atomic_fetch_add(&pv->frees, 1);
}

static ruda__staging *make(provider *pv, size_t chunk, uint64_t limit) {
  memset(pv, 0, sizeof *pv);
  pv->test = pthread_self();
  pthread_mutex_init(&pv->lock, NULL);
  ruda__pinned_ops ops = {prov_alloc, prov_free, pv};
  ruda__staging *s = NULL;
  assert_ok(ruda__staging_create(&ops, chunk, limit, &s));
  return s;
}

static void blocks_come_from_chunks(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 4u << 20, 64u << 20);
  ruda_staging_stats st;
  const size_t sizes[] = {1, 100, 4096, 70000, 1u << 20, 3u << 20, 9u << 20};
  void *p[7];
  uint64_t sum = 0;
  for (int i = 0; i < 7; i++) {
    p[i] = ruda__staging_alloc(s, sizes[i]);
    assert_non_null(p[i]);
    assert_true(ruda__staging_pinned(s, p[i]));
    assert_true(ruda__staging_pinned(s, (char *)p[i] + sizes[i] - 1));
    memset(p[i], i + 1, sizes[i]);
    sum += sizes[i];
  }
  for (int i = 0; i < 7; i++) /* nothing overlapped */
    for (size_t k = 0; k < sizes[i]; k += 997) assert_int_equal(((unsigned char *)p[i])[k], i + 1);
  ruda__staging_usage(s, &st);
  assert_true(st.in_use_bytes >= sum);
  assert_true(st.pinned_bytes >= st.in_use_bytes);
  assert_int_equal(st.pinned_bytes, atomic_load(&pv.bytes));
  assert_int_equal(st.fallback_count, 0);
  assert_int_equal(st.limit_bytes, 64u << 20);
  for (int i = 0; i < 7; i++) ruda__staging_free(s, p[i]);
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, 0);
  assert_true(st.peak_bytes >= sum);
  /* Memory is kept and reused: the same sizes again take no new chunk. */
  int before = atomic_load(&pv.allocs);
  for (int i = 0; i < 7; i++) p[i] = ruda__staging_alloc(s, sizes[i]);
  assert_int_equal(atomic_load(&pv.allocs), before);
  for (int i = 0; i < 7; i++) ruda__staging_free(s, p[i]);
  assert_false(ruda__staging_pinned(s, &before));
  ruda__staging_free(s, NULL);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.frees), atomic_load(&pv.allocs));
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

static void limit_turns_into_fallbacks(void **state) {
  (void)state;
  provider pv;
  /* jemalloc asks for extents somewhat larger than the blocks (size
   * classes, its metadata), so the limit leaves room. */
  ruda__staging *s = make(&pv, 4u << 20, 32u << 20);
  void *big = ruda__staging_alloc(s, 8u << 20);
  assert_true(ruda__staging_pinned(s, big));
  void *over = ruda__staging_alloc(s, 24u << 20); /* would pass 32 MiB */
  assert_non_null(over);
  assert_false(ruda__staging_pinned(s, over));
  memset(over, 7, 24u << 20);
  ruda_staging_stats st;
  ruda__staging_usage(s, &st);
  assert_true(st.pinned_bytes <= 32u << 20);
  assert_int_equal(st.fallback_count, 1);
  assert_true(st.fallback_bytes >= 24u << 20);
  ruda__staging_free(s, over);
  ruda__staging_usage(s, &st);
  assert_int_equal(st.fallback_bytes, 0);
  /* A provider that refuses also falls back. */
  atomic_store(&pv.refuse, 1);
  void *r = ruda__staging_alloc(s, 10u << 20);
  assert_non_null(r);
  assert_false(ruda__staging_pinned(s, r));
  ruda__staging_free(s, r);
  ruda__staging_free(s, big);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

typedef struct churn_arg {
  ruda__staging *s;
  unsigned seed;
  int bad;
} churn_arg;

static void *churn(void *p) {
  churn_arg *a = p;
  void *held[16] = {0};
  size_t len[16] = {0};
  const unsigned char tag = (unsigned char)(a->seed & 0xff);
  for (int i = 0; i < 3000; i++) {
    int k = rand_r(&a->seed) % 16;
    if (held[k]) {
      for (size_t j = 0; j < len[k]; j += 61)
        if (((unsigned char *)held[k])[j] != tag) a->bad = 1;
      ruda__staging_free(a->s, held[k]);
      held[k] = NULL;
    } else {
      len[k] = 1 + (size_t)(rand_r(&a->seed) % (rand_r(&a->seed) % 8 == 0 ? (2u << 20) : 20000));
      held[k] = ruda__staging_alloc(a->s, len[k]);
      if (held[k] == NULL) a->bad = 1;
      else memset(held[k], tag, len[k]);
    }
  }
  for (int k = 0; k < 16; k++) ruda__staging_free(a->s, held[k]);
  return NULL;
}

static void concurrent_users_never_share_bytes(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 8u << 20, 0);
  enum { T = 8 };
  pthread_t t[T];
  churn_arg a[T];
  for (int i = 0; i < T; i++) {
    a[i] = (churn_arg){s, 0x1000u + (unsigned)i * 77u, 0};
    assert_int_equal(pthread_create(&t[i], NULL, churn, &a[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(a[i].bad, 0);
  ruda_staging_stats st;
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, 0);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}


/* A freed block serves the next allocation of its size class on the same
 * thread; other sizes and blocks over the cache's limit do not stay; a
 * stripe full of one size lets its oldest go for another size; usage
 * figures count a kept block as free. */
static void freed_blocks_serve_the_next_of_their_size(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 4u << 20, 0);
  void *a = ruda__staging_alloc(s, 65536);
  assert_true(ruda__staging_pinned(s, a));
  ruda__staging_free(s, a);
  ruda_staging_stats st;
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, 0);
  void *b = ruda__staging_alloc(s, 65536);
  assert_ptr_equal(b, a);
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, ruda__staging_size(s, b));
  void *c = ruda__staging_alloc(s, 65536); /* b is held: another block */
  assert_ptr_not_equal(c, b);
  memset(b, 1, 65536);
  memset(c, 2, 65536);
  assert_int_equal(((unsigned char *)b)[65535], 1);
  ruda__staging_free(s, c);
  ruda__staging_free(s, b);
  /* The newest of a size comes back first. */
  assert_ptr_equal(ruda__staging_alloc(s, 65536), b);
  assert_ptr_equal(ruda__staging_alloc(s, 65536), c);
  ruda__staging_free(s, b);
  ruda__staging_free(s, c);
  /* Eight blocks of another size push the 64 KiB ones out of the stripe:
   * the next 64 KiB block is not one of them kept, but the arena's. */
  void *small[RUDA__CACHE_SLOTS];
  for (unsigned i = 0; i < RUDA__CACHE_SLOTS; i++) small[i] = ruda__staging_alloc(s, 1000);
  for (unsigned i = 0; i < RUDA__CACHE_SLOTS; i++) ruda__staging_free(s, small[i]);
  for (unsigned i = RUDA__CACHE_SLOTS; i-- > 0;) assert_ptr_equal(ruda__staging_alloc(s, 1000), small[i]);
  for (unsigned i = 0; i < RUDA__CACHE_SLOTS; i++) ruda__staging_free(s, small[i]);
  /* A block over the cache's limit goes back to the arena at once. */
  void *big = ruda__staging_alloc(s, RUDA__CACHE_MAX_BLOCK * 2);
  ruda__staging_free(s, big);
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, 0);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

/* Another thread has its own stripe: a block one thread freed is not
 * handed to the next thread's allocation of the same size while the first
 * one's stripe keeps it. */
static void *alloc_64k(void *p) {
  void *b = ruda__staging_alloc(p, 65536);
  ruda__staging_free(p, b); /* kept in that thread's stripe */
  return b;
}

static void threads_keep_to_their_own_stripe(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 4u << 20, 0);
  void *a = ruda__staging_alloc(s, 65536);
  ruda__staging_free(s, a); /* kept in this thread's stripe */
  pthread_t t;
  void *other = NULL;
  assert_int_equal(pthread_create(&t, NULL, alloc_64k, s), 0);
  pthread_join(t, &other);
  assert_non_null(other);
  assert_ptr_not_equal(other, a);
  assert_ptr_equal(ruda__staging_alloc(s, 65536), a);
  ruda__staging_free(s, a);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

/* A block returned by address (ruda__staging_free_addr) comes back to the
 * next allocation after it (ruda__staging_alloc_after) whichever thread
 * freed it, as a stream's write block taken by a client and retired by a
 * worker does; two users, each after its own previous block, keep theirs;
 * an allocation with no previous block is served too. */
typedef struct addr_arg {
  ruda__staging *s;
  void *p;
} addr_arg;

static void *free_addr(void *p) {
  addr_arg *a = p;
  ruda__staging_free_addr(a->s, a->p);
  return NULL;
}

static void blocks_freed_by_address_come_back_after_themselves(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 4u << 20, 0);
  void *mine = ruda__staging_alloc_after(s, 65536, NULL), *theirs = ruda__staging_alloc_after(s, 65536, NULL);
  assert_true(ruda__staging_pinned(s, mine) && ruda__staging_pinned(s, theirs));
  assert_ptr_not_equal(mine, theirs);
  for (int round = 0; round < 4; round++) {
    addr_arg a = {s, mine}, b = {s, theirs};
    pthread_t t, u;
    assert_int_equal(pthread_create(&t, NULL, free_addr, &a), 0); /* a worker retires them */
    assert_int_equal(pthread_create(&u, NULL, free_addr, &b), 0);
    pthread_join(t, NULL);
    pthread_join(u, NULL);
    /* The other user first: it still gets its own block back. */
    void *t2 = ruda__staging_alloc_after(s, 65536, theirs), *m2 = ruda__staging_alloc_after(s, 65536, mine);
    assert_ptr_equal(t2, theirs);
    assert_ptr_equal(m2, mine);
  }
  ruda__staging_free_addr(s, mine);
  ruda__staging_free_addr(s, theirs);
  ruda_staging_stats st;
  ruda__staging_usage(s, &st);
  assert_int_equal(st.in_use_bytes, 0);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

/* A growing arena takes each chunk after its first from the grower
 * thread, made ahead, not from the allocating thread (whose provider call
 * page-locks a chunk under the driver's lock every thread needs): jemalloc
 * asks for extents that fit the spare chunk. Allocations here come slowly
 * enough for the grower to keep ahead. */
static void growth_takes_chunks_made_ahead(void **state) {
  (void)state;
  provider pv;
  ruda__staging *s = make(&pv, 4u << 20, 0);
  enum { N = 640 }; /* 40 MiB of 64 KiB blocks: ten chunks */
  void **held = calloc(N, sizeof *held);
  for (int i = 0; i < N; i++) {
    held[i] = ruda__staging_alloc(s, 65536);
    assert_true(ruda__staging_pinned(s, held[i]));
    if (i % 16 == 15) usleep(10000); /* 1 MiB at a time: the grower keeps up */
  }
  assert_true(atomic_load(&pv.allocs) >= 10);
  /* The first, and one more where a loaded machine kept the grower from
   * running for a while. */
  if (atomic_load(&pv.allocs_by_test) > 2)
    fail_msg("the allocating thread page-locked %d of %d chunks itself (only the first should be)",
             atomic_load(&pv.allocs_by_test), atomic_load(&pv.allocs));
  for (int i = 0; i < N; i++) ruda__staging_free(s, held[i]);
  free(held);
  ruda__staging_destroy(s);
  assert_int_equal(atomic_load(&pv.bytes), 0);
}

typedef struct par_arg {
  _Atomic int hits[1000];
  size_t fail_at;
} par_arg;

static int piece(void *p, size_t i) {
  par_arg *a = p;
  atomic_fetch_add(&a->hits[i], 1);
  if (i == a->fail_at) return ruda__fail(RUDA_ENOMEM, "piece %zu failed on purpose", i);
  /* A piece takes a while, as a copy does: with many helpers and instant
   * pieces, all of them could start before the failure is seen. */
  if (a->fail_at != SIZE_MAX) usleep(50);
  return 0;
}

static void parallel_pieces_run_once_each(void **state) {
  (void)state;
  par_arg *a = calloc(1, sizeof *a);
  a->fail_at = SIZE_MAX;
  assert_ok(ruda__staging_parallel(1000, piece, a));
  for (int i = 0; i < 1000; i++) assert_int_equal(atomic_load(&a->hits[i]), 1);
  /* A failure is reported, with its message, and stops later pieces. */
  memset(a, 0, sizeof *a);
  a->fail_at = 10;
  assert_rc(ruda__staging_parallel(1000, piece, a), RUDA_ENOMEM);
  assert_last_error_contains("piece 10 failed on purpose");
  int ran = 0;
  for (int i = 0; i < 1000; i++) {
    assert_true(atomic_load(&a->hits[i]) <= 1);
    ran += atomic_load(&a->hits[i]);
  }
  assert_true(ran < 1000);
  assert_ok(ruda__staging_parallel(0, piece, a));
  free(a);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(blocks_come_from_chunks),
      cmocka_unit_test(limit_turns_into_fallbacks),
      cmocka_unit_test(concurrent_users_never_share_bytes),
      cmocka_unit_test(freed_blocks_serve_the_next_of_their_size),
      cmocka_unit_test(threads_keep_to_their_own_stripe),
      cmocka_unit_test(blocks_freed_by_address_come_back_after_themselves),
      cmocka_unit_test(growth_takes_chunks_made_ahead),
      cmocka_unit_test(parallel_pieces_run_once_each),
  };
  return test_main("gpu_staging_arena", tests, sizeof tests / sizeof tests[0], argc, argv);
}

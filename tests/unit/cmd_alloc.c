/* cmd_pool.c - command memory: blocks carved from growing slabs, freed by
 * another thread and recycled by their owner, caches adopted by the next
 * thread after their owner exits, and the sizes that skip the pool. */
#include <pthread.h>
#include <stdint.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#if defined(__SANITIZE_ADDRESS__)
#define POOLED 0 /* AddressSanitizer builds keep plain malloc */
#else
#define POOLED 1
#endif

enum { N = 5000 }; /* several slabs' worth */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return (x > y) - (x < y);
}

static int member(void *const *sorted, size_t n, void *p) {
  return bsearch(&p, sorted, n, sizeof *sorted, cmp_ptr) != NULL;
}

typedef struct batch {
  ruda__cmd **cmds;
  size_t n;
} batch;

/* Frees a batch as a worker would: on a thread that does not own it. */
static void *free_all(void *arg) {
  batch *b = arg;
  for (size_t i = 0; i < b->n; i++) ruda__cmd_free(b->cmds[i]);
  return NULL;
}

static void free_elsewhere(ruda__cmd **cmds, size_t n) {
  batch b = {cmds, n};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, free_all, &b), 0);
  pthread_join(t, NULL);
}

static void alloc_n(ruda__cmd **cmds, size_t n, size_t extra) {
  for (size_t i = 0; i < n; i++) {
    cmds[i] = ruda__cmd_alloc(extra);
    assert_non_null(cmds[i]);
    memset(ruda__cmd_extra(cmds[i]), 0xab, extra); /* the whole block is ours */
    cmds[i]->seq = i;
  }
}

static void blocks_are_distinct_and_recycled(void **state) {
  (void)state;
  static ruda__cmd *first[N], *again[N];
  for (size_t extra = 0; extra <= 1024; extra += 1024) { /* both classes */
    alloc_n(first, N, extra);
    for (size_t i = 0; i < N; i++) {
      assert_int_equal(first[i]->seq, i);
      if (POOLED) assert_int_equal((uintptr_t)first[i] % 64, 16); /* blocks are line aligned */
    }
    qsort(first, N, sizeof *first, cmp_ptr);
    for (size_t i = 1; i < N; i++) assert_true(first[i - 1] != first[i]);
    free_elsewhere(first, N);
    /* Everything came home (in chains of 64, plus the stragglers the
     * freeing thread flushed at its exit): the same blocks again. */
    alloc_n(again, N, extra);
    for (size_t i = 0; POOLED && i < N; i++) assert_true(member((void *const *)first, N, again[i]));
    free_elsewhere(again, N);
  }
}

static void oversized_and_owner_freed(void **state) {
  (void)state;
  ruda__cmd *big = ruda__cmd_alloc(100000); /* beyond every class: malloc */
  assert_non_null(big);
  memset(ruda__cmd_extra(big), 1, 100000);
  ruda__cmd_free(big);
  assert_null(ruda__cmd_alloc(SIZE_MAX - 8)); /* overflow refused, not wrapped */
  /* Freed by its own thread (a call that failed after allocating). */
  ruda__cmd *c = ruda__cmd_alloc(8);
  ruda__cmd_free(c);
  ruda__cmd *d = ruda__cmd_alloc(8);
  if (POOLED) assert_ptr_equal(c, d);
  ruda__cmd_free(d);
}

static ruda__cmd *leftover[N];

/* Off the main thread: allocations without cmocka; a NULL block is
 * reported back (a non-NULL return) and asserted by the main thread. */
static void *alloc_off_main(ruda__cmd **cmds) {
  for (size_t i = 0; i < N; i++)
    if ((cmds[i] = ruda__cmd_alloc(0)) == NULL) return (void *)1;
  return NULL;
}

static void *alloc_and_exit(void *arg) {
  (void)arg;
  return alloc_off_main(leftover); /* exits with every block in flight */
}

static void *alloc_again(void *arg) { return alloc_off_main(arg); }

static void exited_thread_cache_is_adopted(void **state) {
  (void)state;
  pthread_t t;
  void *failed = NULL;
  assert_int_equal(pthread_create(&t, NULL, alloc_and_exit, NULL), 0);
  pthread_join(t, &failed);
  assert_null(failed);
  free_elsewhere(leftover, N); /* late remote frees land in the idle cache */
  qsort(leftover, N, sizeof *leftover, cmp_ptr);
  static ruda__cmd *next[N];
  assert_int_equal(pthread_create(&t, NULL, alloc_again, next), 0);
  pthread_join(t, &failed);
  assert_null(failed);
  /* The next new thread took the idle cache, blocks and all. */
  for (size_t i = 0; POOLED && i < N; i++) assert_true(member((void *const *)leftover, N, next[i]));
  free_elsewhere(next, N);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(blocks_are_distinct_and_recycled),
      cmocka_unit_test(oversized_and_owner_freed),
      cmocka_unit_test(exited_thread_cache_is_adopted),
  };
  return test_main("unit_cmd_pool", tests, sizeof tests / sizeof tests[0], argc, argv);
}

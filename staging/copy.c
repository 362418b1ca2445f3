/* copy.c - a small helper pool that fills staging in parallel.
 *
 * One thread copying pageable memory into page-locked memory moves about
 * 10 GB/s; the DMA engine reads it several times faster. Large writes are
 * therefore cut into pieces that the calling thread and a few helpers copy
 * at once, each piece pushed to the stream as soon as it is staged, so the
 * copies of later pieces overlap the DMA of earlier ones.
 *
 * Jobs are on their caller's stack. A helper takes a reference under the
 * pool lock before touching one; the caller unlinks its job and waits for
 * the references to drop before returning, so no helper outlives a job.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "staging/staging.h"

typedef struct job {
  struct job *next;
  size_t n;
  _Atomic size_t cursor;
  int (*fn)(void *, size_t);
  void *arg;
  int refs;   /* helpers inside, under pool.lock */
  int failed; /* first failure's code, under pool.lock */
  ruda_error err;
} job;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  pthread_cond_t work, done;
  job *jobs;
  unsigned helpers;
} pool = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, NULL, 0};

static void record_failure(job *j, int rc) {
  pthread_mutex_lock(&pool.lock);
  if (j->failed == 0) {
    j->failed = rc;
    j->err = *ruda_last_error(); /* the message lives in this thread's slot */
  }
  pthread_mutex_unlock(&pool.lock);
  /* Stop handing out pieces. */
  atomic_store_explicit(&j->cursor, j->n, memory_order_relaxed);
}

static void run(job *j) {
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&j->cursor, 1, memory_order_relaxed);
    if (i >= j->n) return;
    int rc = j->fn(j->arg, i);
    if (rc != 0) record_failure(j, rc);
  }
}

static void *helper_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    job *j = pool.jobs;
    while (j != NULL && atomic_load_explicit(&j->cursor, memory_order_relaxed) >= j->n) j = j->next;
    if (j == NULL) {
      pthread_cond_wait(&pool.work, &pool.lock);
      continue;
    }
    j->refs++;
    pthread_mutex_unlock(&pool.lock);
    run(j);
    pthread_mutex_lock(&pool.lock);
    if (--j->refs == 0) pthread_cond_broadcast(&pool.done);
  }
  return NULL;
}

static void pool_start(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned want = ncpu >= 16 ? 5 : ncpu >= 8 ? 3 : ncpu >= 4 ? 1 : 0;
  const char *v = getenv("RUDA_COPY_THREADS");
  if (v != NULL && *v != '\0') {
    char *end;
    unsigned long x = strtoul(v, &end, 10);
    if (*end == '\0' && x <= 64) want = (unsigned)x;
  }
  for (unsigned i = 0; i < want; i++) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, helper_main, NULL) == 0) {
      pthread_setname_np(t, "ruda-copy");
      pool.helpers++;
    }
    pthread_attr_destroy(&a);
  }
}

unsigned ruda__staging_helpers(void) {
  pthread_once(&pool.once, pool_start);
  return pool.helpers;
}

int ruda__staging_parallel(size_t n, int (*fn)(void *arg, size_t i), void *arg) {
  if (n == 0) return 0;
  job j;
  memset(&j, 0, sizeof j);
  j.n = n;
  atomic_init(&j.cursor, 0);
  j.fn = fn;
  j.arg = arg;
  if (n == 1 || ruda__staging_helpers() == 0) {
    run(&j);
  } else {
    pthread_mutex_lock(&pool.lock);
    j.next = pool.jobs;
    pool.jobs = &j;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.lock);
    run(&j);
    pthread_mutex_lock(&pool.lock);
    job **pp = &pool.jobs;
    while (*pp != &j) pp = &(*pp)->next;
    *pp = j.next;
    while (j.refs > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
  }
  if (j.failed != 0) return ruda__fail_backend(j.failed, j.err.backend_code, "%s", j.err.msg);
  return 0;
}

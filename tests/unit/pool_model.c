/* pool_model.c - randomized allocation from several threads, checked
 * against a model.
 *
 * Each thread drives its own stream: it creates buffers of mixed sizes,
 * tags them with writes, uses some on another stream (so they carry
 * foreign users), hands some to other threads to free on their streams,
 * and frees the rest after reading their tags back. Invariants:
 *  - no two live buffers ever overlap (checked at every allocation);
 *  - every buffer reads back its own tags (memory reused too early would
 *    show another buffer's);
 *  - at checkpoints, with every stream quiet, each stream's usage figures
 *    equal the model's exactly (buffers homed there, bytes requested);
 *  - at the end, everything freed and cleaned up, nothing is reserved.
 * RUDA_POOL_MODEL_OPS sets the operations per thread. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define T 4
#define MAX_LIVE 64
#define MAILBOX 16
#define CHECK_EVERY 2500

typedef struct buf {
  ruda_handle h;
  uint64_t addr, size;
  uint64_t tag;
  uint32_t home;
} buf;

static ruda_device *dev;
static pthread_barrier_t barrier;
static int ops_per_thread = 12000;

/* Live intervals of every thread, for the overlap check. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static buf all_live[T * MAX_LIVE + MAILBOX + 8];
static int nall;

/* Buffers handed between threads, freed by whoever takes them. */
static pthread_mutex_t mail_lock = PTHREAD_MUTEX_INITIALIZER;
static buf mailbox[MAILBOX];
static int nmail;

/* The model: per home stream, live buffers and bytes. */
static _Atomic int64_t model_n[T], model_bytes[T];
static _Atomic int failures;

#define CHECK(cond, ...)                              \
  do {                                               \
    if (!(cond)) {                                   \
      fprintf(stderr, "model: " __VA_ARGS__);        \
      fprintf(stderr, "\n");                         \
      atomic_fetch_add(&failures, 1);                \
    }                                                \
  } while (0)

static int touch_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  volatile const unsigned char *p = args[0];
  unsigned char x = p[0];
  (void)x;
  return 0;
}

static uint64_t rnd(unsigned *seed) { return ((uint64_t)rand_r(seed) << 31) ^ (uint64_t)rand_r(seed); }

static uint64_t pick_size(unsigned *seed) {
  uint64_t r = rnd(seed) % 100, x = rnd(seed);
  if (r < 60) return 1 + x % (4 << 10);
  if (r < 85) return (4 << 10) + x % (252 << 10);
  if (r < 97) return (256 << 10) + x % (1792 << 10);
  return (2 << 20) + x % (14 << 20);
}

static void live_add(const buf *b) {
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < nall; i++) {
    const buf *o = &all_live[i];
    CHECK(b->addr + b->size <= o->addr || o->addr + o->size <= b->addr,
          "buffer [%#llx, +%llu) overlaps live [%#llx, +%llu)", (unsigned long long)b->addr,
          (unsigned long long)b->size, (unsigned long long)o->addr, (unsigned long long)o->size);
  }
  all_live[nall++] = *b;
  pthread_mutex_unlock(&live_lock);
}

static void live_remove(const buf *b) {
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < nall; i++)
    if (all_live[i].h.slot == b->h.slot && all_live[i].h.gen == b->h.gen) {
      all_live[i] = all_live[--nall];
      break;
    }
  pthread_mutex_unlock(&live_lock);
}

static void write_tag(ruda_stream_id s, const buf *b) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(b->h, 0, b->size < 8 ? b->size : 8));
  CHECK(ruda_write(dev, s, &d, &b->tag, b->size < 8 ? b->size : 8) == 0, "write: %s",
        ruda_error_message(ruda_last_error()));
  if (b->size >= 16) {
    uint64_t t = ~b->tag;
    d = ruda_copy_contiguous(ruda_bind_range(b->h, b->size - 8, 8));
    CHECK(ruda_write(dev, s, &d, &t, 8) == 0, "write: %s", ruda_error_message(ruda_last_error()));
  }
}

static void check_tag(ruda_stream_id s, const buf *b) {
  uint64_t head = 0, tail = 0, n = b->size < 8 ? b->size : 8;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(b->h, 0, n));
  ruda_future *f;
  CHECK(ruda_read(dev, s, &d, &head, n, &f) == 0, "read");
  CHECK(ruda_future_wait(f, NULL) == 0, "read wait");
  ruda_future_free(f);
  uint64_t mask = n == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * n)) - 1;
  CHECK((head & mask) == (b->tag & mask), "buffer {%u,%u}: head tag %llx, expected %llx", b->h.slot,
        b->h.gen, (unsigned long long)head, (unsigned long long)b->tag);
  if (b->size >= 16) {
    d = ruda_copy_contiguous(ruda_bind_range(b->h, b->size - 8, 8));
    CHECK(ruda_read(dev, s, &d, &tail, 8, &f) == 0, "read");
    CHECK(ruda_future_wait(f, NULL) == 0, "read wait");
    ruda_future_free(f);
    CHECK(tail == ~b->tag, "buffer {%u,%u}: tail tag %llx, expected %llx", b->h.slot, b->h.gen,
          (unsigned long long)tail, (unsigned long long)~b->tag);
  }
}

static void free_buf(ruda_stream_id s, const buf *b) {
  live_remove(b);
  CHECK(ruda_buffer_free(dev, s, b->h) == 0, "free: %s", ruda_error_message(ruda_last_error()));
  atomic_fetch_sub(&model_n[b->home], 1);
  atomic_fetch_sub(&model_bytes[b->home], (int64_t)b->size);
}

/* With every thread parked: quiet the streams, then compare. */
static void checkpoint(void) {
  /* Twice: frees retired by the first round's commands issue fences
   * that the second round runs. */
  for (int round = 0; round < 2; round++)
    for (ruda_stream_id s = 0; s < T; s++) CHECK(ruda_sync(dev, s, NULL) == 0, "sync");
  for (ruda_stream_id s = 0; s < T; s++) {
    ruda_memory_stats u;
    CHECK(ruda_memory_usage(dev, s, &u) == 0, "usage");
    CHECK((int64_t)u.nallocs == atomic_load(&model_n[s]), "stream %llu: %llu buffers, model %lld",
          (unsigned long long)s, (unsigned long long)u.nallocs, (long long)atomic_load(&model_n[s]));
    CHECK((int64_t)u.bytes_in_use == atomic_load(&model_bytes[s]), "stream %llu: %llu bytes, model %lld",
          (unsigned long long)s, (unsigned long long)u.bytes_in_use,
          (long long)atomic_load(&model_bytes[s]));
    CHECK(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding, "reserved below use");
    CHECK(u.peak_in_use >= u.bytes_in_use, "peak below use");
  }
}

static void *run(void *arg) {
  const uint32_t me = (uint32_t)(uintptr_t)arg;
  const ruda_stream_id s = me;
  unsigned seed = 0x5eed0000u + me;
  buf live[MAX_LIVE];
  int n = 0;
  uint64_t seq = 0;
  for (int op = 1; op <= ops_per_thread; op++) {
    uint64_t r = rnd(&seed) % 100;
    if (n < MAX_LIVE && (r < 45 || n == 0)) {
      buf b = {.size = pick_size(&seed), .home = me, .tag = ((uint64_t)me << 56) | ++seq};
      int rc = ruda_buffer_create(dev, s, b.size, &b.h);
      CHECK(rc == 0, "create %llu: %s", (unsigned long long)b.size, ruda_error_message(ruda_last_error()));
      if (rc != 0) continue;
      uint64_t size;
      CHECK(ruda__handles_pin(&dev->handles, b.h, &b.addr, &size) == 0 && size == b.size, "pin");
      ruda__handles_unpin(&dev->handles, b.h.slot, NULL);
      atomic_fetch_add(&model_n[me], 1);
      atomic_fetch_add(&model_bytes[me], (int64_t)b.size);
      live_add(&b);
      write_tag(s, &b);
      live[n++] = b;
    } else if (r < 80 || n == MAX_LIVE) {
      int i = (int)(rnd(&seed) % (uint64_t)n);
      if (rnd(&seed) % 4 == 0) check_tag(s, &live[i]);
      free_buf(s, &live[i]);
      live[i] = live[--n];
    } else if (r < 90) {
      /* Used on the next stream: a foreign user for record-stream. The
       * sync orders the tag writes before the foreign read, so a race a
       * sanitizer finds there is memory reused too early. */
      int i = (int)(rnd(&seed) % (uint64_t)n);
      CHECK(ruda_sync(dev, s, NULL) == 0, "sync");
      ruda_arg a = ruda_arg_buffer(ruda_bind(live[i].h));
      CHECK(test_launch(dev, (s + 1) % T, "touch", &a, 1) == 0, "launch: %s",
            ruda_error_message(ruda_last_error()));
    } else {
      /* Hand one over, or free one handed over by another thread. */
      buf got;
      int have = 0, post = 0;
      pthread_mutex_lock(&mail_lock);
      if (nmail > 0 && rnd(&seed) % 2) {
        got = mailbox[--nmail];
        have = 1;
      } else {
        post = nmail < MAILBOX;
      }
      pthread_mutex_unlock(&mail_lock);
      if (post) {
        /* Another stream reads it next, so its tag writes must have run
         * first: ruda orders frees across streams, not writes. */
        CHECK(ruda_sync(dev, s, NULL) == 0, "sync");
        int i = (int)(rnd(&seed) % (uint64_t)n);
        pthread_mutex_lock(&mail_lock);
        if (nmail < MAILBOX) {
          mailbox[nmail++] = live[i];
          live[i] = live[--n];
        }
        pthread_mutex_unlock(&mail_lock);
      }
      if (have) {
        if (rnd(&seed) % 2) check_tag(s, &got);
        free_buf(s, &got);
      }
    }
    if (op % CHECK_EVERY == 0) {
      pthread_barrier_wait(&barrier);
      if (me == 0) checkpoint();
      pthread_barrier_wait(&barrier);
    }
  }
  for (int i = 0; i < n; i++) {
    check_tag(s, &live[i]);
    free_buf(s, &live[i]);
  }
  return NULL;
}

static void model_check(void **state) {
  (void)state;
  const char *v = getenv("RUDA_POOL_MODEL_OPS");
  if (v != NULL && atoi(v) > 0) ops_per_thread = (atoi(v) + CHECK_EVERY - 1) / CHECK_EVERY * CHECK_EVERY;
  dev = test_open(T, 65536, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "touch", touch_kernel));
  pthread_barrier_init(&barrier, NULL, T);
  pthread_t th[T];
  for (uintptr_t i = 0; i < T; i++) assert_int_equal(pthread_create(&th[i], NULL, run, (void *)i), 0);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < nmail; i++) free_buf(0, &mailbox[i]);
  nmail = 0;
  checkpoint();
  for (int i = 0; i < T; i++) {
    assert_int_equal(atomic_load(&model_n[i]), 0);
    assert_int_equal(atomic_load(&model_bytes[i]), 0);
  }
  ruda_memory_stats d;
  for (int tries = 0;; tries++) {
    for (ruda_stream_id s = 0; s < T; s++) assert_ok(ruda_memory_cleanup(dev, s));
    assert_ok(ruda_memory_device_usage(dev, &d));
    if (d.bytes_reserved == 0 || tries == 100) break;
    for (ruda_stream_id s = 0; s < T; s++) assert_ok(ruda_sync(dev, s, NULL));
  }
  assert_int_equal(d.nallocs, 0);
  assert_int_equal(d.bytes_in_use, 0);
  assert_int_equal(d.bytes_reserved, 0);
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  assert_int_equal(atomic_load(&failures), 0);
  pthread_barrier_destroy(&barrier);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(model_check),
  };
  return test_main("unit_pool_model", tests, sizeof tests / sizeof tests[0], argc, argv);
}

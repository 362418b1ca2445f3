/* order.c - many producers, nothing lost, each producer's order kept.
 *
 *   stress_order [-p producers] [-n commands] [-s streams] [-w workers]
 *                [-q queue_bound] [-r check_every]
 *
 * Producer i launches its share of the n commands on stream i % s. Every
 * launch carries (producer, seq) as scalars and the producer's record as a
 * buffer binding; the kernel checks seq == last + 1 and counts violations,
 * as Concurrency Kit's validate/ tests do with per-producer sequence
 * numbers. Every check_every commands a producer reads its record back in
 * stream order and checks that exactly its earlier commands ran. At the end
 * every record must hold last == count - 1, executed == count, and no
 * violation; the counts must add up to n.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "common.h"

#define REC_BYTES 64

/* One producer's record, a cache line each so workers of different
 * streams never share a line. */
typedef struct record {
  int64_t last;
  uint64_t executed;
  uint64_t violations;
  uint32_t owner;
  uint32_t wrong_owner;
  uint64_t pad[4];
} record;

static struct {
  uint32_t producers, streams, workers, queue_bound;
  uint64_t commands, check_every;
} opt = {8, 1, 4, 65536, 1000000, 10000};

static ruda_device *dev;
static ruda_handle records;
static pthread_barrier_t start;

static int seq_check(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint32_t p = *(const uint32_t *)args[0];
  int64_t seq = (int64_t) * (const uint64_t *)args[1];
  record *r = args[2];
  if (r->owner != p) r->wrong_owner++;
  if (seq != r->last + 1) r->violations++;
  r->last = seq;
  r->executed++;
  return 0;
}

typedef struct producer {
  uint32_t id;
  uint64_t count;
  pthread_t thread;
  /* Failures are recorded here and asserted on the main thread: cmocka's
   * assertions must not run on other threads. */
  char failure[512];
  double seconds;
} producer;

static uint64_t share(uint32_t i) {
  return opt.commands / opt.producers + (i < opt.commands % opt.producers ? 1 : 0);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *produce(void *arg) {
  producer *pr = arg;
  const ruda_stream_id s = pr->id % opt.streams;
  const ruda_binding rec = ruda_bind_range(records, (uint64_t)pr->id * REC_BYTES, REC_BYTES);
  uint32_t id = pr->id;
  uint64_t seq = 0;
  ruda_arg args[3] = {ruda_arg_scalar(&id, sizeof id), ruda_arg_scalar(&seq, sizeof seq),
                      ruda_arg_buffer(rec)};
  ruda_launch_desc l = {.kernel = "seq_check", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = args, .nargs = 3};
  pthread_barrier_wait(&start);
  double t0 = now();
  for (seq = 0; seq < pr->count; seq++) {
    int rc = ruda_launch(dev, s, &l);
    if (rc != 0) {
      snprintf(pr->failure, sizeof pr->failure, "launch %llu: %s: %s", (unsigned long long)seq,
               ruda_err_name(rc), ruda_error_message(ruda_last_error()));
      return NULL;
    }
    if (opt.check_every && (seq + 1) % opt.check_every == 0) {
      /* Everything this producer enqueued before the read has run when
       * the read does: the record must show exactly those commands. */
      record r = {0};
      ruda_copy_desc d = ruda_copy_contiguous(rec);
      ruda_future *f = NULL;
      ruda_error *err = NULL;
      rc = ruda_read(dev, s, &d, &r, sizeof r, &f);
      if (rc == 0) rc = ruda_future_wait(f, &err);
      ruda_future_free(f);
      if (rc != 0 || r.last != (int64_t)seq || r.executed != seq + 1) {
        snprintf(pr->failure, sizeof pr->failure,
                 "read after seq %llu: rc %s (%s), last %lld, executed %llu", (unsigned long long)seq,
                 ruda_err_name(rc), err ? ruda_error_message(ruda_error_cause(err)) : "",
                 (long long)r.last, (unsigned long long)r.executed);
        ruda_error_free(err);
        return NULL;
      }
    }
  }
  pr->seconds = now() - t0;
  return NULL;
}

static void ordered_delivery(void **state) {
  (void)state;
  dev = test_open(opt.workers, opt.queue_bound, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "seq_check", seq_check));
  const size_t bytes = (size_t)opt.producers * REC_BYTES;
  assert_ok(ruda_buffer_create(dev, 0, bytes, &records));
  record *init = calloc(opt.producers, sizeof *init);
  assert_non_null(init);
  for (uint32_t i = 0; i < opt.producers; i++) {
    init[i].last = -1;
    init[i].owner = i;
  }
  /* Each stream's first command must see its records initialized: write
   * on stream 0, then sync it before any producer starts. */
  test_write(dev, 0, ruda_bind(records), init, bytes);
  assert_ok(ruda_sync(dev, 0, NULL));

  producer *prs = calloc(opt.producers, sizeof *prs);
  assert_non_null(prs);
  assert_int_equal(pthread_barrier_init(&start, NULL, opt.producers + 1), 0);
  for (uint32_t i = 0; i < opt.producers; i++) {
    prs[i].id = i;
    prs[i].count = share(i);
    assert_int_equal(pthread_create(&prs[i].thread, NULL, produce, &prs[i]), 0);
  }
  double t0 = now();
  pthread_barrier_wait(&start);
  for (uint32_t i = 0; i < opt.producers; i++) pthread_join(prs[i].thread, NULL);
  double enqueued = now() - t0;
  for (uint32_t i = 0; i < opt.producers; i++)
    if (prs[i].failure[0]) fail_msg("producer %u: %s", i, prs[i].failure);

  for (uint32_t s = 0; s < opt.streams; s++) {
    ruda_error *err = NULL;
    int rc = ruda_sync(dev, s, &err);
    if (rc != 0) {
      ruda_error_print(err, stderr, 0);
      ruda_error_free(err);
      fail_msg("sync of stream %u: %s", s, ruda_err_name(rc));
    }
  }
  double drained = now() - t0;
  test_read(dev, 0, ruda_bind(records), init, bytes);
  uint64_t total = 0;
  for (uint32_t i = 0; i < opt.producers; i++) {
    const record *r = &init[i];
    if (r->violations || r->wrong_owner || r->last != (int64_t)prs[i].count - 1 || r->executed != prs[i].count)
      fail_msg("producer %u: last %lld (want %lld), executed %llu (want %llu), %llu order violations, "
               "%u commands with another producer's record",
               i, (long long)r->last, (long long)prs[i].count - 1, (unsigned long long)r->executed,
               (unsigned long long)prs[i].count, (unsigned long long)r->violations, r->wrong_owner);
    total += r->executed;
  }
  assert_int_equal(total, opt.commands);
  printf("stress_order: %u producers, %u streams, %u workers: %llu commands enqueued in %.3f s, "
         "drained in %.3f s (%.0f commands/s)\n",
         opt.producers, opt.streams, opt.workers, (unsigned long long)opt.commands, enqueued, drained,
         (double)opt.commands / drained);
  pthread_barrier_destroy(&start);
  free(prs);
  free(init);
  assert_ok(ruda_buffer_free(dev, 0, records));
  test_close(dev);
}

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [-p producers] [-n commands] [-s streams] [-w workers] [-q queue_bound] "
          "[-r check_every]\n",
          argv0);
  exit(2);
}

static uint64_t number(const char *s, const char *argv0) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*s == '\0' || *end != '\0') usage(argv0);
  return v;
}

int main(int argc, char **argv) {
  int c;
  while ((c = getopt(argc, argv, "p:n:s:w:q:r:")) != -1) {
    switch (c) {
      case 'p': opt.producers = (uint32_t)number(optarg, argv[0]); break;
      case 'n': opt.commands = number(optarg, argv[0]); break;
      case 's': opt.streams = (uint32_t)number(optarg, argv[0]); break;
      case 'w': opt.workers = (uint32_t)number(optarg, argv[0]); break;
      case 'q': opt.queue_bound = (uint32_t)number(optarg, argv[0]); break;
      case 'r': opt.check_every = number(optarg, argv[0]); break;
      default: usage(argv[0]);
    }
  }
  if (optind != argc || opt.producers == 0 || opt.streams == 0 || opt.workers == 0 || opt.commands == 0)
    usage(argv[0]);
  const struct CMUnitTest tests[] = {cmocka_unit_test(ordered_delivery)};
  return cmocka_run_group_tests_name("stress_order", tests, NULL, NULL);
}

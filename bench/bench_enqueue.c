#define _GNU_SOURCE
/* bench_enqueue.c - what a launch costs the thread that makes it.
 *
 * Host backend, no GPU. P producer threads each launch a trivial registered
 * host kernel (grid 1x1x1, block 1x1x1, two scalar arguments and, in the
 * 1buf mode, one buffer argument) n times on their own explicit stream,
 * then call ruda_sync on it. For every call we record the caller-side
 * latency of ruda_launch; for the run we record the drain throughput,
 * commands / (last ruda_sync return - first enqueue).
 *
 * The baseline, measured in the same process, does the same work inline on
 * the calling thread: it marshals the same ruda_arg array into the
 * argument vector and context a worker would build, and calls the same C
 * kernel function directly. The difference between the two is the price of
 * not blocking: validation, pinning, building and queueing the command, and
 * the worker's wake-up, execution and unpinning running on other threads.
 * Mode ruda-call-1buf issues the same work as a library call (ruda_call:
 * a and b in its copied data, the buffer read-write).
 *
 * Burst mode (-b) holds each producer's worker back until the producer has
 * issued all n launches: the stream's first command is a gate kernel that
 * spins until the producer is done, so all n commands are in flight at
 * once and the command pool cannot recycle any of them, as in bench_gpu's
 * latency run (where the GPU worker drains 20x slower than the client
 * enqueues). The first repetition in a process meets an empty pool and
 * pays for fresh memory; later ones reuse the blocks the first grew (the
 * pool keeps them), so run `-r 1` in fresh processes to see growth.
 *
 * Latencies are read with a calibrated TSC (lfence; rdtsc ... rdtscp;
 * lfence) or CLOCK_MONOTONIC (-c mono). The cost of one clock pair is
 * measured and printed, and is included in every latency: nothing is
 * subtracted.
 */
#include <getopt.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define HAVE_TSC 1
#else
#define HAVE_TSC 0
#endif

#include "ruda/ruda.h"

#include "bench/bench_args.h"

/* ---- clocks ---- */

static int use_tsc = HAVE_TSC;
static double ns_per_tick = 1.0;

static inline uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The fences keep the measured call from starting before the first read or
 * finishing after the second; rdtscp waits for earlier instructions. */
static inline uint64_t tick_begin(void) {
#if HAVE_TSC
  if (use_tsc) {
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
  }
#endif
  return mono_ns();
}

static inline uint64_t tick_end(void) {
#if HAVE_TSC
  if (use_tsc) {
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
  }
#endif
  return mono_ns();
}

static void calibrate(void) {
  if (!use_tsc) return;
  uint64_t n0 = mono_ns(), t0 = tick_begin();
  struct timespec d = {0, 200 * 1000 * 1000};
  nanosleep(&d, NULL);
  uint64_t n1 = mono_ns(), t1 = tick_end();
  ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
}

/* ---- latency histograms ----
 * One bin per tick below LINEAR_BINS (exact), then one bin per power of two:
 * a percentile that falls there is reported as its bin's upper bound. */

#define LINEAR_BINS 65536u
#define LOG_BINS 48u

typedef struct hist {
  uint64_t bin[LINEAR_BINS + LOG_BINS];
  uint64_t count;
} hist;

static inline void hist_add(hist *h, uint64_t v) {
  if (v < LINEAR_BINS) {
    h->bin[v]++;
  } else {
    unsigned lg = 63u - (unsigned)__builtin_clzll(v); /* >= 16 */
    unsigned i = lg - 16u;
    h->bin[LINEAR_BINS + (i < LOG_BINS ? i : LOG_BINS - 1)]++;
  }
}

static void hist_merge(hist *dst, const hist *src) {
  for (size_t i = 0; i < LINEAR_BINS + LOG_BINS; i++) dst->bin[i] += src->bin[i];
  dst->count += src->count;
}

/* In ticks. */
static double hist_quantile(const hist *h, double q) {
  uint64_t total = 0;
  for (size_t i = 0; i < LINEAR_BINS + LOG_BINS; i++) total += h->bin[i];
  if (total == 0) return 0;
  uint64_t want = (uint64_t)(q * (double)total);
  if (want >= total) want = total - 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < LINEAR_BINS + LOG_BINS; i++) {
    seen += h->bin[i];
    if (seen > want) return i < LINEAR_BINS ? (double)i : (double)(2ull << (i - LINEAR_BINS + 16)) - 1;
  }
  return 0;
}

/* Median cost of one clock pair with nothing between, in ns. */
static double clock_overhead_ns(void) {
  hist *h = calloc(1, sizeof *h);
  for (int i = 0; i < 1000000; i++) {
    uint64_t a = tick_begin();
    uint64_t b = tick_end();
    hist_add(h, b - a);
  }
  double r = hist_quantile(h, 0.5) * ns_per_tick;
  free(h);
  return r;
}

/* ---- the kernels ---- */

/* acc += a * b: the result lets the run check that nothing was lost. */
static int k_buf(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t a = *(const uint64_t *)args[0];
  uint32_t b = *(const uint32_t *)args[1];
  *(uint64_t *)args[2] += a * b;
  return 0;
}

/* Burst mode: holds the worker until the flag whose address it is given
 * turns nonzero. */
static int k_gate(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  _Atomic int *flag = (_Atomic int *)(uintptr_t) * (const uint64_t *)args[0];
  while (atomic_load_explicit(flag, memory_order_acquire) == 0) __builtin_ia32_pause();
  return 0;
}

/* The same arithmetic with nowhere to store it; the empty asm keeps it. */
static int k_nobuf(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  uint64_t v = *(const uint64_t *)args[0] * *(const uint32_t *)args[1];
  __asm__ volatile("" : : "r"(v));
  return 0;
}

/* What a worker does with a launch before calling the kernel, done here on
 * the calling thread: scalars copied out of the caller's memory, buffer
 * arguments resolved to pointers, the context filled in. */
static __attribute__((noinline)) int inline_launch(ruda_host_kernel_fn fn, const ruda_launch_desc *l,
                                                   void *const *buffers) {
  unsigned char bytes[2 * RUDA_MAX_SCALAR_BYTES];
  void *argv[8];
  size_t off = 0;
  for (uint32_t i = 0; i < l->nargs; i++) {
    const ruda_arg *a = &l->args[i];
    if (a->kind == RUDA_ARG_SCALAR) {
      memcpy(bytes + off, a->data, a->size);
      argv[i] = bytes + off;
      off += (a->size + 7u) & ~7u;
    } else {
      argv[i] = (unsigned char *)buffers[i] + a->binding.offset;
    }
  }
  ruda_host_ctx ctx = {.grid_dim = l->grid, .block_dim = l->block};
  return fn(&ctx, argv);
}

/* ---- one run ---- */

/* The nopool modes run producers with RUDA_CMD_POOL=0, so their commands
 * are plain malloc blocks: the allocator before and after, in one run. */
typedef enum mode {
  MODE_INLINE_1BUF,
  MODE_INLINE_0BUF,
  MODE_RUDA_1BUF,
  MODE_RUDA_0BUF,
  MODE_RUDA_1BUF_NOPOOL,
  MODE_RUDA_0BUF_NOPOOL,
  MODE_RUDA_CALL_1BUF, /* ruda_call of a function doing k_buf's work */
  NMODES
} mode;

static const char *mode_name[NMODES] = {"inline-1buf", "inline-0buf",        "ruda-1buf",
                                        "ruda-0buf",   "ruda-1buf-nopool", "ruda-0buf-nopool",
                                        "ruda-call-1buf"};

static int mode_is_ruda(mode m) { return m >= MODE_RUDA_1BUF; }
static int mode_has_buf(mode m) {
  return m == MODE_INLINE_1BUF || m == MODE_RUDA_1BUF || m == MODE_RUDA_1BUF_NOPOOL || m == MODE_RUDA_CALL_1BUF;
}
static int mode_nopool(mode m) { return m == MODE_RUDA_1BUF_NOPOOL || m == MODE_RUDA_0BUF_NOPOOL; }

/* k_buf as a library call: a and b in the call's data. */
static int call_buf(const ruda_call_ctx *c, void *user) {
  (void)user;
  uint64_t ab[2];
  memcpy(ab, c->data, sizeof ab);
  *(uint64_t *)ruda_call_ptr(c, 0) += ab[0] * ab[1];
  return 0;
}

typedef struct producer {
  pthread_t thread;
  int index;
  mode m;
  uint64_t n;
  ruda_device *dev;
  ruda_stream_id stream;
  ruda_handle buf;     /* ruda modes */
  uint64_t *host_buf;  /* inline modes */
  uint64_t expect;     /* running value of the accumulator */
  pthread_barrier_t *go;
  hist *h;
  uint64_t t_first, t_done; /* CLOCK_MONOTONIC ns */
  _Atomic int released;       /* burst mode: the gate opens */
} producer;

#define DIE(...)                    \
  do {                              \
    fprintf(stderr, __VA_ARGS__);   \
    fputc('\n', stderr);            \
    exit(1);                        \
  } while (0)

#define CHECK(call)                                                                     \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    if (rc_ != 0) DIE("%s: %s", #call, ruda_error_message(ruda_last_error()));        \
  } while (0)

static int burst;

static void *producer_main(void *p) {
  producer *w = p;
  const uint32_t b = (uint32_t)w->index + 3; /* per-producer salt */
  const int buf = mode_has_buf(w->m), ruda = mode_is_ruda(w->m);
  void *buffers[3] = {NULL, NULL, w->host_buf};
  ruda_host_kernel_fn fn = buf ? k_buf : k_nobuf;
  hist *h = w->h;
  uint64_t expect = w->expect;

  atomic_store(&w->released, 0);
  if (ruda && burst) { /* close the gate: the worker runs nothing until the loop is done */
    uint64_t flag = (uint64_t)(uintptr_t)&w->released;
    ruda_arg garg = ruda_arg_scalar(&flag, sizeof flag);
    ruda_launch_desc g = {.kernel = "k_gate", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &garg, .nargs = 1};
    CHECK(ruda_launch(w->dev, w->stream, &g));
  }
  pthread_barrier_wait(w->go);
  w->t_first = mono_ns();
  for (uint64_t i = 0; i < w->n; i++) {
    uint64_t a = i;
    ruda_arg args[3] = {ruda_arg_scalar(&a, sizeof a), ruda_arg_scalar(&b, sizeof b),
                        ruda_arg_buffer(ruda_bind(w->buf))};
    ruda_launch_desc l = {.kernel = buf ? "k_buf" : "k_nobuf",
                          .grid = {1, 1, 1},
                          .block = {1, 1, 1},
                          .args = args,
                          .nargs = buf ? 3 : 2};
    int rc;
    uint64_t ab[2] = {a, b};
    ruda_call_desc cd = {.name = "call_buf", .fn = call_buf, .buffers = &args[2], .nbuffers = 1, .data = ab,
                         .data_size = sizeof ab};
    uint64_t t0 = tick_begin();
    if (w->m == MODE_RUDA_CALL_1BUF) rc = ruda_call(w->dev, w->stream, &cd);
    else if (ruda) rc = ruda_launch(w->dev, w->stream, &l);
    else rc = inline_launch(fn, &l, buffers);
    uint64_t t1 = tick_end();
    if (rc != 0) DIE("launch %llu failed: %s", (unsigned long long)i, ruda_error_message(ruda_last_error()));
    hist_add(h, t1 - t0);
    expect += a * b;
  }
  h->count += w->n;
  atomic_store_explicit(&w->released, 1, memory_order_release);
  if (ruda) {
    ruda_error *err = NULL;
    if (ruda_sync(w->dev, w->stream, &err) != 0) {
      ruda_error_print(err, stderr, 0);
      exit(1);
    }
  }
  w->t_done = mono_ns();
  w->expect = expect;
  return NULL;
}

typedef struct result {
  double p50_ns, p99_ns, p999_ns, cmds_per_s;
} result;

typedef struct setup {
  ruda_device *dev; /* NULL for inline modes */
  producer prod[64];
  uint64_t host_acc[64][8]; /* one cache line each, for the inline modes */
} setup;

static result run_once(setup *s, mode m, int nprod, uint64_t n) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)nprod);
  /* Read by each producer thread at its first command. */
  if (mode_nopool(m)) setenv("RUDA_CMD_POOL", "0", 1);
  else unsetenv("RUDA_CMD_POOL");
  for (int i = 0; i < nprod; i++) {
    producer *w = &s->prod[i];
    w->m = m;
    w->n = n;
    w->go = &go;
    memset(w->h, 0, sizeof *w->h);
    if (pthread_create(&w->thread, NULL, producer_main, w) != 0) DIE("pthread_create failed");
  }
  for (int i = 0; i < nprod; i++) pthread_join(s->prod[i].thread, NULL);
  pthread_barrier_destroy(&go);

  uint64_t first = UINT64_MAX, done = 0;
  for (int i = 1; i < nprod; i++) hist_merge(s->prod[0].h, s->prod[i].h);
  for (int i = 0; i < nprod; i++) {
    if (s->prod[i].t_first < first) first = s->prod[i].t_first;
    if (s->prod[i].t_done > done) done = s->prod[i].t_done;
  }
  /* Nothing lost, nothing run twice: each accumulator holds the sum the
   * producer computed itself. */
  if (mode_is_ruda(m) && mode_has_buf(m)) {
    for (int i = 0; i < nprod; i++) {
      producer *w = &s->prod[i];
      uint64_t got = 0;
      ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(w->buf));
      ruda_future *f;
      CHECK(ruda_read(s->dev, w->stream, &d, &got, sizeof got, &f));
      CHECK(ruda_future_wait(f, NULL));
      ruda_future_free(f);
      if (got != w->expect)
        DIE("producer %d: accumulator %llu, expected %llu", i, (unsigned long long)got,
            (unsigned long long)w->expect);
    }
  } else if (m == MODE_INLINE_1BUF) {
    for (int i = 0; i < nprod; i++)
      if (s->host_acc[i][0] != s->prod[i].expect) DIE("inline producer %d: wrong accumulator", i);
  }
  result r;
  r.p50_ns = hist_quantile(s->prod[0].h, 0.50) * ns_per_tick;
  r.p99_ns = hist_quantile(s->prod[0].h, 0.99) * ns_per_tick;
  r.p999_ns = hist_quantile(s->prod[0].h, 0.999) * ns_per_tick;
  r.cmds_per_s = (double)n * nprod / ((double)(done - first) * 1e-9);
  return r;
}

static void setup_open(setup *s, mode m, int nprod, uint32_t streams, uint32_t bound) {
  memset(s->host_acc, 0, sizeof s->host_acc);
  s->dev = NULL;
  if (mode_is_ruda(m)) {
    ruda_config cfg;
    ruda_config_init(&cfg);
    cfg.backend = RUDA_BACKEND_HOST;
    cfg.num_streams = streams ? streams : (uint32_t)nprod;
    if (bound) cfg.queue_bound = bound;
    CHECK(ruda_device_open(&cfg, &s->dev));
    CHECK(ruda_host_kernel_register(s->dev, "k_buf", k_buf));
    CHECK(ruda_host_kernel_register(s->dev, "k_nobuf", k_nobuf));
    CHECK(ruda_host_kernel_register(s->dev, "k_gate", k_gate));
  }
  for (int i = 0; i < nprod; i++) {
    producer *w = &s->prod[i];
    w->index = i;
    w->dev = s->dev;
    w->stream = (ruda_stream_id)i; /* explicit: stream i runs on worker i % streams */
    w->expect = 0;
    w->host_buf = s->host_acc[i];
    w->buf = (ruda_handle){0, 0};
    if (s->dev != NULL) {
      uint64_t zero = 0;
      CHECK(ruda_buffer_create(s->dev, w->stream, sizeof zero, &w->buf));
      ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(w->buf));
      CHECK(ruda_write(s->dev, w->stream, &d, &zero, sizeof zero));
      CHECK(ruda_sync(s->dev, w->stream, NULL));
    }
  }
}

static void setup_close(setup *s, int nprod) {
  if (s->dev == NULL) return;
  for (int i = 0; i < nprod; i++) CHECK(ruda_buffer_free(s->dev, s->prod[i].stream, s->prod[i].buf));
  CHECK(ruda_device_close(s->dev, NULL));
  s->dev = NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [options]\n"
          "  -p LIST    producer counts, comma-separated (default 1,2,4,8; at most 64)\n"
          "  -n N       commands per producer per run (default: sized so a run takes ~1 s)\n"
          "  -t SEC     target run length when -n is not given (default 1.0)\n"
          "  -r R       repetitions; the table shows medians (default 5)\n"
          "  -m LIST    modes (default inline-1buf,inline-0buf,ruda-1buf,ruda-0buf;\n"
          "             also ruda-1buf-nopool,ruda-0buf-nopool: commands from malloc;\n"
          "             ruda-call-1buf: ruda_call of a function doing ruda-1buf's kernel)\n"
          "  -s S       worker streams (default: one per producer)\n"
          "  -q Q       queue bound per stream (default: the library's; with -b, n + 64)\n"
          "  -b         burst: each worker is held until its producer has issued all n\n"
          "             launches, so all are in flight at once (needs -n)\n"
          "  -c CLOCK   tsc or mono (default tsc where available)\n"
          "  -o FILE    also write every repetition as CSV to FILE\n",
          argv0);
  exit(2);
}

int main(int argc, char **argv) {
  int prods[16] = {1, 2, 4, 8}, nprods = 4;
  int modes[NMODES] = {1, 1, 1, 1, 0, 0, 0};
  uint64_t n_fixed = 0;
  double target_s = 1.0;
  int reps = 5;
  uint32_t streams = 0, bound = 0;
  const char *csv_path = NULL;
  int opt;
  while ((opt = getopt(argc, argv, "p:n:t:r:m:s:q:c:o:bh")) != -1) {
    switch (opt) {
      case 'p': {
        if ((nprods = bench_int_list(optarg, 1, 64, prods, 16)) <= 0) usage(argv[0]);
        break;
      }
      case 'n': n_fixed = strtoull(optarg, NULL, 10); break;
      case 't': target_s = atof(optarg); break;
      case 'r': reps = atoi(optarg); break;
      case 'm':
        memset(modes, 0, sizeof modes);
        for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ",")) {
          int found = 0;
          for (int i = 0; i < NMODES; i++)
            if (strcmp(tok, mode_name[i]) == 0) modes[i] = found = 1;
          if (!found) usage(argv[0]);
        }
        break;
      case 's': streams = (uint32_t)atoi(optarg); break;
      case 'q': bound = (uint32_t)atoi(optarg); break;
      case 'c':
        if (strcmp(optarg, "mono") == 0) use_tsc = 0;
        else if (strcmp(optarg, "tsc") == 0 && HAVE_TSC) use_tsc = 1;
        else usage(argv[0]);
        break;
      case 'o': csv_path = optarg; break;
      case 'b': burst = 1; break;
      default: usage(argv[0]);
    }
  }
  if (reps < 1 || reps > 1000 || target_s <= 0) usage(argv[0]);
  if (burst && n_fixed == 0) usage(argv[0]);
  if (burst && bound == 0) bound = n_fixed + 64 > (1u << 30) ? 1u << 30 : (uint32_t)(n_fixed + 64);

  FILE *csv = NULL;
  if (csv_path != NULL) {
    if ((csv = fopen(csv_path, "w")) == NULL) DIE("cannot open %s", csv_path);
    fprintf(csv, "mode,producers,streams,rep,cmds_per_producer,p50_ns,p99_ns,cmds_per_s,p999_ns\n");
  }

  calibrate();
  double ovh = clock_overhead_ns();
  printf("# ruda %s, host backend; clock %s", ruda_version(), use_tsc ? "TSC" : "CLOCK_MONOTONIC");
  if (use_tsc) printf(" at %.4f GHz (calibrated against CLOCK_MONOTONIC)", 1.0 / ns_per_tick);
  printf("\n# one clock read pair costs %.1f ns (median); latencies include it, nothing is subtracted\n",
         ovh);
  printf("# kernel: grid 1x1x1, block 1x1x1, 2 scalars (u64, u32) + 0 or 1 buffer; "
         "each producer on its own explicit stream; %d repetitions, medians shown\n",
         reps);
  if (burst) printf("# burst: each worker held until its producer issued all its launches\n");
  printf("%-9s %-7s %-12s %10s %9s %9s %12s %10s %10s %10s\n", "producers", "streams", "mode", "cmds/prod",
         "p50 ns", "p99 ns", "cmds/s", "p50/inline", "thr/inline", "p99.9 ns");

  static setup s;
  for (int i = 0; i < 64; i++)
    if ((s.prod[i].h = malloc(sizeof(hist))) == NULL) DIE("out of memory");

  for (int pi = 0; pi < nprods; pi++) {
    int nprod = prods[pi];
    double inline_p50[2] = {0, 0}, inline_thr[2] = {0, 0};
    for (int m = 0; m < NMODES; m++) {
      if (!modes[m]) continue;
      setup_open(&s, (mode)m, nprod, streams, bound);
      uint64_t n = n_fixed;
      if (n == 0) { /* a pilot run sizes the real ones */
        uint64_t pilot = mode_is_ruda((mode)m) ? 20000 : 200000;
        result r = run_once(&s, (mode)m, nprod, pilot);
        double per_run = (double)pilot * nprod / r.cmds_per_s;
        n = (uint64_t)((double)pilot * target_s / per_run);
        if (n < 10000) n = 10000;
      }
      double p50[1000], p99[1000], p999[1000], thr[1000];
      for (int r = 0; r < reps; r++) {
        result res = run_once(&s, (mode)m, nprod, n);
        p50[r] = res.p50_ns;
        p99[r] = res.p99_ns;
        p999[r] = res.p999_ns;
        thr[r] = res.cmds_per_s;
        if (csv)
          fprintf(csv, "%s,%d,%u,%d,%llu,%.1f,%.1f,%.0f,%.1f\n", mode_name[m], nprod,
                  s.dev ? ruda_device_num_streams(s.dev) : 0, r, (unsigned long long)n, res.p50_ns,
                  res.p99_ns, res.cmds_per_s, res.p999_ns);
      }
      uint32_t nstreams = s.dev ? ruda_device_num_streams(s.dev) : 0;
      setup_close(&s, nprod);
      double mp50 = median(p50, reps), mp99 = median(p99, reps), mp999 = median(p999, reps), mthr = median(thr, reps);
      int b = mode_has_buf((mode)m) ? 0 : 1;
      char rel50[16] = "-", relthr[16] = "-";
      if (!mode_is_ruda((mode)m)) {
        inline_p50[b] = mp50;
        inline_thr[b] = mthr;
      } else if (inline_p50[b] > 0) {
        snprintf(rel50, sizeof rel50, "%.1fx", mp50 / inline_p50[b]);
        snprintf(relthr, sizeof relthr, "%.3fx", mthr / inline_thr[b]);
      }
      char st[16] = "-";
      if (nstreams) snprintf(st, sizeof st, "%u", nstreams);
      printf("%-9d %-7s %-12s %10llu %9.1f %9.1f %12.0f %10s %10s %10.1f\n", nprod, st, mode_name[m],
             (unsigned long long)n, mp50, mp99, mthr, rel50, relthr, mp999);
      fflush(stdout);
    }
  }
  for (int i = 0; i < 64; i++) free(s.prod[i].h);
  if (csv) fclose(csv);
  return 0;
}

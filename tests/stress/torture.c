/* torture.c - 32 threads at once on 8 workers (host backend): write ->
 * launch -> read chains with sequence numbers, frees racing the reads
 * still queued, handles of other threads freed under their feet, flush
 * and sync storms on other threads' streams, graphs replayed on several
 * streams and destroyed with replays queued, library calls (ruda_call) in
 * place of some of those kernels (with per-worker library states of eight
 * libraries registered at once), half the threads issuing in place,
 * kernels that launch on their own buffer, two graphs every thread
 * replays with patches at once (moved onto its own buffer, or onto shared
 * handles freed under its feet), every third chain on host memory adopted
 * with ruda_buffer_import (freed by its release callback, so an early
 * release is a use after free; imports and releases counted), graphs
 * captured on the own streams of threads that exit at once and replayed
 * after the reaper freed those streams, a request graph every thread
 * replays with its own staging blocks patched in and frees them while the
 * replay is queued, launches that must not wait for room (RUDA_LAUNCH_NOWAIT)
 * retried waiting when refused. Every byte read back is checked; run under ASan and
 * TSan by tools/test.sh.
 *   torture [-t threads] [-n iterations] [-a 1: automatic request graphs on] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/ruda.h"
#include "standin_lib.h"

#define WORDS 64
static int nthreads = 32, iters = 200, auto_graphs;
static ruda_device *dev;
static _Atomic int failures;
static _Atomic long imported, released;

/* Frees an adopted block: any thread, once its chain's last use is done. */
static void release_block(void *user, uint64_t addr, uint64_t bytes) {
  (void)addr, (void)bytes;
  free(user);
  atomic_fetch_add(&released, 1);
}
static _Atomic(uint64_t) shared_h[16]; /* handles any thread may use or free: slot << 32 | gen */
/* Recorded once, replayed by every thread with patches: two bumps of a
 * buffer, and a peek of one. */
static ruda_graph *bump2, *peek1;
/* Recorded once: upload a staging block into a buffer, bump it,
 * download it into another block; replayed with each thread's blocks
 * and buffer patched in. */
static ruda_graph *request;

#define FAIL(...)                                        \
  do {                                                   \
    fprintf(stderr, "torture: " __VA_ARGS__);            \
    fprintf(stderr, " (%s)\n", ruda_error_message(ruda_last_error())); \
    atomic_fetch_add(&failures, 1);                      \
  } while (0)

/* x[i] += 1 for every word. */
static int k_bump(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  uint64_t *x = a[0];
  for (int i = 0; i < WORDS; i++) x[i]++;
  return 0;
}

/* Reads every word (their sum goes nowhere the test looks). */
static _Atomic uint64_t peeked;
static int k_peek(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  const uint64_t *x = a[0];
  uint64_t s = 0;
  for (int i = 0; i < WORDS; i++) s += x[i];
  atomic_fetch_add_explicit(&peeked, s, memory_order_relaxed);
  return 0;
}

/* x[i] += 1, then issues bump(x) on the stream and buffer its scalars
 * name: a kernel calling ruda on its own buffer, which threads running
 * it in place (odd threads' streams) do with no lock of ruda's held. */
static _Atomic int nest_failures;
static int k_bump_nest(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  uint64_t *x = a[0];
  for (int i = 0; i < WORDS; i++) x[i]++;
  uint64_t hv, s;
  memcpy(&hv, a[1], 8);
  memcpy(&s, a[2], 8);
  ruda_arg n = ruda_arg_buffer(ruda_bind(((ruda_handle){(uint32_t)(hv >> 32), (uint32_t)hv})));
  ruda_launch_desc l = {.kernel = "bump", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &n, .nargs = 1};
  if (ruda_launch(dev, s, &l) != 0) atomic_fetch_add(&nest_failures, 1);
  return 0;
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* By name on odd streams, by reference (ruda_kernel_lookup) on even ones;
 * on every other pair of streams first with RUDA_LAUNCH_NOWAIT, then,
 * refused by a full queue, again waiting for room (as Python's
 * launch_gil="auto" does). */
static void launch_bump(ruda_stream_id s, ruda_handle h, int *rc) {
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  ruda_launch_desc l = {.kernel = "bump", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
  if ((s & 1) == 0 && (*rc = ruda_kernel_lookup(dev, "bump", &l.ref)) != 0) return;
  if (s & 2) {
    l.flags = RUDA_LAUNCH_NOWAIT;
    if ((*rc = ruda_launch(dev, s, &l)) != RUDA_EQUEUEFULL) return;
    l.flags = 0;
  }
  *rc = ruda_launch(dev, s, &l);
}

static void launch_peek(ruda_stream_id s, ruda_handle h, int *rc) {
  ruda_arg a = ruda_arg_in(ruda_bind(h));
  ruda_launch_desc l = {.kernel = "peek", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = &a, .nargs = 1};
  *rc = ruda_launch(dev, s, &l);
}

/* The same two as library calls, with a library's per-worker state:
 * each call checks it got its own worker's state and held the worker
 * alone (in place or not); each state is destroyed once, at close. Eight
 * libraries, registered by the first eight threads at once. */
static _Atomic uint32_t lib_ids[8];

static uint32_t lib_pick(uint64_t r) { return atomic_load(&lib_ids[r % 8]); /* 0 until registered: none */ }

static int call_bump_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if (c->library != NULL && standin_enter(c)) return 0;
  uint64_t *x = ruda_call_ptr(c, 0);
  for (int i = 0; i < WORDS; i++) x[i]++;
  if (c->library != NULL) standin_leave(c);
  return 0;
}

static int call_peek_fn(const ruda_call_ctx *c, void *user) {
  (void)user;
  if (c->library != NULL && standin_enter(c)) return 0;
  const uint64_t *x = ruda_call_ptr(c, 0);
  uint64_t s = 0;
  for (int i = 0; i < WORDS; i++) s += x[i];
  atomic_fetch_add_explicit(&peeked, s, memory_order_relaxed);
  if (c->library != NULL) standin_leave(c);
  return 0;
}

static void call_bump(ruda_stream_id s, ruda_handle h, int *rc) {
  ruda_arg a = ruda_arg_buffer(ruda_bind(h));
  ruda_call_desc d = {.name = "bump", .fn = call_bump_fn, .buffers = &a, .nbuffers = 1,
                      .library = lib_pick(s + (uint64_t)h.gen)};
  *rc = ruda_call(dev, s, &d);
}

static void call_peek(ruda_stream_id s, ruda_handle h, int *rc) {
  ruda_arg a = ruda_arg_in(ruda_bind(h));
  ruda_call_desc d = {.name = "peek", .fn = call_peek_fn, .buffers = &a, .nbuffers = 1,
                      .library = lib_pick(s + (uint64_t)h.slot)};
  *rc = ruda_call(dev, s, &d);
}

/* A short-lived thread's capture on its own stream: an upload of zeros,
 * a bump launch and a bump call of x; it syncs and exits. */
typedef struct exiting {
  ruda_handle x;
  uint64_t *zeros;
  ruda_graph *g;
  int rc;
} exiting;

static void *capture_and_exit(void *p) {
  exiting *e = p;
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(e->x));
  e->rc = ruda_graph_begin_capture(dev, RUDA_STREAM_CURRENT);
  if (e->rc == 0) e->rc = ruda_write_staged(dev, RUDA_STREAM_CURRENT, &d, e->zeros, WORDS * 8);
  if (e->rc == 0) launch_bump(RUDA_STREAM_CURRENT, e->x, &e->rc);
  if (e->rc == 0) call_bump(RUDA_STREAM_CURRENT, e->x, &e->rc);
  int rc = ruda_graph_end_capture(dev, RUDA_STREAM_CURRENT, &e->g);
  if (e->rc == 0) e->rc = rc;
  if (e->rc == 0) e->rc = ruda_sync(dev, RUDA_STREAM_CURRENT, NULL);
  return NULL;
}

static int read_words(ruda_stream_id s, ruda_handle h, uint64_t *got) {
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  ruda_future *f = NULL;
  int rc = ruda_read(dev, s, &d, got, WORDS * 8, &f);
  if (rc == 0) rc = ruda_future_wait(f, NULL);
  ruda_future_free(f);
  return rc;
}

/* Every 32nd iteration: a graph captured by a thread that exited at once,
 * replayed on my stream and a shared one after its record was reaped;
 * each replay zeroes x and bumps it twice. */
static void exited_thread_graph(uint64_t t, uint64_t *seed) {
  exiting e = {.rc = -1};
  if (ruda_buffer_create(dev, (ruda_stream_id)t, WORDS * 8, &e.x) != 0) return;
  if (ruda_staging_alloc(dev, WORDS * 8, (void **)&e.zeros) != 0) {
    ruda_buffer_free(dev, (ruda_stream_id)t, e.x);
    return;
  }
  memset(e.zeros, 0, WORDS * 8);
  pthread_t th;
  if (pthread_create(&th, NULL, capture_and_exit, &e) != 0 || pthread_join(th, NULL) != 0 || e.rc != 0) {
    FAIL("thread %llu: capture on an exiting thread's stream: %s", (unsigned long long)t, ruda_err_name(e.rc));
  } else {
    ruda_stream_ids(dev, NULL, 0); /* reaps the exited thread's stream */
    ruda_stream_ids(dev, NULL, 0);
    for (int r = 0; r < 2; r++) {
      ruda_error *err = NULL;
      const ruda_stream_id rs = r == 0 ? (ruda_stream_id)t : (uint64_t)nthreads + rng(seed) % 4;
      if (ruda_graph_run(dev, rs, e.g, &err) != 0) FAIL("thread %llu: replay of an exited thread's graph", (unsigned long long)t);
      ruda_error_free(err);
      uint64_t got[WORDS];
      if (read_words(rs, e.x, got) != 0 || got[0] != 2 || got[WORDS - 1] != 2)
        FAIL("thread %llu: an exited thread's graph left %llu, expected 2", (unsigned long long)t, (unsigned long long)got[0]);
    }
  }
  if (e.g != NULL && ruda_graph_destroy(dev, e.g) != 0) FAIL("destroy an exited thread's graph");
  ruda_staging_free(dev, e.zeros);
  ruda_buffer_free(dev, (ruda_stream_id)t, e.x);
}

/* The shared request graph moved onto my buffer and staging blocks, the
 * blocks freed while the replay is still queued (behind other threads'
 * work): the replay reads and fills them all the same. */
static void patched_blocks_freed(uint64_t t, int i) {
  ruda_handle x;
  uint64_t *in = NULL, *out = NULL;
  if (ruda_buffer_create(dev, (ruda_stream_id)t, WORDS * 8, &x) != 0) return;
  if (ruda_staging_alloc(dev, WORDS * 8, (void **)&in) != 0 || ruda_staging_alloc(dev, WORDS * 8, (void **)&out) != 0) {
    FAIL("thread %llu: staging", (unsigned long long)t);
    ruda_staging_free(dev, in);
    ruda_buffer_free(dev, (ruda_stream_id)t, x);
    return;
  }
  const uint64_t base = (t << 40) | ((uint64_t)i << 8);
  for (int w = 0; w < WORDS; w++) in[w] = base + (uint64_t)w;
  ruda_graph_patch p[5] = {
      ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(x)), ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in),
      ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(x))), ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 2, ruda_bind(x)),
      ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out)};
  ruda_future *f = NULL;
  const ruda_stream_id rs = (uint64_t)nthreads + (t + (uint64_t)i) % 4; /* a shared stream: often busy */
  int rc = ruda_graph_replay_with(dev, rs, request, p, 5, &f);
  if (rc != 0) FAIL("thread %llu: patched request: %s", (unsigned long long)t, ruda_err_name(rc));
  if (ruda_staging_free(dev, in) != 0 || ruda_staging_free(dev, out) != 0) FAIL("thread %llu: staging free", (unsigned long long)t);
  if (rc == 0) {
    if (ruda_future_wait(f, NULL) != 0) FAIL("thread %llu: patched request wait", (unsigned long long)t);
    ruda_future_free(f);
    uint64_t got[WORDS];
    if (read_words((ruda_stream_id)t, x, got) != 0) FAIL("thread %llu: patched request read", (unsigned long long)t);
    for (int w = 0; w < WORDS; w++)
      if (got[w] != base + (uint64_t)w + 1) {
        FAIL("thread %llu: patched request word %d: %llx, expected %llx", (unsigned long long)t, w,
             (unsigned long long)got[w], (unsigned long long)(base + (uint64_t)w + 1));
        break;
      }
  }
  ruda_buffer_free(dev, (ruda_stream_id)t, x);
}

static void *worker(void *p) {
  const uint64_t t = (uint64_t)(uintptr_t)p;
  const ruda_stream_id me = t;
  uint64_t seed = 0x9e3779b97f4a7c15ull * (t + 1);
  uint64_t src[WORDS], back[WORDS];
  /* Odd threads issue in place whenever their worker is idle. */
  if (ruda_stream_set_in_place(dev, me, (int)(t & 1)) != 0) FAIL("thread %llu: set_in_place", (unsigned long long)t);
  if (t < 8) { /* eight registrations at once */
    uint32_t id = 0;
    if (standin_register(dev, &id) != 0 || id < 1 || id > 8) FAIL("thread %llu: register", (unsigned long long)t);
    else atomic_store(&lib_ids[t], id);
  }
  for (int i = 0; i < iters; i++) {
    /* A chain on my stream: write (t, i), bump it twice, read it back;
     * the buffer is freed while the read is still queued. */
    ruda_handle x;
    void *block = i % 3 == 2 ? malloc(sizeof src) : NULL;
    if (block != NULL) {
      if (ruda_buffer_import(dev, me, (uint64_t)(uintptr_t)block, sizeof src, release_block, block, &x) != 0) {
        FAIL("thread %llu: import", (unsigned long long)t);
        free(block);
        continue;
      }
      atomic_fetch_add(&imported, 1);
    } else if (ruda_buffer_create(dev, me, sizeof src, &x) != 0) {
      FAIL("thread %llu: create", (unsigned long long)t);
      continue;
    }
    for (int w = 0; w < WORDS; w++) src[w] = (t << 40) | ((uint64_t)i << 8) | (uint64_t)w;
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(x));
    int rc = ruda_write(dev, me, &d, src, sizeof src);
    if (rc == 0) launch_bump(me, x, &rc);
    /* The second bump on one of four streams every thread shares (never
     * captured, so it is never recorded into someone's graph). */
    /* With -a 1, every other chain bumps twice on my stream: two launches
     * and the read that waits, a run automatic request graphs replay. */
    if (rc == 0) {
      if (auto_graphs && (i & 1)) launch_bump(me, x, &rc);
      else (rng(&seed) & 1 ? launch_bump : call_bump)((uint64_t)nthreads + rng(&seed) % 4, x, &rc);
    }
    /* Every fourth chain, a kernel that bumps x and issues one more bump
     * of it on my stream: the sync lets it run, so the read follows what
     * it issued. */
    const int nested = i % 4 == 1;
    if (rc == 0 && nested) {
      uint64_t hv = ((uint64_t)x.slot << 32) | x.gen, sv = me;
      ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(x)), ruda_arg_scalar(&hv, 8), ruda_arg_scalar(&sv, 8)};
      ruda_launch_desc l = {.kernel = "bump_nest", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = a, .nargs = 3};
      rc = ruda_launch(dev, me, &l);
      if (rc == 0) rc = ruda_sync(dev, me, NULL);
    }
    ruda_future *f = NULL;
    if (rc == 0) rc = ruda_read(dev, me, &d, back, sizeof back, &f);
    if (ruda_buffer_free(dev, me, x) != 0) FAIL("thread %llu: free", (unsigned long long)t);
    if (rc != 0) {
      FAIL("thread %llu: chain: %s", (unsigned long long)t, ruda_err_name(rc));
      continue;
    }
    if (ruda_future_wait(f, NULL) != 0) FAIL("thread %llu: read wait", (unsigned long long)t);
    ruda_future_free(f);
    const uint64_t bumps = nested ? 4 : 2;
    for (int w = 0; w < WORDS; w++)
      if (back[w] != src[w] + bumps) {
        FAIL("thread %llu iteration %d word %d: %llx, expected %llx", (unsigned long long)t, i, w,
             (unsigned long long)back[w], (unsigned long long)(src[w] + bumps));
        break;
      }
    /* Shared handles: read one, or free it and put a new one in its place.
     * Reads only: writes from several threads at once, unordered by the
     * program, are the known limitation in ruda.h (kernel arguments). */
    int k = (int)(rng(&seed) % 16);
    uint64_t hv = atomic_load(&shared_h[k]);
    ruda_handle h = {(uint32_t)(hv >> 32), (uint32_t)hv};
    if (rng(&seed) & 1) {
      /* May be freed meanwhile: refused, never corrupting. */
      (rng(&seed) & 2 ? launch_peek : call_peek)(me, h, &rc);
      if (rc != 0 && rc != RUDA_ENOTFOUND) FAIL("thread %llu: shared launch: %s", (unsigned long long)t, ruda_err_name(rc));
      /* The same through the shared graph, patched onto the handle. */
      ruda_graph_patch pp = ruda_graph_patch_arg(0, 0, ruda_arg_in(ruda_bind(h)));
      rc = ruda_graph_replay_with(dev, me, peek1, &pp, 1, NULL);
      if (rc != 0 && rc != RUDA_ENOTFOUND)
        FAIL("thread %llu: patched peek: %s", (unsigned long long)t, ruda_err_name(rc));
    } else {
      ruda_handle n;
      if (ruda_buffer_create(dev, me, sizeof src, &n) == 0) {
        uint64_t nv = ((uint64_t)n.slot << 32) | n.gen;
        if (atomic_compare_exchange_strong(&shared_h[k], &hv, nv)) {
          rc = ruda_buffer_free(dev, me, h);
          if (rc != 0 && rc != RUDA_EFREE) FAIL("thread %llu: shared free: %s", (unsigned long long)t, ruda_err_name(rc));
        } else {
          ruda_buffer_free(dev, me, n);
        }
      }
    }
    /* Storms: flush or sync another thread's stream. */
    ruda_stream_id other = rng(&seed) % (uint64_t)nthreads;
    if (rng(&seed) & 1) rc = ruda_flush(dev, other, NULL);
    else rc = ruda_sync(dev, other, NULL);
    /* A sync of a stream that is capturing is refused, as it must be. */
    if (rc != 0 && rc != RUDA_EGRAPHSTATE)
      FAIL("thread %llu: flush/sync of stream %llu: %s", (unsigned long long)t, (unsigned long long)other,
           ruda_err_name(rc));
    if (i % 32 == (int)(t % 32)) exited_thread_graph(t, &seed);
    if (i % 8 == (int)(t % 8)) patched_blocks_freed(t, i);
    /* Now and then a graph of two bumps, replayed on three streams and
     * destroyed with the replays queued. */
    if (i % 16 == (int)(t % 16)) {
      ruda_handle g;
      if (ruda_buffer_create(dev, me, sizeof src, &g) != 0) continue;
      uint64_t zero[WORDS] = {0};
      ruda_copy_desc gd = ruda_copy_contiguous(ruda_bind(g));
      ruda_graph *gr = NULL;
      if (ruda_write(dev, me, &gd, zero, sizeof zero) != 0 || ruda_graph_begin_capture(dev, me) != 0) {
        FAIL("thread %llu: graph setup", (unsigned long long)t);
        ruda_buffer_free(dev, me, g);
        continue;
      }
      launch_bump(me, g, &rc);
      if (rc != 0) FAIL("thread %llu: captured launch: %s", (unsigned long long)t, ruda_err_name(rc));
      call_bump(me, g, &rc);
      if (rc != 0) FAIL("thread %llu: captured call: %s", (unsigned long long)t, ruda_err_name(rc));
      if (ruda_graph_end_capture(dev, me, &gr) != 0) {
        FAIL("thread %llu: end capture", (unsigned long long)t);
        continue;
      }
      for (int r = 0; r < 3; r++) /* mine, then two of the shared streams */
        if (ruda_graph_replay(dev, r == 0 ? me : (uint64_t)nthreads + rng(&seed) % 4, gr) != 0) FAIL("replay");
      if (ruda_graph_destroy(dev, gr) != 0) FAIL("destroy with replays queued");
      uint64_t got[WORDS];
      ruda_future *gf = NULL;
      if (ruda_read(dev, me, &gd, got, sizeof got, &gf) == 0) {
        if (ruda_future_wait(gf, NULL) != 0) FAIL("graph read");
        ruda_future_free(gf);
        if (got[0] != 6 || got[WORDS - 1] != 6)
          FAIL("thread %llu: graph buffer holds %llu, 3 replays of 2 bumps make 6", (unsigned long long)t,
               (unsigned long long)got[0]);
      }
      /* The shared graph moved onto g, replayed three times (every thread
       * does so at some point, so replays of it race): 6 more. */
      ruda_graph_patch pg[2] = {ruda_graph_patch_arg(0, 0, ruda_arg_buffer(ruda_bind(g))),
                                ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(g)))};
      for (int r = 0; r < 3; r++)
        if (ruda_graph_replay_with(dev, r == 0 ? me : (uint64_t)nthreads + rng(&seed) % 4, bump2, pg, 2, NULL) != 0)
          FAIL("patched replay");
      if (ruda_read(dev, me, &gd, got, sizeof got, &gf) == 0) {
        if (ruda_future_wait(gf, NULL) != 0) FAIL("patched graph read");
        ruda_future_free(gf);
        if (got[0] != 12 || got[WORDS - 1] != 12)
          FAIL("thread %llu: graph buffer holds %llu, 3 patched replays of 2 bumps more make 12",
               (unsigned long long)t, (unsigned long long)got[0]);
      }
      ruda_buffer_free(dev, me, g);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-t")) nthreads = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-a")) auto_graphs = atoi(argv[i + 1]);
  }
  if (nthreads < 2 || nthreads > 256 || iters < 1) return 2;
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 8;
  cfg.lanes = 8; /* 64 device streams: lanes crossed by every thread mix */
  cfg.log_level = RUDA_LOG_OFF;
  cfg.auto_graphs = auto_graphs;
  if (ruda_device_open(&cfg, &dev) != 0 || ruda_host_kernel_register(dev, "bump", k_bump) != 0 ||
      ruda_host_kernel_register(dev, "peek", k_peek) != 0 || ruda_host_kernel_register(dev, "bump_nest", k_bump_nest) != 0)
    return 1;
  /* 8 workers of 8 lanes: the threads' streams spread over 64 of them. */
  if (ruda_device_num_lanes(dev) != 64) {
    fprintf(stderr, "torture: %u device streams, not 64\n", ruda_device_num_lanes(dev));
    return 1;
  }
  for (int k = 0; k < 16; k++) {
    ruda_handle h;
    if (ruda_buffer_create(dev, 0, WORDS * 8, &h) != 0) return 1;
    atomic_store(&shared_h[k], ((uint64_t)h.slot << 32) | h.gen);
  }
  ruda_handle rec;
  if (ruda_buffer_create(dev, 0, WORDS * 8, &rec) != 0 || ruda_graph_begin_capture(dev, 0) != 0) return 1;
  int rc0 = 0;
  launch_bump(0, rec, &rc0);
  launch_bump(0, rec, &rc0);
  if (rc0 != 0 || ruda_graph_end_capture(dev, 0, &bump2) != 0 || ruda_graph_begin_capture(dev, 0) != 0) return 1;
  launch_peek(0, rec, &rc0);
  if (rc0 != 0 || ruda_graph_end_capture(dev, 0, &peek1) != 0) return 1;
  uint64_t *rin = NULL, *rout = NULL;
  if (ruda_staging_alloc(dev, WORDS * 8, (void **)&rin) != 0 || ruda_staging_alloc(dev, WORDS * 8, (void **)&rout) != 0)
    return 1;
  ruda_copy_desc rd = ruda_copy_contiguous(ruda_bind(rec));
  ruda_future *rnone = NULL;
  if (ruda_graph_begin_capture(dev, 0) != 0 || ruda_write_staged(dev, 0, &rd, rin, WORDS * 8) != 0) return 1;
  launch_bump(0, rec, &rc0);
  if (rc0 != 0 || ruda_read(dev, 0, &rd, rout, WORDS * 8, &rnone) != 0 || ruda_graph_end_capture(dev, 0, &request) != 0)
    return 1;
  pthread_t th[256];
  for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  if (ruda_graph_destroy(dev, bump2) != 0 || ruda_graph_destroy(dev, peek1) != 0 || ruda_graph_destroy(dev, request) != 0)
    FAIL("destroy shared graphs");
  ruda_staging_free(dev, rin);
  ruda_staging_free(dev, rout);
  ruda_buffer_free(dev, 0, rec);
  for (int k = 0; k < 16; k++) {
    uint64_t hv = atomic_load(&shared_h[k]);
    ruda_handle h = {(uint32_t)(hv >> 32), (uint32_t)hv};
    ruda_buffer_free(dev, 0, h);
  }
  ruda_error *errs = NULL;
  int rc = ruda_device_close(dev, &errs);
  if (rc != 0) {
    ruda_error_print(errs, stderr, 0);
    FAIL("close");
  }
  ruda_error_free(errs);
  if (atomic_load(&nest_failures) != 0) FAIL("%d launches issued by kernels failed", atomic_load(&nest_failures));
  if (atomic_load(&standin_wrong) != 0)
    FAIL("%d library states misused (another worker's, two holders, destroyed twice)", atomic_load(&standin_wrong));
  if (atomic_load(&standin_made) != atomic_load(&standin_destroyed))
    FAIL("library states: %d made, %d destroyed", atomic_load(&standin_made), atomic_load(&standin_destroyed));
  if (atomic_load(&released) != atomic_load(&imported))
    FAIL("%ld imports, %ld releases", atomic_load(&imported), atomic_load(&released));
  int f = atomic_load(&failures);
  printf("torture: %d threads x %d iterations, %d library states made and destroyed, %d failures\n", nthreads, iters,
         atomic_load(&standin_made), f);
  return f == 0 ? 0 : 1;
}

/* fuzz_api.c - call sequences over the public API, decoded from bytes,
 * checked against a shadow model (host backend).
 *
 * Every input opens a device, runs the decoded calls from one thread on
 * four streams (three workers), and checks as it goes:
 *   - refusals that must happen (a freed or never-made handle, a range
 *     past the buffer, a capture refusing reads) happen with their code;
 *   - data: every read, waited at once or later, equals the model's bytes
 *     at the moment it was issued, whatever streams the writers used, so
 *     cross-stream ordering (access modes included) is exact;
 *   - request graphs: a recorded upload, kernel and download replay with
 *     new input on any stream and download what the model says;
 *   - replays with patches move a request graph onto another buffer, other
 *     blocks and a new scalar and download what the model says; a bad
 *     patch is refused with its code and the graph replays as recorded;
 *   - all of the above with cfg.auto_graphs on (inputs whose last byte is odd),
 *     and with 1 to 4 lanes a worker (its next two bits);
 *   - streams switched to issuing in place (ruda_stream_set_in_place) and
 *     back keep all of the above;
 *   - library calls (ruda_call) order by their buffers' access modes like
 *     kernels, are recorded and replayed by graphs, refuse stale handles,
 *     and a failing one is one error on its stream; calls naming a
 *     library (ruda_library_register, some registered mid-run, refused
 *     past RUDA_LIBRARY_MAX) get their own worker's state, each state
 *     destroyed once at close;
 *   - kernels that issue work themselves (a launch on their own buffer, a
 *     replay of their own graph), in place or on a worker: nothing hangs
 *     (the fuzzer's timeout) and the data follows the model;
 *   - a graph of every recorded kind (upload, launch, copy, library call,
 *     download) captured on the own stream of a thread that then exits,
 *     replayed after the reaper freed that stream's record;
 *   - host blocks a queued patched replay names, freed before it ran:
 *     the replay still reads and fills them (the free is deferred);
 *   - errors: each flush or sync of a stream hands back exactly the
 *     kernel failures the model counted on it, none lost, none elsewhere;
 *   - buffers adopted from host memory (ruda_buffer_import) behave as made
 *     ones; each block is freed by its release callback, so a release
 *     before the last use is a use after free under ASan, and each is
 *     released exactly once (counted at the end);
 *   - at the end every live buffer equals the model and close is clean.
 * A violation aborts (the fuzzer reports it with the input).
 *
 * Built two ways: with RUDA_LIBFUZZER, the LLVMFuzzerTestOneInput target
 * (tools/fuzz.sh); without, a driver that runs -n inputs from a seeded
 * generator, or the files named on the command line (ctest: fuzz_api.*). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ruda/ruda.h"
#include "standin_lib.h"

#define NSTREAMS 4
#define NBUF 8
#define MAXB 192

typedef struct model_buf {
  ruda_handle h;
  int live, made;
  uint32_t size;
  unsigned char data[MAXB];
} model_buf;

typedef struct pending_read {
  ruda_future *f;
  ruda_stream_id s;
  unsigned char got[MAXB], want[MAXB];
  uint32_t len;
} pending_read;

/* Imports' release callbacks, counted (any thread). */
typedef struct import_rec {
  void *mem;
  _Atomic int released;
} import_rec;

#define MAXIMPORTS 64

static void release_import(void *user, uint64_t addr, uint64_t bytes) {
  import_rec *r = user;
  (void)bytes;
  if ((uint64_t)(uintptr_t)r->mem == addr) free(r->mem); /* a wrong address leaks: the count below fails */
  atomic_fetch_add(&r->released, 1);
}

typedef struct fuzz {
  ruda_device *dev;
  uint32_t libs, lib[RUDA_LIBRARY_MAX]; /* libraries registered (ruda_library_register) */
  import_rec imports[MAXIMPORTS];
  int nimports;
  model_buf b[NBUF];
  int errors[NSTREAMS]; /* kernel failures queued on each stream */
  pending_read pend[4];
  int npend;
  const uint8_t *in;
  size_t n, at;
} fuzz;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "fuzz_api: violated at byte %zu: ", z->at);         \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, " (last error: %s)\n", ruda_error_message(ruda_last_error())); \
      abort();                                                            \
    }                                                                     \
  } while (0)

static uint8_t next(fuzz *z) { return z->at < z->n ? z->in[z->at++] : 0; }

/* Kernels, typed so launches are checked as on cuda. */
static int k_fill(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  memset(a[0], (int)*(const uint32_t *)a[1], *(const uint32_t *)a[2]);
  return 0;
}
static int k_add(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  unsigned char *p = a[0];
  for (uint32_t i = 0; i < *(const uint32_t *)a[2]; i++) p[i] = (unsigned char)(p[i] + *(const uint32_t *)a[1]);
  return 0;
}
static int k_copy(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  memcpy(a[1], a[0], *(const uint32_t *)a[2]);
  return 0;
}
/* Holds its worker a little, so what the client issues next queues up
 * behind it (runs for automatic request graphs form). */
static int k_slow(const ruda_host_ctx *c, void *const *a) {
  (void)c, (void)a;
  usleep(200);
  return 0;
}
static int k_fail(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  return *(const int32_t *)a[0];
}

/* A library call: dst = src + data[0] over the first data[1] bytes, or
 * the status data[2] when it is not 0. */
static int call_add(const ruda_call_ctx *c, void *user) {
  (void)user;
  uint32_t v[3];
  memcpy(v, c->data, sizeof v);
  if (v[2] != 0) return (int)v[2];
  const unsigned char *src = ruda_call_ptr(c, 0);
  unsigned char *dst = ruda_call_ptr(c, 1);
  for (uint32_t i = 0; i < v[1]; i++) dst[i] = (unsigned char)(src[i] + v[0]);
  return 0;
}

/* call_add holding the worker's state of a stand-in library: 55 (an
 * error the model never expects) when the state is wrong. */
static int call_add_lib(const ruda_call_ctx *c, void *user) {
  if (standin_enter(c)) return 55;
  int rc = call_add(c, user);
  standin_leave(c);
  return rc;
}

/* nest(b, v, len, handle, stream, mode): b += v, then, once per op (the
 * kernel may run again in the replay it issues), more work issued from
 * the kernel: mode 0 a launch of add(b, v + 1) on stream, mode 1 a replay
 * of the graph it belongs to on stream. Run in place, the kernel runs on
 * the caller's thread: no lock of ruda's may be held then. */
static ruda_device *nest_dev;
static ruda_graph *nest_graph;
static int nest_left, nest_rc;
static int k_nest(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  unsigned char *p = a[0];
  const uint32_t v = *(const uint32_t *)a[1], len = *(const uint32_t *)a[2];
  for (uint32_t i = 0; i < len; i++) p[i] = (unsigned char)(p[i] + v);
  if (!__atomic_exchange_n(&nest_left, 0, __ATOMIC_ACQ_REL)) return 0;
  uint64_t packed, stream;
  uint32_t mode;
  memcpy(&packed, a[3], 8);
  memcpy(&stream, a[4], 8);
  memcpy(&mode, a[5], 4);
  int rc;
  if (mode == 0) {
    ruda_handle h = {(uint32_t)(packed >> 32), (uint32_t)packed};
    uint32_t w = v + 1;
    ruda_arg n[3] = {ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&w, 4), ruda_arg_scalar(&len, 4)};
    ruda_launch_desc l = {.kernel = "add", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = n, .nargs = 3};
    rc = ruda_launch(nest_dev, stream, &l);
  } else {
    rc = ruda_graph_replay(nest_dev, stream, nest_graph);
  }
  __atomic_store_n(&nest_rc, rc, __ATOMIC_RELEASE);
  return 0;
}

/* Errors handed back by a flush or sync: the causes under the summary. */
static int count_errors(const ruda_error *e) {
  int n = 0;
  for (const ruda_error *c = ruda_error_cause(e); c != NULL; c = ruda_error_next(c)) n++;
  return n;
}

static void drain(fuzz *z, ruda_stream_id s, int sync) {
  ruda_error *err = NULL;
  int rc = sync ? ruda_sync(z->dev, s, &err) : ruda_flush(z->dev, s, &err);
  if (z->errors[s] == 0) CHECK(rc == 0 && err == NULL, "%s of a healthy stream %llu returned %s", sync ? "sync" : "flush",
                               (unsigned long long)s, ruda_err_name(rc));
  else CHECK(rc == RUDA_EUNHEALTHY && count_errors(err) == z->errors[s], "stream %llu: %d errors handed back, %d failed",
             (unsigned long long)s, count_errors(err), z->errors[s]);
  ruda_error_free(err);
  z->errors[s] = 0;
}

/* Waits a read. It hands back its stream's errors recorded by then: some
 * of the failures the model counted there, never more. */
static void finish_read(fuzz *z, pending_read *p) {
  ruda_error *err = NULL;
  int rc = ruda_future_wait(p->f, &err);
  int n = count_errors(err);
  if (rc == RUDA_EUNHEALTHY) CHECK(n > 0, "unhealthy read without errors");
  else CHECK(rc == 0 && n == 0, "read failed: %s", ruda_err_name(rc));
  CHECK(n <= z->errors[p->s], "a read on stream %llu handed back %d errors, %d failed there", (unsigned long long)p->s,
        n, z->errors[p->s]);
  z->errors[p->s] -= n;
  ruda_error_free(err);
  ruda_future_free(p->f);
  CHECK(memcmp(p->got, p->want, p->len) == 0, "a read saw other bytes than the model had when it was issued");
}

static model_buf *pick(fuzz *z) { return &z->b[next(z) % NBUF]; }

/* A thread that captures, on its own stream, a request on b and c:
 * upload in -> b, add v to b, library call c := b + cv[0], copy c -> b,
 * download c into out; then syncs and exits. */
typedef struct exiting_capture {
  ruda_device *dev;
  ruda_handle b, c;
  uint32_t v, len, cv[3];
  unsigned char *in, *out;
  ruda_graph *g;
  int ok;
} exiting_capture;

static uint32_t launch(fuzz *z, ruda_stream_id s, const char *k, ruda_arg *a, uint32_t n);

static void *capture_then_exit(void *p) {
  exiting_capture *e = p;
  const ruda_stream_id cur = RUDA_STREAM_CURRENT;
  ruda_copy_desc db = ruda_copy_contiguous(ruda_bind(e->b)), dc = ruda_copy_contiguous(ruda_bind_range(e->c, 0, e->len));
  ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(e->b)), ruda_arg_scalar(&e->v, 4), ruda_arg_scalar(&e->len, 4)};
  ruda_launch_desc l = {.kernel = "add", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = a, .nargs = 3};
  ruda_arg bufs[2] = {ruda_arg_in(ruda_bind(e->b)), ruda_arg_out(ruda_bind(e->c))};
  ruda_call_desc cd = {.name = "add", .fn = call_add, .buffers = bufs, .nbuffers = 2, .data = e->cv,
                       .data_size = sizeof e->cv};
  ruda_future *none = NULL;
  e->ok = ruda_graph_begin_capture(e->dev, cur) == 0 && ruda_write_staged(e->dev, cur, &db, e->in, e->len) == 0 &&
          ruda_launch(e->dev, cur, &l) == 0 && ruda_call(e->dev, cur, &cd) == 0 &&
          ruda_copy(e->dev, cur, ruda_bind_range(e->b, 0, e->len), ruda_bind_range(e->c, 0, e->len)) == 0 &&
          ruda_read(e->dev, cur, &dc, e->out, e->len, &none) == 0 &&
          ruda_graph_end_capture(e->dev, cur, &e->g) == 0 && ruda_sync(e->dev, cur, NULL) == 0;
  return NULL;
}

/* By name, or by reference (ruda_kernel_lookup), waiting for room or not
 * (RUDA_LAUNCH_NOWAIT; the fuzzer's queues never fill): the same outcome. */
static uint32_t launch(fuzz *z, ruda_stream_id s, const char *k, ruda_arg *a, uint32_t n) {
  ruda_launch_desc l = {.kernel = k, .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = a, .nargs = n};
  const uint8_t how = next(z);
  if (how & 2) l.flags |= RUDA_LAUNCH_NOWAIT;
  if (how & 1) {
    int rc = ruda_kernel_lookup(z->dev, k, &l.ref);
    if (rc != 0) return (uint32_t)rc;
    l.kernel = NULL;
  }
  return (uint32_t)ruda_launch(z->dev, s, &l);
}

/* Waits a replay's result (run or future): some of its stream's failures
 * may come back with it, never more than the model counted. */
static void replay_done(fuzz *z, ruda_stream_id rs, int rc, ruda_error *err, ruda_future *f) {
  int n = count_errors(err);
  CHECK(rc == 0 || (rc == RUDA_EUNHEALTHY && n > 0), "replay future: %s", ruda_err_name(rc));
  CHECK(n <= z->errors[rs], "a replay on stream %llu handed back %d errors, %d failed there", (unsigned long long)rs,
        n, z->errors[rs]);
  z->errors[rs] -= n;
  ruda_error_free(err);
  ruda_future_free(f);
}

/* Runs g on rs with patches p[0..n), waited: in one call or through a
 * future. Returns the call's code when it refused, else 0. */
static int run_patched(fuzz *z, ruda_stream_id rs, ruda_graph *g, const ruda_graph_patch *p, uint32_t n) {
  ruda_future *f = NULL;
  ruda_error *err = NULL;
  int rc;
  if (next(z) & 1) {
    rc = ruda_graph_run_with(z->dev, rs, g, p, n, &err);
    if (rc != 0 && rc != RUDA_EUNHEALTHY) return rc;
  } else {
    if ((rc = ruda_graph_replay_with(z->dev, rs, g, p, n, &f)) != 0) return rc;
    rc = ruda_future_wait(f, &err);
  }
  replay_done(z, rs, rc, err, f);
  return 0;
}

/* Four staging blocks of b's size in blk (in, out, in2, out2), and a
 * request graph recorded on s: upload in -> b, add v to b, download b ->
 * out. */
static ruda_graph *record_request(fuzz *z, ruda_stream_id s, model_buf *b, uint32_t v, unsigned char **blk) {
  uint32_t len = b->size;
  for (int i = 0; i < 4; i++) CHECK(ruda_staging_alloc(z->dev, len, (void **)&blk[i]) == 0, "staging");
  drain(z, s, 1);
  CHECK(ruda_graph_begin_capture(z->dev, s) == 0, "begin capture");
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(b->h));
  ruda_future *none = NULL;
  CHECK(ruda_write_staged(z->dev, s, &d, blk[0], len) == 0, "recorded upload");
  ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
  CHECK(launch(z, s, "add", a, 3) == 0, "captured launch");
  CHECK(ruda_read(z->dev, s, &d, blk[1], len, &none) == 0 && none == NULL, "recorded download");
  ruda_graph *g = NULL;
  CHECK(ruda_graph_end_capture(z->dev, s, &g) == 0, "end capture");
  return g;
}

static void step(fuzz *z) {
  const uint8_t op = next(z) % 20;
  const ruda_stream_id s = next(z) % NSTREAMS;
  model_buf *b = pick(z);
  ruda_copy_desc d;
  int rc;
  switch (op) {
    case 0: { /* create (replacing a dead slot) */
      if (b->live) break;
      uint32_t size = 1 + next(z) % MAXB;
      if ((next(z) & 3) == 0 && z->nimports < MAXIMPORTS) { /* adopted host memory instead */
        import_rec *r = &z->imports[z->nimports++];
        r->mem = malloc(size);
        CHECK(r->mem != NULL, "malloc");
        rc = ruda_buffer_import(z->dev, s, (uint64_t)(uintptr_t)r->mem, size, release_import, r, &b->h);
        CHECK(rc == 0, "import %u bytes: %s", size, ruda_err_name(rc));
        /* The same memory again is an overlap, refused. */
        ruda_handle again;
        rc = ruda_buffer_import(z->dev, s, (uint64_t)(uintptr_t)r->mem, size, release_import, r, &again);
        CHECK(rc == RUDA_EINVAL, "a second import of the same memory returned %s", ruda_err_name(rc));
      } else {
        rc = ruda_buffer_create(z->dev, s, size, &b->h);
        CHECK(rc == 0, "create %u bytes: %s", size, ruda_err_name(rc));
      }
      b->live = b->made = 1;
      b->size = size;
      memset(b->data, 0, sizeof b->data);
      d = ruda_copy_contiguous(ruda_bind(b->h));
      rc = ruda_write(z->dev, s, &d, b->data, size); /* fresh memory is not zero: make it so */
      CHECK(rc == 0, "first write: %s", ruda_err_name(rc));
      break;
    }
    case 1: /* free: live, or already freed */
      if (!b->made) break;
      rc = ruda_buffer_free(z->dev, s, b->h);
      CHECK(rc == (b->live ? 0 : RUDA_EFREE), "free of a %s buffer returned %s", b->live ? "live" : "freed",
            ruda_err_name(rc));
      b->live = 0;
      break;
    case 2: { /* write a range */
      uint32_t off = next(z) % MAXB, len = 1 + next(z) % MAXB;
      unsigned char v = next(z), src[2 * MAXB];
      memset(src, v, sizeof src);
      if (!b->made) break;
      d = ruda_copy_contiguous(ruda_bind_range(b->h, off, len));
      rc = ruda_write(z->dev, s, &d, src, len);
      if (!b->live) CHECK(rc == RUDA_ENOTFOUND, "write to a freed buffer returned %s", ruda_err_name(rc));
      else if (off + len > b->size) CHECK(rc == RUDA_ERANGE, "write past the end returned %s", ruda_err_name(rc));
      else {
        CHECK(rc == 0, "write: %s", ruda_err_name(rc));
        memset(b->data + off, v, len);
      }
      break;
    }
    case 3: { /* read, waited now or later */
      if (!b->live) break;
      if (z->npend == 4) {
        for (int i = 0; i < z->npend; i++) finish_read(z, &z->pend[i]);
        z->npend = 0;
      }
      pending_read *p = &z->pend[z->npend++];
      p->s = s;
      p->len = b->size;
      memcpy(p->want, b->data, b->size);
      d = ruda_copy_contiguous(ruda_bind(b->h));
      rc = ruda_read(z->dev, s, &d, p->got, b->size, &p->f);
      CHECK(rc == 0, "read: %s", ruda_err_name(rc));
      if (next(z) & 1) { /* wait now */
        finish_read(z, p);
        z->npend--;
      }
      break;
    }
    case 4: { /* fill, write-only */
      if (!b->live) break;
      uint32_t v = next(z), len = b->size;
      ruda_arg a[3] = {ruda_arg_out(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
      CHECK(launch(z, s, "fill", a, 3) == 0, "fill launch");
      memset(b->data, (int)(v & 0xff), len);
      break;
    }
    case 5: { /* add, read-write */
      if (!b->live) break;
      uint32_t v = next(z), len = b->size;
      ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
      CHECK(launch(z, s, "add", a, 3) == 0, "add launch");
      for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(b->data[i] + v);
      break;
    }
    case 6: { /* copy kernel: src read-only, dst write-only */
      model_buf *dst = pick(z);
      if (!b->live || !dst->live || dst == b) break;
      uint32_t len = b->size < dst->size ? b->size : dst->size;
      ruda_arg a[3] = {ruda_arg_in(ruda_bind(b->h)), ruda_arg_out(ruda_bind(dst->h)), ruda_arg_scalar(&len, 4)};
      CHECK(launch(z, s, "copy", a, 3) == 0, "copy launch");
      memcpy(dst->data, b->data, len);
      break;
    }
    case 7: { /* ruda_copy */
      model_buf *dst = pick(z);
      if (!b->live || !dst->live || dst == b) break;
      rc = ruda_copy(z->dev, s, ruda_bind(dst->h), ruda_bind(b->h));
      if (b->size > dst->size) {
        CHECK(rc == RUDA_ERANGE, "oversized copy returned %s", ruda_err_name(rc));
      } else {
        CHECK(rc == 0, "copy: %s", ruda_err_name(rc));
        memcpy(dst->data, b->data, b->size);
      }
      break;
    }
    case 8: { /* a kernel that fails */
      int32_t code = (next(z) & 1) ? RUDA_ELAUNCH : RUDA_EINVAL;
      ruda_arg a = ruda_arg_scalar(&code, 4);
      CHECK(launch(z, s, "fail", &a, 1) == 0, "fail launch");
      z->errors[s]++;
      break;
    }
    case 9:
      drain(z, s, 0);
      break;
    case 10:
      drain(z, s, 1);
      break;
    case 11: { /* a graph of one add, replayed on other streams, destroyed */
      if (!b->live) break;
      uint32_t v = next(z), len = b->size, times = 1 + next(z) % 3;
      drain(z, s, 1); /* a capture is refused on a stream holding errors */
      CHECK(ruda_graph_begin_capture(z->dev, s) == 0, "begin capture");
      d = ruda_copy_contiguous(ruda_bind(b->h));
      unsigned char tmp[MAXB];
      CHECK(ruda_write(z->dev, s, &d, tmp, len) == RUDA_EGRAPHSTATE, "a write during capture was not refused");
      ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
      CHECK(launch(z, s, "add", a, 3) == 0, "captured launch");
      ruda_graph *g = NULL;
      CHECK(ruda_graph_end_capture(z->dev, s, &g) == 0, "end capture");
      for (uint32_t t = 0; t < times; t++) {
        CHECK(ruda_graph_replay(z->dev, (s + 1 + t) % NSTREAMS, g) == 0, "replay");
        for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(b->data[i] + v);
      }
      CHECK(ruda_graph_destroy(z->dev, g) == 0, "destroy");
      break;
    }
    case 14: { /* a library call: src read-only, dst write-only; fails, or captured and replayed */
      model_buf *dst = pick(z);
      const uint8_t how = next(z);
      if (!b->made || !dst->live || dst == b) break;
      uint32_t v[3] = {next(z), b->size < dst->size ? b->size : dst->size, (how & 3) == 1 ? 7u : 0u};
      ruda_arg bufs[2] = {ruda_arg_in(ruda_bind(b->h)), ruda_arg_out(ruda_bind(dst->h))};
      ruda_call_desc cd = {.name = "add", .fn = call_add, .buffers = bufs, .nbuffers = 2, .data = v,
                           .data_size = sizeof v};
      if (how & 16) { /* with a library's per-worker state; sometimes a library registered now */
        if ((how & 32) || z->libs == 0) {
          uint32_t id = 0;
          int rc = standin_register(z->dev, &id);
          if (z->libs == RUDA_LIBRARY_MAX) {
            CHECK(rc == RUDA_EINVAL, "library %u of %d registered", z->libs + 1, RUDA_LIBRARY_MAX);
          } else {
            CHECK(rc == 0 && id == z->libs + 1, "register library: %s, id %u", ruda_err_name(rc), id);
            z->lib[z->libs++] = id;
          }
        }
        cd.fn = call_add_lib;
        cd.library = z->lib[next(z) % z->libs];
      }
      if (!b->live) {
        CHECK(ruda_call(z->dev, s, &cd) == RUDA_ENOTFOUND, "a call on a freed buffer was not refused");
        break;
      }
      uint32_t times = 1;
      ruda_graph *g = NULL;
      if ((how & 3) == 2) { /* recorded, then replayed on other streams */
        drain(z, s, 1);
        CHECK(ruda_graph_begin_capture(z->dev, s) == 0, "begin capture");
        cd.flags = RUDA_CALL_NOT_CAPTURABLE;
        CHECK(ruda_call(z->dev, s, &cd) == RUDA_EGRAPHSTATE, "a call not capturable was recorded");
        cd.flags = 0;
        CHECK(ruda_call(z->dev, s, &cd) == 0, "recorded call");
        CHECK(ruda_graph_end_capture(z->dev, s, &g) == 0 && ruda_graph_length(g) == 1, "end capture");
        times = 1 + (how >> 2) % 3;
      }
      for (uint32_t t = 0; t < times; t++) {
        if (g != NULL) CHECK(ruda_graph_replay(z->dev, (s + 1 + t) % NSTREAMS, g) == 0, "replay");
        else CHECK(ruda_call(z->dev, s, &cd) == 0, "call: %s", ruda_err_name(ruda_error_code(ruda_last_error())));
        if (v[2] != 0) z->errors[s]++;
        else
          for (uint32_t i = 0; i < v[1]; i++) dst->data[i] = (unsigned char)(b->data[i] + v[0]);
      }
      if (g != NULL) CHECK(ruda_graph_destroy(z->dev, g) == 0, "destroy");
      break;
    }
    case 15: { /* a kernel that issues a launch on its own buffer, or replays its own graph */
      if (!b->live) break;
      uint32_t v = next(z), len = b->size, mode = next(z) & 1;
      const ruda_stream_id t = next(z) % NSTREAMS;
      uint64_t packed = (uint64_t)b->h.slot << 32 | b->h.gen, stream = t;
      ruda_arg a[6] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4),
                       ruda_arg_scalar(&packed, 8), ruda_arg_scalar(&stream, 8), ruda_arg_scalar(&mode, 4)};
      nest_dev = z->dev;
      __atomic_store_n(&nest_rc, 1, __ATOMIC_RELEASE);
      __atomic_store_n(&nest_left, 1, __ATOMIC_RELEASE);
      if (mode == 0) {
        CHECK(launch(z, s, "nest", a, 6) == 0, "nest launch");
        drain(z, s, 1); /* the kernel ran: what it issued is queued */
      } else {
        drain(z, s, 1);
        CHECK(ruda_graph_begin_capture(z->dev, s) == 0, "begin capture");
        CHECK(launch(z, s, "nest", a, 6) == 0, "captured nest launch");
        CHECK(ruda_graph_end_capture(z->dev, s, &nest_graph) == 0, "end capture");
        ruda_error *err = NULL;
        rc = ruda_graph_run(z->dev, s, nest_graph, &err); /* in place when the worker is idle */
        CHECK(rc == 0 && err == NULL, "nest graph run: %s", ruda_err_name(rc));
      }
      drain(z, t, 1);
      CHECK(__atomic_load_n(&nest_rc, __ATOMIC_ACQUIRE) == 0, "the kernel's own call returned %s",
            ruda_err_name(__atomic_load_n(&nest_rc, __ATOMIC_ACQUIRE)));
      if (mode == 1) CHECK(ruda_graph_destroy(z->dev, nest_graph) == 0, "destroy");
      for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(b->data[i] + 2 * v + (mode == 0));
      break;
    }
    case 13: /* the stream issues in place from now on, or stops */
      CHECK(ruda_stream_set_in_place(z->dev, s, next(z) & 1) == 0, "set_in_place");
      break;
    case 12: { /* a request graph: upload, add, download; replayed (or run) with new input */
      if (!b->live) break;
      uint32_t v = next(z), len = b->size, times = 1 + next(z) % 3;
      unsigned char *in = NULL, *out = NULL, stack[MAXB];
      CHECK(ruda_staging_alloc(z->dev, len, (void **)&in) == 0 && ruda_staging_alloc(z->dev, len, (void **)&out) == 0,
            "staging");
      drain(z, s, 1);
      CHECK(ruda_graph_begin_capture(z->dev, s) == 0, "begin capture");
      d = ruda_copy_contiguous(ruda_bind(b->h));
      ruda_future *none = (ruda_future *)&d;
      CHECK(ruda_read(z->dev, s, &d, stack, len, &none) == RUDA_EINVAL && none == NULL,
            "a recorded read into ordinary memory was not refused");
      CHECK(ruda_write_staged(z->dev, s, &d, in, len) == 0, "recorded upload");
      ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
      CHECK(launch(z, s, "add", a, 3) == 0, "captured launch");
      CHECK(ruda_read(z->dev, s, &d, out, len, &none) == 0 && none == NULL, "recorded download");
      ruda_graph *g = NULL;
      CHECK(ruda_graph_end_capture(z->dev, s, &g) == 0 && ruda_graph_length(g) == 3, "end capture");
      for (uint32_t t = 0; t < times; t++) {
        const ruda_stream_id rs = (s + t) % NSTREAMS;
        memset(in, next(z), len);
        ruda_future *f = NULL;
        ruda_error *err = NULL;
        if (next(z) & 1) { /* served in one call, in place when the worker is idle */
          rc = ruda_graph_run(z->dev, rs, g, &err);
        } else {
          CHECK(ruda_graph_replay_async(z->dev, rs, g, &f) == 0 && f != NULL, "replay_async");
          rc = ruda_future_wait(f, &err);
        }
        int n = count_errors(err);
        CHECK(rc == 0 || (rc == RUDA_EUNHEALTHY && n > 0), "replay future: %s", ruda_err_name(rc));
        CHECK(n <= z->errors[rs], "a replay on stream %llu handed back %d errors, %d failed there",
              (unsigned long long)rs, n, z->errors[rs]);
        z->errors[rs] -= n;
        ruda_error_free(err);
        ruda_future_free(f);
        for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(in[i] + v);
        CHECK(memcmp(out, b->data, len) == 0, "a replay's download differs from the model");
      }
      CHECK(ruda_graph_destroy(z->dev, g) == 0, "destroy");
      /* The blocks must outlive the graph's last replay: it ran (waited). */
      CHECK(ruda_staging_free(z->dev, in) == 0 && ruda_staging_free(z->dev, out) == 0, "staging free");
      break;
    }
    case 16: { /* the worker is held a moment: then a few adds of b in a row */
      if (!b->live) break;
      CHECK(launch(z, s, "slow", NULL, 0) == 0, "slow launch");
      for (uint32_t r = 0, times = 2 + next(z) % 4; r < times; r++) {
        uint32_t v = next(z), len = b->size;
        ruda_arg a[3] = {ruda_arg_buffer(ruda_bind(b->h)), ruda_arg_scalar(&v, 4), ruda_arg_scalar(&len, 4)};
        CHECK(launch(z, s, "add", a, 3) == 0, "add");
        for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(b->data[i] + v);
      }
      drain(z, s, next(z) & 1); /* the wait point that ends the run */
      break;
    }
    case 17: { /* a request graph on b, replayed on c with other blocks and scalar; bad patches */
      model_buf *c = pick(z), *dead = pick(z);
      if (!b->live || !c->live) break;
      uint32_t v = next(z), len = b->size, times = 1 + next(z) % 3;
      unsigned char *blk[4], stack[MAXB];
      ruda_graph *g = record_request(z, s, b, v, blk);
      unsigned char *in = blk[0], *out = blk[1], *in2 = blk[2], *out2 = blk[3];
      for (uint32_t t = 0; t < times; t++) {
        const ruda_stream_id rs = (s + t) % NSTREAMS;
        uint32_t v2 = next(z);
        const uint16_t v16 = 1;
        memset(in2, next(z), len);
        ruda_graph_patch p[7] = {
            ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(c->h)),
            ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in2),
            ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(c->h))),
            ruda_graph_patch_arg(1, 1, ruda_arg_scalar(&v2, 4)),
            ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 2, ruda_bind(c->h)),
            ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out2),
        };
        uint32_t n = 6;
        int want = c->size < len ? RUDA_ERANGE : 0; /* c cannot hold what b did */
        const uint8_t bad = next(z) % 6;
        if (want == 0 && bad == 1) p[n++] = ruda_graph_patch_grid(3, (ruda_dim3){1, 1, 1}), want = RUDA_EINVAL;
        if (want == 0 && bad == 2) p[n++] = ruda_graph_patch_arg(1, 2, ruda_arg_scalar(&v16, 2)), want = RUDA_EINVAL;
        if (want == 0 && bad == 3) p[n++] = ruda_graph_patch_grid(1, (ruda_dim3){1, 0, 1}), want = RUDA_EINVAL;
        if (want == 0 && bad == 4 && dead->made && !dead->live)
          p[n++] = ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(dead->h))), want = RUDA_ENOTFOUND;
        if (want == 0 && bad == 5) p[n++] = ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, stack), want = RUDA_EINVAL;
        rc = run_patched(z, rs, g, p, n);
        CHECK(rc == want, "a patched replay returned %s, expected %s", ruda_err_name(rc), ruda_err_name(want));
        if (rc == 0) {
          for (uint32_t i = 0; i < len; i++) c->data[i] = (unsigned char)(in2[i] + v2);
          CHECK(memcmp(out2, c->data, len) == 0, "a patched replay's download differs from the model");
        } else { /* refused: the graph replays as recorded */
          memset(in, next(z), len);
          CHECK(run_patched(z, rs, g, NULL, 0) == 0, "a replay after a refused patch");
          for (uint32_t i = 0; i < len; i++) b->data[i] = (unsigned char)(in[i] + v);
          CHECK(memcmp(out, b->data, len) == 0, "a replay after a refused patch differs from the model");
        }
      }
      CHECK(ruda_graph_destroy(z->dev, g) == 0, "destroy");
      CHECK(ruda_staging_free(z->dev, in) == 0 && ruda_staging_free(z->dev, out) == 0 &&
                ruda_staging_free(z->dev, in2) == 0 && ruda_staging_free(z->dev, out2) == 0,
            "staging free");
      break;
    }
    case 18: { /* every recorded kind captured by a thread that exits; replayed once its record is freed */
      model_buf *c = pick(z);
      if (!b->live || !c->live || c == b || c->size < b->size) break;
      exiting_capture e = {.dev = z->dev, .b = b->h, .c = c->h, .v = next(z), .len = b->size};
      e.cv[0] = next(z);
      e.cv[1] = e.len;
      CHECK(ruda_staging_alloc(z->dev, e.len, (void **)&e.in) == 0 && ruda_staging_alloc(z->dev, e.len, (void **)&e.out) == 0,
            "staging");
      pthread_t t;
      CHECK(pthread_create(&t, NULL, capture_then_exit, &e) == 0 && pthread_join(t, NULL) == 0 && e.ok,
            "a capture on an exiting thread's own stream");
      CHECK(ruda_graph_length(e.g) == 5, "the exited thread's graph has %u commands", ruda_graph_length(e.g));
      for (int i = 0; i < 4; i++) ruda_stream_ids(z->dev, NULL, 0); /* the reaper frees the record */
      for (uint32_t r = 0, times = 1 + next(z) % 3; r < times; r++) {
        const ruda_stream_id rs = (s + r) % NSTREAMS;
        memset(e.in, next(z), e.len);
        ruda_error *err = NULL;
        ruda_future *f = NULL;
        if (next(z) & 1) rc = ruda_graph_run(z->dev, rs, e.g, &err);
        else {
          CHECK(ruda_graph_replay_async(z->dev, rs, e.g, &f) == 0, "replay_async");
          rc = ruda_future_wait(f, &err);
        }
        replay_done(z, rs, rc, err, f);
        for (uint32_t i = 0; i < e.len; i++) {
          c->data[i] = (unsigned char)(e.in[i] + e.v + e.cv[0]);
          b->data[i] = c->data[i];
        }
        CHECK(memcmp(e.out, c->data, e.len) == 0, "a replay of the exited thread's graph differs from the model");
      }
      CHECK(ruda_graph_destroy(z->dev, e.g) == 0, "destroy");
      CHECK(ruda_staging_free(z->dev, e.in) == 0 && ruda_staging_free(z->dev, e.out) == 0, "staging free");
      break;
    }
    case 19: { /* a patched replay queued behind a slow kernel; its host blocks freed before it ran */
      model_buf *c = pick(z);
      if (!b->live || !c->live || c->size < b->size) break;
      uint32_t v = next(z), len = b->size;
      unsigned char *blk[4];
      ruda_graph *g = record_request(z, s, b, v, blk);
      unsigned char *in = blk[0], *out = blk[1], *in2 = blk[2], *out2 = blk[3];
      const ruda_stream_id rs = next(z) % NSTREAMS;
      const uint8_t fillv = next(z);
      memset(in2, fillv, len);
      ruda_graph_patch p[6] = {
          ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_DST, 0, ruda_bind(c->h)),
          ruda_graph_patch_host(RUDA_GRAPH_PATCH_SRC, 0, in2),
          ruda_graph_patch_arg(1, 0, ruda_arg_buffer(ruda_bind(c->h))),
          ruda_graph_patch_buffer(RUDA_GRAPH_PATCH_SRC, 2, ruda_bind(c->h)),
          ruda_graph_patch_host(RUDA_GRAPH_PATCH_DST, 2, out2),
      };
      CHECK(launch(z, rs, "slow", NULL, 0) == 0, "slow launch");
      ruda_future *f = NULL;
      CHECK(ruda_graph_replay_with(z->dev, rs, g, p, 5, &f) == 0, "patched replay");
      /* Freed with the replay queued (and the recorded blocks too): each
       * goes back once the replay ran. */
      CHECK(ruda_staging_free(z->dev, in2) == 0 && ruda_staging_free(z->dev, out2) == 0, "staging free (queued)");
      const int early = next(z) & 1;
      if (early) CHECK(ruda_staging_free(z->dev, in) == 0 && ruda_staging_free(z->dev, out) == 0, "free");
      unsigned char *junk = NULL; /* reuses what a free handed back at once, if it did */
      CHECK(ruda_staging_alloc(z->dev, len, (void **)&junk) == 0, "staging");
      memset(junk, 0xee, len);
      ruda_error *err = NULL;
      rc = ruda_future_wait(f, &err);
      replay_done(z, rs, rc, err, f);
      for (uint32_t i = 0; i < len; i++) c->data[i] = (unsigned char)(fillv + v);
      CHECK(ruda_graph_destroy(z->dev, g) == 0, "destroy");
      CHECK(ruda_staging_free(z->dev, junk) == 0, "staging free");
      if (!early) CHECK(ruda_staging_free(z->dev, in) == 0 && ruda_staging_free(z->dev, out) == 0, "staging free");
      break;
    }
  }
}

int ruda_fuzz_one(const uint8_t *data, size_t size) {
  fuzz z0, *z = &z0;
  memset(z, 0, sizeof *z);
  z->in = data;
  z->n = size;
  standin_reset();
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 3;
  cfg.log_level = RUDA_LOG_OFF;
  cfg.spin_us = 0;
  cfg.auto_graphs = size > 0 && (data[size - 1] & 1); /* half the inputs: automatic request graphs */
  cfg.lanes = size > 0 ? 1 + ((data[size - 1] >> 1) & 3) : 0; /* 1..4 device streams a worker */
  CHECK(ruda_device_open(&cfg, &z->dev) == 0, "open");
  const ruda_host_param p3[3] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4}};
  const ruda_host_param pc[3] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}};
  const ruda_host_param pf[1] = {{RUDA_ARG_SCALAR, 4}};
  CHECK(ruda_host_kernel_register_typed(z->dev, "fill", k_fill, p3, 3) == 0, "register");
  CHECK(ruda_host_kernel_register_typed(z->dev, "add", k_add, p3, 3) == 0, "register");
  CHECK(ruda_host_kernel_register_typed(z->dev, "copy", k_copy, pc, 3) == 0, "register");
  CHECK(ruda_host_kernel_register_typed(z->dev, "fail", k_fail, pf, 1) == 0, "register");
  const ruda_host_param pn[6] = {{RUDA_ARG_BUFFER, 0}, {RUDA_ARG_SCALAR, 4}, {RUDA_ARG_SCALAR, 4},
                                 {RUDA_ARG_SCALAR, 8}, {RUDA_ARG_SCALAR, 8}, {RUDA_ARG_SCALAR, 4}};
  CHECK(ruda_host_kernel_register_typed(z->dev, "nest", k_nest, pn, 6) == 0, "register");
  CHECK(ruda_host_kernel_register_typed(z->dev, "slow", k_slow, NULL, 0) == 0, "register");
  for (int steps = 0; z->at < z->n && steps < 400; steps++) step(z);
  for (int i = 0; i < z->npend; i++) finish_read(z, &z->pend[i]);
  z->npend = 0;
  /* Whatever is still queued: all of it comes back from one device sync. */
  int queued = 0;
  for (int s = 0; s < NSTREAMS; s++) queued += z->errors[s];
  ruda_error *err = NULL;
  int rc = ruda_device_sync(z->dev, &err);
  int got = 0;
  for (const ruda_error *e = err; e != NULL; e = ruda_error_next(e)) got += count_errors(e);
  ruda_error_free(err);
  CHECK(rc == (queued ? RUDA_EUNHEALTHY : 0) && got == queued, "device sync: %d errors back, %d queued (%s)", got,
        queued, ruda_err_name(rc));
  for (int i = 0; i < NBUF; i++) {
    model_buf *b = &z->b[i];
    if (!b->live) continue;
    unsigned char back[MAXB];
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(b->h));
    ruda_future *f = NULL;
    CHECK(ruda_read(z->dev, 0, &d, back, b->size, &f) == 0, "final read");
    CHECK(ruda_future_wait(f, NULL) == 0, "final wait");
    ruda_future_free(f);
    CHECK(memcmp(back, b->data, b->size) == 0, "buffer %d differs from the model at the end", i);
    CHECK(ruda_buffer_free(z->dev, 0, b->h) == 0, "final free");
  }
  CHECK(ruda_device_close(z->dev, NULL) == 0, "close");
  /* Every state made was destroyed once, by its own worker, at close. */
  CHECK(atomic_load(&standin_destroyed) == atomic_load(&standin_made) && !atomic_load(&standin_wrong),
        "library states: %d made, %d destroyed, %d misused", atomic_load(&standin_made),
        atomic_load(&standin_destroyed), atomic_load(&standin_wrong));
  for (int i = 0; i < z->nimports; i++)
    CHECK(atomic_load(&z->imports[i].released) == 1, "import %d released %d times", i,
          atomic_load(&z->imports[i].released));
  return 0;
}

#ifdef RUDA_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return ruda_fuzz_one(data, size); }
#else
/* Without libFuzzer: -n inputs from a seeded generator (-s), or replay the
 * files named as arguments. */
int main(int argc, char **argv) {
  long count = 200;
  unsigned long long seed = 1;
  int files = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) count = atol(argv[++i]);
    else if (!strcmp(argv[i], "-s") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else {
      FILE *f = fopen(argv[i], "rb");
      if (f == NULL) {
        perror(argv[i]);
        return 2;
      }
      static uint8_t buf[1 << 16];
      size_t n = fread(buf, 1, sizeof buf, f);
      fclose(f);
      ruda_fuzz_one(buf, n);
      files++;
    }
  }
  if (files) return 0;
  static uint8_t buf[2048];
  for (long k = 0; k < count; k++) {
    size_t n = 64 + (size_t)(seed % (sizeof buf - 64));
    for (size_t i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      buf[i] = (uint8_t)(seed >> 56);
    }
    ruda_fuzz_one(buf, n);
  }
  printf("fuzz_api: %ld generated inputs ran clean\n", count);
  return 0;
}
#endif

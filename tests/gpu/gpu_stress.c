/* gpu_stress.c - 16 client threads launching on 16 streams at once, every
 * result checked: each thread owns a buffer and runs K `step` launches on
 * it; a launch lost, repeated or run out of order leaves a poison value.
 * Then request loops (write, launches, read) from many threads, as a
 * server issues them. */
#include "gpu_common.h"
#include "src/device.h"

enum { THREADS = 16, N = 4096 };

typedef struct client {
  ruda_device *dev;
  ruda_stream_id stream;
  unsigned launches;
  pthread_barrier_t *go;
  int rc;
  char why[256];
} client;

/* step(n, h, k) on n elements: each becomes k + 1 if it was k, else poison. */
static int step(ruda_device *dev, ruda_stream_id s, ruda_handle h, unsigned n, unsigned k) {
  ruda_arg args[] = {ruda_arg_scalar(&n, 4), ruda_arg_buffer(ruda_bind(h)), ruda_arg_scalar(&k, 4)};
  ruda_launch_desc l;
  memset(&l, 0, sizeof l);
  l.kernel = "step";
  l.grid = (ruda_dim3){n / 256, 1, 1};
  l.block = (ruda_dim3){256, 1, 1};
  l.args = args;
  l.nargs = 3;
  return ruda_launch(dev, s, &l);
}

static void *client_main(void *p) {
  client *c = p;
  ruda_handle h;
  unsigned *buf = calloc(N, 4);
  c->rc = ruda_buffer_create(c->dev, c->stream, N * 4, &h);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  if (c->rc == 0) c->rc = ruda_write(c->dev, c->stream, &d, buf, N * 4);
  pthread_barrier_wait(c->go);
  const unsigned n = N;
  for (unsigned k = 0; c->rc == 0 && k < c->launches; k++) c->rc = step(c->dev, c->stream, h, n, k);
  if (c->rc != 0) {
    snprintf(c->why, sizeof c->why, "%s", ruda_error_message(ruda_last_error()));
    free(buf);
    return NULL;
  }
  ruda_future *f = NULL;
  ruda_error *err = NULL;
  c->rc = ruda_read(c->dev, c->stream, &d, buf, N * 4, &f);
  if (c->rc == 0) c->rc = ruda_future_wait(f, &err);
  ruda_future_free(f);
  if (c->rc != 0) {
    snprintf(c->why, sizeof c->why, "%s", err ? ruda_error_message(ruda_error_cause(err)) : "read failed");
    ruda_error_free(err);
  }
  for (unsigned i = 0; c->rc == 0 && i < N; i++)
    if (buf[i] != c->launches) {
      c->rc = -1;
      snprintf(c->why, sizeof c->why, "stream %llu: element %u is %u after %u launches",
               (unsigned long long)c->stream, i, buf[i], c->launches);
    }
  if (c->rc == 0) c->rc = ruda_buffer_free(c->dev, c->stream, h);
  free(buf);
  return NULL;
}

static void sixteen_threads_sixteen_streams(void **state) {
  (void)state;
  ruda_device *dev = gpu_open_cfg(THREADS, "", 0);
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned launches = gpu_is_mock(dev) ? 500 : 5000;
  pthread_t t[THREADS];
  client c[THREADS];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, THREADS);
  for (int i = 0; i < THREADS; i++) {
    c[i] = (client){dev, (ruda_stream_id)i, launches, &go, 0, ""};
    assert_int_equal(pthread_create(&t[i], NULL, client_main, &c[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < THREADS; i++)
    if (c[i].rc != 0) fail_msg("client %d: %s (%s)", i, ruda_err_name(c[i].rc), c[i].why);
  pthread_barrier_destroy(&go);
  test_close(dev);
}

/* 64 threads on the calling-thread streams, fewer workers than threads:
 * streams share workers and so CUDA streams; each still sees its order. */
static void sixty_four_threads_shared_workers(void **state) {
  (void)state;
  enum { T = 64 };
  ruda_device *dev = gpu_open_cfg(8, "", 0);
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned launches = gpu_is_mock(dev) ? 100 : 1000;
  pthread_t t[T];
  client c[T];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, T);
  for (int i = 0; i < T; i++) {
    c[i] = (client){dev, (ruda_stream_id)(1000 + i), launches, &go, 0, ""};
    assert_int_equal(pthread_create(&t[i], NULL, client_main, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++)
    if (c[i].rc != 0) fail_msg("client %d: %s (%s)", i, ruda_err_name(c[i].rc), c[i].why);
  pthread_barrier_destroy(&go);
  test_close(dev);
}


/* A request loop per thread: write the buffer to r (a new value each
 * request), three `step` launches (r -> r + 3), a read waited for; every
 * element checked each request. With 1 request in flight the client
 * issues in place, its write and launches held for the read and replayed
 * as one graph once the builder made it (scheduler/inline.c, builder.c):
 * a held run lost, issued twice or out of order with the read, or an
 * upload moved to the wrong staged block, shows as a wrong value. */
typedef struct looper {
  ruda_device *dev;
  ruda_stream_id stream;
  unsigned requests;
  pthread_barrier_t *go;
  int rc;
  char why[256];
} looper;

enum { LOOP_N = 1024 };

static void *loop_main(void *p) {
  looper *c = p;
  ruda_handle h;
  unsigned *in = malloc(LOOP_N * 4), *out = malloc(LOOP_N * 4);
  c->rc = ruda_buffer_create(c->dev, c->stream, LOOP_N * 4, &h);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(h));
  pthread_barrier_wait(c->go);
  const unsigned n = LOOP_N;
  for (unsigned r = 0; c->rc == 0 && r < c->requests; r++) {
    const unsigned base = 10 * r + (unsigned)c->stream;
    for (unsigned i = 0; i < LOOP_N; i++) in[i] = base;
    c->rc = ruda_write(c->dev, c->stream, &d, in, LOOP_N * 4);
    for (unsigned k = 0; c->rc == 0 && k < 3; k++) c->rc = step(c->dev, c->stream, h, n, base + k);
    ruda_future *f = NULL;
    ruda_error *err = NULL;
    if (c->rc == 0) c->rc = ruda_read(c->dev, c->stream, &d, out, LOOP_N * 4, &f);
    if (c->rc == 0) c->rc = ruda_future_wait(f, &err);
    ruda_future_free(f);
    if (c->rc != 0) {
      snprintf(c->why, sizeof c->why, "request %u: %s", r,
               err ? ruda_error_message(ruda_error_cause(err)) : ruda_error_message(ruda_last_error()));
      ruda_error_free(err);
      break;
    }
    for (unsigned i = 0; i < LOOP_N; i++)
      if (out[i] != base + 3) {
        c->rc = -1;
        snprintf(c->why, sizeof c->why, "stream %llu request %u: element %u is %u, expected %u",
                 (unsigned long long)c->stream, r, i, out[i], base + 3);
        break;
      }
  }
  if (c->rc == 0) c->rc = ruda_buffer_free(c->dev, c->stream, h);
  free(in);
  free(out);
  return NULL;
}

/* 12 request loops on 8 workers (four share): held runs beside other
 * workers issuing, shared workers issuing each other's held runs, the
 * builder making templates while requests go one by one. */
static void request_loops_hold_their_runs(void **state) {
  (void)state;
  enum { T = 12 };
  ruda_device *dev = gpu_open_cfg(8, "", 0);
  assert_ok(ruda_kernel_source(dev, "step", SRC_STEP, NULL));
  const unsigned requests = gpu_is_mock(dev) ? 300 : 3000;
  pthread_t t[T];
  looper c[T];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, T);
  for (int i = 0; i < T; i++) {
    c[i] = (looper){dev, (ruda_stream_id)i, requests, &go, 0, ""};
    assert_int_equal(pthread_create(&t[i], NULL, loop_main, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++)
    if (c[i].rc != 0) fail_msg("client %d: %s (%s)", i, ruda_err_name(c[i].rc), c[i].why);
  pthread_barrier_destroy(&go);
  uint64_t replayed = 0;
  for (uint32_t i = 0; i < dev->sched.nworkers; i++) replayed += atomic_load(&dev->sched.workers[i].auto_cmds);
  /* Some requests went as graphs the builder made (the rest one by one,
   * while shapes were noted, built, or issued for a shared worker). */
  assert_true(replayed > 0);
  assert_true(atomic_load(&dev->sched.auto_built) > 0);
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sixteen_threads_sixteen_streams),
      cmocka_unit_test(sixty_four_threads_shared_workers),
      cmocka_unit_test(request_loops_hold_their_runs),
  };
  return gpu_main("gpu_stress", tests, sizeof tests / sizeof tests[0], argc, argv);
}

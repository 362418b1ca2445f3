/* simultaneous_rw.c - ruda.h's promise (kernel argument kinds): a write
 * and a read of one buffer issued at the same moment from two threads,
 * with nothing ordering the calls, still run one after the other. Thread A writes slot s % 2 (every word = s) on stream 1 while
 * thread B launches, on stream 0, a kernel that reads the slot slowly and
 * checks every word equals the first: a torn read means the two ran at
 * once (as it did before records had issue locks: scheduler/order.h).
 *   simultaneous_rw [iterations]   exit 0: no torn read, 1: torn */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "ruda/ruda.h"

enum { WORDS = 4096 };
static ruda_device *dev;
static ruda_handle slot[2], sink;
static int iters = 2000;
static _Atomic int torn;

static int k_check(const ruda_host_ctx *c, void *const *a) {
  (void)c;
  const volatile float *p = a[0];
  float first = p[0];
  for (volatile int k = 0; k < 20000; k++) {
  }
  for (int i = 0; i < WORDS; i++)
    if (p[i] != first) atomic_store(&torn, 1);
  ((float *)a[1])[0] = first;
  return 0;
}

static void *writer(void *p) {
  (void)p;
  static float buf[WORDS];
  for (int s = 0; s < iters; s++) {
    for (int i = 0; i < WORDS; i++) buf[i] = (float)s;
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(slot[s % 2]));
    if (ruda_write(dev, 1, &d, buf, sizeof buf) != 0) abort();
  }
  return NULL;
}

static void *reader(void *p) {
  (void)p;
  for (int s = 0; s < iters; s++) {
    ruda_arg a[2] = {ruda_arg_in(ruda_bind(slot[s % 2])), ruda_arg_out(ruda_bind(sink))};
    ruda_launch_desc l = {.kernel = "check", .grid = {1, 1, 1}, .block = {1, 1, 1}, .args = a, .nargs = 2};
    if (ruda_launch(dev, 0, &l) != 0) abort();
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) iters = atoi(argv[1]);
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  cfg.lanes = 16; /* the two threads' streams on lanes of their own or shared, by id */
  if (ruda_device_open(&cfg, &dev) != 0 || ruda_host_kernel_register(dev, "check", k_check) != 0 ||
      ruda_buffer_create(dev, 1, sizeof(float) * WORDS, &slot[0]) != 0 ||
      ruda_buffer_create(dev, 1, sizeof(float) * WORDS, &slot[1]) != 0 ||
      ruda_buffer_create(dev, 0, sizeof(float), &sink) != 0) {
    ruda_error_print(ruda_last_error(), stderr, 0);
    return 2;
  }
  /* Both slots hold whole values before the threads start: a read that
   * runs before any write (a legal order) must not see fresh memory, whose
   * bytes are arbitrary (ASan fills its first 4 KiB, so it looked torn). */
  static float init[WORDS];
  for (int k = 0; k < 2; k++) {
    ruda_copy_desc d = ruda_copy_contiguous(ruda_bind(slot[k]));
    if (ruda_write(dev, 1, &d, init, sizeof init) != 0) return 2;
  }
  if (ruda_sync(dev, 1, NULL) != 0) return 2;
  pthread_t a, b;
  pthread_create(&a, NULL, writer, NULL);
  pthread_create(&b, NULL, reader, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  if (ruda_device_close(dev, NULL) != 0) return 2;
  printf("simultaneous_rw: %d iterations, %s\n", iters, atomic_load(&torn) ? "TORN read seen" : "no torn read");
  return atomic_load(&torn) ? 1 : 0;
}

/* pool.c - the device memory pools: classes and routing, exact usage
 * figures, reuse on the home stream, caps, layouts, modes, the
 * out-of-memory retry, cleanup, dry runs and unhealthy reports. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

/* ---- a host backend whose allocator the test controls ---- */

static ruda__backend_ops fake;
static _Atomic uint64_t budget;     /* bytes the fake device holds; 0: no limit */
static _Atomic uint64_t allocated;  /* bytes the backend has handed out */
static _Atomic uint64_t nalloc_calls, nfree_calls;

typedef struct sized {
  uint64_t size;
} sized;

/* Sizes live in a header before each block so frees can be counted. */
static int fake_mem_alloc(void *state, uint64_t size, uint64_t *addr) {
  atomic_fetch_add(&nalloc_calls, 1);
  uint64_t b = atomic_load(&budget);
  if (b != 0 && atomic_load(&allocated) + size > b)
    return ruda__fail(RUDA_EOUTOFMEMORY, "fake device: %llu bytes requested, %llu of %llu in use",
                      (unsigned long long)size, (unsigned long long)atomic_load(&allocated),
                      (unsigned long long)b);
  uint64_t a;
  int rc = ruda__host_backend.mem_alloc(state, size + 256, &a);
  if (rc != 0) return rc;
  ((sized *)(uintptr_t)a)->size = size;
  atomic_fetch_add(&allocated, size);
  *addr = a + 256;
  return 0;
}

static void fake_mem_free(void *state, uint64_t addr, void *wstate) {
  atomic_fetch_add(&nfree_calls, 1);
  atomic_fetch_sub(&allocated, ((sized *)(uintptr_t)(addr - 256))->size);
  ruda__host_backend.mem_free(state, addr - 256, wstate);
}

static _Atomic int gate_open;

static int gate_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  while (!atomic_load(&gate_open)) usleep(100);
  return 0;
}

static ruda_device *open_fake(uint32_t streams) {
  ruda_device *dev = test_open(streams, 4096, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&budget, 0);
  atomic_store(&allocated, 0);
  atomic_store(&nalloc_calls, 0);
  atomic_store(&nfree_calls, 0);
  fake = ruda__host_backend;
  fake.mem_alloc = fake_mem_alloc;
  fake.mem_free = fake_mem_free;
  /* Host kernels are refused once the table is not the host's own. */
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  ruda__workers_stop(&dev->sched); /* idle workers read the table too */
  dev->sched.backend.ops = &fake; /* every layer reads this one field */
  assert_ok(ruda__workers_start(&dev->sched));
  return dev;
}

static uint64_t addr_of(ruda_device *dev, ruda_handle h) {
  uint64_t addr, size;
  assert_ok(ruda__handles_pin(&dev->handles, h, &addr, &size));
  ruda__handles_unpin(&dev->handles, h.slot, NULL);
  return addr;
}

static ruda_memory_stats usage(ruda_device *dev, ruda_stream_id s) {
  ruda_memory_stats u;
  assert_ok(ruda_memory_usage(dev, s, &u));
  return u;
}

static int fail_kernel(const ruda_host_ctx *c, void *const *args) {
  (void)c;
  (void)args;
  return RUDA_EGENERIC;
}

/* ---- tests ---- */

static void size_classes(void **state) {
  (void)state;
  /* Every size maps to the smallest class that holds it; classes are
   * multiples of 256 and four per doubling. */
  for (uint64_t s = 1; s < 64 * MiB; s += s / 7 + 1) {
    uint32_t i = ruda__class_index(s);
    uint64_t c = ruda__class_size(i);
    assert_true(c >= s);
    assert_int_equal(c % 256, 0);
    if (i > 0) assert_true(ruda__class_size(i - 1) < s);
    assert_true(c - s < s / 4 + 256);
    uint64_t x = ruda__exclusive_size(s);
    assert_true(x >= s && x % 256 == 0 && x - s <= s / 16 + 256);
  }
  assert_int_equal(ruda__class_size(ruda__class_index(2048)), 2048);
  assert_int_equal(ruda__class_size(ruda__class_index(2049)), 2560);
  assert_int_equal(ruda__class_size(ruda__class_index(1 * MiB)), 1 * MiB);
}

static void routing_and_exact_usage(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_pool_config def[RUDA_MEMORY_MAX_POOLS];
  uint32_t ndef = ruda_memory_default_pools(def, RUDA_MEMORY_MAX_POOLS);
  assert_int_equal(ndef, 3);
  const uint64_t sizes[] = {1,        300,          def[0].max_alloc, def[0].max_alloc + 1, def[1].max_alloc,
                            700 * KiB, def[1].max_alloc + 1, 5 * MiB};
  enum { N = sizeof sizes / sizeof sizes[0] };
  uint32_t pool_of[N];
  for (int i = 0; i < N; i++) pool_of[i] = sizes[i] <= def[0].max_alloc ? 0 : sizes[i] <= def[1].max_alloc ? 1 : 2;
  assert_int_equal(pool_of[7], 2);
  ruda_handle h[N];
  uint64_t in_use = 0, padding = 0;
  for (int i = 0; i < N; i++) {
    assert_ok(ruda_buffer_create(dev, 0, sizes[i], &h[i]));
    in_use += sizes[i];
    uint64_t slot = def[pool_of[i]].kind == RUDA_POOL_SLICED ? ruda__class_size(ruda__class_index(sizes[i]))
                                                             : ruda__exclusive_size(sizes[i]);
    padding += slot - sizes[i];
    assert_int_equal(addr_of(dev, h[i]) % RUDA__MEM_ALIGN, 0);
  }
  ruda_memory_stats u = usage(dev, 0);
  assert_int_equal(u.nallocs, N);
  assert_int_equal(u.bytes_in_use, in_use);
  assert_int_equal(u.bytes_padding, padding);
  assert_true(u.bytes_reserved >= in_use + padding);
  assert_int_equal(u.peak_in_use, in_use);
  assert_int_equal(u.bytes_unbacked, 0);

  ruda_pool_report r[8];
  uint32_t n = 0;
  assert_ok(ruda_memory_report(dev, 0, r, 8, &n));
  assert_int_equal(n, 4); /* three layout pools in routing order, then persistent */
  for (uint32_t p = 0; p < 3; p++) {
    assert_int_equal(r[p].kind, def[p].kind);
    assert_int_equal(r[p].max_alloc, def[p].max_alloc);
    assert_int_equal(r[p].min_alloc, p ? def[p - 1].max_alloc : 0);
    uint64_t cnt = 0, bytes = 0;
    for (int i = 0; i < N; i++)
      if (pool_of[i] == p) cnt++, bytes += sizes[i];
    assert_int_equal(r[p].nallocs, cnt);
    assert_int_equal(r[p].bytes_in_use, bytes);
    assert_int_equal(r[p].peak_nallocs, cnt);
    assert_true(r[p].pages >= 1);
  }
  assert_int_equal(r[3].kind, RUDA_POOL_PERSISTENT);
  assert_int_equal(r[3].nallocs, 0);
  /* Report with room for fewer entries still tells how many there are. */
  assert_ok(ruda_memory_report(dev, 0, NULL, 0, &n));
  assert_int_equal(n, 4);

  for (int i = 0; i < N; i++) {
    assert_ok(ruda_buffer_free(dev, 0, h[i]));
    in_use -= sizes[i];
    u = usage(dev, 0); /* freed memory leaves the figures at once */
    assert_int_equal(u.nallocs, N - 1 - i);
    assert_int_equal(u.bytes_in_use, in_use);
  }
  assert_int_equal(u.bytes_padding, 0);
  uint64_t total = 0;
  for (int i = 0; i < N; i++) total += sizes[i];
  assert_int_equal(u.peak_in_use, total);
  /* The other stream saw none of it. */
  u = usage(dev, 1);
  assert_int_equal(u.nallocs, 0);
  assert_int_equal(u.bytes_reserved, 0);
  test_close(dev);
}

static void home_stream_reuses_at_once(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  atomic_store(&gate_open, 0);
  assert_ok(ruda_host_kernel_register(dev, "gate", gate_kernel));
  const uint64_t sizes[] = {256, 48 * KiB, 3 * MiB};
  for (int k = 0; k < 3; k++) {
    ruda_handle x, y;
    assert_ok(ruda_buffer_create(dev, 0, sizes[k], &x));
    uint64_t ax = addr_of(dev, x);
    /* The worker is held: X's write below is still queued when X is freed
     * and its memory handed to Y. Stream order makes that safe. */
    atomic_store(&gate_open, 0);
    assert_ok(test_launch(dev, 0, "gate", NULL, 0));
    unsigned char a[64], b[64], back[64];
    memset(a, 0xaa, sizeof a);
    memset(b, 0xbb, sizeof b);
    test_write(dev, 0, ruda_bind_range(x, 0, 64), a, 64);
    assert_ok(ruda_buffer_free(dev, 0, x));
    assert_ok(ruda_buffer_create(dev, 0, sizes[k], &y));
    assert_int_equal(addr_of(dev, y), ax); /* reused at once, no wait */
    test_write(dev, 0, ruda_bind_range(y, 0, 64), b, 64);
    atomic_store(&gate_open, 1);
    test_read(dev, 0, ruda_bind_range(y, 0, 64), back, 64);
    assert_memory_equal(back, b, 64);
    assert_ok(ruda_buffer_free(dev, 0, y));
  }
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_int_equal(ruda__handles_live_count(&dev->handles), 0);
  test_close(dev);
}

static void bad_handles(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle h, h2;
  char buf[128] = {0};
  assert_ok(ruda_buffer_create(dev, 0, 100, &h));
  /* Past the end: refused, never clamped. */
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(h, 64, 64));
  assert_rc(ruda_write(dev, 0, &d, buf, 64), RUDA_ERANGE);
  d = ruda_copy_contiguous(ruda_bind_range(h, 101, 0));
  assert_rc(ruda_write(dev, 0, &d, buf, 1), RUDA_ERANGE);
  d = ruda_copy_contiguous(ruda_bind_range(h, 0, 100));
  assert_ok(ruda_write(dev, 0, &d, buf, 100));
  /* Once the write ran, the free drops the last reference itself and the
   * slot goes straight back to the stream's cache. */
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_EFREE);
  assert_rc(ruda_buffer_free(dev, 1, h), RUDA_EFREE);
  assert_rc(ruda_write(dev, 0, &d, buf, 100), RUDA_ENOTFOUND);
  uint64_t size;
  assert_rc(ruda_buffer_size(dev, h, &size), RUDA_ENOTFOUND);
  /* The slot comes back under a new generation; the stale handle stays
   * dead and never reaches the new buffer. */
  assert_ok(ruda_buffer_create(dev, 0, 100, &h2));
  assert_int_equal(h2.slot, h.slot);
  assert_int_equal(h2.gen, h.gen + 1);
  assert_rc(ruda_write(dev, 0, &d, buf, 100), RUDA_ENOTFOUND);
  assert_rc(ruda_buffer_free(dev, 0, h), RUDA_EFREE);
  assert_rc(ruda_buffer_free(dev, 0, (ruda_handle){h.slot, h.gen + 7}), RUDA_ENOTFOUND);
  assert_ok(ruda_buffer_size(dev, h2, &size));
  assert_int_equal(size, 100);
  assert_ok(ruda_buffer_free(dev, 0, h2));
  test_close(dev);
}

static void capacity_caps(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  const ruda_pool_config layout[] = {
      {.kind = RUDA_POOL_SLICED, .max_alloc = 4 * KiB, .page_size = 64 * KiB, .capacity = 128 * KiB},
      {.kind = RUDA_POOL_EXCLUSIVE, .max_alloc = 8 * MiB, .capacity = 4 * MiB},
  };
  assert_ok(ruda_memory_install_pools(dev, 0, layout, 2));
  /* 4 KiB slots in 64 KiB pages: two pages fit under the cap. */
  ruda_handle h[40];
  int n = 0;
  int rc;
  while ((rc = ruda_buffer_create(dev, 0, 4 * KiB, &h[n])) == 0) n++;
  assert_int_equal(rc, RUDA_EPOOLCAPACITY);
  assert_int_equal(n, 32);
  assert_last_error_contains("capped at 131072 bytes");
  assert_last_error_contains("a 4096-byte buffer");
  assert_last_error_contains("131072 bytes in use");
  /* A free makes room again. */
  assert_ok(ruda_buffer_free(dev, 0, h[5]));
  assert_ok(ruda_buffer_create(dev, 0, 4 * KiB, &h[5]));
  for (int i = 0; i < n; i++) assert_ok(ruda_buffer_free(dev, 0, h[i]));

  /* Exclusive pool capped at 4 MiB: 3 MiB fits once. */
  ruda_handle a, b;
  assert_ok(ruda_buffer_create(dev, 0, 3 * MiB, &a));
  assert_rc(ruda_buffer_create(dev, 0, 3 * MiB, &b), RUDA_EPOOLCAPACITY);
  assert_last_error_contains("capped at 4194304");
  assert_last_error_contains("3145728 bytes in use");
  assert_ok(ruda_buffer_free(dev, 0, a));
  /* Its freed page is kept, and given up when the cap needs the room. */
  assert_ok(ruda_buffer_create(dev, 0, 3 * MiB + 300 * KiB, &b));
  assert_ok(ruda_buffer_free(dev, 0, b));
  /* Beyond every pool: can never fit, whatever is freed. */
  assert_rc(ruda_buffer_create(dev, 0, 8 * MiB + 1, &b), RUDA_EBUFFERTOOBIG);
  assert_last_error_contains("8388609 bytes can never fit");
  assert_rc(ruda_buffer_create(dev, 0, UINT64_C(1) << 62, &b), RUDA_EBUFFERTOOBIG);
  test_close(dev);
}

static void install_layouts(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle h, p;
  assert_ok(ruda_buffer_create(dev, 0, 1000, &h));
  const ruda_pool_config two[] = {
      {.kind = RUDA_POOL_SLICED, .max_alloc = 64 * KiB, .page_size = 1 * MiB},
      {.kind = RUDA_POOL_EXCLUSIVE, .max_alloc = UINT64_MAX},
  };
  assert_rc(ruda_memory_install_pools(dev, 0, two, 2), RUDA_EPOOLSINUSE);
  assert_last_error_contains("1 buffers (1000 bytes) are live");
  ruda_pool_report r[8];
  uint32_t n;
  assert_ok(ruda_memory_report(dev, 0, r, 8, &n));
  assert_int_equal(n, 4); /* stream 0 kept the default layout */
  /* A stream whose pools are made now gets the new layout. */
  assert_ok(ruda_memory_report(dev, 1, r, 8, &n));
  assert_int_equal(n, 3);
  assert_int_equal(r[0].max_alloc, 64 * KiB);
  assert_int_equal(r[0].page_size, 1 * MiB);
  /* Persistent buffers are outside the layout and do not block it. */
  assert_ok(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_PERSISTENT));
  assert_ok(ruda_buffer_create(dev, 0, 5000, &p));
  assert_ok(ruda_memory_mode_pop(dev, 0));
  assert_ok(ruda_buffer_free(dev, 0, h));
  assert_ok(ruda_memory_install_pools(dev, 0, two, 2));
  assert_ok(ruda_memory_report(dev, 0, r, 8, &n));
  assert_int_equal(n, 3);
  assert_int_equal(r[2].kind, RUDA_POOL_PERSISTENT);
  assert_int_equal(r[2].nallocs, 1);
  assert_int_equal(r[0].nallocs, 0);
  /* Bad layouts. */
  const ruda_pool_config unordered[] = {{.kind = RUDA_POOL_SLICED, .max_alloc = 64 * KiB, .page_size = 1 * MiB},
                                        {.kind = RUDA_POOL_SLICED, .max_alloc = 32 * KiB, .page_size = 1 * MiB}};
  assert_rc(ruda_memory_install_pools(dev, 0, unordered, 2), RUDA_EINVAL);
  const ruda_pool_config small_page[] = {{.kind = RUDA_POOL_SLICED, .max_alloc = 64 * KiB, .page_size = 32 * KiB}};
  assert_rc(ruda_memory_install_pools(dev, 0, small_page, 1), RUDA_EINVAL);
  assert_rc(ruda_memory_install_pools(dev, 0, two, 0), RUDA_EINVAL);
  assert_rc(ruda_memory_install_pools(dev, 0, NULL, 2), RUDA_EINVAL);
  const ruda_pool_config reserved[] = {{.kind = RUDA_POOL_EXCLUSIVE, .max_alloc = UINT64_MAX, .reserved = {0, 1}}};
  assert_rc(ruda_memory_install_pools(dev, 0, reserved, 1), RUDA_EINVAL);
  assert_last_error_contains("reserved");
  /* Only one exclusive pool up to 1 MiB: bigger requests can never fit. */
  const ruda_pool_config one[] = {{.kind = RUDA_POOL_EXCLUSIVE, .max_alloc = 1 * MiB}};
  assert_ok(ruda_memory_install_pools(dev, 1, one, 1));
  assert_rc(ruda_buffer_create(dev, 1, 1 * MiB + 1, &h), RUDA_EBUFFERTOOBIG);
  assert_ok(ruda_buffer_create(dev, 1, 1 * MiB, &h));
  assert_ok(ruda_buffer_free(dev, 1, h));
  assert_ok(ruda_buffer_free(dev, 0, p));
  test_close(dev);
}

static void modes_nest(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle a, b, c, d;
  assert_ok(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_PERSISTENT));
  assert_ok(ruda_buffer_create(dev, 0, 1000, &a));
  assert_ok(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_AUTO));
  assert_ok(ruda_buffer_create(dev, 0, 1000, &b));
  assert_ok(ruda_memory_mode_pop(dev, 0));
  assert_ok(ruda_buffer_create(dev, 0, 3000, &c));
  assert_ok(ruda_memory_mode_pop(dev, 0));
  assert_ok(ruda_buffer_create(dev, 0, 1000, &d));
  assert_rc(ruda_memory_mode_pop(dev, 0), RUDA_EINVAL);
  assert_rc(ruda_memory_mode_push(dev, 0, (ruda_alloc_mode)7), RUDA_EINVAL);
  /* Modes belong to the stream: stream 1 is unaffected by 0's stack. */
  assert_ok(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_PERSISTENT));
  ruda_handle e;
  assert_ok(ruda_buffer_create(dev, 1, 1000, &e));
  ruda_pool_report r[8];
  uint32_t n;
  assert_ok(ruda_memory_report(dev, 0, r, 8, &n));
  assert_int_equal(r[n - 1].kind, RUDA_POOL_PERSISTENT);
  assert_int_equal(r[n - 1].nallocs, 2);
  assert_int_equal(r[n - 1].bytes_in_use, 4000);
  /* Persistent pages are sized exactly (to the 256-byte alignment). */
  assert_int_equal(r[n - 1].bytes_reserved, 1024 + 3072);
  assert_int_equal(r[0].nallocs, 2);
  assert_ok(ruda_memory_report(dev, 1, r, 8, &n));
  assert_int_equal(r[0].nallocs, 1);
  assert_int_equal(r[n - 1].nallocs, 0);
  for (int i = 0; i < RUDA_MEMORY_MODE_DEPTH - 1; i++) assert_ok(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_AUTO));
  assert_rc(ruda_memory_mode_push(dev, 0, RUDA_ALLOC_AUTO), RUDA_EINVAL);
  ruda_handle all[] = {a, b, c, d};
  for (int i = 0; i < 4; i++) assert_ok(ruda_buffer_free(dev, 0, all[i]));
  assert_ok(ruda_buffer_free(dev, 1, e));
  test_close(dev);
}

static void out_of_memory_retry(void **state) {
  (void)state;
  ruda_device *dev = open_fake(2);
  atomic_store(&budget, 24 * MiB);
  ruda_handle a, b, c;
  /* 16 MiB, freed: its page stays cached in the stream's pool. */
  assert_ok(ruda_buffer_create(dev, 0, 16 * MiB, &a));
  assert_ok(ruda_buffer_free(dev, 0, a));
  ruda_memory_stats u = usage(dev, 0);
  assert_int_equal(u.bytes_in_use, 0);
  assert_int_equal(u.bytes_reserved, 16 * MiB);
  /* 12 MiB does not fit next to it: the backend fails, the cached page is
   * released (once the worker passed its fence) and the retry succeeds. */
  uint64_t calls = atomic_load(&nalloc_calls);
  assert_ok(ruda_buffer_create(dev, 0, 12 * MiB, &b));
  assert_int_equal(atomic_load(&nalloc_calls), calls + 2);
  assert_int_equal(atomic_load(&allocated), 12 * MiB);
  /* A buffer that fits the device but not next to live ones: out of
   * memory (retryable), never "too big". */
  assert_rc(ruda_buffer_create(dev, 0, 16 * MiB, &c), RUDA_EOUTOFMEMORY);
  assert_last_error_contains("16777216-byte buffer");
  assert_last_error_contains("fake device");
  /* Pages another stream keeps are released too. */
  assert_ok(ruda_buffer_free(dev, 0, b));
  assert_ok(ruda_buffer_create(dev, 1, 20 * MiB, &c));
  assert_int_equal(atomic_load(&allocated), 20 * MiB);
  assert_ok(ruda_buffer_free(dev, 1, c));
  test_close(dev);
  assert_int_equal(atomic_load(&allocated), 0); /* close returned every page */
}

static void cleanup_returns_pages(void **state) {
  (void)state;
  ruda_device *dev = open_fake(2);
  ruda_handle h[64];
  for (int i = 0; i < 64; i++)
    assert_ok(ruda_buffer_create(dev, (ruda_stream_id)(i % 2), (uint64_t)(i + 1) * 37 * KiB, &h[i]));
  ruda_memory_stats d;
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.nallocs, 64);
  assert_int_equal(d.bytes_reserved, atomic_load(&allocated));
  for (int i = 0; i < 64; i++) assert_ok(ruda_buffer_free(dev, (ruda_stream_id)(i % 2), h[i]));
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.nallocs, 0);
  assert_true(d.bytes_reserved > 0); /* cached for reuse */
  assert_int_equal(d.bytes_reserved, atomic_load(&allocated));
  assert_ok(ruda_sync(dev, 0, NULL));
  assert_ok(ruda_sync(dev, 1, NULL));
  assert_ok(ruda_memory_cleanup(dev, 0));
  assert_ok(ruda_memory_cleanup(dev, 1));
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.bytes_reserved, 0);
  assert_int_equal(atomic_load(&allocated), 0);
  assert_int_equal(atomic_load(&nfree_calls), atomic_load(&nalloc_calls));
  assert_true(d.peak_reserved > 0);
  test_close(dev);
}

static void reports_work_while_errors_wait(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  assert_ok(ruda_host_kernel_register(dev, "fail", fail_kernel));
  assert_ok(test_launch(dev, 0, "fail", NULL, 0));
  ruda__stream *s = ruda__stream_get(&dev->sched, 0);
  for (int i = 0; atomic_load(&s->nerr) == 0; i++) {
    assert_true(i < 10000 * (int)test_patience());
    usleep(100);
  }
  ruda_memory_stats u;
  ruda_pool_report r[4];
  uint32_t n;
  /* Reports report; the error stays queued for the stream's flush. */
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_ok(ruda_memory_report(dev, 0, r, 4, &n));
  assert_ok(ruda_memory_device_usage(dev, &u));
  assert_ok(ruda_memory_usage(dev, 1, &u));
  assert_int_equal(atomic_load(&s->nerr), 1);
  assert_rc(ruda_flush(dev, 0, NULL), RUDA_EUNHEALTHY);
  assert_ok(ruda_memory_usage(dev, 0, &u));
  assert_ok(ruda_memory_report(dev, 0, r, 4, &n));
  assert_ok(ruda_memory_device_usage(dev, &u));
  test_close(dev);
}

static void dry_run_backs_later(void **state) {
  (void)state;
  ruda_device *dev = open_fake(2);
  ruda_handle small, big, real;
  uint64_t calls = atomic_load(&nalloc_calls);
  assert_rc(ruda_memory_dry_run_end(dev, 0), RUDA_EINVAL);
  assert_ok(ruda_memory_dry_run_begin(dev, 0));
  assert_ok(ruda_memory_dry_run_begin(dev, 0)); /* nested */
  assert_ok(ruda_buffer_create(dev, 0, 1000, &small));
  assert_ok(ruda_buffer_create(dev, 0, 20 * MiB, &big));
  assert_int_equal(atomic_load(&nalloc_calls), calls); /* recorded, not backed */
  ruda_memory_stats u = usage(dev, 0);
  assert_int_equal(u.nallocs, 2);
  assert_int_equal(u.bytes_in_use, 20 * MiB + 1000);
  assert_true(u.bytes_unbacked >= 20 * MiB + 1000);
  assert_int_equal(u.bytes_unbacked, u.bytes_reserved);
  assert_ok(ruda_memory_dry_run_end(dev, 0));
  assert_ok(ruda_memory_dry_run_end(dev, 0));
  /* A real allocation next to a dry-run one gets memory at once. */
  assert_ok(ruda_buffer_create(dev, 0, 1000, &real));
  assert_int_equal(addr_of(dev, real) & RUDA__UNBACKED, 0);
  /* First use backs the page; the data round-trips. */
  unsigned char v[1000], back[1000];
  for (int i = 0; i < 1000; i++) v[i] = (unsigned char)(i * 7);
  test_write(dev, 0, ruda_bind(small), v, 1000);
  test_read(dev, 0, ruda_bind(small), back, 1000);
  assert_memory_equal(v, back, 1000);
  u = usage(dev, 0);
  assert_int_equal(u.bytes_unbacked, 20 * MiB); /* only the big page is left */
  /* The big one cannot be backed now: its first use says why. */
  atomic_store(&budget, atomic_load(&allocated) + 1 * MiB);
  ruda_copy_desc d = ruda_copy_contiguous(ruda_bind_range(big, 0, 16));
  assert_rc(ruda_write(dev, 0, &d, v, 16), RUDA_ESTORAGEMAPPING);
  assert_last_error_contains("dry-run");
  assert_last_error_contains("caused by RUDA_EOUTOFMEMORY");
  /* The cause names the call that needed the memory, not the allocation. */
  assert_null(strstr(ruda_error_message(ruda_last_error()), "ruda_buffer_create"));
  ruda_arg arg = ruda_arg_buffer(ruda_bind(big));
  atomic_store(&gate_open, 1);
  assert_rc(test_launch(dev, 0, "gate", &arg, 1), RUDA_ESTORAGEMAPPING);
  /* Freeing it needs no backing. */
  assert_ok(ruda_buffer_free(dev, 0, big));
  atomic_store(&budget, 0);
  assert_ok(ruda_buffer_free(dev, 0, small));
  assert_ok(ruda_buffer_free(dev, 0, real));
  u = usage(dev, 0);
  assert_int_equal(u.nallocs, 0);
  assert_int_equal(u.bytes_unbacked, 0);
  test_close(dev);
  assert_int_equal(atomic_load(&allocated), 0);
}

typedef struct sharer {
  ruda_device *dev;
  int id, rc;
} sharer;

/* Several threads on one explicit stream: the pool lock serializes them. */
static void *share_thread(void *p) {
  sharer *s = p;
  ruda_handle h[32];
  for (int round = 0; round < 300 && s->rc == 0; round++) {
    for (int i = 0; i < 32 && s->rc == 0; i++)
      s->rc = ruda_buffer_create(s->dev, 7, (uint64_t)(1 + (i * 997 + s->id * 31) % 70000), &h[i]);
    for (int i = 0; i < 32 && s->rc == 0; i++) s->rc = ruda_buffer_free(s->dev, 7, h[i]);
  }
  return NULL;
}

static void threads_share_a_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  enum { T = 4 };
  sharer s[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    s[i] = (sharer){dev, i, 0};
    assert_int_equal(pthread_create(&t[i], NULL, share_thread, &s[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++) assert_int_equal(s[i].rc, 0);
  ruda_memory_stats u = usage(dev, 7);
  assert_int_equal(u.nallocs, 0);
  assert_int_equal(u.bytes_in_use, 0);
  assert_int_equal(u.bytes_padding, 0);
  test_close(dev);
}

/* Past the arena's budget a trim takes the size it holds most of, not
 * merely the oldest page: two big pages returned first survive forty small
 * ones, and another stream then gets them without a backend call. */
static void trims_keep_every_size_in_stock(void **state) {
  (void)state;
  ruda_device *dev = open_fake(2);
  ruda_handle big[2], small[40], x, y;
  for (int i = 0; i < 2; i++) assert_ok(ruda_buffer_create(dev, 0, 32 * MiB, &big[i]));
  for (int i = 0; i < 40; i++) assert_ok(ruda_buffer_create(dev, 0, 4 * MiB, &small[i]));
  for (int i = 0; i < 2; i++) assert_ok(ruda_buffer_free(dev, 0, big[i]));
  for (int i = 0; i < 40; i++) assert_ok(ruda_buffer_free(dev, 0, small[i]));
  /* 224 MiB came free against a 128 MiB budget: pages were trimmed. */
  assert_true(atomic_load(&nfree_calls) > 0);
  uint64_t calls = atomic_load(&nalloc_calls);
  /* Stream 1 runs on worker 1: both pages come from worker 0's shard
   * (untouched, so no fence either). */
  assert_ok(ruda_buffer_create(dev, 1, 32 * MiB, &x));
  assert_ok(ruda_buffer_create(dev, 1, 32 * MiB, &y));
  assert_int_equal(atomic_load(&nalloc_calls), calls);
  assert_ok(ruda_buffer_free(dev, 1, x));
  assert_ok(ruda_buffer_free(dev, 1, y));
  test_close(dev);
}

/* Free pages within the budget stay for reuse, but not when new memory
 * would raise reserved past its high-water mark: then the arena keeps a
 * quarter of its budget (32 MiB) and frees the rest first. */
static void new_peak_trims_first(void **state) {
  (void)state;
  ruda_device *dev = open_fake(1);
  ruda_handle h[25], big;
  for (int i = 0; i < 25; i++) assert_ok(ruda_buffer_create(dev, 0, 4 * MiB, &h[i]));
  for (int i = 0; i < 25; i++) assert_ok(ruda_buffer_free(dev, 0, h[i]));
  ruda_memory_stats d;
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.bytes_reserved, 100 * MiB); /* all kept: under the 128 MiB budget */
  assert_int_equal(atomic_load(&nfree_calls), 0);
  assert_ok(ruda_buffer_create(dev, 0, 64 * MiB, &big));
  assert_ok(ruda_memory_device_usage(dev, &d));
  assert_int_equal(d.bytes_in_use, 64 * MiB);
  assert_true(d.bytes_reserved <= 64 * MiB + 32 * MiB);
  assert_true(d.peak_reserved <= 100 * MiB); /* the high-water mark did not move */
  assert_ok(ruda_buffer_free(dev, 0, big));
  test_close(dev);
}

/* The printed summary shows every stream's pools with their figures. */
static void summary_prints_every_stream(void **state) {
  (void)state;
  ruda_device *dev = test_open(2, 1024, RUDA_BACKPRESSURE_BLOCK);
  ruda_handle a, b, c;
  assert_ok(ruda_buffer_create(dev, 0, 3000, &a));
  assert_ok(ruda_buffer_create(dev, 1, 100 * KiB, &b));
  assert_ok(ruda_buffer_create(dev, 1, 5 * MiB, &c));
  FILE *f = tmpfile();
  assert_non_null(f);
  assert_ok(ruda_memory_summary(dev, f));
  rewind(f);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_contains(text, "ruda memory summary: host CPU (host backend), 2 workers");
  assert_contains(text, "device: 3 buffers");
  assert_contains(text, "stream 0");
  assert_contains(text, "stream 1");
  assert_contains(text, "sliced <= 8.0 KiB");
  assert_contains(text, "exclusive, any");
  assert_contains(text, "5.1 MiB");
  assert_contains(text, "largest free");
  assert_rc(ruda_memory_summary(dev, NULL), RUDA_EINVAL);
  assert_ok(ruda_buffer_free(dev, 0, a));
  assert_ok(ruda_buffer_free(dev, 1, b));
  assert_ok(ruda_buffer_free(dev, 1, c));
  test_close(dev);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(size_classes),
      cmocka_unit_test(routing_and_exact_usage),
      cmocka_unit_test(home_stream_reuses_at_once),
      cmocka_unit_test(bad_handles),
      cmocka_unit_test(capacity_caps),
      cmocka_unit_test(install_layouts),
      cmocka_unit_test(modes_nest),
      cmocka_unit_test(out_of_memory_retry),
      cmocka_unit_test(cleanup_returns_pages),
      cmocka_unit_test(reports_work_while_errors_wait),
      cmocka_unit_test(summary_prints_every_stream),
      cmocka_unit_test(dry_run_backs_later),
      cmocka_unit_test(threads_share_a_stream),
      cmocka_unit_test(trims_keep_every_size_in_stock),
      cmocka_unit_test(new_peak_trims_first),
  };
  return test_main("unit_pool", tests, sizeof tests / sizeof tests[0], argc, argv);
}

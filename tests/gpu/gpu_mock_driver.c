/* gpu_mock_driver.c - a stand-in libcuda for machines without a GPU.
 *
 * Built as libruda_mockcuda.so and loaded by ruda through
 * RUDA_CUDA_DRIVER, it lets the GPU tests exercise the cuda backend's own
 * code - loading through cuGetProcAddress, limits, streams, pooled events,
 * staging retirement, 1D/2D/3D copies, parameter passing, launch checks,
 * faults - where no device exists. It is not a GPU model:
 *  - "device" memory is host memory; a CUdeviceptr is a host address;
 *  - each stream is a host thread running its operations in order, later
 *    than they were issued (truly asynchronous, so a staging block freed
 *    too early or a missing wait shows up as wrong data);
 *  - kernels are C functions looked up by name (the test kernels of
 *    gpu_common.h and gpu_order.c), run over the launch's grid and block;
 *    launching any other kernel fails (CUDA_ERROR_NOT_SUPPORTED), never a
 *    silent no-op. NVRTC (real) still compiles the source: a kernel's
 *    parameter sizes, __launch_bounds__ and static shared memory, which
 *    ruda checks launches against, are read from that PTX (and must match
 *    the emulation's table, else the function cannot be loaded);
 *  - launching "planted_fault" poisons the context: from then on syncs,
 *    queries and new work return CUDA_ERROR_ILLEGAL_ADDRESS, as a real
 *    illegal access does.
 * Device properties are an H100's, with 8 GiB of memory (RUDA_MOCK_MEM).
 * Tests reach hooks with dlsym (see "test hooks" below): holding the
 * streams, so recorded events stay pending; gating cuEventRecord, so a
 * worker stops inside a command; counting the events each thread made.
 */
#include <cuda.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- context-wide state ---- */

static _Atomic int sticky;                /* CUresult that poisoned the context */
static _Atomic unsigned long long mem_used;
static unsigned long long mem_total = 8ull << 30;
static int dummy_ctx;
static _Thread_local CUcontext current;

static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct range {
  uintptr_t base;
  size_t size;
  struct range *next;
} range;
static range *pinned, *allocs;

static int in_ranges(range **list, const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&pinned_lock);
  range *r = *list;
  for (; r; r = r->next)
    if (a >= r->base && a + n <= r->base + r->size) break;
  pthread_mutex_unlock(&pinned_lock);
  return r != NULL;
}

static void add_range(range **list, void *p, size_t n) {
  range *r = malloc(sizeof *r);
  r->base = (uintptr_t)p;
  r->size = n;
  pthread_mutex_lock(&pinned_lock);
  r->next = *list;
  *list = r;
  pthread_mutex_unlock(&pinned_lock);
}

static size_t remove_range(range **list, void *p) {
  size_t n = 0;
  pthread_mutex_lock(&pinned_lock);
  for (range **pp = list; *pp; pp = &(*pp)->next)
    if ((*pp)->base == (uintptr_t)p) {
      range *r = *pp;
      *pp = r->next;
      n = r->size;
      free(r);
      break;
    }
  pthread_mutex_unlock(&pinned_lock);
  return n;
}

/* ---- test hooks ---- */

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;
static _Atomic int streams_held, records_gated, records_waiting;

static void hook_wait(_Atomic int *flag) {
  if (!atomic_load(flag)) return;
  pthread_mutex_lock(&hook_lock);
  while (atomic_load(flag)) pthread_cond_wait(&hook_cond, &hook_lock);
  pthread_mutex_unlock(&hook_lock);
}

static void hook_set(_Atomic int *flag, int on) {
  pthread_mutex_lock(&hook_lock);
  atomic_store(flag, on);
  pthread_cond_broadcast(&hook_cond);
  pthread_mutex_unlock(&hook_lock);
}

/* While on, no stream starts another operation: everything issued stays
 * pending (queries say not ready, synchronizes wait), as behind a kernel
 * that runs long. */
EXPORT void ruda_mock_hold_streams(int on) { hook_set(&streams_held, on); }

/* While on, cuEventRecord blocks its caller (a worker, inside a command)
 * until it is turned off. */
EXPORT void ruda_mock_gate_records(int on) { hook_set(&records_gated, on); }

/* How many callers cuEventRecord holds at its gate now: a test waits for
 * this to know a worker stopped there, instead of sleeping. */
EXPORT int ruda_mock_records_waiting(void) { return atomic_load(&records_waiting); }

/* cuEventCreate calls by the name of the calling thread (its first 15
 * characters), so a test can tell which of ruda's threads made events. */
static pthread_mutex_t creates_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char name[16];
  unsigned long n;
} creates[64];

static void count_create(void) {
  char name[16] = "";
  pthread_getname_np(pthread_self(), name, sizeof name);
  pthread_mutex_lock(&creates_lock);
  for (size_t i = 0; i < sizeof creates / sizeof creates[0]; i++)
    if (creates[i].name[0] == 0 || strcmp(creates[i].name, name) == 0) {
      memcpy(creates[i].name, name, sizeof name);
      creates[i].n++;
      break;
    }
  pthread_mutex_unlock(&creates_lock);
}

/* Events created so far by threads whose name starts with prefix. */
EXPORT unsigned long ruda_mock_event_creates(const char *prefix) {
  unsigned long n = 0;
  pthread_mutex_lock(&creates_lock);
  for (size_t i = 0; i < sizeof creates / sizeof creates[0] && creates[i].name[0] != 0; i++)
    if (strncmp(creates[i].name, prefix, strlen(prefix)) == 0) n += creates[i].n;
  pthread_mutex_unlock(&creates_lock);
  return n;
}

/* ---- streams: a thread per stream running queued operations ---- */

typedef struct op op;
struct CUstream_st;
struct CUevent_st {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  unsigned long long recorded, done; /* generations */
  int timing;                        /* created without CU_EVENT_DISABLE_TIMING */
  struct timespec at;                /* when the stream reached the last record */
};

struct op {
  op *next;
  void (*run)(op *);
  union {
    struct {
      void *dst;
      const void *src;
      size_t n;
      void *owned; /* snapshot of pageable source, freed after */
    } copy;
    struct {
      CUDA_MEMCPY3D c; /* 2D copies are stored as one-slice 3D copies */
    } c3;
    struct {
      struct CUevent_st *ev;
      unsigned long long gen;
    } event;
    struct {
      const struct mock_kernel *k;
      unsigned g[3], b[3], shared;
      unsigned char params[512] __attribute__((aligned(16)));
    } launch;
  } u;
};

struct CUstream_st {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond, idle;
  op *head, *tail;
  int busy, stop;
  /* Stream capture: work goes to this list instead of running. */
  int capturing;
  op *cap_head, *cap_tail;
  CUgraphNode cap_dep; /* what cuStreamGetCaptureInfo hands out: the last op captured */
};

static void *stream_main(void *p) {
  struct CUstream_st *s = p;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
    if (s->head == NULL && s->stop) break;
    op *o = s->head;
    s->head = o->next;
    if (s->head == NULL) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    hook_wait(&streams_held);
    o->run(o); /* runs even when poisoned: events must still complete */
    free(o);
    pthread_mutex_lock(&s->lock);
    s->busy = 0;
    if (s->head == NULL) pthread_cond_broadcast(&s->idle);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void enqueue(struct CUstream_st *s, op *o) {
  o->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->capturing) {
    if (s->cap_tail) s->cap_tail->next = o;
    else s->cap_head = o;
    s->cap_tail = o;
    pthread_mutex_unlock(&s->lock);
    return;
  }
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static void drain(struct CUstream_st *s) {
  pthread_mutex_lock(&s->lock);
  while (s->head != NULL || s->busy) pthread_cond_wait(&s->idle, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *streams[4096];
static int nstreams;

static void drain_all(void) {
  pthread_mutex_lock(&streams_lock);
  for (int i = 0; i < nstreams; i++)
    if (streams[i]) drain(streams[i]);
  pthread_mutex_unlock(&streams_lock);
}

static op *op_new(void (*run)(op *)) {
  op *o = calloc(1, sizeof *o);
  o->run = run;
  return o;
}

#define POISONED() (atomic_load(&sticky) != 0)

/* ---- kernels ---- */

typedef struct mock_kernel {
  const char *name;
  int nparams;
  unsigned sizes[8];
  int max_threads, static_shared;
  void (*fn)(const unsigned g[3], const unsigned b[3], const unsigned char *params);
} mock_kernel;

static unsigned long long total_threads(const unsigned g[3], const unsigned b[3]) {
  return (unsigned long long)g[0] * g[1] * g[2] * b[0] * b[1] * b[2];
}

#define P(type, off) (*(const type *)(params + (off)))
#define PTR(type, off) ((type *)(uintptr_t)P(CUdeviceptr, off))

static void k_axpy(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned n = P(unsigned, 0);
  float a = P(float, 4);
  const float *x = PTR(const float, 8);
  float *y = PTR(float, 16);
  unsigned long long t = total_threads(g, b);
  for (unsigned long long i = 0; i < n && i < t; i++) y[i] = a * x[i] + y[i];
}

/* The grid-stride loops of SRC_REDUCE and SRC_CHECKSUM, thread by
 * thread: what each thread of the launch's shape adds. */
static void k_reduce_sum(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned n = P(unsigned, 0);
  const float *x = PTR(const float, 8);
  double *out = PTR(double, 16);
  unsigned long long t = total_threads(g, b);
  double s = 0;
  for (unsigned long long tid = 0; tid < t && tid < n; tid++)
    for (unsigned long long i = tid; i < n; i += t) s += x[i];
  *out += s;
}

static void k_matmul(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned M = P(unsigned, 0), N = P(unsigned, 4), K = P(unsigned, 8);
  const float *A = PTR(const float, 16), *B = PTR(const float, 24);
  float *C = PTR(float, 32);
  unsigned rows = g[1] * b[1], cols = g[0] * b[0];
  for (unsigned i = 0; i < M && i < rows; i++)
    for (unsigned j = 0; j < N && j < cols; j++) {
      float s = 0;
      for (unsigned k = 0; k < K; k++) s += A[(size_t)i * K + k] * B[(size_t)k * N + j];
      C[(size_t)i * N + j] = s;
    }
}

static void k_step(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned n = P(unsigned, 0);
  unsigned *buf = PTR(unsigned, 8);
  unsigned k = P(unsigned, 16);
  unsigned long long t = total_threads(g, b);
  for (unsigned long long i = 0; i < n && i < t; i++) buf[i] = buf[i] == k ? k + 1 : 0xffffffffu;
}

static void k_checksum(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned long long n = P(unsigned long long, 0);
  const unsigned *w = PTR(const unsigned, 8);
  unsigned long long *out = PTR(unsigned long long, 16);
  unsigned long long t = total_threads(g, b), s = 0;
  for (unsigned long long tid = 0; tid < t && tid < n; tid++)
    for (unsigned long long i = tid; i < n; i += t) s += (unsigned long long)w[i] * (2 * i + 1);
  *out += s;
}

static void k_mark_blocks(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)b;
  unsigned *out = PTR(unsigned, 0);
  for (unsigned long long i = 0; i < (unsigned long long)g[0] * g[1] * g[2]; i++) out[i] += 1;
}

static void k_planted_fault(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)g, (void)b, (void)params;
  int expected = 0;
  atomic_compare_exchange_strong(&sticky, &expected, CUDA_ERROR_ILLEGAL_ADDRESS);
}

/* Tensor maps: this mock's encoding of a tiled map (see
 * m_cuTensorMapEncodeTiled); a real map is opaque. */
#define TMAP_MAGIC 0x70616d74u
typedef struct mock_tmap {
  uint32_t magic, rank, elem, oob;
  uint64_t addr;
  uint64_t dim[5], stride[5]; /* innermost first; stride[0] = elem */
  uint32_t box[5];
} mock_tmap; /* must fit the map's 128 bytes */
_Static_assert(sizeof(mock_tmap) <= 128, "mock tensor map too big");

/* tma_copy(map, out, x0, y0): the 2D box at (x0, y0) into out, zeros
 * outside the tensor. */
static void k_tma_copy(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)g, (void)b;
  const mock_tmap *m = (const mock_tmap *)params;
  float *out = PTR(float, 128);
  int x0 = P(int, 136), y0 = P(int, 140);
  if (m->magic != TMAP_MAGIC) return;
  for (uint32_t y = 0; y < m->box[1]; y++)
    for (uint32_t x = 0; x < m->box[0]; x++) {
      long long gx = x0 + (long long)x, gy = y0 + (long long)y;
      float v = 0;
      if (gx >= 0 && gy >= 0 && (uint64_t)gx < m->dim[0] && (uint64_t)gy < m->dim[1])
        memcpy(&v, (const unsigned char *)(uintptr_t)m->addr + gy * m->stride[1] + gx * m->elem, 4);
      out[y * m->box[0] + x] = v;
    }
}

/* The slow kernels of gpu_order.c: spin is clock64 cycles on a GPU,
 * slept here as microseconds at 2 GHz, so the work lands late. */
static void spin_sleep(long long spin) {
  if (spin > 0) usleep((useconds_t)(spin / 2000));
}

/* Their loops stride over gridDim.x * blockDim.x threads (x only). */
static unsigned long long threads_x(const unsigned g[3], const unsigned b[3]) {
  return (unsigned long long)g[0] * b[0];
}

static void k_order_fill(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned n = P(unsigned, 0);
  unsigned *buf = PTR(unsigned, 8);
  unsigned v = P(unsigned, 16);
  spin_sleep(P(long long, 24));
  unsigned long long t = threads_x(g, b);
  for (unsigned long long tid = 0; tid < t && tid < n; tid++)
    for (unsigned long long i = tid; i < n; i += t) buf[i] = v + (unsigned)i;
}

static void k_order_add(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  unsigned n = P(unsigned, 0);
  const unsigned *src = PTR(const unsigned, 8);
  unsigned *dst = PTR(unsigned, 16);
  unsigned k = P(unsigned, 24);
  spin_sleep(P(long long, 32));
  unsigned long long t = threads_x(g, b);
  for (unsigned long long tid = 0; tid < t && tid < n; tid++)
    for (unsigned long long i = tid; i < n; i += t) dst[i] = src[i] + k;
}

static void k_access_meet(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)g, (void)b;
  _Atomic int *counter = PTR(_Atomic int, 0);
  int want = P(int, 8);
  long long timeout_us = P(long long, 16) / 2000;
  int *met = PTR(int, 24);
  atomic_fetch_add(counter, 1);
  for (long long t = 0; atomic_load(counter) < want && t < timeout_us; t += 100) usleep(100);
  met[0] = atomic_load(counter) >= want;
}

/* SRC_CXX's kernels, under their mangled names. */
/* One element per thread of the x dimensions (blockIdx.x * blockDim.x +
 * threadIdx.x), as the sources index. */
static void k_vector_add(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  const float *x = PTR(const float, 0), *y = PTR(const float, 8);
  float *z = PTR(float, 16);
  int n = P(int, 24);
  for (long long i = 0; i < n && (unsigned long long)i < threads_x(g, b); i++) z[i] = x[i] + y[i];
}
static void k_scale_f(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  float *x = PTR(float, 0), a = P(float, 8);
  int n = P(int, 12);
  for (long long i = 0; i < n && (unsigned long long)i < threads_x(g, b); i++) x[i] *= a;
}
/* Four elements per thread: (blockIdx.x * block.size() + rank) * 4. */
static void k_ns_axpy4(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  const float *x = PTR(const float, 0);
  float *y = PTR(float, 8), a = P(float, 16);
  int n = P(int, 20);
  unsigned long long covered = (unsigned long long)g[0] * b[0] * b[1] * b[2] * 4;
  for (long long i = 0; i < n && (unsigned long long)i < covered; i++) y[i] = a * x[i] + y[i];
}
static void k_block_sum(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  const float *x = PTR(const float, 0);
  float *out = PTR(float, 8);
  int n = P(int, 16);
  for (unsigned blk = 0; blk < g[0]; blk++) {
    float s = 0;
    for (unsigned t = 0; t < b[0]; t++) {
      long i = (long)blk * b[0] + t;
      if (i < n) s += x[i];
    }
    out[blk] = s;
  }
}

/* bench_serve's request (a row of 128 floats per block of 128 threads),
 * so the README loop runs on this mock: counting calls per request.
 * RUDA_MOCK_SKIP_SERVE=1 leaves y as it is (results then fail bench_serve's
 * check), for profiling the host's side without the emulation's cost. */
static int skip_serve(void) {
  static int v = -1;
  if (v < 0) v = getenv("RUDA_MOCK_SKIP_SERVE") != NULL && *getenv("RUDA_MOCK_SKIP_SERVE") == '1';
  return v;
}

static void k_serve_layer(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  const float *x = PTR(const float, 0), *w = PTR(const float, 8);
  float *y = PTR(float, 16);
  if (skip_serve()) return;
  for (unsigned r = 0; r < g[0]; r++)
    for (unsigned c = 0; c < b[0]; c++) {
      float acc = 0.0f;
      for (unsigned k = 0; k < 128u; k++) acc += x[r * 128u + k] * w[k * 128u + c];
      y[r * 128u + c] = acc;
    }
}

static void k_serve_bias_relu(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  float *y = PTR(float, 0);
  const float *bias = PTR(const float, 8);
  if (skip_serve()) return;
  for (unsigned i = 0; i < g[0] * 128u && i < g[0] * b[0]; i++) {
    float v = y[i] + bias[i % 128u];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

static void k_serve_softmax(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)b;
  float *y = PTR(float, 0);
  if (skip_serve()) return;
  for (unsigned r = 0; r < g[0]; r++) {
    float *row = y + r * 128u, mx = row[0], sum = 0.0f;
    for (unsigned c = 1; c < 128u; c++) mx = row[c] > mx ? row[c] : mx;
    for (unsigned c = 0; c < 128u; c++) sum += (row[c] = expf(row[c] - mx));
    for (unsigned c = 0; c < 128u; c++) row[c] /= sum;
  }
}

static void k_nop(const unsigned g[3], const unsigned b[3], const unsigned char *params) {
  (void)g, (void)b, (void)params;
}

static const mock_kernel kernels[] = {
    {"axpy", 4, {4, 4, 8, 8}, 1024, 0, k_axpy},
    {"reduce_sum", 3, {4, 8, 8}, 1024, 0, k_reduce_sum},
    {"matmul", 6, {4, 4, 4, 8, 8, 8}, 1024, 0, k_matmul},
    {"step", 3, {4, 8, 4}, 1024, 0, k_step},
    {"checksum", 3, {8, 8, 8}, 1024, 0, k_checksum},
    {"mark_blocks", 1, {8}, 1024, 0, k_mark_blocks},
    {"planted_fault", 1, {8}, 1024, 0, k_planted_fault},
    {"empty", 0, {0}, 1024, 0, k_nop},
    {"static_smem", 1, {8}, 1024, 16384, k_nop},
    {"bounded128", 1, {8}, 128, 0, k_nop},
    {"tma_copy", 4, {128, 8, 4, 4}, 1024, 4096 + 8, k_tma_copy},
    {"order_fill", 4, {4, 8, 4, 8}, 1024, 0, k_order_fill},
    {"order_add", 5, {4, 8, 8, 4, 8}, 1024, 0, k_order_add},
    {"access_meet", 4, {8, 4, 8, 8}, 1024, 0, k_access_meet},
    {"_Z9vectorAddPKfS0_Pfi", 4, {8, 8, 8, 4}, 1024, 0, k_vector_add},
    {"_Z5scaleIfEvPT_S0_i", 3, {8, 4, 4}, 1024, 0, k_scale_f},
    {"scale", 3, {8, 4, 4}, 1024, 0, k_scale_f}, /* the README's Python snippet */
    {"_ZN2ns4axpyIfLi4EEEvPKT_PS1_S1_i", 4, {8, 8, 4, 4}, 1024, 0, k_ns_axpy4},
    {"_Z9block_sumPKfPfi", 3, {8, 8, 4}, 1024, 0, k_block_sum},
    {"serve_layer", 3, {8, 8, 8}, 1024, 0, k_serve_layer},
    {"serve_bias_relu", 2, {8, 8}, 1024, 0, k_serve_bias_relu},
    {"serve_softmax", 1, {8}, 1024, 512, k_serve_softmax},
};

/* Parameters sit at their natural alignment, as in the CUDA ABI. */
static size_t param_offset(const unsigned *sizes, size_t i) {
  size_t off = 0;
  for (size_t j = 0;; j++) {
    size_t a = sizes[j] < 8 ? sizes[j] : 8;
    off = (off + a - 1) / a * a;
    if (j == i) return off;
    off += sizes[j];
  }
}

struct CUfunc_st {
  struct CUfunc_st *next; /* the module's functions, freed with it */
  char name[128];
  const mock_kernel *k; /* its emulation; NULL: none, a launch fails */
  int max_dyn_shared;
  /* What the driver reports: read from the PTX where the image is PTX
   * (so from what NVRTC compiled, not from this file), else the table's. */
  int known; /* the fields below hold the kernel's, not defaults */
  int nparams;
  unsigned sizes[8];
  int max_threads, static_shared;
};

/* Size of a PTX type token (".u32", ".f64", ".b8", ...), 0 if none. */
static unsigned ptx_type_size(const char *t, size_t len) {
  if (len < 3 || t[0] != '.' || strchr("usbf", t[1]) == NULL) return 0;
  char digits[4] = {0};
  if (len - 2 > 2) return 0;
  memcpy(digits, t + 2, len - 2);
  int bits = atoi(digits);
  return bits == 8 || bits == 16 || bits == 32 || bits == 64 ? (unsigned)bits / 8 : 0;
}

/* The end of the token at t (a space, or limit). */
static const char *type_end(const char *t, const char *limit) {
  while (t < limit && *t != ' ') t++;
  return t;
}

/* Reads `.entry name(params)`, its .maxntid and the static .shared of its
 * body from PTX text into f. Returns 0, or -1 when the text is not what
 * this reader knows (the caller then keeps the table's answers). */
static int ptx_describe(const char *ptx, size_t len, const char *name, struct CUfunc_st *f) {
  char head[160];
  snprintf(head, sizeof head, ".entry %s(", name);
  const char *p = NULL, *end = ptx + len;
  for (const char *q = ptx; q + strlen(head) <= end; q++)
    if (memcmp(q, head, strlen(head)) == 0) {
      p = q + strlen(head);
      break;
    }
  if (p == NULL) return -1;
  f->nparams = 0;
  while (p < end && *p != ')') {
    const char *e = p;
    while (e < end && *e != ',' && *e != ')') e++; /* one parameter */
    unsigned size = 0, count = 1;
    int any = 0;
    for (const char *t = p; t < e;) {
      while (t < e && (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r')) t++;
      const char *te = t;
      while (te < e && *te != ' ' && *te != '\t' && *te != '\n' && *te != '\r') te++;
      if (te == t) break;
      if (te - t >= 6 && memcmp(t, ".param", 6) == 0) any = 1;
      else if (ptx_type_size(t, (size_t)(te - t)) != 0 && size == 0) size = ptx_type_size(t, (size_t)(te - t));
      else if (memchr(t, '[', (size_t)(te - t)) != NULL) count = (unsigned)atoi((const char *)memchr(t, '[', (size_t)(te - t)) + 1);
      t = te;
    }
    if (any) {
      if (size == 0 || f->nparams == 8) return -1;
      f->sizes[f->nparams++] = size * count;
    }
    p = e < end && *e == ',' ? e + 1 : e;
  }
  if (p >= end) return -1;
  const char *body = memchr(p, '{', (size_t)(end - p));
  if (body == NULL) return -1;
  f->max_threads = 1024;
  for (const char *q = p; q + 8 < body; q++)
    if (memcmp(q, ".maxntid", 8) == 0) { /* the scan stops at the body's '{' at the latest */
      unsigned x = 1, y = 1, z = 1;
      sscanf(q + 8, " %u , %u , %u", &x, &y, &z);
      f->max_threads = (int)(x * y * z);
    }
  f->static_shared = 0;
  int depth = 0;
  for (const char *q = body; q < end; q++) {
    if (*q == '{') depth++;
    else if (*q == '}' && --depth == 0) break;
    else if (depth == 1 && end - q >= 7 && memcmp(q, ".shared", 7) == 0 && (q == body || q[-1] != '.')) {
      /* ".shared .align A .bN name[count];" (an .extern one has no count) */
      const char *semi = memchr(q, ';', (size_t)(end - q));
      const char *br = semi ? memchr(q, '[', (size_t)(semi - q)) : NULL;
      const char *ty = semi ? memmem(q, (size_t)(semi - q), " .b", 3) : NULL;
      if (br != NULL && ty != NULL && ty < br && br[1] != ']')
        f->static_shared += atoi(br + 1) * (int)ptx_type_size(ty + 1, (size_t)(type_end(ty + 1, br) - (ty + 1)));
    }
  }
  return 0;
}

struct CUmod_st {
  unsigned char *image;
  size_t size;
  struct CUfunc_st *funcs;
};

/* ---- API ---- */

static CUresult m_cuInit(unsigned int flags) {
  (void)flags;
  const char *v = getenv("RUDA_MOCK_MEM");
  if (v && *v) mem_total = strtoull(v, NULL, 10);
  return CUDA_SUCCESS;
}
static CUresult m_cuDriverGetVersion(int *v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}
static CUresult m_cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
static CUresult m_cuDeviceGetCount(int *n) {
  *n = 1;
  return CUDA_SUCCESS;
}
static CUresult m_cuDeviceGetName(char *name, int len, CUdevice d) {
  (void)d;
  snprintf(name, (size_t)len, "ruda mock GPU");
  return CUDA_SUCCESS;
}
static CUresult m_cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d) {
  (void)d;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = 2147483647; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult m_cuDeviceTotalMem(size_t *bytes, CUdevice d) {
  (void)d;
  *bytes = mem_total;
  return CUDA_SUCCESS;
}
static CUresult m_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  (void)d;
  *c = (CUcontext)&dummy_ctx;
  return CUDA_SUCCESS;
}
static CUresult m_cuDevicePrimaryCtxRelease(CUdevice d) {
  (void)d;
  return CUDA_SUCCESS;
}
static CUresult m_cuCtxSetCurrent(CUcontext c) {
  current = c;
  return CUDA_SUCCESS;
}
static CUresult m_cuCtxGetCurrent(CUcontext *c) {
  *c = current;
  return CUDA_SUCCESS;
}
/* Calls that need a context fail without one, as the driver's do. */
#define NEED_CTX()                                              \
  do {                                                          \
    if (current != (CUcontext)&dummy_ctx) return CUDA_ERROR_INVALID_CONTEXT; \
  } while (0)

static CUresult m_cuCtxSynchronize(void) {
  NEED_CTX();
  drain_all();
  return atomic_load(&sticky);
}
static CUresult m_cuStreamCreate(CUstream *out, unsigned int flags) {
  (void)flags;
  NEED_CTX();
  struct CUstream_st *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  pthread_cond_init(&s->idle, NULL);
  pthread_create(&s->thread, NULL, stream_main, s);
  pthread_mutex_lock(&streams_lock);
  int at = 0; /* a destroyed stream's place, else a new one */
  while (at < nstreams && streams[at] != NULL) at++;
  if (at == nstreams && nstreams == (int)(sizeof streams / sizeof streams[0])) {
    pthread_mutex_unlock(&streams_lock);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  streams[at] = s;
  if (at == nstreams) nstreams++;
  pthread_mutex_unlock(&streams_lock);
  *out = s;
  return CUDA_SUCCESS;
}
/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name one stream made at
 * first use (a consumer's default stream, as DLPack passes it); the
 * legacy stream's implicit ordering with other streams is not modelled. */
static CUstream default_stream;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void default_make(void) { m_cuStreamCreate(&default_stream, 0); }
static CUstream resolve(CUstream s) {
  if (s != NULL && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) return s;
  pthread_once(&default_once, default_make);
  return default_stream;
}

static CUresult m_cuStreamDestroy(CUstream s) {
  drain(s);
  pthread_mutex_lock(&s->lock);
  s->stop = 1;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&streams_lock);
  for (int i = 0; i < nstreams; i++)
    if (streams[i] == s) streams[i] = NULL;
  pthread_mutex_unlock(&streams_lock);
  free(s);
  return CUDA_SUCCESS;
}
static CUresult m_cuStreamSynchronize(CUstream s) {
  NEED_CTX();
  drain(resolve(s));
  return atomic_load(&sticky);
}
static CUresult m_cuStreamQuery(CUstream s) {
  pthread_mutex_lock(&s->lock);
  int idle = s->head == NULL && !s->busy;
  pthread_mutex_unlock(&s->lock);
  if (POISONED()) return atomic_load(&sticky);
  return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static void run_event(op *o) {
  struct CUevent_st *e = o->u.event.ev;
  pthread_mutex_lock(&e->lock);
  clock_gettime(CLOCK_MONOTONIC, &e->at);
  if (o->u.event.gen > e->done) e->done = o->u.event.gen;
  pthread_cond_broadcast(&e->cond);
  pthread_mutex_unlock(&e->lock);
}
static void run_wait_event(op *o) {
  struct CUevent_st *e = o->u.event.ev;
  pthread_mutex_lock(&e->lock);
  while (e->done < o->u.event.gen) pthread_cond_wait(&e->cond, &e->lock);
  pthread_mutex_unlock(&e->lock);
}
static CUresult m_cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  (void)flags;
  if (POISONED()) return atomic_load(&sticky);
  op *o = op_new(run_wait_event);
  o->u.event.ev = e;
  pthread_mutex_lock(&e->lock);
  o->u.event.gen = e->recorded;
  pthread_mutex_unlock(&e->lock);
  enqueue(resolve(s), o);
  return CUDA_SUCCESS;
}
static CUresult m_cuEventCreate(CUevent *out, unsigned int flags) {
  NEED_CTX();
  count_create();
  struct CUevent_st *e = calloc(1, sizeof *e);
  e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->cond, NULL);
  *out = e;
  return CUDA_SUCCESS;
}
static CUresult m_cuEventDestroy(CUevent e) {
  pthread_mutex_destroy(&e->lock);
  pthread_cond_destroy(&e->cond);
  free(e);
  return CUDA_SUCCESS;
}
static CUresult m_cuEventRecord(CUevent e, CUstream s) {
  atomic_fetch_add(&records_waiting, 1);
  hook_wait(&records_gated);
  atomic_fetch_sub(&records_waiting, 1);
  if (POISONED()) return atomic_load(&sticky);
  op *o = op_new(run_event);
  o->u.event.ev = e;
  pthread_mutex_lock(&e->lock);
  o->u.event.gen = ++e->recorded;
  pthread_mutex_unlock(&e->lock);
  enqueue(resolve(s), o);
  return CUDA_SUCCESS;
}
static CUresult m_cuEventQuery(CUevent e) {
  pthread_mutex_lock(&e->lock);
  int done = e->done >= e->recorded;
  pthread_mutex_unlock(&e->lock);
  if (done && POISONED()) return atomic_load(&sticky);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult m_cuEventSynchronize(CUevent e) {
  pthread_mutex_lock(&e->lock);
  while (e->done < e->recorded) pthread_cond_wait(&e->cond, &e->lock);
  pthread_mutex_unlock(&e->lock);
  return atomic_load(&sticky);
}
/* As the driver: both events recorded, complete, and made with timing. */
static CUresult m_cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  if (!a->timing || !b->timing) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&a->lock);
  int ready = a->recorded > 0 && a->done >= a->recorded;
  struct timespec ta = a->at;
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_lock(&b->lock);
  ready = ready && b->recorded > 0 && b->done >= b->recorded;
  struct timespec tb = b->at;
  pthread_mutex_unlock(&b->lock);
  if (!ready) return CUDA_ERROR_NOT_READY;
  *ms = (float)((double)(tb.tv_sec - ta.tv_sec) * 1e3 + (double)(tb.tv_nsec - ta.tv_nsec) / 1e6);
  return CUDA_SUCCESS;
}

static CUresult m_cuMemAlloc(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  if (POISONED()) return atomic_load(&sticky);
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long used = atomic_fetch_add(&mem_used, n) + n;
  if (used > mem_total) {
    atomic_fetch_sub(&mem_used, n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void *m = NULL;
  if (posix_memalign(&m, 256, n) != 0) {
    atomic_fetch_sub(&mem_used, n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  add_range(&allocs, m, n);
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult m_cuMemFree(CUdeviceptr p) {
  NEED_CTX();
  /* The real cuMemFree waits for work in flight; so does this one. */
  drain_all();
  size_t n = remove_range(&allocs, (void *)(uintptr_t)p);
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  atomic_fetch_sub(&mem_used, n);
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}
/* Stream-ordered: the memory is taken at once (usable by the stream's
 * later work, as the driver's pool gives it) and given back when the
 * stream reaches the free. */
static CUresult m_cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  CUresult r = m_cuMemAlloc(p, n);
  if (r != CUDA_ERROR_OUT_OF_MEMORY || s == NULL) return r;
  /* The driver's pool reuses what the stream freed before: let the
   * stream reach its frees, then try again. */
  drain(s);
  return m_cuMemAlloc(p, n);
}
static void run_free(op *o) {
  size_t n = remove_range(&allocs, o->u.copy.dst);
  atomic_fetch_sub(&mem_used, n);
  free(o->u.copy.dst);
}
static CUresult m_cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  NEED_CTX();
  if (!in_ranges(&allocs, (void *)(uintptr_t)p, 1)) return CUDA_ERROR_INVALID_VALUE;
  op *o = op_new(run_free);
  o->u.copy.dst = (void *)(uintptr_t)p;
  enqueue(s, o);
  return CUDA_SUCCESS;
}
static CUresult m_cuMemGetInfo(size_t *fr, size_t *total) {
  *total = mem_total;
  *fr = mem_total - atomic_load(&mem_used);
  return CUDA_SUCCESS;
}
/* mmap, as the driver does: memory from the process's malloc would be
 * known to jemalloc already, and the staging arena carves its own extents
 * out of these blocks. */
static CUresult m_cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
  (void)flags;
  NEED_CTX();
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  add_range(&pinned, m, n);
  *pp = m;
  return CUDA_SUCCESS;
}
static CUresult m_cuMemFreeHost(void *p) {
  size_t n = remove_range(&pinned, p);
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, n);
  return CUDA_SUCCESS;
}

/* Memory of another context (ruda_mock_foreign_alloc): what a pointer of
 * a second device or a user-made context looks like to the attributes. */
static range *foreign;
static int foreign_ctx;

EXPORT void *ruda_mock_foreign_alloc(size_t n) {
  void *m = malloc(n);
  if (m) add_range(&foreign, m, n);
  return m;
}

EXPORT void ruda_mock_foreign_free(void *p) {
  if (remove_range(&foreign, p)) free(p);
}

/* The range of list that holds a (its base and size), 0 when none. */
static int range_of(range **list, uintptr_t a, uintptr_t *base, size_t *size) {
  pthread_mutex_lock(&pinned_lock);
  range *r = *list;
  for (; r; r = r->next)
    if (a >= r->base && a < r->base + r->size) break;
  if (r) *base = r->base, *size = r->size;
  pthread_mutex_unlock(&pinned_lock);
  return r != NULL;
}

static CUresult m_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
  uintptr_t base = 0;
  size_t size = 0;
  unsigned int type;
  CUcontext ctx = (CUcontext)&dummy_ctx;
  if (range_of(&allocs, (uintptr_t)p, &base, &size)) type = CU_MEMORYTYPE_DEVICE;
  else if (range_of(&foreign, (uintptr_t)p, &base, &size)) type = CU_MEMORYTYPE_DEVICE, ctx = (CUcontext)&foreign_ctx;
  else if (range_of(&pinned, (uintptr_t)p, &base, &size)) type = CU_MEMORYTYPE_HOST;
  else return CUDA_ERROR_INVALID_VALUE; /* as the driver says of memory it does not know */
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = type; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = size; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

static int device_range(CUdeviceptr p, size_t n) { return in_ranges(&allocs, (void *)(uintptr_t)p, n); }

static void run_copy(op *o) {
  if (!POISONED()) memcpy(o->u.copy.dst, o->u.copy.src, o->u.copy.n);
  free(o->u.copy.owned);
}

/* Async copies from pageable memory behave as the driver's do: the source
 * is consumed before the call returns. Page-locked sources are read later,
 * by the stream thread. */
static CUresult copy_async(void *dst, const void *src, size_t n, CUstream s, int src_is_host) {
  if (POISONED()) return atomic_load(&sticky);
  op *o = op_new(run_copy);
  o->u.copy.dst = dst;
  o->u.copy.n = n;
  if (src_is_host && !in_ranges(&pinned, src, n)) {
    o->u.copy.owned = malloc(n ? n : 1);
    memcpy(o->u.copy.owned, src, n);
    o->u.copy.src = o->u.copy.owned;
  } else {
    o->u.copy.src = src;
  }
  enqueue(s, o);
  return CUDA_SUCCESS;
}
static CUresult m_cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s) {
  if (!device_range(d, n)) return CUDA_ERROR_INVALID_VALUE;
  return copy_async((void *)(uintptr_t)d, h, n, s, 1);
}
static CUresult m_cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s) {
  if (!device_range(d, n)) return CUDA_ERROR_INVALID_VALUE;
  return copy_async(h, (const void *)(uintptr_t)d, n, s, 0);
}
static CUresult m_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) {
  if (!device_range(d, n) || !device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
  return copy_async((void *)(uintptr_t)d, (const void *)(uintptr_t)src, n, s, 0);
}
static CUresult m_cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) {
  NEED_CTX();
  drain_all();
  if (!device_range(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, h, n);
  return atomic_load(&sticky);
}
static CUresult m_cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) {
  NEED_CTX();
  drain_all();
  if (!device_range(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(h, (const void *)(uintptr_t)d, n);
  return atomic_load(&sticky);
}

static unsigned char *addr_of(CUmemorytype t, const void *host, CUdeviceptr dev) {
  return t == CU_MEMORYTYPE_HOST ? (unsigned char *)(uintptr_t)host : (unsigned char *)(uintptr_t)dev;
}

static void run_3d(op *o) {
  const CUDA_MEMCPY3D *c = &o->u.c3.c;
  if (POISONED()) return;
  unsigned char *s = addr_of(c->srcMemoryType, c->srcHost, c->srcDevice);
  unsigned char *d = addr_of(c->dstMemoryType, c->dstHost, c->dstDevice);
  for (size_t z = 0; z < c->Depth; z++)
    for (size_t y = 0; y < c->Height; y++)
      memcpy(d + (z * c->dstHeight + y) * c->dstPitch + c->dstXInBytes,
             s + (z * c->srcHeight + y) * c->srcPitch + c->srcXInBytes, c->WidthInBytes);
}

/* The bytes a pitched region spans, for range checks. */
static size_t span(size_t pitch, size_t height, size_t rows, size_t depth, size_t width) {
  if (depth == 0 || rows == 0) return 0;
  return ((depth - 1) * height + (rows - 1)) * pitch + width;
}

static CUresult check_3d(const CUDA_MEMCPY3D *c) {
  if (c->WidthInBytes > c->srcPitch || c->WidthInBytes > c->dstPitch) return CUDA_ERROR_INVALID_VALUE;
  if (c->Depth > 1 && (c->srcHeight < c->Height || c->dstHeight < c->Height)) return CUDA_ERROR_INVALID_VALUE;
  if (c->srcMemoryType == CU_MEMORYTYPE_DEVICE &&
      !device_range(c->srcDevice, span(c->srcPitch, c->srcHeight, c->Height, c->Depth, c->WidthInBytes)))
    return CUDA_ERROR_INVALID_VALUE;
  if (c->dstMemoryType == CU_MEMORYTYPE_DEVICE &&
      !device_range(c->dstDevice, span(c->dstPitch, c->dstHeight, c->Height, c->Depth, c->WidthInBytes)))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

static CUresult enqueue_3d(const CUDA_MEMCPY3D *c, CUstream s) {
  if (POISONED()) return atomic_load(&sticky);
  CUresult r = check_3d(c);
  if (r != CUDA_SUCCESS) return r;
  op *o = op_new(run_3d);
  o->u.c3.c = *c;
  /* Pageable host sources are consumed at the call (see copy_async). */
  if (c->srcMemoryType == CU_MEMORYTYPE_HOST) {
    size_t n = span(c->srcPitch, c->srcHeight ? c->srcHeight : c->Height, c->Height, c->Depth, c->WidthInBytes);
    if (!in_ranges(&pinned, c->srcHost, n)) {
      run_3d(o); /* synchronous with respect to the host, like the driver */
      free(o);
      return CUDA_SUCCESS;
    }
  }
  enqueue(s, o);
  return CUDA_SUCCESS;
}
static CUresult m_cuMemcpy2DAsync(const CUDA_MEMCPY2D *p, CUstream s) {
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcXInBytes = p->srcXInBytes;
  c.srcY = p->srcY;
  c.srcMemoryType = p->srcMemoryType;
  c.srcHost = p->srcHost;
  c.srcDevice = p->srcDevice;
  c.srcPitch = p->srcPitch;
  c.srcHeight = p->Height;
  c.dstXInBytes = p->dstXInBytes;
  c.dstY = p->dstY;
  c.dstMemoryType = p->dstMemoryType;
  c.dstHost = p->dstHost;
  c.dstDevice = p->dstDevice;
  c.dstPitch = p->dstPitch;
  c.dstHeight = p->Height;
  c.WidthInBytes = p->WidthInBytes;
  c.Height = p->Height;
  c.Depth = 1;
  if (p->srcY || p->dstY) return CUDA_ERROR_NOT_SUPPORTED; /* ruda never uses them */
  return enqueue_3d(&c, s);
}
static CUresult m_cuMemcpy3DAsync(const CUDA_MEMCPY3D *p, CUstream s) { return enqueue_3d(p, s); }

static void run_memset(op *o) {
  if (!POISONED()) memset(o->u.copy.dst, (int)(uintptr_t)o->u.copy.src, o->u.copy.n);
}
static CUresult m_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  if (POISONED()) return atomic_load(&sticky);
  if (!device_range(d, n)) return CUDA_ERROR_INVALID_VALUE;
  op *o = op_new(run_memset);
  o->u.copy.dst = (void *)(uintptr_t)d;
  o->u.copy.src = (const void *)(uintptr_t)v;
  o->u.copy.n = n;
  enqueue(s, o);
  return CUDA_SUCCESS;
}

/* A cubin is an ELF file: its size is where the section headers end. */
static size_t image_size(const unsigned char *img) {
  if (memcmp(img, "\177ELF", 4) == 0 && img[4] == 2) {
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, img + 0x28, 8);
    memcpy(&shentsize, img + 0x3a, 2);
    memcpy(&shnum, img + 0x3c, 2);
    return shoff + (size_t)shentsize * shnum;
  }
  return strlen((const char *)img) + 1; /* PTX */
}

static CUresult m_cuModuleLoadData(CUmodule *m, const void *image) {
  NEED_CTX();
  if (POISONED()) return atomic_load(&sticky);
  struct CUmod_st *mod = calloc(1, sizeof *mod);
  mod->size = image_size(image);
  mod->image = malloc(mod->size);
  memcpy(mod->image, image, mod->size);
  *m = mod;
  return CUDA_SUCCESS;
}
static CUresult m_cuModuleUnload(CUmodule m) {
  for (struct CUfunc_st *f = m->funcs; f;) {
    struct CUfunc_st *n = f->next;
    free(f);
    f = n;
  }
  free(m->image);
  free(m);
  return CUDA_SUCCESS;
}
static CUresult m_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  /* An ELF symbol name sits between NULs in the string table; PTX text
   * declares ".entry <name>(". */
  size_t n = strlen(name);
  int found = 0;
  for (size_t i = 0; i + n + 1 < m->size && !found; i++)
    found = m->image[i] == 0 && memcmp(m->image + i + 1, name, n) == 0 && m->image[i + n + 1] == 0;
  for (size_t i = 0; !found && i + 7 + n + 1 < m->size; i++)
    found = memcmp(m->image + i, ".entry ", 7) == 0 && memcmp(m->image + i + 7, name, n) == 0 &&
            m->image[i + 7 + n] == '(';
  if (!found) return CUDA_ERROR_NOT_FOUND;
  struct CUfunc_st *fn = calloc(1, sizeof *fn);
  snprintf(fn->name, sizeof fn->name, "%s", name);
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++)
    if (strcmp(kernels[i].name, name) == 0) fn->k = &kernels[i];
  fn->max_dyn_shared = 49152;
  fn->max_threads = 1024;
  if (fn->k != NULL) {
    fn->known = 1;
    fn->nparams = fn->k->nparams;
    memcpy(fn->sizes, fn->k->sizes, sizeof fn->sizes);
    fn->max_threads = fn->k->max_threads;
    fn->static_shared = fn->k->static_shared;
  }
  struct CUfunc_st seen = *fn;
  if (ptx_describe((const char *)m->image, m->size, name, &seen) == 0) {
    /* The emulation must take what the compiled kernel takes: a table
     * that drifted from the source is this mock's bug, said loudly. */
    if (fn->k != NULL && (seen.nparams != fn->nparams || memcmp(seen.sizes, fn->sizes, sizeof fn->sizes) != 0 ||
                          seen.max_threads != fn->max_threads || seen.static_shared != fn->static_shared)) {
      fprintf(stderr, "mock driver: kernel %s: its emulation does not match its PTX (%d parameters, %d threads, "
                      "%d static shared bytes)\n", name, seen.nparams, seen.max_threads, seen.static_shared);
      free(fn);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    *fn = seen;
    fn->known = 1;
  }
  pthread_mutex_lock(&pinned_lock);
  fn->next = m->funcs;
  m->funcs = fn;
  pthread_mutex_unlock(&pinned_lock);
  *f = fn;
  return CUDA_SUCCESS;
}
static CUresult m_cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction f) {
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = f->max_threads; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = f->static_shared; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dyn_shared; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult m_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_NOT_SUPPORTED;
  int st = f->static_shared;
  if (v < 0 || v + st > 232448) return CUDA_ERROR_INVALID_VALUE;
  f->max_dyn_shared = v;
  return CUDA_SUCCESS;
}
static CUresult m_cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
  if (!f->known) return CUDA_ERROR_NOT_SUPPORTED; /* a cubin of a kernel with no emulation */
  if (i >= (size_t)f->nparams) return CUDA_ERROR_INVALID_VALUE;
  *off = param_offset(f->sizes, i);
  *size = f->sizes[i];
  return CUDA_SUCCESS;
}

static void run_launch(op *o) {
  if (POISONED()) return;
  o->u.launch.k->fn(o->u.launch.g, o->u.launch.b, o->u.launch.params);
}
static CUresult m_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
  (void)extra;
  NEED_CTX();
  if (POISONED()) return atomic_load(&sticky);
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  if ((unsigned long long)bx * by * bz > (unsigned)f->max_threads) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  if ((int)shared > f->max_dyn_shared) return CUDA_ERROR_INVALID_VALUE;
  if (f->k == NULL) {
    /* Never a silent no-op: a test whose kernel this mock cannot run
     * would otherwise pass on what the kernel never did. */
    fprintf(stderr, "mock driver: no emulation of kernel %s\n", f->name);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  op *o = op_new(run_launch);
  o->u.launch.k = f->k;
  unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  memcpy(o->u.launch.g, g, sizeof g);
  memcpy(o->u.launch.b, b, sizeof b);
  o->u.launch.shared = shared;
  /* The driver copies parameter values at the call; so does this. */
  for (int i = 0; i < f->k->nparams; i++)
    memcpy(o->u.launch.params + param_offset(f->k->sizes, (size_t)i), params[i], f->k->sizes[i]);
  enqueue(s, o);
  return CUDA_SUCCESS;
}

/* ---- graphs: a captured list of operations, replayed as copies ---- */

/* A node is the op a capture recorded (CUgraphNode points at it); an
 * executable graph holds copies, found again by their place in the list. */
struct CUgraph_st {
  op *head;
};
struct CUgraphExec_st {
  op *head;
  struct CUgraph_st *src; /* instantiated from: node updates name its ops */
};

/* Instantiations and executable-graph node updates so far (test hook). */
static _Atomic unsigned graphs_instantiated, nodes_updated;
EXPORT void ruda_mock_graph_stats(unsigned *instantiated, unsigned *updated) {
  *instantiated = atomic_load(&graphs_instantiated);
  *updated = atomic_load(&nodes_updated);
}

static op *op_copy(const op *o) {
  op *c = malloc(sizeof *c);
  memcpy(c, o, sizeof *c);
  c->next = NULL;
  if (o->run == run_copy && o->u.copy.owned != NULL) {
    c->u.copy.owned = malloc(o->u.copy.n ? o->u.copy.n : 1);
    memcpy(c->u.copy.owned, o->u.copy.owned, o->u.copy.n);
    c->u.copy.src = c->u.copy.owned;
  }
  return c;
}

static void ops_free(op *o) {
  while (o != NULL) {
    op *next = o->next;
    if (o->run == run_copy) free(o->u.copy.owned);
    free(o);
    o = next;
  }
}

static CUresult m_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  (void)mode;
  NEED_CTX();
  pthread_mutex_lock(&s->lock);
  CUresult r = s->capturing ? CUDA_ERROR_ILLEGAL_STATE : CUDA_SUCCESS;
  s->capturing = 1;
  pthread_mutex_unlock(&s->lock);
  return r;
}
static CUresult m_cuStreamEndCapture(CUstream s, CUgraph *g) {
  NEED_CTX();
  pthread_mutex_lock(&s->lock);
  if (!s->capturing) {
    pthread_mutex_unlock(&s->lock);
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  struct CUgraph_st *graph = calloc(1, sizeof *graph);
  graph->head = s->cap_head;
  s->cap_head = s->cap_tail = NULL;
  s->capturing = 0;
  pthread_mutex_unlock(&s->lock);
  *g = graph;
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  (void)flags;
  struct CUgraphExec_st *x = calloc(1, sizeof *x);
  op **tail = &x->head;
  for (op *o = g->head; o != NULL; o = o->next) {
    *tail = op_copy(o);
    tail = &(*tail)->next;
  }
  x->src = g;
  atomic_fetch_add(&graphs_instantiated, 1);
  *e = x;
  return CUDA_SUCCESS;
}
static CUresult m_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                         const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
  NEED_CTX();
  pthread_mutex_lock(&s->lock);
  *st = s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = 1;
  if (g) *g = NULL;
  s->cap_dep = (CUgraphNode)s->cap_tail;
  if (deps) *deps = &s->cap_dep;
  if (edges) *edges = NULL;
  if (ndeps) *ndeps = s->capturing && s->cap_tail ? 1 : 0;
  pthread_mutex_unlock(&s->lock);
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
  const op *o = (const op *)n;
  if (o->run == run_launch) *t = CU_GRAPH_NODE_TYPE_KERNEL;
  else if (o->run == run_copy) *t = CU_GRAPH_NODE_TYPE_MEMCPY;
  else *t = CU_GRAPH_NODE_TYPE_EMPTY;
  return CUDA_SUCCESS;
}
/* A 1D copy's parameters; host sides are the page-locked ones. */
static CUresult m_cuGraphMemcpyNodeGetParams(CUgraphNode n, CUDA_MEMCPY3D *c) {
  const op *o = (const op *)n;
  if (o->run != run_copy) return CUDA_ERROR_INVALID_VALUE;
  memset(c, 0, sizeof *c);
  c->srcMemoryType = in_ranges(&pinned, o->u.copy.src, o->u.copy.n) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  c->dstMemoryType = in_ranges(&pinned, o->u.copy.dst, o->u.copy.n) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  if (c->srcMemoryType == CU_MEMORYTYPE_HOST) c->srcHost = o->u.copy.src;
  else c->srcDevice = (CUdeviceptr)(uintptr_t)o->u.copy.src;
  if (c->dstMemoryType == CU_MEMORYTYPE_HOST) c->dstHost = o->u.copy.dst;
  else c->dstDevice = (CUdeviceptr)(uintptr_t)o->u.copy.dst;
  c->WidthInBytes = o->u.copy.n;
  c->Height = c->Depth = 1;
  return CUDA_SUCCESS;
}
/* The executable graph's copy of node n, or NULL. */
static op *exec_op(CUgraphExec e, CUgraphNode n) {
  op *x = e->head;
  for (const op *o = e->src->head; o != NULL && x != NULL; o = o->next, x = x->next)
    if (o == (const op *)n) return x;
  return NULL;
}
static CUresult m_cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
  op *x = exec_op(e, n);
  if (x == NULL || x->run != run_launch || p->func == NULL || p->func->k != x->u.launch.k)
    return CUDA_ERROR_INVALID_VALUE;
  if (!p->gridDimX || !p->gridDimY || !p->gridDimZ) return CUDA_ERROR_INVALID_VALUE;
  unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ}, b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  memcpy(x->u.launch.g, g, sizeof g);
  memcpy(x->u.launch.b, b, sizeof b);
  x->u.launch.shared = p->sharedMemBytes;
  const mock_kernel *k = x->u.launch.k;
  for (int i = 0; i < k->nparams; i++)
    memcpy(x->u.launch.params + param_offset(k->sizes, (size_t)i), p->kernelParams[i], k->sizes[i]);
  atomic_fetch_add(&nodes_updated, 1);
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_MEMCPY3D *c, CUcontext ctx) {
  (void)ctx;
  op *x = exec_op(e, n);
  if (x == NULL || x->run != run_copy || c->WidthInBytes != x->u.copy.n) return CUDA_ERROR_INVALID_VALUE;
  const void *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? c->srcHost : (const void *)(uintptr_t)c->srcDevice;
  void *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? c->dstHost : (void *)(uintptr_t)c->dstDevice;
  if ((c->srcMemoryType != CU_MEMORYTYPE_HOST && !device_range(c->srcDevice, c->WidthInBytes)) ||
      (c->dstMemoryType != CU_MEMORYTYPE_HOST && !device_range(c->dstDevice, c->WidthInBytes)))
    return CUDA_ERROR_INVALID_VALUE;
  free(x->u.copy.owned);
  x->u.copy.owned = NULL;
  x->u.copy.src = src;
  x->u.copy.dst = dst;
  atomic_fetch_add(&nodes_updated, 1);
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphLaunch(CUgraphExec e, CUstream s) {
  NEED_CTX();
  if (POISONED()) return atomic_load(&sticky);
  for (op *o = e->head; o != NULL; o = o->next) enqueue(s, op_copy(o));
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphExecDestroy(CUgraphExec e) {
  ops_free(e->head);
  free(e);
  return CUDA_SUCCESS;
}
static CUresult m_cuGraphDestroy(CUgraph g) {
  ops_free(g->head);
  free(g);
  return CUDA_SUCCESS;
}

static CUresult m_cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *addr,
                                         const cuuint64_t *dim, const cuuint64_t *strides, const cuuint32_t *box,
                                         const cuuint32_t *estrides, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                         CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  (void)estrides, (void)il, (void)sw, (void)l2;
  static const uint32_t sizes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  /* The driver's documented requirements, the ones tests touch. */
  if (rank < 1 || rank > 5 || (unsigned)type >= 13 || ((uintptr_t)addr & 15) || ((uintptr_t)map & 63))
    return CUDA_ERROR_INVALID_VALUE;
  mock_tmap m;
  memset(&m, 0, sizeof m);
  m.magic = TMAP_MAGIC;
  m.addr = (uintptr_t)addr;
  m.rank = rank;
  m.elem = sizes[type];
  m.oob = oob;
  for (cuuint32_t i = 0; i < rank; i++) {
    if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    m.dim[i] = dim[i];
    m.box[i] = box[i];
    m.stride[i] = i == 0 ? m.elem : strides[i - 1];
    if (i > 0 && (strides[i - 1] % 16 != 0)) return CUDA_ERROR_INVALID_VALUE;
  }
  if ((box[0] * m.elem) % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  memset(map, 0, sizeof *map);
  memcpy(map, &m, sizeof m);
  return CUDA_SUCCESS;
}

static CUresult m_cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *s = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult m_cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    default: *s = "mock driver error"; break;
  }
  return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

/* Each entry is checked against the declaration in <cuda.h> at compile
 * time: a mismatched signature does not build. */
#define MOCK_FUNCS(X)                                                                               \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)             \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
  X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuStreamCreate) X(cuStreamDestroy)    \
  X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy)   \
  X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuMemAlloc)        \
  X(cuMemFree) X(cuMemGetInfo) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyHtoD) X(cuMemcpyDtoH)   \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpy2DAsync)                 \
  X(cuMemcpy3DAsync) X(cuMemsetD8Async) X(cuModuleLoadData) X(cuModuleUnload)                       \
  X(cuModuleGetFunction) X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel)             \
  X(cuGetErrorName) X(cuGetErrorString) X(cuFuncGetParamInfo) X(cuTensorMapEncodeTiled)           \
  X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuStreamBeginCapture) X(cuStreamEndCapture)              \
  X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)          \
  X(cuStreamGetCaptureInfo) X(cuGraphNodeGetType) X(cuGraphMemcpyNodeGetParams)                     \
  X(cuGraphExecKernelNodeSetParams) X(cuGraphExecMemcpyNodeSetParams) X(cuPointerGetAttribute)

#define MOCK_ENTRY(name) {#name, (void *)(__typeof__(&name))m_##name},
static const struct {
  const char *name;
  void *fn;
} table[] = {MOCK_FUNCS(MOCK_ENTRY)};

#define MOCK_CHECK(name) static __typeof__(&name) const check_##name __attribute__((unused)) = m_##name;
MOCK_FUNCS(MOCK_CHECK)

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
  (void)version, (void)flags;
#ifdef RUDA_MOCK_OMIT
  /* A driver that lacks one symbol (tests/CMakeLists.txt): ruda must
   * report it as a broken driver, which the tests count as a failure. */
  if (strcmp(symbol, RUDA_MOCK_OMIT) == 0) {
    *pfn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
#endif
  for (size_t i = 0; i < sizeof table / sizeof *table; i++)
    if (strcmp(table[i].name, symbol) == 0) {
      *pfn = table[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuDriverGetVersion(int *v) { return m_cuDriverGetVersion(v); }

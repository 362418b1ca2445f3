/* host_backend.c - the CPU backend: host memory, memcpy copies, kernels as
 * C functions run on the worker thread. Everything a worker submits has
 * also finished when the call returns, so completions carry no event. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/host_backend.h"

/* Alignment of buffers, as the CUDA allocator gives. */
#define HOST_ALIGN 256
/* Grid limits, reported by host_open and applied to indirect grids read
 * at run time (as the cuda backend does). */
#define HOST_MAX_GRID_X ((uint32_t)INT32_MAX)
#define HOST_MAX_GRID_YZ 65535u

/* Staging blocks carry a header that links them into the device's list,
 * so the ones an application never gave back die with the device. */
typedef struct stage_hdr {
  struct stage_hdr *next, *prev;
  size_t size;
  uint64_t pad; /* keeps the payload 32-byte aligned */
} stage_hdr;

typedef struct host_state {
  pthread_mutex_t lock;
  stage_hdr head; /* a ring */
} host_state;

static int host_open(const ruda__backend_env *env, void **state, ruda__limits *lim) {
  (void)env;
  host_state *h = calloc(1, sizeof *h);
  if (h == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  pthread_mutex_init(&h->lock, NULL);
  h->head.next = h->head.prev = &h->head;
  *state = h;
  memset(lim, 0, sizeof *lim);
  strcpy(lim->name, "host CPU");
  lim->sm_count = 1;
  lim->warp_size = 32;
  lim->max_threads_per_block = 1024;
  lim->max_block[0] = 1024;
  lim->max_block[1] = 1024;
  lim->max_block[2] = 64;
  lim->max_grid[0] = HOST_MAX_GRID_X;
  lim->max_grid[1] = HOST_MAX_GRID_YZ;
  lim->max_grid[2] = HOST_MAX_GRID_YZ;
  lim->max_shared = 48 * 1024;
  lim->max_shared_optin = 48 * 1024;
  lim->total_mem = UINT64_C(1) << 40; /* nothing larger can be sensible on a CPU */
  return 0;
}

static void host_close(void *state) {
  host_state *h = state;
  if (h == NULL) return;
  for (stage_hdr *b = h->head.next; b != &h->head;) {
    stage_hdr *n = b->next;
    free(b);
    b = n;
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
}

static int host_mem_alloc(void *state, uint64_t size, uint64_t *addr) {
  (void)state;
  void *p = NULL;
  uint64_t rounded = (size + HOST_ALIGN - 1) & ~(uint64_t)(HOST_ALIGN - 1);
  if (rounded < size || posix_memalign(&p, HOST_ALIGN, rounded) != 0)
    return ruda__fail(RUDA_EOUTOFMEMORY, "ruda_buffer_create: host allocation of %llu bytes failed",
                      (unsigned long long)size);
  *addr = (uint64_t)(uintptr_t)p;
  return 0;
}

static void host_mem_free(void *state, uint64_t addr, void *wstate) {
  (void)state;
  (void)wstate;
  free((void *)(uintptr_t)addr);
}

static void *host_stage_alloc(void *state, size_t size, const void *prev) {
  (void)prev; /* malloc keeps its own per-thread caches */
  host_state *h = state;
  if (size > SIZE_MAX - sizeof(stage_hdr)) return NULL;
  stage_hdr *b = malloc(sizeof *b + (size ? size : 1));
  if (b == NULL) return NULL;
  b->size = size;
  pthread_mutex_lock(&h->lock);
  b->next = h->head.next;
  b->prev = &h->head;
  b->next->prev = b;
  h->head.next = b;
  pthread_mutex_unlock(&h->lock);
  return b + 1;
}

static void host_stage_free(void *state, void *p) {
  host_state *h = state;
  if (p == NULL) return;
  stage_hdr *b = (stage_hdr *)p - 1;
  pthread_mutex_lock(&h->lock);
  b->prev->next = b->next;
  b->next->prev = b->prev;
  pthread_mutex_unlock(&h->lock);
  free(b);
}

static int host_write(void *ws, uint64_t dst, const ruda__layout *l, void *staged, ruda_error **err) {
  (void)err;
  ruda__copy_to_strided((unsigned char *)(uintptr_t)dst, l, staged);
  host_stage_free(ws, staged);
  return 0;
}

/* A read lands where cuda's does for an ordinary destination: in a bounce
 * block when the worker runs it, in dst only when the future is waited
 * (never, if it is freed unwaited). So code that forgets to wait fails
 * here as it would on a GPU. */
typedef struct read_bounce {
  void *dst;
  size_t bytes;
} read_bounce;

static void read_finish(void *state, void *arg) {
  read_bounce *r = arg;
  memcpy(r->dst, r + 1, r->bytes);
  host_stage_free(state, r);
}

static void read_discard(void *state, void *arg) { host_stage_free(state, arg); }

static int host_read(void *ws, void *dst, uint64_t src, const ruda__layout *l, ruda__completion *c,
                     ruda_error **err) {
  read_bounce *r = host_stage_alloc(ws, sizeof *r + l->bytes, NULL);
  c->event = NULL;
  if (r == NULL) {
    *err = ruda__error_new(RUDA_ENOMEM, 0, "no host memory for a read of %llu bytes", (unsigned long long)l->bytes);
    return RUDA_ENOMEM;
  }
  r->dst = dst;
  r->bytes = l->bytes;
  ruda__copy_from_strided((unsigned char *)(r + 1), l, (const unsigned char *)(uintptr_t)src);
  c->finish = read_finish;
  c->discard = read_discard;
  c->arg = r;
  return 0;
}

static int host_copy(void *ws, uint64_t dst, uint64_t src, uint64_t size, ruda_error **err) {
  (void)ws;
  (void)err;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, size);
  return 0;
}

static int host_upload(void *ws, uint64_t dst, const void *src, uint64_t size, ruda_error **err) {
  (void)ws;
  (void)err;
  memcpy((void *)(uintptr_t)dst, src, size);
  return 0;
}

static void host_stage_retire(void *ws, void *staged, uint64_t bytes) {
  (void)bytes;
  host_stage_free(ws, staged); /* the upload copied it already */
}

static int host_download(void *ws, void *dst, uint64_t src, uint64_t size, ruda_error **err) {
  (void)ws;
  (void)err;
  memcpy(dst, (const void *)(uintptr_t)src, size);
  return 0;
}

/* A walk of the staging list: called when a graph records a copy, not per
 * command. */
static size_t host_stage_size(void *state, const void *p) {
  (void)state;
  return ((const stage_hdr *)p - 1)->size;
}

static int host_stage_owns(void *state, const void *p, size_t size) {
  host_state *h = state;
  const unsigned char *a = p;
  int owns = 0;
  pthread_mutex_lock(&h->lock);
  for (stage_hdr *b = h->head.next; b != &h->head && !owns; b = b->next) {
    const unsigned char *base = (const unsigned char *)(b + 1);
    owns = a >= base && (size_t)(a - base) <= b->size && size <= b->size - (size_t)(a - base);
  }
  pthread_mutex_unlock(&h->lock);
  return owns;
}

static int host_launch(void *ws, const ruda__launch_cmd *cmd, ruda_error **err) {
  (void)ws;
  void *argv[RUDA_MAX_ARGS];
  for (uint32_t i = 0; i < cmd->nargs; i++)
    argv[i] = cmd->args[i].kind == RUDA_ARG_BUFFER ? (void *)(uintptr_t)cmd->args[i].addr
                                                   : (void *)cmd->args[i].bytes;
  ruda_dim3 grid = cmd->grid;
  if (cmd->flags & RUDA_LAUNCH_INDIRECT) {
    /* The binding may lie at any offset: no aligned loads. */
    uint32_t g[3];
    memcpy(g, (const void *)(uintptr_t)cmd->indirect_addr, sizeof g);
    grid = (ruda_dim3){g[0], g[1], g[2]};
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return 0; /* empty dispatch */
    /* Written by earlier work, so only checkable here: refuse what a
     * direct launch would have been refused at the call. */
    if (grid.x > HOST_MAX_GRID_X || grid.y > HOST_MAX_GRID_YZ || grid.z > HOST_MAX_GRID_YZ) {
      *err = ruda__error_new(RUDA_EGRIDDIM, 0, "indirect grid (%u,%u,%u) exceeds maximum (%u,%u,%u)", grid.x,
                             grid.y, grid.z, HOST_MAX_GRID_X, HOST_MAX_GRID_YZ, HOST_MAX_GRID_YZ);
      return RUDA_EGRIDDIM;
    }
  }
  void *shared = NULL;
  if (cmd->shared_mem > 0 && (shared = malloc(cmd->shared_mem)) == NULL) {
    *err = ruda__error_new(RUDA_ENOMEM, 0, "no host memory for %u bytes of shared memory",
                           cmd->shared_mem);
    return RUDA_ENOMEM;
  }
  ruda_host_ctx ctx = {.grid_dim = grid, .block_dim = cmd->block, .shared = shared, .nargs = cmd->nargs};
  ruda_host_kernel_fn fn = cmd->kernel->host_fn;
  int rc = 0;
  for (ctx.block_idx.z = 0; ctx.block_idx.z < grid.z; ctx.block_idx.z++)
    for (ctx.block_idx.y = 0; ctx.block_idx.y < grid.y; ctx.block_idx.y++)
      for (ctx.block_idx.x = 0; ctx.block_idx.x < grid.x; ctx.block_idx.x++)
        for (ctx.thread_idx.z = 0; ctx.thread_idx.z < cmd->block.z; ctx.thread_idx.z++)
          for (ctx.thread_idx.y = 0; ctx.thread_idx.y < cmd->block.y; ctx.thread_idx.y++)
            for (ctx.thread_idx.x = 0; ctx.thread_idx.x < cmd->block.x; ctx.thread_idx.x++) {
              rc = fn(&ctx, argv);
              if (rc > 0) { /* not a ruda code: say so rather than guess */
                *err = ruda__error_new(RUDA_EINVAL, 0,
                                       "kernel returned %d at block (%u,%u,%u) thread (%u,%u,%u); host kernels "
                                       "return 0 or a negative RUDA_E* code",
                                       rc, ctx.block_idx.x, ctx.block_idx.y, ctx.block_idx.z, ctx.thread_idx.x,
                                       ctx.thread_idx.y, ctx.thread_idx.z);
                rc = RUDA_EINVAL;
                goto out;
              }
              if (rc != 0) {
                *err = ruda__error_new(rc, 0,
                                       "kernel returned %s at block (%u,%u,%u) thread (%u,%u,%u)",
                                       ruda_err_name(rc), ctx.block_idx.x, ctx.block_idx.y,
                                       ctx.block_idx.z, ctx.thread_idx.x, ctx.thread_idx.y,
                                       ctx.thread_idx.z);
                goto out;
              }
            }
out:
  free(shared);
  return rc;
}

/* A worker's state is the device's: what it needs is the staging list. */
static int host_worker_start(void *state, uint32_t index, void **wstate) {
  (void)index;
  *wstate = state;
  return 0;
}

static int host_record(void *ws, ruda__completion *c, ruda_error **err) {
  (void)ws;
  (void)err;
  c->event = NULL;
  return 0;
}

/* Typed kernels: the checks the cuda backend makes from the compiled
 * function, with its messages. */
static int host_launch_check(void *state, const ruda__kernel *k, const ruda_launch_desc *l) {
  (void)state;
  if (k->host_params == NULL) return 0;
  if (l->nargs != k->host_nparams)
    return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": %u arguments given, the kernel takes %u", l->kernel, l->nargs,
                      k->host_nparams);
  for (uint32_t i = 0; i < l->nargs; i++) {
    const int is_buf = l->args[i].kind != RUDA_ARG_SCALAR, want_buf = k->host_params[i].kind != RUDA_ARG_SCALAR;
    uint32_t have = is_buf ? 8u : l->args[i].size, want = want_buf ? 8u : k->host_params[i].size;
    if (is_buf != want_buf || have != want)
      return ruda__fail(RUDA_EINVAL,
                        "ruda_launch \"%s\": argument %u is %s of %u bytes, the kernel's parameter %u is %s of %u "
                        "bytes",
                        l->kernel, i, is_buf ? "a buffer pointer" : "a scalar", have, i,
                        want_buf ? "a buffer pointer" : "a scalar", want);
  }
  return 0;
}

static int host_kernel_prepare(void *state, ruda__kernel *k) {
  (void)state;
  if (k->host_fn == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "kernel \"%s\": the host backend runs C functions only "
                                       "(ruda_host_kernel_register), not CUDA sources", k->name);
  return 0;
}

const ruda__backend_ops ruda__host_backend = {
    .name = "host",
    .host_kernels = 1,
    .open = host_open,
    .close = host_close,
    .worker_start = host_worker_start,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .stage_alloc = host_stage_alloc,
    .stage_free = host_stage_free,
    .stage_size = host_stage_size,
    .write = host_write,
    .read = host_read,
    .copy = host_copy,
    .upload = host_upload,
    .stage_retire = host_stage_retire,
    .download = host_download,
    .stage_owns = host_stage_owns,
    .launch = host_launch,
    .record = host_record,
    .kernel_prepare = host_kernel_prepare,
    .launch_check = host_launch_check,
    .comm_init = ruda__host_comm_init,
    .comm_destroy = ruda__host_comm_destroy,
    .comm_init_rank = ruda__host_comm_init_rank,
    .collective = ruda__host_collective,
};

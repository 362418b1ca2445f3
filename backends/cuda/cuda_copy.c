/* cuda_copy.c - writes, reads and device-to-device copies.
 *
 * The host side of a copy is always dense; the device side is whatever
 * the descriptor says. A layout maps onto one driver copy when, after
 * dropping unit dimensions and merging dimensions that are contiguous with
 * each other, at most three remain and the innermost has stride 1:
 *   1 dim  -> cuMemcpyHtoDAsync / DtoHAsync
 *   2 dims -> cuMemcpy2DAsync (pitch = outer stride * elem_size)
 *   3 dims -> cuMemcpy3DAsync when the outer stride is a whole number of
 *             rows, else one cuMemcpy2DAsync per outer index (up to 64)
 * Anything else is refused at the call with RUDA_EUNSUPPORTEDSTRIDES.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

#define MAX_2D_LOOP 64

typedef struct plan {
  int dims;             /* 1, 2 or 3 */
  int loop;             /* 3 dims as a loop of 2D copies */
  uint64_t width;       /* bytes of the innermost run */
  uint64_t height;      /* rows (dims >= 2) */
  uint64_t depth;       /* slices (dims == 3) */
  uint64_t pitch;       /* device bytes between rows */
  uint64_t rows_per_slice; /* device rows between slices (3D copy) */
  uint64_t slice_stride;   /* device bytes between slices (loop) */
} plan;

/* Fills p for l, or writes why it cannot into why and returns -1. */
static int make_plan(const ruda__layout *l, uint64_t max_pitch, plan *p, char *why, size_t len) {
  memset(p, 0, sizeof *p);
  if (l->rank == 0 || l->contiguous) {
    p->dims = 1;
    p->width = l->bytes;
    return 0;
  }
  const uint64_t es = l->elem_size;
  uint64_t shape[RUDA_MAX_RANK], stride[RUDA_MAX_RANK]; /* stride in bytes */
  int n = 0;
  for (uint32_t i = 0; i < l->rank; i++) {
    if (l->shape[i] == 1) continue;
    shape[n] = l->shape[i];
    stride[n] = l->strides[i] * es;
    n++;
  }
  /* Merge an outer dim into the next inner one when it is contiguous
   * with it; work from the inside out. */
  for (int i = n - 2; i >= 0; i--) {
    if (stride[i] == shape[i + 1] * stride[i + 1]) {
      shape[i] *= shape[i + 1];
      stride[i] = stride[i + 1];
      for (int k = i + 1; k + 1 < n; k++) shape[k] = shape[k + 1], stride[k] = stride[k + 1];
      n--;
    }
  }
  if (n == 0) { /* every dim was 1: one element */
    p->dims = 1;
    p->width = es;
    return 0;
  }
  /* A column (innermost extent 1) is rows of one element each. */
  if (stride[n - 1] != es && l->shape[l->rank - 1] == 1 && n < RUDA_MAX_RANK) {
    shape[n] = 1;
    stride[n] = es;
    n++;
  }
  if (stride[n - 1] != es) {
    snprintf(why, len, "the innermost stride is %llu elements; the cuda backend copies rows with stride 1",
             (unsigned long long)(stride[n - 1] / es));
    return -1;
  }
  p->width = shape[n - 1] * es;
  if (n == 1) {
    p->dims = 1;
    return 0;
  }
  if (n > 3) {
    snprintf(why, len, "%d non-contiguous dimensions remain after merging; at most 3 map onto driver copies", n);
    return -1;
  }
  p->pitch = stride[n - 2];
  p->height = shape[n - 2];
  if (p->pitch < p->width) {
    snprintf(why, len, "rows overlap (row stride %llu bytes < row width %llu bytes)",
             (unsigned long long)p->pitch, (unsigned long long)p->width);
    return -1;
  }
  if (p->pitch > max_pitch) {
    snprintf(why, len, "row stride %llu bytes exceeds the device's maximum pitch %llu",
             (unsigned long long)p->pitch, (unsigned long long)max_pitch);
    return -1;
  }
  if (n == 2) {
    p->dims = 2;
    return 0;
  }
  p->dims = 3;
  p->depth = shape[0];
  p->slice_stride = stride[0];
  if (stride[0] % p->pitch == 0 && stride[0] / p->pitch >= p->height) {
    p->rows_per_slice = stride[0] / p->pitch;
    return 0;
  }
  if (stride[0] < p->pitch * (p->height - 1) + p->width) {
    snprintf(why, len, "slices overlap (slice stride %llu bytes)", (unsigned long long)stride[0]);
    return -1;
  }
  if (p->depth > MAX_2D_LOOP) {
    snprintf(why, len,
             "slice stride %llu bytes is not a multiple of the row stride %llu and there are %llu "
             "slices (at most %d are copied one by one)",
             (unsigned long long)stride[0], (unsigned long long)p->pitch,
             (unsigned long long)p->depth, MAX_2D_LOOP);
    return -1;
  }
  p->loop = 1;
  return 0;
}

int ruda__cu_layout_check(void *state, const ruda__layout *l, const char *fn) {
  ruda__cu_backend *b = state;
  plan p;
  char why[256];
  if (make_plan(l, b->max_pitch, &p, why, sizeof why) == 0) return 0;
  return ruda__fail(RUDA_EUNSUPPORTEDSTRIDES, "%s: rank-%u layout not supported by the cuda backend: %s", fn,
                    l->rank, why);
}

/* One strided copy between dense host memory and the device region. */
static CUresult copy_strided(ruda__cu_worker *w, const plan *p, int to_device, void *host, uint64_t dev) {
  if (p->dims == 1) {
    return to_device ? ruda__cu.cuMemcpyHtoDAsync((CUdeviceptr)dev, host, p->width, w->stream)
                     : ruda__cu.cuMemcpyDtoHAsync(host, (CUdeviceptr)dev, p->width, w->stream);
  }
  if (p->dims == 2 || p->loop) {
    const uint64_t slices = p->loop ? p->depth : 1;
    for (uint64_t z = 0; z < slices; z++) {
      CUDA_MEMCPY2D c;
      memset(&c, 0, sizeof c);
      unsigned char *h = (unsigned char *)host + z * p->width * p->height;
      CUdeviceptr d = (CUdeviceptr)(dev + z * p->slice_stride);
      if (to_device) {
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = h;
        c.srcPitch = p->width;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = d;
        c.dstPitch = p->pitch;
      } else {
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = d;
        c.srcPitch = p->pitch;
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = h;
        c.dstPitch = p->width;
      }
      c.WidthInBytes = p->width;
      c.Height = p->height;
      CUresult r = ruda__cu.cuMemcpy2DAsync(&c, w->stream);
      if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  }
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  if (to_device) {
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host;
    c.srcPitch = p->width;
    c.srcHeight = p->height;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = (CUdeviceptr)dev;
    c.dstPitch = p->pitch;
    c.dstHeight = p->rows_per_slice;
  } else {
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = (CUdeviceptr)dev;
    c.srcPitch = p->pitch;
    c.srcHeight = p->rows_per_slice;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = host;
    c.dstPitch = p->width;
    c.dstHeight = p->height;
  }
  c.WidthInBytes = p->width;
  c.Height = p->height;
  c.Depth = p->depth;
  return ruda__cu.cuMemcpy3DAsync(&c, w->stream);
}

int ruda__cu_write(void *ws, uint64_t dst, const ruda__layout *l, void *staged, ruda_error **err) {
  ruda__cu_worker *w = ws;
  plan p;
  char why[256];
  if (make_plan(l, w->b->max_pitch, &p, why, sizeof why) != 0) { /* api.c checked; be safe */
    ruda__staging_free_addr(w->b->staging, staged);
    *err = ruda__error_new(RUDA_EUNSUPPORTEDSTRIDES, 0, "%s", why);
    return RUDA_EUNSUPPORTEDSTRIDES;
  }
  CUresult r = copy_strided(w, &p, 1, staged, dst);
  if (r != CUDA_SUCCESS) {
    /* A failed async copy was never queued (or the context is dead), so
     * the block can go back at once. */
    ruda__staging_free_addr(w->b->staging, staged);
    return ruda__cu_worker_fail(w, r, err, "upload of %llu bytes to 0x%llx", (unsigned long long)l->bytes,
                                (unsigned long long)dst);
  }
  /* The block goes back once an event recorded after the copy completed
   * (progress_writes in cuda_backend.c): no event of its own. */
  ruda__cu_retire(w, NULL, staged, l->bytes);
  return 0;
}

/* A read lands in a staging block whose header says where the bytes go;
 * the future's waiter copies them out after the event. */
typedef struct read_block {
  ruda__cu_backend *b;
  void *dst;
  size_t bytes;
} read_block;

#define READ_HDR 64 /* keeps the payload cache-line aligned */

#define READ_PIECE ((size_t)8 << 20)

static int read_piece(void *arg, size_t i) {
  read_block *rb = arg;
  size_t off = i * READ_PIECE, n = rb->bytes - off < READ_PIECE ? rb->bytes - off : READ_PIECE;
  memcpy((unsigned char *)rb->dst + off, (unsigned char *)rb + READ_HDR + off, n);
  return 0;
}

/* Large reads are copied out by the staging helpers too: one thread moves
 * pinned memory to pageable memory at a fraction of the DMA's speed. */
static void read_finish(void *state, void *arg) {
  ruda__cu_backend *b = state;
  read_block *rb = arg;
  if (rb->bytes > 2 * READ_PIECE)
    ruda__staging_parallel((rb->bytes + READ_PIECE - 1) / READ_PIECE, read_piece, rb);
  else
    memcpy(rb->dst, (unsigned char *)rb + READ_HDR, rb->bytes);
  ruda__staging_free_addr(b->staging, rb);
}

static void read_discard(void *state, void *arg) {
  ruda__staging_free_addr(((ruda__cu_backend *)state)->staging, arg);
}

int ruda__cu_read(void *ws, void *dst, uint64_t src, const ruda__layout *l, ruda__completion *c,
                  ruda_error **err) {
  ruda__cu_worker *w = ws;
  plan p;
  char why[256];
  c->event = NULL;
  if (make_plan(l, w->b->max_pitch, &p, why, sizeof why) != 0) {
    *err = ruda__error_new(RUDA_EUNSUPPORTEDSTRIDES, 0, "%s", why);
    return RUDA_EUNSUPPORTEDSTRIDES;
  }
  /* A destination in page-locked memory of the staging arena (a block
   * from ruda_staging_alloc) takes the copy itself: no bounce, no memcpy
   * when the future is waited. */
  const unsigned char *end = (const unsigned char *)dst + (l->bytes ? l->bytes - 1 : 0);
  if (ruda__staging_pinned(w->b->staging, dst) && ruda__staging_pinned(w->b->staging, end)) {
    CUresult r = copy_strided(w, &p, 0, dst, src);
    ruda__cu_event *e = r == CUDA_SUCCESS ? ruda__cu_record(w, &r) : NULL;
    if (e == NULL)
      return ruda__cu_worker_fail(w, r, err, "download of %llu bytes from 0x%llx", (unsigned long long)l->bytes,
                                  (unsigned long long)src);
    c->event = e;
    return 0;
  }
  /* After the lane's last read block: with one read in flight, the same
   * block each time (freed by address once copied out). */
  read_block *rb = ruda__staging_alloc_after(w->b->staging, READ_HDR + l->bytes, w->last_read);
  if (rb == NULL) {
    *err = ruda__error_new(RUDA_ENOMEM, 0, "no staging memory for a read of %llu bytes",
                           (unsigned long long)l->bytes);
    return RUDA_ENOMEM;
  }
  rb->b = w->b;
  rb->dst = dst;
  rb->bytes = l->bytes;
  w->last_read = rb;
  CUresult r = copy_strided(w, &p, 0, (unsigned char *)rb + READ_HDR, src);
  ruda__cu_event *e = r == CUDA_SUCCESS ? ruda__cu_record(w, &r) : NULL;
  if (e == NULL) {
    ruda__staging_free_addr(w->b->staging, rb);
    return ruda__cu_worker_fail(w, r, err, "download of %llu bytes from 0x%llx", (unsigned long long)l->bytes,
                                (unsigned long long)src);
  }
  c->event = e;
  c->finish = read_finish;
  c->discard = read_discard;
  c->arg = rb;
  return 0;
}

int ruda__cu_upload(void *ws, uint64_t dst, const void *src, uint64_t size, ruda_error **err) {
  ruda__cu_worker *w = ws;
  /* A graph's copy node reads its host side when the graph runs, by DMA:
   * only page-locked staging qualifies (a write staged in a pageable
   * fallback block fails its graph here, which then goes one by one). */
  if ((w->patch != NULL || w->capturing) && !ruda__cu_stage_owns(w->b, src, size)) {
    *err = ruda__error_new(RUDA_EINVAL, 0, "a graph's upload of %llu bytes needs page-locked staging memory",
                           (unsigned long long)size);
    return RUDA_EINVAL;
  }
  if (w->patch != NULL) return ruda__cu_graph_set_copy(w, (uintptr_t)dst, (uintptr_t)src, err);
  CUresult r = ruda__cu.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, size, w->stream);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "upload of %llu bytes to 0x%llx", (unsigned long long)size,
                                (unsigned long long)dst);
  return 0;
}

void ruda__cu_stage_retire(void *ws, void *staged, uint64_t bytes) {
  ruda__cu_retire(ws, NULL, staged, bytes);
}

int ruda__cu_download(void *ws, void *dst, uint64_t src, uint64_t size, ruda_error **err) {
  ruda__cu_worker *w = ws;
  if (w->patch != NULL) return ruda__cu_graph_set_copy(w, (uintptr_t)dst, (uintptr_t)src, err);
  CUresult r = ruda__cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, size, w->stream);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "download of %llu bytes from 0x%llx", (unsigned long long)size,
                                (unsigned long long)src);
  return 0;
}

int ruda__cu_stage_owns(void *state, const void *p, size_t size) {
  ruda__cu_backend *b = state;
  const unsigned char *end = (const unsigned char *)p + (size ? size - 1 : 0);
  return ruda__staging_pinned(b->staging, p) && ruda__staging_pinned(b->staging, end);
}

int ruda__cu_copy(void *ws, uint64_t dst, uint64_t src, uint64_t size, ruda_error **err) {
  ruda__cu_worker *w = ws;
  if (w->patch != NULL) return ruda__cu_graph_set_copy(w, (uintptr_t)dst, (uintptr_t)src, err);
  CUresult r = ruda__cu.cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, w->stream);
  if (r != CUDA_SUCCESS)
    return ruda__cu_worker_fail(w, r, err, "cuMemcpyDtoDAsync of %llu bytes", (unsigned long long)size);
  return 0;
}

/* api.c - the client side of every command: validate at the call, build
 * the command, push it on the stream's worker queue, return.
 *
 * Everything that can be checked without the device is checked here, so a
 * bad input fails at the call with a message naming the call and the
 * values, and never reaches a worker.
 */
#include <stdlib.h>
#include <string.h>

#include "memory/import.h"
#include "staging/staging.h"
#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

/* ---- shared helpers ---- */

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static int add_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Checks a copy descriptor against its binding's size and fills l. */
static int make_layout(const ruda_copy_desc *d, uint64_t binding_len, const char *fn, ruda__layout *l) {
  memset(l, 0, sizeof *l);
  const int r = RUDA__RESERVED_SET(d);
  if (r >= 0) return ruda__fail(RUDA_EINVAL, "%s: descriptor reserved[%d] is not zero", fn, r);
  if (d->rank == 0) {
    l->bytes = l->extent = binding_len;
    l->elem_size = 1;
    l->contiguous = 1;
    return 0;
  }
  if (d->rank > RUDA_MAX_RANK)
    return ruda__fail(RUDA_EINVAL, "%s: rank %u exceeds %d", fn, d->rank, RUDA_MAX_RANK);
  if (d->elem_size == 0) return ruda__fail(RUDA_EINVAL, "%s: elem_size is 0", fn);
  l->rank = d->rank;
  l->elem_size = d->elem_size;
  uint64_t count = 1, span = 0; /* span: offset of the last element, in elements */
  for (uint32_t i = 0; i < d->rank; i++) {
    l->shape[i] = d->shape[i];
    l->strides[i] = d->strides[i];
    uint64_t t;
    if (d->shape[i] == 0) return ruda__fail(RUDA_EINVAL, "%s: shape[%u] is 0", fn, i);
    if (!mul_ok(count, d->shape[i], &count) || !mul_ok(d->shape[i] - 1, d->strides[i], &t) ||
        !add_ok(span, t, &span))
      return ruda__fail(RUDA_ERANGE, "%s: shape/strides overflow 64 bits at dim %u", fn, i);
  }
  if (!mul_ok(count, d->elem_size, &l->bytes) || !add_ok(span, 1, &span) ||
      !mul_ok(span, d->elem_size, &l->extent))
    return ruda__fail(RUDA_ERANGE, "%s: descriptor size overflows 64 bits", fn);
  if (l->extent > binding_len)
    return ruda__fail(RUDA_ERANGE,
                      "%s: strided region spans %llu bytes but the binding holds %llu", fn,
                      (unsigned long long)l->extent, (unsigned long long)binding_len);
  /* Dense row-major in the buffer too? Then one memcpy does it. */
  uint64_t expect = 1;
  l->contiguous = 1;
  for (int i = (int)d->rank - 1; i >= 0; i--) {
    if (d->shape[i] > 1 && d->strides[i] != expect) l->contiguous = 0;
    expect *= d->shape[i];
  }
  return 0;
}

/* What a capture cannot record is refused at the call (ruda/graph.h). */
static int refuse_capturing(ruda__stream *s, const char *fn, const char *why) {
  return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing a graph, and %s", fn, RUDA__SNAME(s->id),
                    why);
}

/* Records, in the capture of s, an upload (RUDA__CMD_WRITE) or download
 * (RUDA__CMD_READ) between a buffer at addr (pinned, pin) and a host block
 * the caller keeps: each replay copies again (ruda/graph.h). On success
 * the pin stays with the recorded command; otherwise the caller unpins. */
static int record_io(ruda_device *dev, ruda__stream *s, ruda__order *o, int kind, uint32_t pin, uint64_t addr,
                     void *host, const ruda__layout *l, const char *fn) {
  const char *what = kind == RUDA__CMD_WRITE ? "source" : "destination";
  if (!l->contiguous)
    return ruda__fail(RUDA_EINVAL, "%s: %s is capturing, and a recorded copy must be contiguous", fn,
                      RUDA__SNAME(s->id));
  if (dev->sched.backend.ops->stage_owns == NULL || !dev->sched.backend.ops->stage_owns(dev->sched.backend.state, host, (size_t)l->bytes))
    return ruda__fail(RUDA_EINVAL,
                      "%s: %s is capturing, and a recorded copy needs its %s (%llu bytes at %p) inside one block "
                      "from ruda_staging_alloc (page-locked), which the graph reads or fills at each replay",
                      fn, RUDA__SNAME(s->id), what, (unsigned long long)l->bytes, host);
  ruda__cmd *cmd = ruda__cmd_alloc(sizeof(uint32_t));
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  cmd->kind = kind;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  cmd->pins[0] = pin;
  cmd->npins = 1;
  if (kind == RUDA__CMD_WRITE) {
    cmd->u.write.dst = addr;
    cmd->u.write.staged = host;
    cmd->u.write.layout = *l;
  } else {
    cmd->u.read.src = addr;
    cmd->u.read.dst = host;
    cmd->u.read.layout = *l;
  }
  int rc = ruda__capture_record(s, cmd);
  ruda__order_abandon(o); /* recorded, not pushed: replays order themselves */
  if (rc == 0) return 0;
  ruda__cmd_free(cmd);
  if (rc == 1) return refuse_capturing(s, fn, "the capture ended during the call; nothing was recorded or run");
  return rc;
}

/* ---- buffers ---- */

int ruda_buffer_create(ruda_device *dev, ruda_stream_id stream, uint64_t size, ruda_handle *out) {
  RUDA__CHECK_DEV(dev, "ruda_buffer_create");
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "ruda_buffer_create: out is NULL");
  *out = (ruda_handle){0, 0};
  if (size == 0) return ruda__fail(RUDA_EINVAL, "ruda_buffer_create: size is 0");
  if (size > dev->limits.total_mem)
    return ruda__fail(RUDA_EBUFFERTOOBIG,
                      "ruda_buffer_create: %llu bytes can never fit (device holds %llu bytes)",
                      (unsigned long long)size, (unsigned long long)dev->limits.total_mem);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, "ruda_buffer_create", &rc);
  if (s == NULL) return rc;
  ruda__pools *p = ruda__stream_pools(&dev->sched, s);
  if (p == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_buffer_create: out of host memory for pools");
  return ruda__memory_alloc(p, size, "ruda_buffer_create", out); /* memory/pool.c */
}

int ruda_buffer_free(ruda_device *dev, ruda_stream_id stream, ruda_handle h) {
  RUDA__CHECK_DEV(dev, "ruda_buffer_free");
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, "ruda_buffer_free", &rc);
  if (s == NULL) return rc;
  /* Stream order comes from the pins of the commands that use the buffer
   * and, for other workers, from fences (memory/pool.c): no command. */
  rc = ruda__memory_free(&dev->memory, h);
  ruda__import_poll(&dev->memory);
  return rc;
}

int ruda_buffer_import(ruda_device *dev, ruda_stream_id stream, uint64_t addr, uint64_t bytes,
                       ruda_release_fn release, void *user, ruda_handle *out) {
  static const char fn[] = "ruda_buffer_import";
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  *out = (ruda_handle){0, 0};
  if (bytes == 0) return ruda__fail(RUDA_EINVAL, "%s: bytes is 0", fn);
  /* The top bit tags deferred (dry-run) addresses (memory/arena.h). */
  if (addr == 0 || (addr & RUDA__UNBACKED) || addr + bytes < addr)
    return ruda__fail(RUDA_EINVAL, "%s: address 0x%llx (+%llu bytes) cannot be a buffer", fn,
                      (unsigned long long)addr, (unsigned long long)bytes);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if (dev->sched.backend.ops->mem_check != NULL && (rc = dev->sched.backend.ops->mem_check(dev->sched.backend.state, addr, bytes, fn)) != 0) return rc;
  ruda__import_poll(&dev->memory);
  return ruda__import_add(&dev->memory, addr, bytes, release, user, out); /* memory/import.c */
}

int ruda_buffer_size(ruda_device *dev, ruda_handle h, uint64_t *size) {
  RUDA__CHECK_DEV(dev, "ruda_buffer_size");
  if (size == NULL) return ruda__fail(RUDA_EINVAL, "ruda_buffer_size: size is NULL");
  return ruda__handles_size(&dev->handles, h, size);
}

/* ---- copies ---- */

/* A backend may refuse strided layouts it cannot copy (cuda: innermost
 * stride 1, at most three dims after merging); refuse them at the call. */
static int check_layout(ruda_device *dev, const ruda__layout *l, const char *fn) {
  if (l->contiguous || dev->sched.backend.ops->layout_check == NULL) return 0;
  return dev->sched.backend.ops->layout_check(dev->sched.backend.state, l, fn);
}

/* Contiguous writes larger than this go in pieces of this size, staged in
 * parallel (staging/copy.c) and each pushed as soon as it is
 * copied, so the host copy of later pieces overlaps the DMA of earlier
 * ones. Every piece is pushed before ruda_write returns, so later commands
 * of the caller still follow the whole write. */
#define RUDA__WRITE_PIECE ((size_t)8 << 20)

typedef struct write_pieces {
  ruda_device *dev;
  ruda__stream *s;
  ruda_handle h;
  uint64_t addr;
  const unsigned char *src;
  size_t len;
} write_pieces;

static int write_piece(void *arg, size_t i) {
  write_pieces *j = arg;
  ruda_device *dev = j->dev;
  size_t off = i * RUDA__WRITE_PIECE;
  size_t n = j->len - off < RUDA__WRITE_PIECE ? j->len - off : RUDA__WRITE_PIECE;
  uint64_t base, size;
  /* Each piece pins the buffer itself: pieces retire independently. */
  if (ruda__handles_pin(&dev->handles, j->h, &base, &size) != 0)
    return ruda__fail(RUDA_ENOTFOUND, "ruda_write: buffer {slot %u, gen %u} was freed during the write",
                      j->h.slot, j->h.gen);
  ruda__cmd *cmd = ruda__cmd_alloc(sizeof(uint32_t));
  void *staged = cmd ? dev->sched.backend.ops->stage_alloc(dev->sched.backend.state, n, NULL) : NULL;
  if (staged == NULL) {
    ruda__cmd_free(cmd);
    ruda__handles_unpin(&dev->handles, j->h.slot, NULL);
    return ruda__fail(RUDA_ENOMEM, "ruda_write: no staging memory for a %zu-byte piece at offset %zu", n, off);
  }
  memcpy(staged, j->src + off, n);
  cmd->kind = RUDA__CMD_WRITE;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  cmd->pins[0] = j->h.slot;
  cmd->npins = 1;
  cmd->u.write.dst = j->addr + off;
  cmd->u.write.staged = staged;
  memset(&cmd->u.write.layout, 0, sizeof cmd->u.write.layout);
  cmd->u.write.layout.elem_size = 1;
  cmd->u.write.layout.bytes = cmd->u.write.layout.extent = n;
  cmd->u.write.layout.contiguous = 1;
  /* The whole write was admitted under the bound once (write_impl). */
  cmd->stream = j->s;
  cmd->seq = atomic_fetch_add_explicit(&j->s->seq, 1, memory_order_relaxed) + 1;
  ruda__queue_push_unbounded(j->s->worker, cmd);
  return 0;
}

/* user_staged: a staging buffer the caller hands over (ruda_write_staged),
 * uploaded as is; NULL: src is copied into staging here. */
static int write_impl(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *dst, const void *src,
                      size_t len, void *user_staged, const char *fn) {
  RUDA__CHECK_DEV(dev, fn);
  if (dst == NULL || src == NULL)
    return ruda__fail(RUDA_EINVAL, "%s: %s is NULL", fn, dst ? "src" : "dst");
  if (len == 0) return ruda__fail(RUDA_EINVAL, "%s: len is 0", fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  if (capturing && user_staged == NULL)
    return refuse_capturing(s, fn,
                            "ruda_write copies its source at the call, so it cannot be recorded (record "
                            "ruda_write_staged of a block from ruda_staging_alloc: each replay uploads it)");
  uint64_t addr, blen;
  ruda__order o;
  ruda__order_init(&o);
  if ((rc = ruda__pin_binding(&dev->sched, s, dst->binding, fn, "dst", -1, &addr, &blen, &o, capturing,
                              RUDA__USE_WRITE)) != 0)
    return rc;
  ruda__layout l;
  if ((rc = make_layout(dst, blen, fn, &l)) != 0 || (rc = check_layout(dev, &l, fn)) != 0) goto unpin;
  if (l.bytes != len) {
    rc = ruda__fail(RUDA_EINVAL, "%s: len %zu does not match the descriptor's %llu bytes", fn, len,
                    (unsigned long long)l.bytes);
    goto unpin;
  }
  if (capturing) {
    if ((rc = record_io(dev, s, &o, RUDA__CMD_WRITE, dst->binding.handle.slot, addr, user_staged, &l, fn)) != 0)
      goto unpin;
    return 0;
  }
  if (user_staged == NULL && l.contiguous && len > RUDA__WRITE_PIECE) {
    /* Admit the write once, before any piece is staged: a full queue then
     * refuses it whole instead of leaving part of it written. */
    if ((rc = ruda__queue_admit(s->worker, s->id)) != 0) goto unpin;
    /* Pieces are pushed in any order: a WAIT goes before all of them. The
     * buffer's issue lock is held until the last piece is queued. */
    ruda__order_lock(&o, s->lane);
    if (ruda__order_needed(&o) && (rc = ruda__order_prepare(&dev->sched, &o, s, 0)) != 0) {
      ruda__queue_unadmit(s->worker);
      goto unpin;
    }
    write_pieces j = {dev, s, dst->binding.handle, addr, src, len};
    rc = ruda__staging_parallel((len + RUDA__WRITE_PIECE - 1) / RUDA__WRITE_PIECE, write_piece, &j);
    ruda__queue_unadmit(s->worker);
    ruda__order_publish(&o, s->lane); /* still pinned here */
    goto unpin; /* the pieces hold their own pins */
  }
  ruda__cmd *cmd = ruda__cmd_alloc(sizeof(uint32_t));
  void *staged = user_staged;
  if (cmd != NULL && staged == NULL) {
    /* After the stream's last write's block: it comes back once retired. */
    staged = dev->sched.backend.ops->stage_alloc(dev->sched.backend.state, len,
                                                 atomic_load_explicit(&s->last_staged, memory_order_relaxed));
    if (staged != NULL) atomic_store_explicit(&s->last_staged, staged, memory_order_relaxed);
  }
  if (cmd == NULL || staged == NULL) {
    ruda__cmd_free(cmd);
    rc = ruda__fail(RUDA_ENOMEM, "%s: no staging memory for %zu bytes", fn, len);
    goto unpin;
  }
  if (user_staged == NULL) memcpy(staged, src, len);
  cmd->kind = RUDA__CMD_WRITE;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  cmd->pins[0] = dst->binding.handle.slot;
  cmd->npins = 1;
  cmd->u.write.dst = addr;
  cmd->u.write.staged = staged;
  cmd->u.write.layout = l;
  if ((rc = ruda__submit(&dev->sched, s, cmd, &o)) != 0) {
    if (user_staged == NULL) dev->sched.backend.ops->stage_free(dev->sched.backend.state, staged); /* never queued */
    ruda__cmd_free(cmd);
    goto unpin;
  }
  return 0;
unpin:
  ruda__order_abandon(&o); /* a no-op once published */
  ruda__handles_unpin(&dev->handles, dst->binding.handle.slot, NULL);
  return rc;
}

int ruda_write(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *dst, const void *src,
               size_t len) {
  return write_impl(dev, stream, dst, src, len, NULL, "ruda_write");
}

int ruda_write_staged(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *dst, void *staged,
                      size_t len) {
  return write_impl(dev, stream, dst, staged, len, staged, "ruda_write_staged");
}

int ruda_read(ruda_device *dev, ruda_stream_id stream, const ruda_copy_desc *src, void *dst, size_t len,
              ruda_future **fut) {
  static const char fn[] = "ruda_read";
  if (fut != NULL) *fut = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (src == NULL || dst == NULL || fut == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_read: %s is NULL", !src ? "src" : !dst ? "dst" : "fut");
  if (len == 0) return ruda__fail(RUDA_EINVAL, "ruda_read: len is 0");
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  uint64_t addr, blen;
  ruda__order o;
  ruda__order_init(&o);
  if ((rc = ruda__pin_binding(&dev->sched, s, src->binding, fn, "src", -1, &addr, &blen, &o, capturing,
                              RUDA__USE_READ)) != 0)
    return rc;
  ruda__layout l;
  if ((rc = make_layout(src, blen, fn, &l)) != 0 || (rc = check_layout(dev, &l, fn)) != 0) goto unpin;
  if (l.bytes != len) {
    rc = ruda__fail(RUDA_EINVAL, "ruda_read: len %zu does not match the descriptor's %llu bytes", len,
                    (unsigned long long)l.bytes);
    goto unpin;
  }
  if (capturing) { /* recorded; the replay's future says when dst is filled */
    if ((rc = record_io(dev, s, &o, RUDA__CMD_READ, src->binding.handle.slot | RUDA__PIN_READ, addr, dst, &l,
                        fn)) != 0)
      goto unpin;
    return 0;
  }
  ruda__cmd *cmd = ruda__cmd_alloc(sizeof(uint32_t));
  ruda_future *f = cmd ? ruda__future_new(&dev->sched, s, 1) : NULL;
  if (f == NULL) {
    ruda__cmd_free(cmd);
    rc = ruda__fail(RUDA_ENOMEM, "ruda_read: out of host memory");
    goto unpin;
  }
  cmd->kind = RUDA__CMD_READ;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  cmd->pins[0] = src->binding.handle.slot;
  cmd->npins = 1;
  cmd->future = f;
  cmd->u.read.src = addr;
  cmd->u.read.dst = dst;
  cmd->u.read.layout = l;
  if ((rc = ruda__submit(&dev->sched, s, cmd, &o)) != 0) {
    free(f);
    ruda__cmd_free(cmd);
    goto unpin;
  }
  *fut = f;
  ruda__future_hand_out(f);
  return 0;
unpin:
  ruda__order_abandon(&o); /* a no-op once published */
  ruda__handles_unpin(&dev->handles, src->binding.handle.slot, NULL);
  return rc;
}

int ruda_copy(ruda_device *dev, ruda_stream_id stream, ruda_binding dst, ruda_binding src) {
  static const char fn[] = "ruda_copy";
  RUDA__CHECK_DEV(dev, fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  uint64_t da, dl, sa, sl;
  ruda__order o;
  ruda__order_init(&o);
  if ((rc = ruda__pin_binding(&dev->sched, s, src, fn, "src", -1, &sa, &sl, &o, capturing, RUDA__USE_READ)) != 0) return rc;
  if ((rc = ruda__pin_binding(&dev->sched, s, dst, fn, "dst", -1, &da, &dl, &o, capturing, RUDA__USE_WRITE)) != 0) {
    ruda__order_abandon(&o);
    ruda__handles_unpin(&dev->handles, src.handle.slot, NULL);
    return rc;
  }
  uint32_t pins[2] = {src.handle.slot | RUDA__PIN_READ, dst.handle.slot};
  if (sl > dl) {
    ruda__order_abandon(&o);
    ruda__unpin_all(&dev->sched, pins, 2);
    return ruda__fail(RUDA_ERANGE, "ruda_copy: source of %llu bytes does not fit in destination of %llu",
                      (unsigned long long)sl, (unsigned long long)dl);
  }
  ruda__cmd *cmd = ruda__cmd_alloc(sizeof pins);
  if (cmd == NULL) {
    ruda__order_abandon(&o);
    ruda__unpin_all(&dev->sched, pins, 2);
    return ruda__fail(RUDA_ENOMEM, "ruda_copy: out of host memory");
  }
  cmd->kind = RUDA__CMD_COPY;
  cmd->pins = (uint32_t *)ruda__cmd_extra(cmd);
  memcpy(cmd->pins, pins, sizeof pins);
  cmd->npins = 2;
  cmd->u.copy.dst = da;
  cmd->u.copy.src = sa;
  cmd->u.copy.size = sl;
  if (capturing && (rc = ruda__capture_record(s, cmd)) <= 0) {
    ruda__order_abandon(&o); /* recorded, not pushed: replays order themselves */
    if (rc == 0) return 0;
    ruda__cmd_free(cmd);
    ruda__unpin_all(&dev->sched, pins, 2);
    return rc;
  }
  if ((rc = ruda__submit(&dev->sched, s, cmd, &o)) != 0) {
    ruda__cmd_free(cmd);
    ruda__unpin_all(&dev->sched, pins, 2);
  }
  return rc;
}

/* ---- launch ---- */

static int check_limits(ruda_device *dev, const ruda_launch_desc *l) {
  const ruda__limits *lim = &dev->limits;
  const ruda_dim3 b = l->block, g = l->grid;
  if (b.x == 0 || b.y == 0 || b.z == 0)
    return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": block (%u,%u,%u) has a zero dimension",
                      l->kernel, b.x, b.y, b.z);
  if (b.x > lim->max_block[0] || b.y > lim->max_block[1] || b.z > lim->max_block[2])
    return ruda__fail(RUDA_EBLOCKDIM, "ruda_launch \"%s\": block (%u,%u,%u) exceeds maximum (%u,%u,%u)",
                      l->kernel, b.x, b.y, b.z, lim->max_block[0], lim->max_block[1], lim->max_block[2]);
  uint64_t units = (uint64_t)b.x * b.y * b.z;
  if (units > lim->max_threads_per_block)
    return ruda__fail(RUDA_EBLOCKTHREADS,
                      "ruda_launch \"%s\": %llu threads per block requested, maximum is %u", l->kernel,
                      (unsigned long long)units, lim->max_threads_per_block);
  if (!(l->flags & RUDA_LAUNCH_INDIRECT)) {
    if (g.x == 0 || g.y == 0 || g.z == 0)
      return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": grid (%u,%u,%u) has a zero dimension",
                        l->kernel, g.x, g.y, g.z);
    if (g.x > lim->max_grid[0] || g.y > lim->max_grid[1] || g.z > lim->max_grid[2])
      return ruda__fail(RUDA_EGRIDDIM, "ruda_launch \"%s\": grid (%u,%u,%u) exceeds maximum (%u,%u,%u)",
                        l->kernel, g.x, g.y, g.z, lim->max_grid[0], lim->max_grid[1], lim->max_grid[2]);
  }
  if (l->shared_mem > lim->max_shared_optin)
    return ruda__fail(RUDA_ESHAREDMEM,
                      "ruda_launch \"%s\": %u bytes of shared memory requested, maximum is %u",
                      l->kernel, l->shared_mem, lim->max_shared_optin);
  return 0;
}

int ruda_launch(ruda_device *dev, ruda_stream_id stream, const ruda_launch_desc *l) {
  static const char fn[] = "ruda_launch";
  RUDA__CHECK_DEV(dev, fn);
  if (l == NULL || (l->kernel == NULL && l->ref == NULL))
    return ruda__fail(RUDA_EINVAL, "ruda_launch: %s is NULL", l ? "kernel name is NULL, and ref" : "launch descriptor");
  ruda__kernel *k;
  ruda_launch_desc named;
  if (l->ref != NULL) { /* resolved once (ruda_kernel_lookup): no name to look up */
    const char *name = NULL;
    if ((k = ruda__kernel_of_ref(dev, l->ref, &name)) == NULL)
      return ruda__fail(RUDA_EINVAL, "ruda_launch: the kernel reference is not one of this device's (take it "
                                     "with ruda_kernel_lookup on the device the launch is for)");
    named = *l; /* messages below name the kernel */
    named.kernel = name;
    l = &named;
  } else {
    k = ruda__kernel_find(dev, l->kernel);
  }
  if (l->nargs > RUDA_MAX_ARGS)
    return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": %u arguments, at most %d", l->kernel, l->nargs,
                      RUDA_MAX_ARGS);
  if (l->nargs > 0 && l->args == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": args is NULL with nargs %u", l->kernel, l->nargs);
  if (l->flags & ~(RUDA_LAUNCH_DRY_RUN | RUDA_LAUNCH_INDIRECT | RUDA_LAUNCH_NOWAIT))
    return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": unknown flags 0x%x", l->kernel, l->flags);
  const int r = RUDA__RESERVED_SET(l);
  if (r >= 0) return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": reserved[%d] is not zero", l->kernel, r);
  if (k == NULL)
    return ruda__fail(RUDA_EKERNEL, "ruda_launch: no kernel named \"%s\" is registered", l->kernel);
  int rc = check_limits(dev, l);
  if (rc == 0 && dev->sched.backend.ops->launch_check != NULL) rc = dev->sched.backend.ops->launch_check(dev->sched.backend.state, k, l);
  if (rc != 0) return rc;
  int rc2 = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc2);
  if (s == NULL) return rc2;
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  if (__builtin_expect(capturing, 0) && (l->flags & RUDA_LAUNCH_INDIRECT) && !(l->flags & RUDA_LAUNCH_DRY_RUN))
    return refuse_capturing(s, fn, "indirect launches read their grid when they run, so cannot be recorded");

  /* One allocation: header, pins, args, scalar bytes. */
  size_t scalar_bytes = 0;
  uint32_t nbuf = 0;
  for (uint32_t i = 0; i < l->nargs; i++) {
    const ruda_arg *a = &l->args[i];
    if (a->kind == RUDA_ARG_SCALAR) {
      if (a->data == NULL || a->size == 0 || a->size > RUDA_MAX_SCALAR_BYTES)
        return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": scalar argument %u has %s", l->kernel, i,
                          a->data == NULL ? "NULL data" : "a size outside 1..256");
      scalar_bytes += (a->size + 7u) & ~7u;
    } else if (a->kind == RUDA_ARG_BUFFER || a->kind == RUDA_ARG_BUFFER_IN || a->kind == RUDA_ARG_BUFFER_OUT) {
      nbuf++;
    } else {
      return ruda__fail(RUDA_EINVAL, "ruda_launch \"%s\": argument %u has unknown kind %d", l->kernel, i,
                        (int)a->kind);
    }
  }
  const int indirect = (l->flags & RUDA_LAUNCH_INDIRECT) != 0;
  const uint32_t npins = nbuf + (uint32_t)indirect;
  size_t pins_off = 0;
  size_t args_off = (npins * sizeof(uint32_t) + 7) & ~(size_t)7;
  size_t bytes_off = args_off + l->nargs * sizeof(ruda__karg);
  ruda__cmd *cmd = ruda__cmd_alloc(bytes_off + scalar_bytes);
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_launch \"%s\": out of host memory", l->kernel);
  unsigned char *extra = ruda__cmd_extra(cmd);
  cmd->pins = (uint32_t *)(extra + pins_off);
  ruda__karg *kargs = (ruda__karg *)(extra + args_off);
  unsigned char *bytes = extra + bytes_off;

  uint32_t pinned = 0;
  ruda__order o;
  ruda__order_init(&o);
  for (uint32_t i = 0; i < l->nargs; i++) {
    const ruda_arg *a = &l->args[i];
    kargs[i].kind = (uint32_t)a->kind;
    if (a->kind == RUDA_ARG_SCALAR) {
      memcpy(bytes, a->data, a->size);
      kargs[i].bytes = bytes;
      kargs[i].size = a->size;
      kargs[i].addr = 0;
      kargs[i].len = 0;
      bytes += (a->size + 7u) & ~7u;
    } else {
      uint64_t addr, len;
      const int read = a->kind == RUDA_ARG_BUFFER_IN;
      rc = ruda__pin_binding(&dev->sched, s, a->binding, fn, "argument", (int)i, &addr, &len, &o, capturing,
                             read ? RUDA__USE_READ : RUDA__USE_WRITE);
      if (rc != 0) goto fail;
      cmd->pins[pinned++] = a->binding.handle.slot | (read ? RUDA__PIN_READ : 0);
      kargs[i].kind = RUDA_ARG_BUFFER; /* backends see a buffer; the mode is for ordering */
      kargs[i].addr = addr;
      kargs[i].len = len;
      kargs[i].size = 0;
      kargs[i].bytes = NULL;
    }
  }
  uint64_t indirect_addr = 0;
  if (indirect) {
    uint64_t len;
    rc = ruda__pin_binding(&dev->sched, s, l->indirect_grid, fn, "indirect grid", -1, &indirect_addr, &len, &o, capturing,
                           RUDA__USE_READ);
    if (rc != 0) goto fail;
    cmd->pins[pinned++] = l->indirect_grid.handle.slot | RUDA__PIN_READ;
    if (len < 3 * sizeof(uint32_t)) {
      rc = ruda__fail(RUDA_ERANGE, "ruda_launch \"%s\": indirect grid binding holds %llu bytes, needs 12",
                      l->kernel, (unsigned long long)len);
      goto fail;
    }
  }
  if (l->flags & RUDA_LAUNCH_DRY_RUN) { /* validated; nothing to dispatch */
    ruda__order_abandon(&o);
    ruda__unpin_all(&dev->sched, cmd->pins, pinned);
    ruda__cmd_free(cmd);
    return 0;
  }
  cmd->kind = RUDA__CMD_LAUNCH;
  cmd->npins = (uint8_t)pinned;
  cmd->u.launch = (ruda__launch_cmd){.kernel = k,
                                     .grid = l->grid,
                                     .block = l->block,
                                     .shared_mem = l->shared_mem,
                                     .flags = l->flags & ~RUDA_LAUNCH_NOWAIT, /* the call's, not the command's */
                                     .nargs = l->nargs,
                                     .indirect_addr = indirect_addr,
                                     .args = kargs};
  if (__builtin_expect(capturing, 0) && (rc = ruda__capture_record(s, cmd)) <= 0) {
    ruda__order_abandon(&o); /* recorded, not pushed: replays order themselves */
    if (rc == 0) return 0;
    goto fail;
  }
  cmd->nowait = (l->flags & RUDA_LAUNCH_NOWAIT) != 0;
  if ((rc = ruda__submit(&dev->sched, s, cmd, &o)) != 0) goto fail;
  return 0;
fail:
  ruda__order_abandon(&o);
  ruda__unpin_all(&dev->sched, cmd->pins, pinned);
  ruda__cmd_free(cmd);
  return rc;
}

/* ---- flush and sync ---- */

/* Pushes a control command carrying a new future. */
static int control(ruda_device *dev, ruda_stream_id stream, int kind, const char *fn, ruda__stream **sp,
                   ruda_future **out) {
  int rc = 0;
  ruda__stream *s = *sp = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if (kind == RUDA__CMD_SYNC && atomic_load_explicit(&s->capturing, memory_order_acquire))
    return refuse_capturing(s, fn, "a sync would wait for work that is being recorded, not run");
  return ruda__push_control(&dev->sched, s, kind, kind == RUDA__CMD_SYNC, fn, out);
}

int ruda_flush(ruda_device *dev, ruda_stream_id stream, ruda_error **errors) {
  if (errors) *errors = NULL;
  RUDA__CHECK_DEV(dev, "ruda_flush");
  ruda__stream *s;
  ruda_future *f;
  int rc = control(dev, stream, RUDA__CMD_FENCE, "ruda_flush", &s, &f);
  if (rc != 0) return rc;
  ruda_future_wait(f, NULL);
  ruda_future_free(f);
  return ruda__stream_drain(&dev->sched, s, errors);
}

int ruda_sync_async(ruda_device *dev, ruda_stream_id stream, ruda_future **fut) {
  if (fut) *fut = NULL;
  RUDA__CHECK_DEV(dev, "ruda_sync_async");
  if (fut == NULL) return ruda__fail(RUDA_EINVAL, "ruda_sync_async: fut is NULL");
  ruda__stream *s;
  int rc = control(dev, stream, RUDA__CMD_SYNC, "ruda_sync_async", &s, fut);
  if (rc == 0) ruda__future_hand_out(*fut);
  return rc;
}

int ruda_sync(ruda_device *dev, ruda_stream_id stream, ruda_error **errors) {
  if (errors) *errors = NULL;
  RUDA__CHECK_DEV(dev, "ruda_sync");
  ruda__stream *s;
  ruda_future *f;
  int rc = control(dev, stream, RUDA__CMD_SYNC, "ruda_sync", &s, &f);
  if (rc != 0) return rc;
  rc = ruda_future_wait(f, errors);
  ruda_future_free(f);
  ruda__import_poll(&dev->memory); /* imports whose last use this passed */
  return rc;
}

/* ---- the whole device ---- */

typedef struct stream_list {
  ruda__stream **s;
  size_t n, cap;
  int nomem;
} stream_list;

static void collect_stream(ruda__stream *s, void *arg) {
  stream_list *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    ruda__stream **p = realloc(l->s, cap * sizeof *p);
    if (p == NULL) {
      l->nomem = 1;
      return;
    }
    l->s = p;
    l->cap = cap;
  }
  l->s[l->n++] = s;
}

int ruda_device_sync(ruda_device *dev, ruda_error **errors) {
  static const char fn[] = "ruda_device_sync";
  if (errors) *errors = NULL;
  RUDA__CHECK_DEV(dev, fn);
  stream_list l = {NULL, 0, 0, 0};
  ruda__streams_each(&dev->sched.streams, collect_stream, &l);
  ruda_future **f = l.n ? calloc(l.n, sizeof *f) : NULL;
  if (l.nomem || (l.n && f == NULL)) {
    free(l.s);
    free(f);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  }
  /* All syncs first, then the waits: the workers run them side by side. */
  int rc = 0;
  for (size_t i = 0; i < l.n && rc == 0; i++) rc = ruda__push_control(&dev->sched, l.s[i], RUDA__CMD_SYNC, 1, fn, &f[i]);
  ruda_error *head = NULL, **tail = &head;
  int unhealthy = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (f[i] == NULL) continue;
    ruda_error *e = NULL;
    if (ruda_future_wait(f[i], &e) != 0) unhealthy = 1;
    ruda_future_free(f[i]);
    *tail = e;
    while (*tail != NULL) tail = &(*tail)->next;
  }
  free(f);
  free(l.s);
  ruda__import_poll(&dev->memory);
  if (errors) *errors = head;
  else ruda_error_free(head);
  if (rc != 0) return rc;
  return unhealthy ? RUDA_EUNHEALTHY : 0;
}

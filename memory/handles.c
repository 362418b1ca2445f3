/* handles.c - the handle table (see handles.h for the state word). */
#include <stdlib.h>

#include "../src/internal.h"

#define LIVE (1ull << 32)
#define REFS_MASK 0xffffffffull
#define GEN_SHIFT 33
#define NONE UINT32_MAX

static inline uint32_t gen_of(uint64_t s) { return (uint32_t)(s >> GEN_SHIFT); }

static ruda__slot *slot_at(ruda__handles *h, uint32_t index) {
  uint32_t c = index / RUDA__SLOTS_PER_CHUNK;
  if (c >= RUDA__MAX_CHUNKS) return NULL;
  ruda__slot *chunk = atomic_load_explicit(&h->chunks[c], memory_order_acquire);
  return chunk ? &chunk[index % RUDA__SLOTS_PER_CHUNK] : NULL;
}

void ruda__handles_init(ruda__handles *h) {
  for (uint32_t i = 0; i < RUDA__MAX_CHUNKS; i++) atomic_init(&h->chunks[i], NULL);
  pthread_mutex_init(&h->lock, NULL);
  h->nslots = 0;
  h->free_head = NONE;
  atomic_init(&h->live_bytes, 0);
  atomic_init(&h->live_count, 0);
}

int ruda__handles_insert(ruda__handles *h, uint64_t addr, uint64_t size, ruda_handle *out) {
  pthread_mutex_lock(&h->lock);
  uint32_t index = h->free_head;
  ruda__slot *s;
  if (index != NONE) {
    s = slot_at(h, index);
    h->free_head = s->next_free;
  } else {
    index = h->nslots;
    uint32_t c = index / RUDA__SLOTS_PER_CHUNK;
    if (c >= RUDA__MAX_CHUNKS) {
      pthread_mutex_unlock(&h->lock);
      return ruda__fail(RUDA_ENOMEM, "ruda_buffer_create: %u live buffers is the limit",
                        RUDA__MAX_CHUNKS * RUDA__SLOTS_PER_CHUNK);
    }
    if (atomic_load_explicit(&h->chunks[c], memory_order_relaxed) == NULL) {
      ruda__slot *chunk = calloc(RUDA__SLOTS_PER_CHUNK, sizeof *chunk);
      if (chunk == NULL) {
        pthread_mutex_unlock(&h->lock);
        return ruda__fail(RUDA_ENOMEM, "ruda_buffer_create: no host memory for the handle table");
      }
      atomic_store_explicit(&h->chunks[c], chunk, memory_order_release);
    }
    h->nslots++;
    s = slot_at(h, index);
  }
  uint32_t gen = gen_of(atomic_load_explicit(&s->state, memory_order_relaxed)) + 1;
  gen &= 0x7fffffffu;
  if (gen == 0) gen = 1; /* handle {0,0} is never valid */
  s->addr = addr;
  s->size = size;
  /* Release: a pinner that sees the new generation sees addr and size. */
  atomic_store_explicit(&s->state, ((uint64_t)gen << GEN_SHIFT) | LIVE | 1, memory_order_release);
  pthread_mutex_unlock(&h->lock);
  atomic_fetch_add_explicit(&h->live_bytes, size, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->live_count, 1, memory_order_relaxed);
  out->slot = index;
  out->gen = gen;
  return 0;
}

int ruda__handles_pin(ruda__handles *h, ruda_handle handle, uint64_t *addr, uint64_t *size) {
  ruda__slot *s = slot_at(h, handle.slot);
  if (s == NULL || handle.gen == 0) goto not_found;
  uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  for (;;) {
    if (gen_of(st) != handle.gen || !(st & LIVE)) goto not_found;
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, st + 1, memory_order_acquire,
                                              memory_order_acquire))
      break;
  }
  *addr = s->addr;
  *size = s->size;
  return 0;
not_found:
  return ruda__fail(RUDA_ENOTFOUND, "handle {slot %u, gen %u} names no live buffer (freed or never created)",
                    handle.slot, handle.gen);
}

int ruda__handles_size(ruda__handles *h, ruda_handle handle, uint64_t *size) {
  uint64_t addr;
  int rc = ruda__handles_pin(h, handle, &addr, size);
  if (rc == 0) {
    /* The pin guarantees the slot stays ours while size was read; the
     * owner's reference is still held, so this unpin never frees. */
    ruda__slot *s = slot_at(h, handle.slot);
    atomic_fetch_sub_explicit(&s->state, 1, memory_order_release);
  }
  return rc;
}

int ruda__handles_kill(ruda__handles *h, ruda_handle handle) {
  ruda__slot *s = slot_at(h, handle.slot);
  if (s == NULL || handle.gen == 0)
    return ruda__fail(RUDA_ENOTFOUND, "ruda_buffer_free: handle {slot %u, gen %u} never existed",
                      handle.slot, handle.gen);
  uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  for (;;) {
    uint32_t g = gen_of(st);
    if (g == handle.gen && !(st & LIVE))
      return ruda__fail(RUDA_EFREE, "ruda_buffer_free: handle {slot %u, gen %u} was already freed",
                        handle.slot, handle.gen);
    if (g != handle.gen)
      return ruda__fail(g > handle.gen ? RUDA_EFREE : RUDA_ENOTFOUND,
                        "ruda_buffer_free: handle {slot %u, gen %u} is %s (slot now at gen %u)",
                        handle.slot, handle.gen, g > handle.gen ? "already freed" : "unknown", g);
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, st & ~LIVE, memory_order_acq_rel,
                                              memory_order_acquire))
      return 0;
  }
}

void ruda__handles_unpin(ruda__handles *h, ruda_device *dev, uint32_t index, void *wstate) {
  ruda__slot *s = slot_at(h, index);
  uint64_t st = atomic_fetch_sub_explicit(&s->state, 1, memory_order_acq_rel);
  if ((st & REFS_MASK) != 1) return;
  /* Last reference of a dead buffer (a live one always holds the owner's). */
  uint64_t size = s->size;
  dev->ops->mem_free(dev->bstate, s->addr, wstate);
  atomic_fetch_sub_explicit(&h->live_bytes, size, memory_order_relaxed);
  atomic_fetch_sub_explicit(&h->live_count, 1, memory_order_relaxed);
  pthread_mutex_lock(&h->lock);
  s->next_free = h->free_head;
  h->free_head = index;
  pthread_mutex_unlock(&h->lock);
}

void ruda__handles_destroy(ruda__handles *h, ruda_device *dev) {
  for (uint32_t i = 0; i < h->nslots; i++) {
    ruda__slot *s = slot_at(h, i);
    uint64_t st = atomic_load(&s->state);
    if (st & LIVE) dev->ops->mem_free(dev->bstate, s->addr, NULL);
  }
  for (uint32_t c = 0; c < RUDA__MAX_CHUNKS; c++) free(atomic_load(&h->chunks[c]));
  pthread_mutex_destroy(&h->lock);
}

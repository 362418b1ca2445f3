/* handles.c - the handle table (see handles.h for the state word). */
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/error.h"
#include "base/progress.h"
#include "memory/handles.h"

#define LIVE (1ull << 32)
#define REFS_MASK 0xffffffffull
#define GEN_SHIFT 33
#define NONE UINT32_MAX

static inline uint32_t gen_of(uint64_t s) { return (uint32_t)(s >> GEN_SHIFT); }

/* Is generation a later than b? Generations are 31 bits and wrap (0 is
 * skipped), so compare them serially: a handle freed just before the wrap
 * is older than the slot's generation 1, 2, ... after it. */
static inline int gen_after(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) & 0x7fffffffu;
  return d != 0 && d < 0x40000000u;
}

static ruda__slot *slot_at(ruda__handles *h, uint32_t index) {
  uint32_t c = index / RUDA__SLOTS_PER_CHUNK;
  if (c >= RUDA__MAX_CHUNKS) return NULL;
  ruda__slot *chunk = atomic_load_explicit(&h->chunks[c], memory_order_acquire);
  return chunk ? &chunk[index % RUDA__SLOTS_PER_CHUNK] : NULL;
}

/* A chunk: RUDA__SLOTS_PER_CHUNK slots, then as many use records
 * (RUDA__USE_WORDS words each, line-aligned; handles.h). */
#define CHUNK_BYTES (RUDA__SLOTS_PER_CHUNK * (sizeof(ruda__slot) + RUDA__USE_WORDS * sizeof(uint64_t)))

/* The record of slot s, which is the slot at index. */
static _Atomic uint64_t *last_of(ruda__slot *s, uint32_t index) {
  uint32_t i = index % RUDA__SLOTS_PER_CHUNK;
  return (_Atomic uint64_t *)(s - i + RUDA__SLOTS_PER_CHUNK) + RUDA__USE_WORDS * i;
}

ruda__slot *ruda__handles_slot(ruda__handles *h, uint32_t index) { return slot_at(h, index); }

_Atomic uint64_t *ruda__handles_last(ruda__handles *h, uint32_t index) {
  return last_of(slot_at(h, index), index);
}

void ruda__handles_init(ruda__handles *h) {
  for (uint32_t i = 0; i < RUDA__MAX_CHUNKS; i++) atomic_init(&h->chunks[i], NULL);
  pthread_mutex_init(&h->lock, NULL);
  h->nslots = 0;
  h->free_head = NONE;
  atomic_init(&h->returned, NONE);
}

/* Moves the slots workers released onto the free list. Lock held. Taking
 * the whole stack with one exchange leaves no ABA window. */
static void adopt_returned(ruda__handles *h) {
  uint32_t i = atomic_exchange_explicit(&h->returned, NONE, memory_order_acquire);
  while (i != NONE) {
    ruda__slot *s = slot_at(h, i);
    uint32_t next = s->next_free;
    s->next_free = h->free_head;
    h->free_head = i;
    i = next;
  }
}

uint32_t ruda__handles_take(ruda__handles *h, uint32_t *slots, uint32_t n) {
  uint32_t got = 0;
  pthread_mutex_lock(&h->lock);
  if (h->free_head == NONE) adopt_returned(h);
  while (got < n && h->free_head != NONE) {
    uint32_t i = h->free_head;
    h->free_head = slot_at(h, i)->next_free;
    slots[got++] = i;
  }
  /* Carve new slots only when none are free, so the table grows with the
   * number of buffers alive at once, not with the callers' caches. */
  const int carve = got == 0;
  while (carve && got < n) {
    uint32_t index = h->nslots;
    uint32_t c = index / RUDA__SLOTS_PER_CHUNK;
    if (c >= RUDA__MAX_CHUNKS) {
      ruda__fail(RUDA_ENOMEM, "ruda_buffer_create: %u live buffers is the limit",
                 RUDA__MAX_CHUNKS * RUDA__SLOTS_PER_CHUNK);
      break;
    }
    if (atomic_load_explicit(&h->chunks[c], memory_order_relaxed) == NULL) {
      /* The records start line-aligned after the slots. */
      ruda__slot *chunk = aligned_alloc(64, CHUNK_BYTES);
      if (chunk != NULL) memset(chunk, 0, CHUNK_BYTES);
      if (chunk == NULL) {
        ruda__fail(RUDA_ENOMEM, "ruda_buffer_create: no host memory for the handle table");
        break;
      }
      atomic_store_explicit(&h->chunks[c], chunk, memory_order_release);
    }
    h->nslots++;
    slots[got++] = index;
  }
  pthread_mutex_unlock(&h->lock);
  return got;
}

void ruda__handles_put(ruda__handles *h, const uint32_t *slots, uint32_t n) {
  pthread_mutex_lock(&h->lock);
  for (uint32_t k = n; k-- > 0;) {
    slot_at(h, slots[k])->next_free = h->free_head;
    h->free_head = slots[k];
  }
  pthread_mutex_unlock(&h->lock);
}

void ruda__handles_publish(ruda__handles *h, uint32_t index, uint64_t addr, uint64_t size, uint32_t home,
                           void *mem, ruda_handle *out) {
  ruda__slot *s = slot_at(h, index);
  uint32_t gen = gen_of(atomic_load_explicit(&s->state, memory_order_relaxed)) + 1;
  gen &= 0x7fffffffu;
  if (gen == 0) gen = 1; /* handle {0,0} is never valid */
  s->addr = addr;
  s->size = size;
  s->raw = 0;
  s->imp = NULL;
  atomic_store_explicit(&s->home, home, memory_order_relaxed);
  atomic_store_explicit(&s->users, 0, memory_order_relaxed);
  atomic_store_explicit(&s->used, 0, memory_order_relaxed);
  atomic_store_explicit(&s->held, 0, memory_order_relaxed);
  atomic_store_explicit(&s->mem, mem, memory_order_relaxed);
  uint64_t last = 0;
  if (home != UINT32_MAX && h->progress != NULL)
    last = ruda__use_pack(home, gen, ruda__progress_ticket(h->progress, home));
  atomic_store_explicit(last_of(s, index), last, memory_order_relaxed);
  atomic_store_explicit(last_of(s, index) + RUDA__USE_READERS, 0, memory_order_relaxed);
  /* Release: a pinner that sees the new generation sees all of the above. */
  atomic_store_explicit(&s->state, ((uint64_t)gen << GEN_SHIFT) | LIVE | 1, memory_order_release);
  out->slot = index;
  out->gen = gen;
}

int ruda__handles_insert(ruda__handles *h, uint64_t addr, uint64_t size, ruda_handle *out) {
  uint32_t index;
  if (ruda__handles_take(h, &index, 1) != 1) return RUDA_ENOMEM;
  ruda__handles_publish(h, index, addr, size, UINT32_MAX, NULL, out);
  slot_at(h, index)->raw = 1; /* before any pin can see it: the handle is not out yet */
  return 0;
}

void ruda__handles_publish_import(ruda__handles *h, uint32_t index, uint64_t addr, uint64_t size, void *imp,
                                  ruda_handle *out) {
  ruda__slot *s = slot_at(h, index);
  s->imp = imp; /* before the publish's release: a pinner that sees the handle sees it */
  uint32_t gen = gen_of(atomic_load_explicit(&s->state, memory_order_relaxed)) + 1;
  gen &= 0x7fffffffu;
  if (gen == 0) gen = 1;
  s->addr = addr;
  s->size = size;
  s->raw = 0;
  atomic_store_explicit(&s->home, UINT32_MAX, memory_order_relaxed);
  atomic_store_explicit(&s->users, 0, memory_order_relaxed);
  atomic_store_explicit(&s->used, 0, memory_order_relaxed);
  atomic_store_explicit(&s->held, 0, memory_order_relaxed);
  atomic_store_explicit(&s->mem, NULL, memory_order_relaxed);
  atomic_store_explicit(last_of(s, index), 0, memory_order_relaxed);
  atomic_store_explicit(last_of(s, index) + RUDA__USE_READERS, 0, memory_order_relaxed);
  atomic_store_explicit(&s->state, ((uint64_t)gen << GEN_SHIFT) | LIVE | 1, memory_order_release);
  out->slot = index;
  out->gen = gen;
}

static int pin(ruda__handles *h, ruda_handle handle, uint32_t worker, int use, int hold, int pending,
               uint64_t *addr, uint64_t *size, ruda__slot **slot, _Atomic uint64_t **last) {
  ruda__slot *s = slot_at(h, handle.slot);
  if (s == NULL || handle.gen == 0) goto not_found;
  /* Counted before the pin takes effect: a free whose kill sees the pin
   * (the compare-and-swap below, released; the kill acquires) sees this. */
  if (pending) atomic_fetch_add_explicit(&s->pending, 1, memory_order_relaxed);
  uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  for (;;) {
    if (gen_of(st) != handle.gen || !(st & LIVE)) {
      if (pending) ruda__handles_settle(s);
      goto not_found;
    }
    /* Record a foreign user before the pin takes effect: a free that
     * kills the handle after this pin then sees the bit (its kill reads
     * this pin's increment). A pin that fails leaves a stray bit, which
     * only makes a free more careful. */
    uint32_t home = atomic_load_explicit(&s->home, memory_order_relaxed);
    if (worker != UINT32_MAX && worker != home) {
      uint64_t bit = UINT64_C(1) << (worker & 63);
      if (!(atomic_load_explicit(&s->users, memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(&s->users, bit, memory_order_relaxed);
    }
    /* Likewise the used mark: a store only on first use, the line is the
     * one the compare-and-swap below writes anyway. */
    if (use && !atomic_load_explicit(&s->used, memory_order_relaxed))
      atomic_store_explicit(&s->used, 1, memory_order_relaxed);
    /* And a graph's hold, so a free after this pin never returns the
     * memory at once (scheduler/capture.h). */
    if (hold && !atomic_load_explicit(&s->held, memory_order_relaxed))
      atomic_store_explicit(&s->held, 1, memory_order_relaxed);
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, st + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      break;
  }
  *addr = s->addr;
  *size = s->size;
  if (slot != NULL) *slot = s;
  if (last != NULL) *last = last_of(s, handle.slot);
  return 0;
not_found:
  return ruda__fail(RUDA_ENOTFOUND, "handle {slot %u, gen %u} names no live buffer (freed or never created)",
                    handle.slot, handle.gen);
}

int ruda__handles_pin_use(ruda__handles *h, ruda_handle handle, uint32_t worker, int hold, uint64_t *addr,
                          uint64_t *size, ruda__slot **slot, _Atomic uint64_t **last) {
  return pin(h, handle, worker, 1, hold, 1, addr, size, slot, last);
}

int ruda__handles_pin(ruda__handles *h, ruda_handle handle, uint64_t *addr, uint64_t *size) {
  return pin(h, handle, UINT32_MAX, 1, 0, 0, addr, size, NULL, NULL);
}

void ruda__handles_add_user(ruda__handles *h, uint32_t slot, uint32_t worker) {
  ruda__slot *s = slot_at(h, slot);
  if (worker == atomic_load_explicit(&s->home, memory_order_relaxed)) return;
  uint64_t bit = UINT64_C(1) << (worker & 63);
  if (!(atomic_load_explicit(&s->users, memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(&s->users, bit, memory_order_relaxed);
}

uint32_t ruda__handles_gen(ruda__handles *h, uint32_t slot) {
  return gen_of(atomic_load_explicit(&slot_at(h, slot)->state, memory_order_relaxed));
}

int ruda__handles_size(ruda__handles *h, ruda_handle handle, uint64_t *size) {
  uint64_t addr;
  int rc = pin(h, handle, UINT32_MAX, 0, 0, 0, &addr, size, NULL, NULL); /* a look, not a use */
  if (rc != 0) return rc;
  /* If the owner freed the buffer meanwhile, this pin may be the last
   * reference, which must release like any other. */
  if (h->progress != NULL) ruda__handles_unpin(h, handle.slot, NULL);
  else atomic_fetch_sub_explicit(&slot_at(h, handle.slot)->state, 1, memory_order_release);
  return 0;
}

int ruda__handles_kill(ruda__handles *h, ruda_handle handle, uint32_t *refs) {
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
    if (g != handle.gen) {
      /* A generation above 31 bits was never handed out. */
      const int older = handle.gen <= 0x7fffffffu && gen_after(g, handle.gen);
      return ruda__fail(older ? RUDA_EFREE : RUDA_ENOTFOUND,
                        "ruda_buffer_free: handle {slot %u, gen %u} is %s (slot now at gen %u)",
                        handle.slot, handle.gen, older ? "already freed" : "unknown", g);
    }
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, st & ~LIVE, memory_order_acq_rel,
                                              memory_order_acquire)) {
      if (refs != NULL) *refs = (uint32_t)(st & REFS_MASK);
      return 0;
    }
  }
}

int ruda__handles_drop(ruda__handles *h, uint32_t index) {
  ruda__slot *s = slot_at(h, index);
  uint64_t st = atomic_fetch_sub_explicit(&s->state, 1, memory_order_acq_rel);
  return (st & REFS_MASK) == 1;
}

void ruda__handles_unpin(ruda__handles *h, uint32_t index, void *wstate) {
  ruda__slot *s = slot_at(h, index);
  uint64_t st = atomic_fetch_sub_explicit(&s->state, 1, memory_order_acq_rel);
  if ((st & REFS_MASK) != 1) return;
  /* Last reference of a dead buffer (a live one always holds the owner's). */
  void *page = atomic_load_explicit(&s->mem, memory_order_relaxed);
  if (page != NULL)
    h->retire(h->retire_ctx, page, s->addr, s->size, atomic_load_explicit(&s->home, memory_order_relaxed),
              atomic_load_explicit(&s->users, memory_order_relaxed));
  else if (s->imp != NULL) {
    void *imp = s->imp;
    s->imp = NULL;
    h->retire_import(h->retire_ctx, imp, atomic_load_explicit(&s->users, memory_order_relaxed));
  } else if (s->raw)
    h->backend->ops->mem_free(h->backend->state, s->addr, wstate);
  /* Workers release here; a lock-free push keeps them off the table lock. */
  uint32_t head = atomic_load_explicit(&h->returned, memory_order_relaxed);
  do {
    s->next_free = head;
  } while (!atomic_compare_exchange_weak_explicit(&h->returned, &head, index, memory_order_release,
                                                  memory_order_relaxed));
}

static uint64_t live_scan(ruda__handles *h, int bytes) {
  uint64_t n = 0;
  pthread_mutex_lock(&h->lock);
  for (uint32_t i = 0; i < h->nslots; i++) {
    ruda__slot *s = slot_at(h, i);
    if (atomic_load_explicit(&s->state, memory_order_acquire) & REFS_MASK) n += bytes ? s->size : 1;
  }
  pthread_mutex_unlock(&h->lock);
  return n;
}

uint64_t ruda__handles_live_count(ruda__handles *h) { return live_scan(h, 0); }
uint64_t ruda__handles_live_bytes(ruda__handles *h) { return live_scan(h, 1); }

void ruda__handles_destroy(ruda__handles *h) {
  /* Pool memory goes back with the pools (ruda__memory_destroy); only raw
   * buffers are freed here. */
  for (uint32_t i = 0; i < h->nslots; i++) {
    ruda__slot *s = slot_at(h, i);
    uint64_t st = atomic_load(&s->state);
    if ((st & LIVE) && s->raw && h->backend != NULL) h->backend->ops->mem_free(h->backend->state, s->addr, NULL);
  }
  for (uint32_t c = 0; c < RUDA__MAX_CHUNKS; c++) free(atomic_load(&h->chunks[c]));
  pthread_mutex_destroy(&h->lock);
}

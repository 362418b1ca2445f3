/* cache.c - recently freed staging blocks (see staging/cache.h). */
#include "staging/cache.h"

#include <stdatomic.h>

static _Atomic unsigned next_stripe;
static _Thread_local unsigned my_stripe; /* stripe + 1; 0: not assigned yet */

static struct ruda__cache_stripe *stripe_of(ruda__block_cache *c, uint32_t key) {
  if (key != RUDA__CACHE_THREAD) return &c->stripe[key % RUDA__CACHE_STRIPES];
  if (my_stripe == 0)
    my_stripe = atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) % RUDA__CACHE_STRIPES + 1;
  return &c->stripe[my_stripe - 1];
}

void ruda__block_cache_init(ruda__block_cache *c, void (*release)(void *ctx, void *p), void *ctx) {
  c->release = release;
  c->ctx = ctx;
  for (unsigned i = 0; i < RUDA__CACHE_STRIPES; i++) {
    pthread_mutex_init(&c->stripe[i].lock, NULL);
    c->stripe[i].n = 0;
    c->stripe[i].bytes = 0;
  }
}

void ruda__block_cache_destroy(ruda__block_cache *c) {
  for (unsigned i = 0; i < RUDA__CACHE_STRIPES; i++) {
    for (unsigned k = 0; k < c->stripe[i].n; k++) c->release(c->ctx, c->stripe[i].slot[k].p);
    c->stripe[i].n = 0;
    pthread_mutex_destroy(&c->stripe[i].lock);
  }
}

void *ruda__block_cache_take(ruda__block_cache *c, size_t size, uint32_t key, const void *want) {
  struct ruda__cache_stripe *s = stripe_of(c, key);
  void *p = NULL;
  pthread_mutex_lock(&s->lock);
  unsigned i = s->n; /* the loop below starts at slot i - 1 */
  for (unsigned k = 0; want != NULL && k < s->n; k++)
    if (s->slot[k].p == want && s->slot[k].size == size) i = k + 1; /* want itself */
  for (; i-- > 0;) { /* else newest first: likely still in the CPU's cache */
    if (s->slot[i].size != size) continue;
    p = s->slot[i].p;
    for (unsigned k = i; k + 1 < s->n; k++) s->slot[k] = s->slot[k + 1];
    s->n--;
    s->bytes -= size;
    break;
  }
  pthread_mutex_unlock(&s->lock);
  return p;
}

void ruda__block_cache_put(ruda__block_cache *c, void *p, size_t size, uint32_t key) {
  if (size > RUDA__CACHE_MAX_BLOCK) {
    c->release(c->ctx, p);
    return;
  }
  struct ruda__cache_stripe *s = stripe_of(c, key);
  void *out[RUDA__CACHE_SLOTS];
  unsigned n_out = 0;
  pthread_mutex_lock(&s->lock);
  /* Full: the oldest go, so a stripe follows the sizes in use now. */
  while (s->n == RUDA__CACHE_SLOTS || s->bytes + size > RUDA__CACHE_MAX_BYTES) {
    out[n_out++] = s->slot[0].p;
    s->bytes -= s->slot[0].size;
    for (unsigned k = 0; k + 1 < s->n; k++) s->slot[k] = s->slot[k + 1];
    s->n--;
  }
  s->slot[s->n].p = p;
  s->slot[s->n].size = size;
  s->n++;
  s->bytes += size;
  pthread_mutex_unlock(&s->lock);
  for (unsigned i = 0; i < n_out; i++) c->release(c->ctx, out[i]); /* outside the lock */
}

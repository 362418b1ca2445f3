/* kernels.c - the kernel registry: name -> kernel, read on every launch.
 *
 * Same scheme as the stream table: open addressing, lock-free lookups,
 * inserts under a mutex, full tables retired until close. Replacing a
 * kernel swaps the entry's pointer; the old kernel stays allocated until
 * close because commands already queued may still name it.
 */
#include <stdlib.h>
#include <string.h>

#include "scheduler/device.h"
#include "src/api.h"

typedef struct ruda__kernel_entry {
  const char *name; /* owned by the first kernel registered under it */
  uint64_t hash;
  ruda__kernel *_Atomic kernel;
  struct ruda__kernel_entry *replaced; /* older kernels of this name */
} ruda__kernel_entry;

typedef struct ruda__kernel_slots {
  uint64_t mask, count;
  struct ruda__kernel_slots *prev_retired;
  ruda__kernel_entry *_Atomic slot[];
} ruda__kernel_slots;

static uint64_t hash_name(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static ruda__kernel_slots *slots_new(uint64_t cap) {
  ruda__kernel_slots *t = calloc(1, sizeof *t + cap * sizeof(ruda__kernel_entry *));
  if (t) t->mask = cap - 1;
  return t;
}

/* Kernel registry: name -> kernel, lock-free reads. */
struct ruda__kernel_table {
  struct ruda__kernel_slots *_Atomic current;
  struct ruda__kernel_slots *retired;
  pthread_mutex_t lock; /* writers */
};

ruda__kernel_table *ruda__kernels_new(void) {
  ruda__kernel_table *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  ruda__kernel_slots *s = slots_new(64);
  if (s == NULL) {
    free(t);
    return NULL;
  }
  atomic_init(&t->current, s);
  pthread_mutex_init(&t->lock, NULL);
  return t;
}

static ruda__kernel_entry *lookup(ruda__kernel_slots *s, const char *name, uint64_t h) {
  for (uint64_t i = h & s->mask;; i = (i + 1) & s->mask) {
    ruda__kernel_entry *e = atomic_load_explicit(&s->slot[i], memory_order_acquire);
    if (e == NULL) return NULL;
    if (e->hash == h && strcmp(e->name, name) == 0) return e;
  }
}

static void place(ruda__kernel_slots *s, ruda__kernel_entry *e) {
  uint64_t i = e->hash & s->mask;
  while (atomic_load_explicit(&s->slot[i], memory_order_relaxed) != NULL) i = (i + 1) & s->mask;
  atomic_store_explicit(&s->slot[i], e, memory_order_release);
  s->count++;
}

/* The launch path's lookup goes through a small per-thread cache first:
 * a thread usually launches the same few kernels by the same string
 * literals, so (device serial, name pointer) finds the entry without
 * hashing the name or probing the table. The cache holds the entry, never
 * the kernel, because a replacement swaps the entry's kernel pointer: each
 * hit loads it afresh. Entries live until their device closes, and a serial
 * is never reused (nor 0, an unused slot's), so a slot of a closed device
 * can only miss. The name is compared on every hit, because the caller may
 * have rewritten the string behind the same pointer. Only the owning thread
 * touches its slots.
 *
 * initial-exec: the slots are reached %fs-relative with no __tls_get_addr
 * call. KCACHE_SLOTS * 24 = 96 bytes of static TLS, affordable even when
 * libruda is dlopen'ed. */
#define KCACHE_BITS 2
#define KCACHE_SLOTS (1u << KCACHE_BITS)

typedef struct kcache_slot {
  uint64_t serial;
  const char *name; /* the caller's pointer */
  ruda__kernel_entry *entry;
} kcache_slot;

static __thread kcache_slot kcache[KCACHE_SLOTS] __attribute__((tls_model("initial-exec")));

/* Direct-mapped on the name pointer and the serial, so one name used on
 * two devices from one thread can occupy two slots. */
static unsigned kcache_index(uint64_t serial, const char *name) {
  uint64_t x = ((uint64_t)(uintptr_t)name + serial) * 0x9e3779b97f4a7c15ull;
  return (unsigned)(x >> (64 - KCACHE_BITS));
}

/* The table lookup behind a cache miss, out of line so that the hit path
 * keeps few registers live. */
static __attribute__((noinline, cold)) ruda__kernel *kcache_miss(ruda_device *dev, const char *name) {
  ruda__kernel_slots *s = atomic_load_explicit(&dev->kernels->current, memory_order_acquire);
  ruda__kernel_entry *e = lookup(s, name, hash_name(name));
  if (e == NULL) return NULL;
  kcache_slot *c = &kcache[kcache_index(dev->serial, name)];
  c->serial = dev->serial;
  c->name = name;
  c->entry = e;
  return atomic_load_explicit(&e->kernel, memory_order_acquire);
}

ruda__kernel *ruda__kernel_find(ruda_device *dev, const char *name) {
  const kcache_slot *c = &kcache[kcache_index(dev->serial, name)];
  if (__builtin_expect(c->serial == dev->serial && c->name == name, 1)) {
    ruda__kernel_entry *e = c->entry;
    if (__builtin_expect(strcmp(e->name, name) == 0, 1))
      return atomic_load_explicit(&e->kernel, memory_order_acquire);
  }
  return kcache_miss(dev, name);
}

static void kernel_free(ruda_device *dev, ruda__kernel *k) {
  if (dev->ops->kernel_release) dev->ops->kernel_release(dev->bstate, k);
  if (k->options)
    for (char **o = k->options; *o; o++) free(*o);
  free(k->options);
  free(k->source);
  free((void *)k->name);
  free(k);
}

int ruda__kernel_add(ruda_device *dev, ruda__kernel *k) {
  ruda__kernel_table *t = dev->kernels;
  uint64_t h = hash_name(k->name);
  int rc = 0;
  pthread_mutex_lock(&t->lock);
  ruda__kernel_slots *s = atomic_load_explicit(&t->current, memory_order_relaxed);
  ruda__kernel_entry *e = lookup(s, k->name, h);
  if (e != NULL) {
    /* Keep the old kernel reachable for release at close. */
    ruda__kernel_entry *old = malloc(sizeof *old);
    if (old == NULL) {
      rc = ruda__fail(RUDA_ENOMEM, "kernel \"%s\": out of host memory", k->name);
      goto out;
    }
    old->kernel = atomic_load_explicit(&e->kernel, memory_order_relaxed);
    old->replaced = e->replaced;
    old->name = NULL;
    e->replaced = old;
    atomic_store_explicit(&e->kernel, k, memory_order_release);
    goto out;
  }
  e = malloc(sizeof *e);
  if (e == NULL) {
    rc = ruda__fail(RUDA_ENOMEM, "kernel \"%s\": out of host memory", k->name);
    goto out;
  }
  e->name = k->name;
  e->hash = h;
  e->replaced = NULL;
  atomic_init(&e->kernel, k);
  if ((s->count + 1) * 2 > s->mask + 1) {
    ruda__kernel_slots *bigger = slots_new((s->mask + 1) * 2);
    if (bigger == NULL) {
      free(e);
      rc = ruda__fail(RUDA_ENOMEM, "kernel \"%s\": out of host memory", k->name);
      goto out;
    }
    for (uint64_t i = 0; i <= s->mask; i++) {
      ruda__kernel_entry *x = atomic_load_explicit(&s->slot[i], memory_order_relaxed);
      if (x) place(bigger, x);
    }
    place(bigger, e);
    atomic_store_explicit(&t->current, bigger, memory_order_release);
    s->prev_retired = t->retired;
    t->retired = s;
  } else {
    place(s, e);
  }
out:
  pthread_mutex_unlock(&t->lock);
  return rc;
}

void ruda__kernels_destroy(ruda_device *dev) {
  ruda__kernel_table *t = dev->kernels;
  if (t == NULL) return;
  ruda__kernel_slots *s = atomic_load(&t->current);
  if (s != NULL) {
    for (uint64_t i = 0; i <= s->mask; i++) {
      ruda__kernel_entry *e = atomic_load(&s->slot[i]);
      if (e == NULL) continue;
      for (ruda__kernel_entry *o = e->replaced; o;) {
        ruda__kernel_entry *n = o->replaced;
        kernel_free(dev, atomic_load(&o->kernel));
        free(o);
        o = n;
      }
      kernel_free(dev, atomic_load(&e->kernel));
      free(e);
    }
    free(s);
  }
  for (ruda__kernel_slots *r = t->retired; r;) {
    ruda__kernel_slots *p = r->prev_retired;
    free(r);
    r = p;
  }
  pthread_mutex_destroy(&t->lock);
  free(t);
  dev->kernels = NULL;
}

int ruda_host_kernel_register(ruda_device *dev, const char *name, ruda_host_kernel_fn fn) {
  RUDA__CHECK_DEV(dev, "ruda_host_kernel_register");
  if (name == NULL || *name == '\0')
    return ruda__fail(RUDA_EINVAL, "ruda_host_kernel_register: name is NULL or empty");
  if (fn == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_host_kernel_register: kernel \"%s\": function is NULL", name);
  if (dev->ops != &ruda__host_backend)
    return ruda__fail(RUDA_ENOBACKEND,
                      "ruda_host_kernel_register: kernel \"%s\": device uses the %s backend; "
                      "host kernels need backend=host",
                      name, dev->ops->name);
  ruda__kernel *k = calloc(1, sizeof *k);
  char *copy = strdup(name);
  if (k == NULL || copy == NULL) {
    free(k);
    free(copy);
    return ruda__fail(RUDA_ENOMEM, "ruda_host_kernel_register: out of host memory");
  }
  k->name = copy;
  k->host_fn = fn;
  int rc = dev->ops->kernel_prepare ? dev->ops->kernel_prepare(dev->bstate, k) : 0;
  if (rc == 0) rc = ruda__kernel_add(dev, k);
  if (rc != 0) kernel_free(dev, k);
  return rc;
}

int ruda_kernel_source(ruda_device *dev, const char *name, const char *source,
                       const char *const *options) {
  RUDA__CHECK_DEV(dev, "ruda_kernel_source");
  if (name == NULL || *name == '\0')
    return ruda__fail(RUDA_EINVAL, "ruda_kernel_source: name is NULL or empty");
  if (source == NULL || *source == '\0')
    return ruda__fail(RUDA_EINVAL, "ruda_kernel_source: kernel \"%s\": source is NULL or empty", name);
  if (dev->ops == &ruda__host_backend)
    return ruda__fail(RUDA_ENOBACKEND,
                      "ruda_kernel_source: kernel \"%s\": the host backend cannot run CUDA C; "
                      "register a C function with ruda_host_kernel_register",
                      name);
  size_t nopt = 0;
  while (options && options[nopt]) nopt++;
  ruda__kernel *k = calloc(1, sizeof *k);
  if (k == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  k->name = strdup(name);
  k->source = strdup(source);
  k->options = calloc(nopt + 1, sizeof(char *));
  int ok = k->name && k->source && k->options;
  for (size_t i = 0; ok && i < nopt; i++) ok = (k->options[i] = strdup(options[i])) != NULL;
  int rc = ok ? 0 : ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  if (rc == 0 && dev->ops->kernel_prepare) rc = dev->ops->kernel_prepare(dev->bstate, k);
  if (rc == 0) rc = ruda__kernel_add(dev, k);
  if (rc != 0) kernel_free(dev, k);
  return rc;
}

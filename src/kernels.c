/* kernels.c - the kernel registry: name -> kernel, read on every launch.
 *
 * Same scheme as the stream table: open addressing, lock-free lookups,
 * inserts under a mutex, full tables retired until close. Replacing a
 * kernel swaps the entry's pointer; the old kernel stays allocated until
 * close because commands already queued may still name it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "src/device.h"
#include "src/api.h"

/* What a ruda_kernel_ref points at: entries live until close, and a
 * replacement swaps their kernel, so a reference follows it. */
typedef struct ruda__kernel_entry {
  const struct ruda__kernel_table *table; /* the device's: refs are checked against it */
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
 * initial-exec where the build allows it (base/tls.h): KCACHE_SLOTS * 24
 * = 96 bytes. */
#define KCACHE_BITS 2
#define KCACHE_SLOTS (1u << KCACHE_BITS)

typedef struct kcache_slot {
  uint64_t serial;
  const char *name; /* the caller's pointer */
  ruda__kernel_entry *entry;
} kcache_slot;

static __thread kcache_slot kcache[KCACHE_SLOTS] RUDA__TLS_HOT;

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
  kcache_slot *c = &kcache[kcache_index(dev->sched.serial, name)];
  c->serial = dev->sched.serial;
  c->name = name;
  c->entry = e;
  return atomic_load_explicit(&e->kernel, memory_order_acquire);
}

ruda__kernel *ruda__kernel_of_ref(ruda_device *dev, const ruda_kernel_ref *ref, const char **name) {
  const ruda__kernel_entry *e = (const ruda__kernel_entry *)ref;
  if (e->table != dev->kernels) return NULL;
  *name = e->name;
  return atomic_load_explicit(&e->kernel, memory_order_acquire);
}

int ruda_kernel_lookup(ruda_device *dev, const char *name, const ruda_kernel_ref **out) {
  static const char fn[] = "ruda_kernel_lookup";
  if (out != NULL) *out = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (name == NULL || out == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_kernel_lookup: %s is NULL", name ? "out" : "name");
  ruda__kernel_slots *s = atomic_load_explicit(&dev->kernels->current, memory_order_acquire);
  ruda__kernel_entry *e = lookup(s, name, hash_name(name));
  if (e == NULL) return ruda__fail(RUDA_EKERNEL, "ruda_kernel_lookup: no kernel named \"%s\" is registered", name);
  *out = (const ruda_kernel_ref *)e;
  return 0;
}

ruda__kernel *ruda__kernel_find(ruda_device *dev, const char *name) {
  const kcache_slot *c = &kcache[kcache_index(dev->sched.serial, name)];
  if (__builtin_expect(c->serial == dev->sched.serial && c->name == name, 1)) {
    ruda__kernel_entry *e = c->entry;
    if (__builtin_expect(strcmp(e->name, name) == 0, 1))
      return atomic_load_explicit(&e->kernel, memory_order_acquire);
  }
  return kcache_miss(dev, name);
}

static void free_list(char **v) {
  for (char **o = v; o && *o; o++) free(*o);
  free(v);
}

static void kernel_free(ruda_device *dev, ruda__kernel *k) {
  if (dev->sched.backend.ops->kernel_release && k->impl) dev->sched.backend.ops->kernel_release(dev->sched.backend.state, k);
  free_list(k->options);
  free_list(k->module_names);
  free(k->host_params);
  free((void *)k->file_name);
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
  e->table = t;
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

static int host_register(ruda_device *dev, const char *name, ruda_host_kernel_fn fn, const ruda_host_param *params,
                         uint32_t n, int typed) {
  RUDA__CHECK_DEV(dev, "ruda_host_kernel_register");
  if (name == NULL || *name == '\0')
    return ruda__fail(RUDA_EINVAL, "ruda_host_kernel_register: name is NULL or empty");
  if (fn == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_host_kernel_register: kernel \"%s\": function is NULL", name);
  if (!dev->sched.backend.ops->host_kernels)
    return ruda__fail(RUDA_ENOBACKEND,
                      "ruda_host_kernel_register: kernel \"%s\": device uses the %s backend; "
                      "host kernels need backend=host",
                      name, dev->sched.backend.ops->name);
  ruda__kernel *k = calloc(1, sizeof *k);
  char *copy = strdup(name);
  if (k == NULL || copy == NULL) {
    free(k);
    free(copy);
    return ruda__fail(RUDA_ENOMEM, "ruda_host_kernel_register: out of host memory");
  }
  k->name = copy;
  k->host_fn = fn;
  if (typed) {
    k->host_params = calloc(n ? n : 1, sizeof *k->host_params);
    if (k->host_params == NULL) {
      kernel_free(dev, k);
      return ruda__fail(RUDA_ENOMEM, "ruda_host_kernel_register: out of host memory");
    }
    if (n) memcpy(k->host_params, params, n * sizeof *params);
    k->host_nparams = n;
  }
  int rc = dev->sched.backend.ops->kernel_prepare ? dev->sched.backend.ops->kernel_prepare(dev->sched.backend.state, k) : 0;
  if (rc == 0) rc = ruda__kernel_add(dev, k);
  if (rc != 0) kernel_free(dev, k);
  return rc;
}

int ruda_host_kernel_register(ruda_device *dev, const char *name, ruda_host_kernel_fn fn) {
  return host_register(dev, name, fn, NULL, 0, 0);
}

int ruda_host_kernel_register_typed(ruda_device *dev, const char *name, ruda_host_kernel_fn fn,
                                    const ruda_host_param *params, uint32_t n) {
  static const char fn_name[] = "ruda_host_kernel_register_typed";
  RUDA__CHECK_DEV(dev, fn_name);
  if (n > RUDA_MAX_ARGS) return ruda__fail(RUDA_EINVAL, "%s: %u parameters, at most %d", fn_name, n, RUDA_MAX_ARGS);
  if (n > 0 && params == NULL) return ruda__fail(RUDA_EINVAL, "%s: params is NULL", fn_name);
  for (uint32_t i = 0; i < n; i++) {
    if (params[i].kind == RUDA_ARG_SCALAR && (params[i].size == 0 || params[i].size > RUDA_MAX_SCALAR_BYTES))
      return ruda__fail(RUDA_EINVAL, "%s: scalar parameter %u has %u bytes, not 1..%d", fn_name, i, params[i].size,
                        RUDA_MAX_SCALAR_BYTES);
    if (params[i].kind != RUDA_ARG_SCALAR && params[i].kind != RUDA_ARG_BUFFER)
      return ruda__fail(RUDA_EINVAL, "%s: parameter %u has kind %d, not RUDA_ARG_BUFFER or RUDA_ARG_SCALAR", fn_name,
                        i, (int)params[i].kind);
  }
  return host_register(dev, name, fn, params, n, 1);
}

/* A NULL-terminated copy of v[0..n) (n < 0: v is NULL-terminated). */
static char **copy_list(const char *const *v, long n, int *ok) {
  if (n < 0)
    for (n = 0; v && v[n]; n++) {
    }
  char **c = calloc((size_t)n + 1, sizeof *c);
  *ok = c != NULL;
  for (long i = 0; *ok && i < n; i++) *ok = (c[i] = strdup(v[i])) != NULL;
  return c;
}

/* A kernel of a CUDA source (or an image) for the backend to prepare. */
static ruda__kernel *cuda_kernel(const char *name, const char *source, const char *file_name,
                                 const char *const *options, const char *const *module_names, uint32_t nmodule) {
  ruda__kernel *k = calloc(1, sizeof *k);
  if (k == NULL) return NULL;
  int ok = (k->name = strdup(name)) != NULL;
  if (ok && source != NULL) ok = (k->source = strdup(source)) != NULL;
  if (ok && file_name != NULL) ok = (k->file_name = strdup(file_name)) != NULL;
  if (ok) k->options = copy_list(options, -1, &ok);
  if (ok && module_names != NULL) k->module_names = copy_list(module_names, (long)nmodule, &ok);
  if (!ok) {
    free_list(k->options);
    free_list(k->module_names);
    free((void *)k->file_name);
    free(k->source);
    free((void *)k->name);
    free(k);
    return NULL;
  }
  return k;
}

static int refuse_host(ruda_device *dev, const char *fn) {
  if (!dev->sched.backend.ops->host_kernels) return 0;
  return ruda__fail(RUDA_ENOBACKEND,
                    "%s: the host backend cannot run CUDA C; register a C function with ruda_host_kernel_register",
                    fn);
}

/* Prepares every kernel, then adds them all: none is registered unless
 * all are. Consumes ks[0..n). */
static int add_all(ruda_device *dev, ruda__kernel **ks, uint32_t n, const char *fn) {
  int rc = 0;
  uint32_t i = 0;
  for (; i < n && rc == 0; i++) {
    if (ks[i] == NULL) rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
    else if (dev->sched.backend.ops->kernel_prepare) rc = dev->sched.backend.ops->kernel_prepare(dev->sched.backend.state, ks[i]);
  }
  for (uint32_t j = 0; rc == 0 && j < n; j++) {
    ks[j]->image = NULL; /* only prepare reads it */
    rc = ruda__kernel_add(dev, ks[j]);
    ks[j] = NULL;
  }
  for (uint32_t j = 0; j < n; j++)
    if (ks[j] != NULL) kernel_free(dev, ks[j]);
  return rc;
}

static int check_names(const char *const *names, uint32_t n, const char *fn) {
  if (names == NULL || n == 0) return ruda__fail(RUDA_EINVAL, "%s: no kernel names", fn);
  if (n > 4096) return ruda__fail(RUDA_EINVAL, "%s: %u names, at most 4096", fn, n);
  for (uint32_t i = 0; i < n; i++)
    if (names[i] == NULL || *names[i] == '\0') return ruda__fail(RUDA_EINVAL, "%s: name %u is NULL or empty", fn, i);
  return 0;
}

int ruda_module_source(ruda_device *dev, const char *file_name, const char *source, const char *const *names,
                       uint32_t n, const char *const *options) {
  static const char fn[] = "ruda_module_source";
  RUDA__CHECK_DEV(dev, fn);
  int rc = check_names(names, n, fn);
  if (rc == 0 && (source == NULL || *source == '\0')) rc = ruda__fail(RUDA_EINVAL, "%s: source is NULL or empty", fn);
  if (rc == 0) rc = refuse_host(dev, fn);
  if (rc != 0) return rc;
  ruda__kernel **ks = calloc(n, sizeof *ks);
  if (ks == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  for (uint32_t i = 0; i < n; i++)
    ks[i] = cuda_kernel(names[i], source, file_name ? file_name : "module.cu", options, names, n);
  rc = add_all(dev, ks, n, fn);
  free(ks);
  return rc;
}

int ruda_module_image(ruda_device *dev, const void *image, size_t size, const char *const *names, uint32_t n) {
  static const char fn[] = "ruda_module_image";
  RUDA__CHECK_DEV(dev, fn);
  int rc = check_names(names, n, fn);
  if (rc == 0 && (image == NULL || size == 0)) rc = ruda__fail(RUDA_EINVAL, "%s: image is NULL or empty", fn);
  if (rc == 0) rc = refuse_host(dev, fn);
  if (rc != 0) return rc;
  ruda__kernel **ks = calloc(n, sizeof *ks);
  if (ks == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  for (uint32_t i = 0; i < n; i++)
    if ((ks[i] = cuda_kernel(names[i], NULL, NULL, NULL, NULL, 0)) != NULL) {
      ks[i]->image = image;
      ks[i]->image_size = size;
    }
  rc = add_all(dev, ks, n, fn);
  free(ks);
  return rc;
}

int ruda_module_file(ruda_device *dev, const char *path, const char *const *names, uint32_t n,
                     const char *const *options) {
  static const char fn[] = "ruda_module_file";
  RUDA__CHECK_DEV(dev, fn);
  if (path == NULL) return ruda__fail(RUDA_EINVAL, "%s: path is NULL", fn);
  FILE *f = fopen(path, "rb");
  if (f == NULL) return ruda__fail(RUDA_EINVAL, "%s: cannot open %s: %s", fn, path, strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 65536;
      char *p = realloc(buf, cap);
      if (p == NULL) {
        free(buf);
        fclose(f);
        return ruda__fail(RUDA_ENOMEM, "%s: out of host memory reading %s", fn, path);
      }
      buf = p;
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err || len == 0) {
    free(buf);
    return ruda__fail(RUDA_EINVAL, "%s: %s is %s", fn, path, err ? "unreadable" : "empty");
  }
  buf[len] = '\0'; /* PTX is text: the driver wants it terminated */
  size_t pl = strlen(path);
  int rc;
  if (pl > 3 && strcmp(path + pl - 3, ".cu") == 0) {
    const char *base = strrchr(path, '/');
    rc = ruda_module_source(dev, base ? base + 1 : path, buf, names, n, options);
  } else {
    rc = ruda_module_image(dev, buf, len + 1, names, n);
  }
  free(buf);
  return rc;
}

int ruda_kernel_source(ruda_device *dev, const char *name, const char *source,
                       const char *const *options) {
  static const char fn[] = "ruda_kernel_source";
  RUDA__CHECK_DEV(dev, fn);
  if (name == NULL || *name == '\0') return ruda__fail(RUDA_EINVAL, "%s: name is NULL or empty", fn);
  if (source == NULL || *source == '\0')
    return ruda__fail(RUDA_EINVAL, "%s: kernel \"%s\": source is NULL or empty", fn, name);
  int rc = refuse_host(dev, fn);
  if (rc != 0) return rc;
  ruda__kernel *k = cuda_kernel(name, source, NULL, options, NULL, 0);
  return add_all(dev, &k, 1, fn);
}

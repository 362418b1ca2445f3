/* python/src/staging_alloc.c - the few jemalloc entry points libruda's
 * staging arena calls (staging/arena.c: arenas.create with extent hooks,
 * mallocx, sallocx, dallocx), for the extension build only.
 *
 * Why: Debian's jemalloc keeps its thread state in initial-exec TLS
 * (2.6 KiB), more than glibc's static TLS has left for a library loaded
 * after start-up, and every Python extension is one: with jemalloc linked
 * in, `import ruda` fails ("cannot allocate memory in static TLS block").
 * The extension links libruda without jemalloc (RUDA_JEMALLOC=OFF) and
 * these definitions instead.
 *
 * The allocator: every block takes its memory from the arena's extent
 * hooks (page-locked chunk space), in power-of-two size classes from 64
 * bytes, with a 64-byte header that records the class; freed blocks go
 * on their class's free list and are reused, never handed back (the
 * hooks keep chunk space anyway). One mutex per arena. */
#include <jemalloc/jemalloc.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define HEADER 64u
#define NCLASSES 48 /* 64 B << 47: far beyond any request */
#define MAX_ARENAS 64

typedef struct block {
  struct block *next; /* on a free list */
  uint32_t cls;
} block;

typedef struct {
  extent_hooks_t *hooks; /* NULL: the slot is free (never created, or destroyed) */
  int inited;            /* lock initialized (on first use of the slot) */
  pthread_mutex_t lock;
  block *free[NCLASSES];
} arena;

/* A device has one arena; slots are reused after arena.N.destroy. */
static arena arenas[MAX_ARENAS];
static pthread_mutex_t arenas_lock = PTHREAD_MUTEX_INITIALIZER;

/* The names libruda calls (base/jemalloc_private.h renames jemalloc's). */
int ruda_je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
void *ruda_je_mallocx(size_t size, int flags);
void ruda_je_dallocx(void *ptr, int flags);
size_t ruda_je_sallocx(const void *ptr, int flags);

static arena *arena_of(int flags) {
  unsigned a = (unsigned)(flags >> 20) - 1; /* MALLOCX_ARENA(a) is (a + 1) << 20 */
  return a < MAX_ARENAS ? &arenas[a] : NULL;
}

static uint32_t class_of(size_t size) {
  uint32_t c = 0;
  while (((size_t)64 << c) < size) c++;
  return c;
}

int ruda_je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  if (strcmp(name, "arenas.create") == 0) {
    if (!oldp || !oldlenp || *oldlenp != sizeof(unsigned) || !newp || newlen != sizeof(extent_hooks_t *))
      return EINVAL;
    pthread_mutex_lock(&arenas_lock);
    unsigned a = 0;
    while (a < MAX_ARENAS && arenas[a].hooks) a++;
    if (a == MAX_ARENAS) {
      pthread_mutex_unlock(&arenas_lock);
      return EAGAIN; /* more devices open at once than arenas here */
    }
    if (!arenas[a].inited) {
      pthread_mutex_init(&arenas[a].lock, NULL);
      arenas[a].inited = 1;
    }
    pthread_mutex_lock(&arenas[a].lock);
    memset(arenas[a].free, 0, sizeof arenas[a].free);
    arenas[a].hooks = *(extent_hooks_t **)newp;
    pthread_mutex_unlock(&arenas[a].lock);
    pthread_mutex_unlock(&arenas_lock);
    *(unsigned *)oldp = a;
    return 0;
  }
  /* arena.N.destroy: the owner frees the chunks right after, so the free
     lists (inside them) are dropped. Decay and growth settings mean
     nothing here. */
  unsigned a;
  char tail[32];
  if (sscanf(name, "arena.%u.%31s", &a, tail) == 2 && strcmp(tail, "destroy") == 0 && a < MAX_ARENAS &&
      arenas[a].inited) {
    pthread_mutex_lock(&arenas_lock);
    pthread_mutex_lock(&arenas[a].lock);
    memset(arenas[a].free, 0, sizeof arenas[a].free);
    arenas[a].hooks = NULL;
    pthread_mutex_unlock(&arenas[a].lock);
    pthread_mutex_unlock(&arenas_lock);
  }
  return 0;
}

void *ruda_je_mallocx(size_t size, int flags) {
  arena *ar = arena_of(flags);
  if (!ar || !ar->inited || size > ((size_t)1 << 46)) return NULL;
  uint32_t c = class_of(size);
  pthread_mutex_lock(&ar->lock);
  block *b = ar->free[c];
  if (b) {
    ar->free[c] = b->next;
  } else if (ar->hooks) {
    bool zero = false, commit = true;
    unsigned index = (unsigned)(ar - arenas);
    b = ar->hooks->alloc(ar->hooks, NULL, ((size_t)64 << c) + HEADER, HEADER, &zero, &commit, index);
  }
  pthread_mutex_unlock(&ar->lock);
  if (!b) return NULL;
  b->cls = c;
  b->next = NULL;
  return (char *)b + HEADER;
}

size_t ruda_je_sallocx(const void *ptr, int flags) {
  (void)flags;
  const block *b = (const block *)((const char *)ptr - HEADER);
  return (size_t)64 << b->cls;
}

void ruda_je_dallocx(void *ptr, int flags) {
  arena *ar = arena_of(flags);
  if (!ptr || !ar || !ar->inited) return;
  block *b = (block *)((char *)ptr - HEADER);
  pthread_mutex_lock(&ar->lock);
  b->next = ar->free[b->cls];
  ar->free[b->cls] = b;
  pthread_mutex_unlock(&ar->lock);
}

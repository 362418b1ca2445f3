/* cmd_alloc.c - command memory: per-thread caches with remote-free return.
 *
 * A command is allocated by a client thread and freed by a worker thread,
 * so with plain malloc every free is a remote free: glibc takes the owning
 * arena's lock for it, against the client's own mallocs, and client and
 * worker end up in futex calls on the launch path.
 *
 * Here each thread has a cache, and each block of the two size classes
 * remembers the cache it was allocated from (its owner). A worker freeing
 * blocks chains them per owner and hands a chain back every BATCH blocks
 * (or when the owner changes) with one compare-and-swap onto the owner's
 * remote list. The owner allocates from its private free list and, when
 * that is empty, takes its whole remote list with one exchange; only when
 * both are empty does it take a fresh block from its newest slab. So a
 * launch makes no library call and no atomic operation for allocation in
 * BATCH-1 of BATCH commands, and it prefetches the block the next one will
 * take, which a worker on another core last wrote.
 *
 * Slabs: fresh blocks are carved, one at a time, from a slab the cache
 * mallocs when the last one is used up, each twice the size of the one
 * before (8 blocks first, at most SLAB_MAX_BYTES). A thread that makes a
 * few commands holds a few KiB; a burst that keeps thousands in flight
 * (its worker far behind, nothing to recycle) costs one malloc per 512
 * commands instead of one per command. Blocks are 64-byte aligned. Pages
 * are not touched ahead: the burst still pays the kernel for every fresh
 * page, spread one fault per eight 512-byte commands, rather than all of a
 * slab's faults (~2 us each in a VM) on the one launch that carves it.
 *
 * The remote list is a Treiber stack that only its owner empties, and only
 * whole, so there is no ABA problem. Blocks circulate within their owner,
 * so one thread cannot hoard another's: the pool holds at most what each
 * thread once had in flight (rounded up to its last slab), plus BATCH-1
 * blocks per freeing thread and class. Memory is not returned to libc
 * while the process runs; the cache's list of slabs keeps every block
 * reachable for leak checkers.
 *
 * A cache outlives its thread: at exit it goes on an idle list, with the
 * blocks still in flight that will come home to it, and the next new
 * thread adopts it. Caches are never freed, so a late remote free always
 * lands in live memory. The idle list takes a mutex, on a thread's first
 * command and at its exit only.
 *
 * Commands larger than the biggest class, every command when built with
 * AddressSanitizer (so it still sees use-after-free of commands), and those
 * of threads that started allocating while RUDA_CMD_POOL=0 was set are
 * plain malloc blocks; the block header says which kind a block is.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "scheduler/sched.h"

#define BATCH 64u
#define NCLASS 2
/* Whole blocks, header included: a launch with a few arguments fits the
 * first, one with up to ~50 the second. */
static const size_t class_size[NCLASS] = {512, 2048};
#define CLASS_MALLOC 0xffffffffu
#define SLAB_FIRST_BLOCKS 8u
#define SLAB_MAX_BYTES ((size_t)256 << 10)

typedef struct cache cache;

/* The 16 bytes before every command. While the block is allocated, owner
 * says where it goes home to; while it is free, next links it. Lists point
 * at block starts, so leak checkers see cached blocks as reachable. */
typedef struct blk {
  union {
    cache *owner;
    struct blk *next;
  };
  uint32_t cls;
  uint32_t pad;
} blk;
_Static_assert(sizeof(blk) == 16, "a command must start 16 bytes into its block");

/* A slab's header; its blocks follow, from the next cache line on. */
typedef struct slab {
  struct slab *next; /* the cache's slabs, newest first */
} slab;
#define SLAB_HEADER RUDA__CACHELINE

/* Blocks this thread freed for one other owner, not yet handed back. */
typedef struct pending {
  blk *head, *tail;
  cache *owner;
  uint32_t n;
} pending;

struct cache {
  /* Written by every thread that frees this cache's blocks. */
  blk *_Atomic remote[NCLASS] __attribute__((aligned(RUDA__CACHELINE)));
  /* Only the thread using the cache touches the rest. */
  blk *free[NCLASS] __attribute__((aligned(RUDA__CACHELINE)));
  pending pend[NCLASS];
  /* The part of each class's newest slab not yet handed out. */
  unsigned char *carve[NCLASS], *carve_end[NCLASS];
  uint32_t slab_blocks[NCLASS]; /* blocks in the class's next slab */
  slab *slabs;
  int pooling;
  cache *idle_next;
};

/* Read on every command: initial-exec where the build allows it
 * (base/tls.h). */
static __thread cache *my RUDA__TLS_HOT;

static pthread_mutex_t idle_lock = PTHREAD_MUTEX_INITIALIZER;
static cache *idle;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* Pushes the chain head..tail on owner's remote list. Lock-free. */
static void give_back(cache *owner, int c, blk *head, blk *tail) {
  blk *top = atomic_load_explicit(&owner->remote[c], memory_order_relaxed);
  do {
    tail->next = top;
  } while (!atomic_compare_exchange_weak_explicit(&owner->remote[c], &top, head, memory_order_release,
                                                  memory_order_relaxed));
}

static void flush(pending *p, int c) {
  if (p->n == 0) return;
  give_back(p->owner, c, p->head, p->tail);
  p->head = p->tail = NULL;
  p->owner = NULL;
  p->n = 0;
}

static void thread_exit(void *arg) {
  cache *me = arg;
  for (int c = 0; c < NCLASS; c++) flush(&me->pend[c], c);
  my = NULL;
  pthread_mutex_lock(&idle_lock);
  me->idle_next = idle;
  idle = me;
  pthread_mutex_unlock(&idle_lock);
}

static void make_key(void) {
  /* Without the key an exiting thread's cache is not reused and its
   * pending blocks stay out: memory, not correctness. */
  (void)pthread_key_create(&exit_key, thread_exit);
}

/* First command on this thread: adopt an idle cache or make one. */
static cache *adopt(void) {
  pthread_mutex_lock(&idle_lock);
  cache *me = idle;
  if (me != NULL) idle = me->idle_next;
  pthread_mutex_unlock(&idle_lock);
  if (me == NULL && (me = aligned_alloc(RUDA__CACHELINE, sizeof *me)) != NULL) {
    memset(me, 0, sizeof *me);
    for (int c = 0; c < NCLASS; c++) atomic_init(&me->remote[c], NULL);
  }
  if (me == NULL) return NULL;
#if defined(__SANITIZE_ADDRESS__)
  me->pooling = 0;
#else
  const char *v = getenv("RUDA_CMD_POOL");
  me->pooling = !(v != NULL && strcmp(v, "0") == 0);
#endif
  pthread_once(&exit_once, make_key);
  (void)pthread_setspecific(exit_key, me);
  my = me;
  return me;
}

/* The block the next command will take was most likely last written by
 * a worker on another core (it ran and freed it): start moving the lines a
 * small command fills (header, command, a few arguments) to this core now,
 * so the next launch does not wait for them (it shows in bench_gpu's
 * steady-state launch latency). */
static inline void prefetch_block(const blk *b) {
  if (b == NULL) return; /* no arithmetic on a null pointer */
  const char *p = (const char *)b;
  __builtin_prefetch(p, 1, 3);
  __builtin_prefetch(p + 64, 1, 3);
  __builtin_prefetch(p + 128, 1, 3);
  __builtin_prefetch(p + 192, 1, 3);
}

/* A fresh block of class c from the newest slab, or from a new one. */
static blk *carve(cache *me, int c) {
  if (me->carve[c] == me->carve_end[c]) {
    uint32_t n = me->slab_blocks[c] ? me->slab_blocks[c] : SLAB_FIRST_BLOCKS;
    slab *s = aligned_alloc(RUDA__CACHELINE, SLAB_HEADER + n * class_size[c]);
    if (s == NULL && n > SLAB_FIRST_BLOCKS) /* short of memory: try small */
      s = aligned_alloc(RUDA__CACHELINE, SLAB_HEADER + (n = SLAB_FIRST_BLOCKS) * class_size[c]);
    if (s == NULL) return NULL;
    s->next = me->slabs;
    me->slabs = s;
    me->carve[c] = (unsigned char *)s + SLAB_HEADER;
    me->carve_end[c] = me->carve[c] + n * class_size[c];
    if ((2 * n) * class_size[c] <= SLAB_MAX_BYTES) n *= 2;
    me->slab_blocks[c] = n;
  }
  blk *b = (blk *)me->carve[c];
  me->carve[c] += class_size[c];
  b->cls = (uint32_t)c; /* for good: a block never changes class or owner */
  return b;
}

/* Everything but a pop from the private free list: the first command of a
 * thread, the remote list, fresh blocks, plain malloc blocks. */
static __attribute__((noinline)) blk *alloc_slow(cache *me, size_t need) {
  if (me == NULL) me = adopt();
  int c = need <= class_size[0] ? 0 : need <= class_size[1] ? 1 : -1;
  blk *b;
  if (c < 0 || me == NULL || !me->pooling) {
    if ((b = malloc(need)) == NULL) return NULL;
    b->cls = CLASS_MALLOC;
    return b;
  }
  if ((b = me->free[c]) != NULL) { /* adopted a cache with free blocks */
    me->free[c] = b->next;
  } else if ((b = atomic_exchange_explicit(&me->remote[c], NULL, memory_order_acquire)) != NULL) {
    me->free[c] = b->next; /* everything freed back since the last time */
    prefetch_block(b->next);
  } else if ((b = carve(me, c)) == NULL) {
    return NULL;
  }
  b->owner = me;
  return b;
}

ruda__cmd *ruda__cmd_alloc(size_t extra) {
  cache *me = my;
  blk *b;
  /* extra beyond the biggest class: plain malloc, and need might overflow */
  if (__builtin_expect(extra > class_size[NCLASS - 1], 0)) {
    size_t need = sizeof(blk) + sizeof(ruda__cmd) + extra;
    if (need < extra || (b = malloc(need)) == NULL) return NULL;
    b->cls = CLASS_MALLOC;
  } else {
    size_t need = sizeof(blk) + sizeof(ruda__cmd) + extra;
    int c = need > class_size[0];
    if (__builtin_expect(me != NULL && need <= class_size[1] && (b = me->free[c]) != NULL, 1)) {
      blk *next = b->next;
      me->free[c] = next;
      b->owner = me;
      prefetch_block(next);
    } else if ((b = alloc_slow(me, need)) == NULL) {
      return NULL;
    }
  }
  ruda__cmd *cmd = (ruda__cmd *)(b + 1);
  cmd->node.next = NULL; /* cds_wfcq_node_init, without a call into liburcu */
  cmd->npins = 0;
  cmd->nowait = 0;
  cmd->pins = NULL;
  cmd->future = NULL;
  cmd->origin = NULL;
  cmd->enq_ns = 0;
  return cmd;
}

void ruda__cmd_free(ruda__cmd *cmd) {
  if (cmd == NULL) return;
  if (__builtin_expect(cmd->origin != NULL, 0)) free(cmd->origin);
  blk *b = (blk *)cmd - 1;
  if (b->cls == CLASS_MALLOC) {
    free(b);
    return;
  }
  int c = (int)b->cls;
  cache *owner = b->owner;
  cache *me = my;
  if (__builtin_expect(me == NULL, 0) && (me = adopt()) == NULL) {
    give_back(owner, c, b, b); /* no cache of our own: return it alone */
    return;
  }
  if (owner == me) { /* freed by its own thread (a failed call) */
    b->next = me->free[c];
    me->free[c] = b;
    return;
  }
  pending *p = &me->pend[c];
  if (p->owner != owner) {
    flush(p, c);
    p->owner = owner;
    p->tail = b;
  }
  b->next = p->head;
  p->head = b;
  if (++p->n == BATCH) flush(p, c);
}

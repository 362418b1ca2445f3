/* cmd_pool.c - command memory: per-thread caches over a shared depot.
 *
 * A command is allocated by a client thread and freed by a worker thread,
 * so with plain malloc every free is a remote free: glibc takes the owning
 * arena's lock for it, against the client's own mallocs, and the two
 * threads end up in futex calls on the launch path.
 *
 * Here blocks of two size classes are recycled instead. A thread that frees
 * a block chains it on a thread-local pending list; every BATCH blocks the
 * chain goes to the class's depot with one compare-and-swap. A thread that
 * allocates pops its thread-local free list and, when that is empty, takes
 * one batch from the depot, malloc'ing a new block only when the depot is
 * empty too. So the launch path makes no library call and no atomic
 * operation in BATCH-1 of BATCH commands.
 *
 * The depot is a Treiber stack of batches that is only ever emptied whole
 * (one exchange): no one pops a single entry, so there is no ABA problem
 * and no double-width compare-and-swap. A taker keeps the first batch and
 * pushes the rest back; a thread that finds the depot empty meanwhile
 * mallocs, which is always correct. Memory is never returned to libc while
 * the process runs; the pool holds at most what was once in flight plus
 * one batch per thread and class. A thread that exits hands its lists to
 * the depot.
 *
 * Commands larger than the biggest class, and every command when built
 * with AddressSanitizer (so it still sees use-after-free of commands) or
 * for threads that start allocating while RUDA_CMD_POOL=0 is set, are
 * plain malloc blocks; a header says which kind a block is.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"

#define BATCH 64u
#define NCLASS 2
/* Whole blocks, header included: a launch with a few arguments fits the
 * first, one with up to ~50 the second. */
static const size_t class_size[NCLASS] = {512, 2048};
#define CLASS_MALLOC 0xffffffffu

/* The first 16 bytes of every block: while it is allocated they say which
 * class it is (and keep the command as aligned as malloc's), while it is
 * free they link it. Lists point at block starts, not at the bodies, so
 * leak checkers see cached blocks as reachable rather than possibly lost. */
typedef union blk {
  uint32_t cls;
  struct {
    union blk *next;       /* within a batch or list; NULL ends it */
    union blk *batch_next; /* batch heads in the depot only */
  } link;
} blk;
_Static_assert(sizeof(blk) == 16, "a command must start 16 bytes into its block");

typedef struct depot {
  blk *_Atomic top;
} __attribute__((aligned(RUDA__CACHELINE))) depot;

static depot depots[NCLASS];

typedef struct tcache {
  blk *free[NCLASS]; /* ready to allocate */
  blk *pend[NCLASS]; /* freed here, not yet in the depot */
  uint32_t npend[NCLASS];
  uint8_t state; /* 0 new, 1 pooling, 2 malloc only */
} tcache;

/* initial-exec: one %fs-relative load, no __tls_get_addr call, on every
 * allocation. The cost is a few bytes of static TLS, which libruda can
 * afford even when dlopen'ed. */
static __thread tcache tc __attribute__((tls_model("initial-exec")));

static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* Pushes a chain of batches, first..last linked by batch_next. Lock-free. */
static void depot_push(depot *d, blk *first, blk *last) {
  blk *top = atomic_load_explicit(&d->top, memory_order_relaxed);
  do {
    last->link.batch_next = top;
  } while (!atomic_compare_exchange_weak_explicit(&d->top, &top, first, memory_order_release,
                                                  memory_order_relaxed));
}

static void flush_pending(tcache *t, int c) {
  if (t->pend[c] == NULL) return;
  depot_push(&depots[c], t->pend[c], t->pend[c]);
  t->pend[c] = NULL;
  t->npend[c] = 0;
}

static void thread_exit(void *arg) {
  tcache *t = arg;
  for (int c = 0; c < NCLASS; c++) {
    flush_pending(t, c);
    if (t->free[c] != NULL) depot_push(&depots[c], t->free[c], t->free[c]);
    t->free[c] = NULL;
  }
}

static void make_key(void) {
  /* Without the key a thread's lists are lost at its exit (a leak, not an
   * error), so a failure here only costs memory. */
  (void)pthread_key_create(&exit_key, thread_exit);
}

/* First pool use on this thread: choose, and arrange the hand-back. */
static void tcache_init(tcache *t) {
#if defined(__SANITIZE_ADDRESS__)
  t->state = 2;
#else
  const char *v = getenv("RUDA_CMD_POOL");
  t->state = (v != NULL && strcmp(v, "0") == 0) ? 2 : 1;
#endif
  /* Even a thread that does not pool may hold pooled blocks it freed. */
  pthread_once(&exit_once, make_key);
  (void)pthread_setspecific(exit_key, t);
}

/* The slow path: take a batch from the depot, or malloc one block. */
static blk *refill(tcache *t, int c) {
  blk *got = atomic_exchange_explicit(&depots[c].top, NULL, memory_order_acquire);
  if (got != NULL) {
    blk *rest = got->link.batch_next;
    if (rest != NULL) {
      blk *last = rest;
      while (last->link.batch_next != NULL) last = last->link.batch_next;
      depot_push(&depots[c], rest, last);
    }
    t->free[c] = got->link.next;
    return got;
  }
  return malloc(class_size[c]);
}

ruda__cmd *ruda__cmd_alloc(size_t extra) {
  tcache *t = &tc;
  if (__builtin_expect(t->state == 0, 0)) tcache_init(t);
  size_t need = sizeof(blk) + sizeof(ruda__cmd) + extra;
  int c = need <= class_size[0] ? 0 : need <= class_size[1] ? 1 : -1;
  blk *b;
  if (c < 0 || t->state != 1) {
    if (need < extra || (b = malloc(need)) == NULL) return NULL;
    b->cls = CLASS_MALLOC;
  } else {
    b = t->free[c];
    if (__builtin_expect(b != NULL, 1)) t->free[c] = b->link.next;
    else if ((b = refill(t, c)) == NULL) return NULL;
    b->cls = (uint32_t)c;
  }
  ruda__cmd *cmd = (ruda__cmd *)(b + 1);
  cds_wfcq_node_init(&cmd->node);
  cmd->npins = 0;
  cmd->pins = NULL;
  cmd->future = NULL;
  return cmd;
}

void ruda__cmd_free(ruda__cmd *cmd) {
  if (cmd == NULL) return;
  blk *b = (blk *)cmd - 1;
  if (b->cls == CLASS_MALLOC) {
    free(b);
    return;
  }
  tcache *t = &tc;
  if (__builtin_expect(t->state == 0, 0)) tcache_init(t);
  /* A thread that does not pool (RUDA_CMD_POOL=0) may still free pooled
   * blocks that other threads allocated; they go back the same way. */
  int c = (int)b->cls;
  b->link.next = t->pend[c];
  t->pend[c] = b;
  if (++t->npend[c] == BATCH) flush_pending(t, c);
}

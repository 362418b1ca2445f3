/* import.c - foreign memory adopted as buffers (see import.h). */
#include <stdlib.h>

#include "base/error.h"
#include "memory/fence.h"
#include "memory/import.h"
#include "memory/memory.h"

int ruda__import_add(ruda__memory *mem, uint64_t addr, uint64_t size, ruda_release_fn release, void *user,
                     ruda_handle *out) {
  static const char fn[] = "ruda_buffer_import";
  ruda__import *imp = malloc(sizeof *imp + mem->nworkers * sizeof imp->wait[0]);
  if (imp == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  *imp = (ruda__import){NULL, addr, size, release, user, 0, 0};
  pthread_mutex_lock(&mem->import_lock);
  for (ruda__import *o = mem->imports; o != NULL; o = o->next)
    if (addr < o->addr + o->size && o->addr < addr + size) {
      uint64_t oa = o->addr, os = o->size;
      int retired = o->retired;
      pthread_mutex_unlock(&mem->import_lock);
      free(imp);
      return ruda__fail(RUDA_EINVAL, "%s: [0x%llx, +%llu) overlaps the import [0x%llx, +%llu)%s", fn,
                        (unsigned long long)addr, (unsigned long long)size, (unsigned long long)oa,
                        (unsigned long long)os, retired ? ", freed but not yet released" : "");
    }
  uint32_t slot;
  if (ruda__handles_take(mem->handles, &slot, 1) != 1) {
    pthread_mutex_unlock(&mem->import_lock);
    free(imp);
    return ruda_error_code(ruda_last_error());
  }
  ruda__handles_publish_import(mem->handles, slot, addr, size, imp, out);
  imp->next = mem->imports;
  mem->imports = imp;
  atomic_fetch_add_explicit(&mem->nimports, 1, memory_order_release);
  pthread_mutex_unlock(&mem->import_lock);
  return 0;
}

void ruda__import_retire(void *ctx, void *p, uint64_t users) {
  ruda__memory *mem = ctx;
  ruda__import *imp = p;
  /* Every worker that pinned it has its bit (an import has no home). Its
   * commands have been issued: a fence after what it ran follows them. */
  uint32_t n = 0;
  /* Closing (a graph's pins dropped at close): the workers have stopped,
   * their work is done. */
  const int closing = mem->progress.ops != NULL && mem->progress.ops->closing(mem->progress.ctx);
  for (uint32_t w = 0; w < mem->nworkers && !closing; w++)
    if ((users >> (w & 63)) & 1) {
      imp->wait[n].worker = w;
      imp->wait[n].need = ruda__fence_need(mem, w, 1);
      n++;
    }
  pthread_mutex_lock(&mem->import_lock);
  imp->nwait = n;
  imp->retired = 1;
  pthread_mutex_unlock(&mem->import_lock);
  ruda__import_poll(mem);
}

static int import_done(ruda__memory *mem, const ruda__import *imp) {
  for (uint32_t i = 0; i < imp->nwait; i++)
    if (!ruda__fence_passed(mem, imp->wait[i].worker, imp->wait[i].need)) return 0;
  return 1;
}

/* Unlinks the imports that may go (all with every, else the retired ones
 * whose fences passed) and releases them outside the lock. */
static void release_ready(ruda__memory *mem, int every) {
  ruda__import *ready = NULL;
  pthread_mutex_lock(&mem->import_lock);
  for (ruda__import **link = &mem->imports; *link != NULL;) {
    ruda__import *imp = *link;
    if (every || (imp->retired && import_done(mem, imp))) {
      *link = imp->next;
      imp->next = ready;
      ready = imp;
      atomic_fetch_sub_explicit(&mem->nimports, 1, memory_order_relaxed);
    } else {
      link = &imp->next;
    }
  }
  pthread_mutex_unlock(&mem->import_lock);
  while (ready != NULL) {
    ruda__import *next = ready->next;
    if (ready->release != NULL) ready->release(ready->user, ready->addr, ready->size);
    free(ready);
    ready = next;
  }
}

void ruda__import_poll(ruda__memory *mem) {
  /* Nothing retired: the common case costs one load. */
  if (atomic_load_explicit(&mem->nimports, memory_order_acquire) == 0) return;
  release_ready(mem, 0);
}

void ruda__import_destroy_all(ruda__memory *mem) { release_ready(mem, 1); }

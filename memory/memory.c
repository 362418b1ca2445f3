/* memory.c - a device's memory assembled (memory/memory.h): the fences,
 * the arena and the pools' shared state are made and torn down here, in
 * order, and each part is handed what it needs of the others, so the
 * parts call one way (pool -> arena -> fence; handles -> hooks).
 */
#include <string.h>

#include "memory/arena.h"
#include "memory/fence.h"
#include "memory/import.h"
#include "memory/memory.h"
#include "memory/pool.h"

int ruda__memory_init(ruda__memory *mem, uint32_t nworkers) {
  ruda__memory given = *mem; /* what the device handed down */
  memset(mem, 0, sizeof *mem);
  mem->backend = given.backend;
  mem->handles = given.handles;
  mem->progress = given.progress;
  mem->nworkers = nworkers;
  mem->reclaim = ruda__pools_reclaim;
  pthread_mutex_init(&mem->layout_lock, NULL);
  pthread_mutex_init(&mem->all_lock, NULL);
  pthread_mutex_init(&mem->import_lock, NULL);
  mem->nlayout = ruda_memory_default_pools(mem->layout, RUDA_MEMORY_MAX_POOLS);
  int rc = ruda__fence_table_init(mem);
  if (rc == 0) rc = ruda__arena_init(mem);
  if (rc != 0) return rc;
  if (mem->handles != NULL) {
    ruda__handles *h = mem->handles;
    h->backend = mem->backend;
    h->progress = &mem->progress;
    h->retire = ruda__pools_retire_hook;
    h->retire_import = ruda__import_retire;
    h->retire_ctx = mem;
  }
  return 0;
}

void ruda__memory_destroy(ruda__memory *mem) {
  /* The workers stopped: every import's work is done, owners get theirs. */
  ruda__import_destroy_all(mem);
  pthread_mutex_destroy(&mem->import_lock);
  ruda__fence_table_destroy(mem);
  ruda__pools_destroy_all(mem);
  ruda__arena_destroy(mem);
  pthread_mutex_destroy(&mem->layout_lock);
  pthread_mutex_destroy(&mem->all_lock);
}

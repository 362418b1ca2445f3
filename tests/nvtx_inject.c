/* nvtx_inject.c - an NVTX tool for the tests: the library NVTX loads from
 * NVTX_INJECTION64_PATH, as it loads Nsight Systems'. It records every
 * domain, range, category name and thread name it is handed; the test
 * reads them back through nvtx_inject_* (dlopen this library with
 * RTLD_NOLOAD). With NVTX_INJECT_REPORT=1 it prints, at exit, the ranges
 * per name and the threads named, for any program run under it (e.g. the
 * examples on a GPU machine without Nsight Systems). Thread-safe: one
 * mutex. */
#include <stdlib.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

#define MAX 4096

typedef struct range {
  char msg[64];
  uint32_t category, tid, domain;
  uint64_t payload;
} range;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char domains[8][32];
static uint32_t ndomains;
static range ranges[MAX];
static uint32_t nranges, npops, ntotal; /* ranges kept (MAX), pops, pushes */
static struct {
  uint32_t id;
  char name[40];
} categories[256], threads[64];
static uint32_t ncategories, nthreads;

static nvtxDomainHandle_t domain_create(const char *name) {
  pthread_mutex_lock(&lock);
  uint32_t i = ndomains < 8 ? ndomains++ : 7;
  snprintf(domains[i], sizeof domains[i], "%s", name);
  pthread_mutex_unlock(&lock);
  return (nvtxDomainHandle_t)(uintptr_t)(i + 1);
}

static int range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  pthread_mutex_lock(&lock);
  ntotal++;
  if (nranges < MAX) {
    range *r = &ranges[nranges++];
    snprintf(r->msg, sizeof r->msg, "%s",
             a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii ? a->message.ascii : "?");
    r->category = a->category;
    r->payload = a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 ? a->payload.ullValue : 0;
    r->tid = (uint32_t)syscall(SYS_gettid);
    r->domain = (uint32_t)(uintptr_t)d;
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static int range_pop(nvtxDomainHandle_t d) {
  (void)d;
  pthread_mutex_lock(&lock);
  npops++;
  pthread_mutex_unlock(&lock);
  return 0;
}

static void name_category(nvtxDomainHandle_t d, uint32_t cat, const char *name) {
  (void)d;
  pthread_mutex_lock(&lock);
  if (ncategories < 256) {
    categories[ncategories].id = cat;
    snprintf(categories[ncategories++].name, 40, "%s", name);
  }
  pthread_mutex_unlock(&lock);
}

static void name_thread(uint32_t tid, const char *name) {
  pthread_mutex_lock(&lock);
  if (nthreads < 64) {
    threads[nthreads].id = tid;
    snprintf(threads[nthreads++].name, 40, "%s", name);
  }
  pthread_mutex_unlock(&lock);
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable core = NULL, core2 = NULL;
  unsigned n1 = 0, n2 = 0;
  if (cb == NULL || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &n1) ||
      !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &n2))
    return 0;
  *core[NVTX_CBID_CORE_NameOsThreadA] = (NvtxFunctionPointer)name_thread;
  *core2[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
  *core2[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)range_push;
  *core2[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)range_pop;
  *core2[NVTX_CBID_CORE2_DomainNameCategoryA] = (NvtxFunctionPointer)name_category;
  return 1;
}

/* ---- what the test reads ---- */

__attribute__((visibility("default"))) const char *nvtx_inject_domain(uint32_t i) {
  return i < ndomains ? domains[i] : NULL;
}

/* Ranges named msg (NULL: all), and the pops seen. */
__attribute__((visibility("default"))) uint32_t nvtx_inject_count(const char *msg) {
  uint32_t n = 0;
  pthread_mutex_lock(&lock);
  for (uint32_t i = 0; i < nranges; i++) n += msg == NULL || strcmp(ranges[i].msg, msg) == 0;
  pthread_mutex_unlock(&lock);
  return n;
}

__attribute__((visibility("default"))) uint32_t nvtx_inject_pops(void) { return npops; }

/* The i-th range named msg: its category, payload and thread. */
__attribute__((visibility("default"))) int nvtx_inject_range(const char *msg, uint32_t i, uint32_t *category,
                                                             uint64_t *payload, uint32_t *tid) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (uint32_t k = 0; k < nranges && !found; k++)
    if (strcmp(ranges[k].msg, msg) == 0 && i-- == 0) {
      *category = ranges[k].category;
      *payload = ranges[k].payload;
      *tid = ranges[k].tid;
      found = 1;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

/* The name given to category id, or to thread tid. */
__attribute__((visibility("default"))) const char *nvtx_inject_category(uint32_t id) {
  for (uint32_t i = 0; i < ncategories; i++)
    if (categories[i].id == id) return categories[i].name;
  return NULL;
}

__attribute__((visibility("default"))) const char *nvtx_inject_thread(uint32_t tid) {
  for (uint32_t i = 0; i < nthreads; i++)
    if (threads[i].id == tid) return threads[i].name;
  return NULL;
}

__attribute__((visibility("default"))) uint32_t nvtx_inject_threads(void) { return nthreads; }

/* NVTX_INJECT_REPORT=1: a summary on stderr at exit. */
__attribute__((destructor)) static void report(void) {
  const char *v = getenv("NVTX_INJECT_REPORT");
  if (v == NULL || *v != '1') return;
  fprintf(stderr, "nvtx_inject: %u ranges pushed, %u popped (by name: the first %u); domains:", ntotal, npops,
          nranges);
  for (uint32_t i = 0; i < ndomains; i++) fprintf(stderr, " %s", domains[i]);
  fprintf(stderr, "\n");
  for (uint32_t i = 0; i < nranges; i++) {
    uint32_t seen = 0, n = 0;
    for (uint32_t k = 0; k < i && !seen; k++) seen = strcmp(ranges[k].msg, ranges[i].msg) == 0;
    if (seen) continue;
    for (uint32_t k = i; k < nranges; k++) n += strcmp(ranges[k].msg, ranges[i].msg) == 0;
    fprintf(stderr, "nvtx_inject:   %-24s %u\n", ranges[i].msg, n);
  }
  for (uint32_t i = 0; i < nthreads; i++) fprintf(stderr, "nvtx_inject: thread %u \"%s\"\n", threads[i].id, threads[i].name);
  for (uint32_t i = 0; i < ncategories; i++)
    fprintf(stderr, "nvtx_inject: category %u \"%s\"\n", categories[i].id, categories[i].name);
}

/* nvtx.c - NVTX ranges for the workers' commands and users' ranges
 * (nvtx.h). The NVTX v3 headers are header-only: with no tool attached
 * each call is a check of a function pointer, and ruda does not even make
 * those unless ruda__nvtx_on(). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "scheduler/nvtx.h"
#include "scheduler/trace.h"

#ifdef RUDA_HAVE_NVTX
#include <sys/syscall.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int on;
static nvtxDomainHandle_t domain;

static void init(void) {
  const char *tool = getenv("NVTX_INJECTION64_PATH");
  int force = 0;
  on = ruda__env_bool("RUDA_NVTX", &force) > 0 ? force : tool != NULL && *tool != '\0';
  if (on) domain = nvtxDomainCreateA("ruda");
}

int ruda__nvtx_on(void) {
  pthread_once(&once, init);
  return on;
}

void ruda__nvtx_name_worker(uint32_t index) {
  if (!ruda__nvtx_on()) return;
  char name[32];
  snprintf(name, sizeof name, "ruda worker %u", index);
  nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), name);
}

/* Categories are 32-bit: streams are named by their low 32 bits, once per
 * worker and stream in a small direct-mapped cache of names given. */
static _Thread_local uint64_t named[64];

void ruda__nvtx_begin(const ruda__cmd *cmd) {
  nvtxEventAttributes_t a;
  memset(&a, 0, sizeof a);
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = ruda__trace_cmd_name(cmd);
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = cmd->seq;
  if (cmd->stream != NULL) {
    const uint64_t id = cmd->stream->id;
    a.category = (uint32_t)id;
    if (named[id % 64] != id + 1) {
      char name[40];
      snprintf(name, sizeof name, "stream %llu", (unsigned long long)id);
      nvtxDomainNameCategoryA(domain, a.category, name);
      named[id % 64] = id + 1;
    }
  }
  nvtxDomainRangePushEx(domain, &a);
}

void ruda__nvtx_end(void) { nvtxDomainRangePop(domain); }

int ruda__nvtx_range_push(const char *name) {
  if (!ruda__nvtx_on()) return 0;
  nvtxEventAttributes_t a;
  memset(&a, 0, sizeof a);
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(domain, &a);
  return 1;
}

void ruda__nvtx_range_pop(void) {
  if (ruda__nvtx_on()) nvtxDomainRangePop(domain);
}
#else
int ruda__nvtx_on(void) { return 0; }
void ruda__nvtx_name_worker(uint32_t index) { (void)index; }
void ruda__nvtx_begin(const ruda__cmd *cmd) { (void)cmd; }
void ruda__nvtx_end(void) {}
int ruda__nvtx_range_push(const char *name) {
  (void)name;
  return 0;
}
void ruda__nvtx_range_pop(void) {}
#endif

/* device.c - configuration, device open/close, logging. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/env.h"
#include "base/log.h"
#include "src/device.h"
#include "base/parse.h"
#include "scheduler/builder.h"
#include "scheduler/graph.h"
#include "scheduler/trace.h"
#include "src/api.h"

static int env_u32(const char *name, uint32_t *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  uint64_t x;
  if (ruda__parse_u64(v, UINT32_MAX, &x) != 0) return -1;
  *out = (uint32_t)x;
  return 1;
}

void ruda_config_init(ruda_config *cfg) {
  if (cfg == NULL) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->size = (uint32_t)sizeof *cfg;
  cfg->backend = RUDA_BACKEND_AUTO;
  /* 8 submitting threads is where the driver peaks
   * (docs/benchmarks.md); idle workers sleep and cost nothing. */
  cfg->num_streams = 8;
  cfg->queue_bound = 65536;
  cfg->backpressure = RUDA_BACKPRESSURE_BLOCK;
  cfg->log_level = RUDA_LOG_WARN;
  cfg->cache_dir = NULL;

  /* Malformed variables are ignored with a warning rather than failing
   * open(): the environment is not the caller's code. */
  const char *v;
  if ((v = getenv("RUDA_BACKEND")) != NULL) {
    if (!strcasecmp(v, "cuda")) cfg->backend = RUDA_BACKEND_CUDA;
    else if (!strcasecmp(v, "host")) cfg->backend = RUDA_BACKEND_HOST;
    else if (!strcasecmp(v, "auto")) cfg->backend = RUDA_BACKEND_AUTO;
    else fprintf(stderr, "ruda: ignoring RUDA_BACKEND=%s (auto|cuda|host)\n", v);
  }
  uint32_t u = 0;
  int dv = env_u32("RUDA_DEVICE", &u);
  if (dv < 0 || (dv > 0 && u > INT32_MAX)) fprintf(stderr, "ruda: ignoring malformed RUDA_DEVICE (a GPU ordinal: 0, 1, ...)\n");
  else if (dv > 0) cfg->device_ordinal = (int)u;
  if (env_u32("RUDA_STREAMS", &u) < 0) fprintf(stderr, "ruda: ignoring malformed RUDA_STREAMS\n");
  else if (getenv("RUDA_STREAMS") && *getenv("RUDA_STREAMS")) cfg->num_streams = u;
  if (env_u32("RUDA_QUEUE_BOUND", &u) < 0) fprintf(stderr, "ruda: ignoring malformed RUDA_QUEUE_BOUND\n");
  else if (getenv("RUDA_QUEUE_BOUND") && *getenv("RUDA_QUEUE_BOUND")) cfg->queue_bound = u;
  if ((v = getenv("RUDA_BACKPRESSURE")) != NULL) {
    if (!strcasecmp(v, "block")) cfg->backpressure = RUDA_BACKPRESSURE_BLOCK;
    else if (!strcasecmp(v, "error")) cfg->backpressure = RUDA_BACKPRESSURE_ERROR;
    else fprintf(stderr, "ruda: ignoring RUDA_BACKPRESSURE=%s (block|error)\n", v);
  }
  if ((v = getenv("RUDA_LOG")) != NULL) {
    static const char *names[] = {"off", "error", "warn", "info", "debug"};
    int found = 0;
    for (int i = 0; i < 5; i++)
      if (!strcasecmp(v, names[i])) cfg->log_level = (ruda_log_level)i, found = 1;
    if (!found) fprintf(stderr, "ruda: ignoring RUDA_LOG=%s (off|error|warn|info|debug)\n", v);
  }
  int on = 0;
  if (ruda__env_bool("RUDA_BOUNDS_CHECK", &on) > 0) cfg->bounds_checked = on;
  if (ruda__env_bool("RUDA_LAUNCH_BLOCKING", &on) > 0) cfg->launch_blocking = on;
  cfg->auto_graphs = -1; /* where the backend's graphs pay */
  if (ruda__env_bool("RUDA_AUTO_GRAPHS", &on) > 0) cfg->auto_graphs = on;
  if ((v = getenv("RUDA_CACHE_DIR")) != NULL) cfg->cache_dir = v;
  if (env_u32("RUDA_LANES", &u) < 0) fprintf(stderr, "ruda: ignoring malformed RUDA_LANES\n");
  else if (getenv("RUDA_LANES") && *getenv("RUDA_LANES")) cfg->lanes = u;
  cfg->spin_us = 50;
  if (env_u32("RUDA_SPIN_US", &u) < 0) fprintf(stderr, "ruda: ignoring malformed RUDA_SPIN_US\n");
  else if (getenv("RUDA_SPIN_US") && *getenv("RUDA_SPIN_US")) cfg->spin_us = u;
}

/* The backend's view of its device (base/backend.h). */
static void env_fault(void *ctx, ruda_error *err) { ruda__sched_fault(ctx, err); }
static int env_faulted(void *ctx) {
  return atomic_load_explicit(&((ruda__sched *)ctx)->faulted, memory_order_acquire);
}

static _Atomic uint64_t device_serial = 1;

int ruda_device_open(const ruda_config *cfg_in, ruda_device **out) {
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "ruda_device_open: out is NULL");
  *out = NULL;
  ruda_config cfg;
  if (cfg_in != NULL && cfg_in->size != sizeof *cfg_in)
    return ruda__fail(RUDA_EINVAL,
                      "ruda_device_open: cfg->size is %u, not sizeof(ruda_config) = %zu: fill the config with "
                      "ruda_config_init() of the ruda version it is built against",
                      cfg_in->size, sizeof *cfg_in);
  if (cfg_in) cfg = *cfg_in;
  else ruda_config_init(&cfg);
  /* A nonzero word is a setting this library does not know (the caller's
   * headers are newer) or garbage: refused, never silently ignored. */
  /* lanes took reserved[0]'s low half: its high half is checked alone. */
  if (cfg.reserved[0] >> 32 != 0)
    return ruda__fail(RUDA_EINVAL,
                      "ruda_device_open: cfg->reserved[0] is 0x%llx, not zero above lanes: a setting this ruda %s "
                      "does not know, or a config not filled by ruda_config_init()",
                      (unsigned long long)cfg.reserved[0], RUDA_VERSION_STRING);
  int r = ruda__reserved_set(cfg.reserved + 1, 7);
  if (r >= 0 && ++r > 0)
    return ruda__fail(RUDA_EINVAL,
                      "ruda_device_open: cfg->reserved[%d] is 0x%llx, not zero: a setting this ruda %s does not "
                      "know, or a config not filled by ruda_config_init()",
                      r, (unsigned long long)cfg.reserved[r], RUDA_VERSION_STRING);

  if (cfg.num_streams == 0 || cfg.num_streams > 1024)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: num_streams %u outside 1..1024", cfg.num_streams);
  if (cfg.lanes > 32)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: lanes %u outside 1..32 (0: the default)", cfg.lanes);
  /* By default one CUstream per worker until a library is registered,
   * then two for streams made after: more lanes win GEMM-sized requests
   * of clients that share a worker and lose small kernels' launch rate
   * (docs/benchmarks.md, "Lanes"). The second lane is made at open
   * (within 64 lanes, where ordering keeps a reader bit per lane). */
  const int lanes_auto = cfg.lanes == 0;
  if (lanes_auto) cfg.lanes = cfg.num_streams <= 32 ? 2 : 1;
  if (cfg.num_streams * cfg.lanes > 1024)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: %u workers of %u lanes: more than 1024 device streams",
                      cfg.num_streams, cfg.lanes);
  if (cfg.queue_bound == 0 || cfg.queue_bound > (1u << 30))
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: queue_bound %u outside 1..2^30", cfg.queue_bound);
  if (cfg.backend > RUDA_BACKEND_HOST)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: backend %d is not auto, cuda or host", (int)cfg.backend);
  if ((int)cfg.backpressure < 0 || cfg.backpressure > RUDA_BACKPRESSURE_ERROR)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: backpressure %d is not block or error",
                      (int)cfg.backpressure);
  if ((int)cfg.log_level < 0 || cfg.log_level > RUDA_LOG_DEBUG)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: log level %d outside 0..4", (int)cfg.log_level);
  if (cfg.spin_us > 1000000)
    return ruda__fail(RUDA_EINVAL, "ruda_device_open: spin_us %u above one second", cfg.spin_us);

  ruda_device *dev = calloc(1, sizeof *dev);
  if (dev == NULL) return ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
  /* The scheduler's root owns what every command reads: the serial, the
   * config and (below) the backend. */
  dev->sched.serial = atomic_fetch_add(&device_serial, 1);
  dev->sched.cfg = cfg;

  /* Backend choice: cuda when asked; auto tries cuda, then host. */
  const ruda__backend_env env = {&dev->sched.cfg, &dev->sched, env_fault, env_faulted};
  int rc = RUDA_ENOBACKEND;
  if (cfg.backend != RUDA_BACKEND_HOST) {
    if (ruda__cuda_backend == NULL) {
      rc = ruda__fail(RUDA_ENOBACKEND, "ruda_device_open: this libruda was built without CUDA support");
    } else {
      dev->sched.backend.ops = ruda__cuda_backend;
      rc = dev->sched.backend.ops->open(&env, &dev->sched.backend.state, &dev->limits);
    }
    if (rc != 0 && cfg.backend == RUDA_BACKEND_AUTO) {
      snprintf(dev->fallback, sizeof dev->fallback, "%s", ruda_error_message(ruda_last_error()));
      ruda__log(cfg.log_level, RUDA_LOG_INFO, "cuda backend unavailable (%s); using host", dev->fallback);
    }
  }
  if (rc != 0 && cfg.backend != RUDA_BACKEND_CUDA) {
    dev->sched.backend.ops = &ruda__host_backend;
    rc = dev->sched.backend.ops->open(&env, &dev->sched.backend.state, &dev->limits);
  }
  if (rc != 0) {
    free(dev);
    return rc;
  }

  ruda__handles_init(&dev->handles);
  ruda__stage_holds_init(&dev->holds);
  /* The rest of the scheduler's root: memory's parts it pins and
   * allocates from. */
  dev->sched.handle = dev;
  /* Where the config leaves it to the backend (-1). */
  if (dev->sched.cfg.auto_graphs < 0) dev->sched.cfg.auto_graphs = dev->sched.backend.ops->auto_graphs_pay;
  dev->sched.auto_in_place = dev->sched.backend.ops->in_place_pays;
  dev->sched.closed = &dev->closed;
  dev->sched.handles = &dev->handles;
  dev->sched.memory = &dev->memory;
  ruda__streams_init(&dev->sched.streams);
  pthread_mutex_init(&dev->sched.graph_lock, NULL);
  pthread_mutex_init(&dev->sched.builder_lock, NULL);
  pthread_mutex_init(&dev->sched.trace_lock, NULL);
  dev->kernels = ruda__kernels_new();
  dev->sched.nworkers = cfg.num_streams;
  dev->sched.nlanes = cfg.lanes;
  dev->sched.lanes_total = cfg.num_streams * cfg.lanes;
  dev->sched.lanes_auto = lanes_auto;
  atomic_init(&dev->sched.lanes_spread, lanes_auto ? 1 : cfg.lanes);
  dev->sched.workers = aligned_alloc(RUDA__CACHELINE, sizeof(ruda__worker) * dev->sched.nworkers);
  dev->sched.lanes = aligned_alloc(RUDA__CACHELINE, sizeof(ruda__lane) * dev->sched.lanes_total);
  dev->calls = aligned_alloc(RUDA__CACHELINE, sizeof(ruda__call_slot) * RUDA__CALL_SLOTS);
  if (dev->calls != NULL) memset(dev->calls, 0, sizeof(ruda__call_slot) * RUDA__CALL_SLOTS);
  dev->sched.streams.grace.calls = dev->calls;
  dev->sched.streams.grace.phase = &dev->call_phase;
  if (dev->sched.workers == NULL || dev->sched.lanes == NULL || dev->calls == NULL || dev->kernels == NULL || atomic_load(&dev->sched.streams.current) == NULL) {
    rc = ruda__fail(RUDA_ENOMEM, "ruda_device_open: out of host memory");
    goto fail;
  }
  memset(dev->sched.workers, 0, sizeof(ruda__worker) * dev->sched.nworkers);
  memset(dev->sched.lanes, 0, sizeof(ruda__lane) * dev->sched.lanes_total);
  ruda__lanes_init(&dev->sched);
  if ((rc = ruda__futures_open(&dev->sched)) != 0) goto fail;
  if ((rc = ruda__progress_init(&dev->sched)) != 0) goto fail;
  dev->memory.backend = &dev->sched.backend;
  dev->memory.handles = &dev->handles;
  rc = ruda__memory_init(&dev->memory, dev->sched.lanes_total); /* memory's "workers" are lanes */
  if (rc != 0) goto fail;
  ruda__trace_open(&dev->sched);
  rc = ruda__workers_start(&dev->sched);
  if (rc != 0) goto fail;
  ruda__log(cfg.log_level, RUDA_LOG_INFO, "device open: backend %s (%s), %u streams of %u lanes%s, queue bound %u",
            dev->sched.backend.ops->name, dev->limits.name, dev->sched.nworkers, dev->sched.nlanes,
            lanes_auto && cfg.lanes > 1 ? " (one used until a library is registered)" : "", cfg.queue_bound);
  *out = dev;
  return 0;

fail:
  ruda__futures_close(&dev->sched); /* none handed out yet */
  ruda__trace_close(&dev->sched, 0);
  ruda__memory_destroy(&dev->memory);
  ruda__progress_destroy(&dev->sched);
  free(dev->sched.workers);
  free(dev->sched.lanes);
  free(dev->calls);
  ruda__kernels_destroy(dev);
  ruda__streams_destroy(&dev->sched.streams);
  ruda__handles_destroy(&dev->handles);
  ruda__stage_holds_destroy(&dev->holds);
  pthread_mutex_destroy(&dev->sched.graph_lock);
  pthread_mutex_destroy(&dev->sched.builder_lock);
  pthread_mutex_destroy(&dev->sched.trace_lock);
  dev->sched.backend.ops->close(dev->sched.backend.state);
  free(dev);
  return rc;
}

_Thread_local unsigned ruda__call_slot_id;

unsigned ruda__call_slot_assign(void) {
  static _Atomic unsigned next;
  ruda__call_slot_id = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) % RUDA__CALL_SLOTS + 1;
  return ruda__call_slot_id;
}

int ruda__call_closed(ruda_device *dev, _Atomic unsigned long **slot, const char *fn) {
  ruda__test_point(RUDA__HOOK_CALL_CLOSED, dev);
  ruda__call_leave(slot);
  *slot = NULL;
  /* dev may be freed from here on. */
  return ruda__fail(RUDA_ECLOSED, "%s: device is closed", fn);
}

/* Waits until no call is counted on dev (src/api.h). After `closed` is
 * set, the calls that entered before it run to their end, and later ones
 * see it and leave. Blocks: a call blocked on back-pressure finishes
 * because the workers still run. */
static void calls_wait(ruda_device *dev) {
  for (unsigned i = 0; i < RUDA__CALL_SLOTS; i++)
    while (atomic_load_explicit(&dev->calls[i].n[0], memory_order_seq_cst) != 0 ||
           atomic_load_explicit(&dev->calls[i].n[1], memory_order_seq_cst) != 0) {
      ruda__test_point(RUDA__HOOK_CLOSE_WAITING, dev);
      sched_yield();
    }
}

typedef struct collect_arg {
  ruda_device *dev;
  ruda_error *head, *tail;
  int unhealthy;
} collect_arg;

static void collect(ruda__stream *s, void *p) {
  collect_arg *a = p;
  ruda_error *e = NULL;
  if (ruda__stream_drain(&a->dev->sched, s, &e) == 0) return;
  a->unhealthy = 1;
  if (e == NULL) return;
  if (a->tail) a->tail->next = e;
  else a->head = e;
  while (e->next) e = e->next;
  a->tail = e;
}

/* The close sequence, in order (ruda.h has the contract, architecture.md
 * the picture):
 *  1. refuse while a communicator is live (RUDA_EBUSY, still open);
 *  2. mark closed: calls starting from here fail with RUDA_ECLOSED;
 *  3. wait for the calls in progress (their commands are queued by then,
 *     the futures they hand out listed);
 *  4. stop the workers: every queued command runs (or is reported);
 *  5. complete the held futures (scheduler/future.c): waits in progress
 *     finish with their results, the rest get RUDA_ECLOSED; all outlive
 *     the device;
 *  6. collect the streams' errors, then free graphs, staging holds,
 *     handles, memory, kernels, streams and the backend;
 *  7. wait for calls that raced the first wait, free the device. */
int ruda_device_close(ruda_device *dev, ruda_error **errors) {
  if (errors) *errors = NULL;
  if (dev == NULL) return ruda__fail(RUDA_EINVAL, "ruda_device_close: device is NULL");
  {
    /* Counted like any call while it looks, so a second close racing the
     * first is waited for before the device is freed. */
    RUDA__IN_CALL(dev);
    uint32_t comms = atomic_load(&dev->comms);
    if (comms != 0 && !atomic_load(&dev->closed))
      return ruda__fail(RUDA_EBUSY,
                        "ruda_device_close: the device is a rank of %u live communicator%s; ruda_comm_destroy %s "
                        "first (the device stays open)",
                        comms, comms == 1 ? "" : "s", comms == 1 ? "it" : "them");
    if (atomic_exchange(&dev->closed, 1)) return ruda__call_closed(dev, &ruda__in_call, "ruda_device_close");
  }
  calls_wait(dev);
  ruda__test_point(RUDA__HOOK_CLOSE_WAITED, dev);
  ruda__workers_stop(&dev->sched);
  ruda__builder_stop(&dev->sched); /* the workers let go of their templates */
  ruda__futures_close(&dev->sched);
  ruda__trace_close(&dev->sched, 1);

  ruda__streams_unpend(&dev->sched);
  collect_arg a = {dev, NULL, NULL, 0};
  ruda__streams_each(&dev->sched.streams, collect, &a);
  if (errors) *errors = a.head;
  else ruda_error_free(a.head);

  /* Graphs hold pins and backend objects: before handles and context. */
  ruda__streams_each(&dev->sched.streams, ruda__capture_close, &dev->sched);
  ruda__graphs_close(&dev->sched);
  ruda__stage_holds_destroy(&dev->holds); /* every replay ran; the blocks go with the backend */
  pthread_mutex_destroy(&dev->sched.graph_lock);
  pthread_mutex_destroy(&dev->sched.builder_lock);
  pthread_mutex_destroy(&dev->sched.trace_lock);
  ruda__handles_destroy(&dev->handles);
  ruda__memory_destroy(&dev->memory);
  ruda__progress_destroy(&dev->sched);
  ruda__kernels_destroy(dev);
  ruda__streams_each(&dev->sched.streams, ruda__profiles_free, NULL);
  ruda__streams_destroy(&dev->sched.streams);
  dev->sched.backend.ops->close(dev->sched.backend.state);
  ruda_error_free(dev->sched.fault);
  free(dev->sched.workers);
  free(dev->sched.lanes);
  /* A call that started while close ran may have entered its slot after
   * the first wait; it only reads `closed` and leaves, and is waited for
   * here, before the slots and the device go. */
  ruda__test_point(RUDA__HOOK_CLOSE_FREE, dev);
  calls_wait(dev);
  free(dev->calls);
  free(dev);
  return a.unhealthy ? RUDA_EUNHEALTHY : 0;
}

const char *ruda_device_backend(const ruda_device *dev) { return dev ? dev->sched.backend.ops->name : ""; }

const char *ruda_device_fallback_reason(const ruda_device *dev) {
  return dev != NULL && dev->fallback[0] != '\0' ? dev->fallback : NULL;
}
uint32_t ruda_device_num_streams(const ruda_device *dev) { return dev ? dev->sched.nworkers : 0; }
uint32_t ruda_device_num_lanes(const ruda_device *dev) { return dev ? dev->sched.lanes_total : 0; }

size_t ruda_stream_ids(ruda_device *dev, ruda_stream_id *ids, size_t cap) {
  if (dev == NULL) return 0;
  RUDA__IN_CALL(dev);
  if (ruda__closing(dev)) return 0;
  ruda__streams_reap(&dev->sched); /* exited threads' drained streams are not listed */
  return ruda__streams_list(&dev->sched.streams, ids, cap);
}

int ruda_stream_name(ruda_stream_id id, char *buf, size_t len) {
  if (buf == NULL || len == 0) return ruda__fail(RUDA_EINVAL, "ruda_stream_name: buf is NULL or len is 0");
  char name[RUDA__STREAM_NAME_MAX];
  snprintf(buf, len, "%s", ruda__stream_name(id == RUDA_STREAM_CURRENT ? ruda_stream_current() : id, name));
  return 0;
}

int ruda_stream_set_in_place(ruda_device *dev, ruda_stream_id stream, int on) {
  static const char fn[] = "ruda_stream_set_in_place";
  RUDA__CHECK_DEV(dev, fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  atomic_store_explicit(&s->in_place, on != 0 ? RUDA__IN_PLACE_ON : RUDA__IN_PLACE_OFF, memory_order_relaxed);
  return 0;
}

/* trace.c - RUDA_TRACE: per-worker command records, written as Chrome
 * trace-event JSON at close (trace.h). */
#include "scheduler/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "scheduler/sched.h"

typedef struct trace_rec {
  uint64_t t0, t1;
  uint64_t queued; /* ns from the client's submit to t0; 0: not known */
  /* Device timing events (cuda), or NULL: ev0 before this command, ev1
   * after the last of the span_cmds device commands it opens (the worker
   * times its batches, not each command). */
  void *ev0, *ev1;
  double dev0, dev1; /* once harvested: their ms since this worker's zero */
  uint32_t span_cmds;
  ruda_stream_id stream; /* RUDA__TRACE_INTERNAL for the device's own commands */
  uint64_t seq, bytes;
  int rc;
  uint8_t kind;
  uint8_t harvested; /* dev0/dev1 hold the span; the events went back */
  char name[48];
} trace_rec;

struct ruda__trace {
  trace_rec *recs;
  uint32_t n, cap;
  uint64_t dropped;
  /* Device times (backends with timing events): every event is timed
   * against `zero`, an event this worker recorded and waited for before
   * its first timed command, at host time zero_ns. */
  void *zero;
  uint64_t zero_ns;
  uint32_t ntimed;
  uint32_t harvest; /* first record whose events may still be held */
  uint32_t open, open_cmds; /* record holding the open span's ev0 + 1 (0: none); its commands */
  void *open_ws;            /* the lane the open span's events go on (its backend state) */
  int device; /* RUDA_TRACE_DEVICE=1: record device spans */
  /* Memory over time: device memory the arena holds, sampled by this
   * worker at most once a millisecond, after a command. */
  struct {
    uint64_t t, held, pinned; /* device memory the arena holds; staging page-locked */
  } *samples;
  uint32_t nsamples, samples_cap;
  uint64_t last_sample;
};

#define RUDA__TRACE_INTERNAL UINT64_MAX

static const char *const kind_name[] = {
    [RUDA__CMD_WRITE] = "write", [RUDA__CMD_READ] = "read",   [RUDA__CMD_COPY] = "copy",
    [RUDA__CMD_LAUNCH] = "launch", [RUDA__CMD_FENCE] = "fence", [RUDA__CMD_SYNC] = "sync",
    [RUDA__CMD_STOP] = "stop",   [RUDA__CMD_MARK] = "mark",   [RUDA__CMD_WAIT] = "wait",
    [RUDA__CMD_GRAPH] = "graph", [RUDA__CMD_STAMP] = "stamp", [RUDA__CMD_COLL] = "collective",
    [RUDA__CMD_CALL] = "call",   [RUDA__CMD_TRACE] = "trace",
};

const char *ruda__trace_cmd_name(const ruda__cmd *cmd) {
  if (cmd->kind == RUDA__CMD_LAUNCH && cmd->u.launch.kernel != NULL) return cmd->u.launch.kernel->name;
  if (cmd->kind == RUDA__CMD_CALL) return cmd->u.call.name;
  return kind_name[cmd->kind];
}

static void free_traces(struct ruda__sched *sch);

/* Buffers for every worker and the file, opened now so that a path that
 * cannot be written fails at once; sch->trace_path etc. set. 0, or
 * RUDA_EIO / RUDA_ENOMEM (via ruda__fail) with nothing left allocated. */
static int make_traces(struct ruda__sched *sch, const char *path, const char *fn) {
  const char *dv = getenv("RUDA_TRACE_DEVICE");
  const int device = dv != NULL && *dv != '\0' && *dv != '0';
  sch->traces = calloc(sch->nworkers, sizeof *sch->traces);
  sch->trace_path = strdup(path);
  int ok = sch->traces != NULL && sch->trace_path != NULL;
  for (uint32_t i = 0; ok && i < sch->nworkers; i++) {
    ruda__trace *t = calloc(1, sizeof *t);
    if (t != NULL) t->recs = malloc(4096 * sizeof *t->recs);
    if ((ok = t != NULL && t->recs != NULL) == 0) {
      free(t);
      break;
    }
    t->cap = 4096;
    t->device = device;
    sch->traces[i] = t;
  }
  if (!ok) {
    free_traces(sch);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory for the trace buffers", fn);
  }
  if ((sch->trace_file = fopen(path, "w")) == NULL) {
    free_traces(sch);
    return ruda__fail(RUDA_EIO, "%s: cannot write the trace file %s", fn, path);
  }
  sch->trace_start_ns = ruda__now_ns();
  return 0;
}

void ruda__trace_open(struct ruda__sched *sch) {
  const char *path = getenv("RUDA_TRACE");
  if (path == NULL || *path == '\0') return;
  if (make_traces(sch, path, "RUDA_TRACE") != 0) {
    ruda__log(sch->cfg.log_level, RUDA_LOG_WARN, "%s; not tracing", ruda_error_message(ruda_last_error()));
    return;
  }
  /* The workers have not started: theirs at once. */
  for (uint32_t i = 0; i < sch->nworkers; i++) sch->workers[i].trace = sch->traces[i];
  atomic_store_explicit(&sch->tracing, 1, memory_order_release);
}

/* Commands that put work on the device, so have a device span. */
static int device_work(int kind) {
  return kind == RUDA__CMD_WRITE || kind == RUDA__CMD_READ || kind == RUDA__CMD_COPY || kind == RUDA__CMD_LAUNCH ||
         kind == RUDA__CMD_GRAPH || kind == RUDA__CMD_COLL || kind == RUDA__CMD_CALL;
}

/* A timing event on a lane of w now (its backend state ws), or NULL (no
 * timing events on this backend, or the record failed: the span is then
 * host-only). */
static void *stamp(ruda__worker *w, void *ws) {
  const ruda__backend_ops *ops = w->sch->backend.ops;
  ruda__completion c = {0};
  ruda_error *err = NULL;
  if (ops->stamp == NULL || ops->elapsed == NULL || ops->stamp(ws, &c, &err) != 0) {
    ruda_error_free(err);
    return NULL;
  }
  return c.event;
}

static void start_device_clock(ruda__worker *w, ruda__trace *t, void *ws) {
  t->zero = stamp(w, ws);
  if (t->zero == NULL) return;
  /* Blocks this worker once, while tracing: the zero's completion is
   * what ties device time to the host clock (within a wake-up). */
  if (w->sch->backend.ops->event_wait(w->sch->backend.state, t->zero, NULL) != 0) {
    w->sch->backend.ops->event_release(w->sch->backend.state, t->zero);
    t->zero = NULL;
    return;
  }
  t->zero_ns = ruda__now_ns();
}

void ruda__trace_begin(ruda__worker *w, const ruda__cmd *cmd) {
  ruda__trace *t = w->trace;
  if (t->n == t->cap) {
    trace_rec *r = t->cap < RUDA__TRACE_MAX ? realloc(t->recs, 2 * (size_t)t->cap * sizeof *r) : NULL;
    if (r != NULL) {
      t->recs = r;
      t->cap *= 2;
    }
  }
  if (t->n == t->cap) {
    t->dropped++;
    return;
  }
  trace_rec *r = &t->recs[t->n];
  r->kind = cmd->kind;
  r->stream = cmd->stream != NULL ? cmd->stream->id : RUDA__TRACE_INTERNAL;
  r->seq = cmd->seq;
  r->bytes = cmd->kind == RUDA__CMD_WRITE  ? cmd->u.write.layout.bytes
             : cmd->kind == RUDA__CMD_READ ? cmd->u.read.layout.bytes
             : cmd->kind == RUDA__CMD_COPY ? cmd->u.copy.size
                                           : 0;
  const char *name = ruda__trace_cmd_name(cmd);
  size_t len = strnlen(name, sizeof r->name - 1);
  memcpy(r->name, name, len);
  r->name[len] = '\0';
  r->ev0 = r->ev1 = NULL;
  r->span_cmds = 0;
  if (t->device && device_work(cmd->kind) && w->sch->backend.ops->stamp != NULL) {
    /* A span times one lane: another lane's command closes it. */
    void *ws = cmd->stream->lane->wstate;
    if (t->open != 0 && t->open_ws != ws) {
      ruda__trace_batch_end(w, t);
      r = &t->recs[t->n];
    }
    if (t->open == 0 && t->ntimed < RUDA__TRACE_DEVICE_MAX) {
      if (t->zero == NULL && t->ntimed == 0) start_device_clock(w, t, ws);
      t->ntimed++;
      if (t->zero != NULL && (r->ev0 = stamp(w, ws)) != NULL) {
        t->open = t->n + 1;
        t->open_ws = ws;
      }
    }
    if (t->open != 0) t->open_cmds++;
  }
  r->t0 = ruda__now_ns();
  r->queued = cmd->enq_ns != 0 && r->t0 > cmd->enq_ns ? r->t0 - cmd->enq_ns : 0;
}

void ruda__trace_begin_run(ruda__worker *w, ruda__cmd *const *run, uint32_t n) {
  ruda__trace *t = w->trace;
  ruda__trace_begin(w, run[0]);
  if (t->n == t->cap) return; /* dropped */
  trace_rec *r = &t->recs[t->n];
  snprintf(r->name, sizeof r->name, "auto graph (%u commands)", n);
  r->kind = RUDA__CMD_GRAPH;
  if (t->open != 0) t->open_cmds += n - 1;
}

static void sample_memory(ruda__worker *w, ruda__trace *t, uint64_t now) {
  if (now - t->last_sample < 1000000) return;
  t->last_sample = now;
  if (t->nsamples == t->samples_cap) {
    uint32_t cap = t->samples_cap ? 2 * t->samples_cap : 256;
    if (cap > RUDA__TRACE_MAX) return;
    __typeof__(t->samples) grown = realloc(t->samples, cap * sizeof *grown);
    if (grown == NULL) return;
    t->samples = grown;
    t->samples_cap = cap;
  }
  ruda_staging_stats st = {0};
  const ruda__backend_ops *ops = w->sch->backend.ops;
  if (ops->stage_usage != NULL) ops->stage_usage(w->sch->backend.state, &st);
  t->samples[t->nsamples].t = now;
  t->samples[t->nsamples].pinned = st.pinned_bytes;
  t->samples[t->nsamples++].held = atomic_load_explicit(&w->sch->memory->arena.backed, memory_order_relaxed);
}

/* Turns the events of records whose work the device finished into times
 * since this worker's zero and gives them back to the backend's pool, so
 * a long trace holds only the events of work in flight (creating new ones
 * for every command would cost the worker more than the command). Stops
 * at the first record still running: the stream finishes in order. */
static void harvest(ruda__worker *w, ruda__trace *t) {
  const ruda__backend_ops *ops = w->sch->backend.ops;
  for (; t->harvest < t->n; t->harvest++) {
    trace_rec *r = &t->recs[t->harvest];
    if (t->open == t->harvest + 1) break; /* its span is still open */
    if (r->ev1 != NULL && ops->event_query(w->sch->backend.state, r->ev1) == 0) break;
    if (r->ev0 != NULL && r->ev1 != NULL && ops->elapsed(w->sch->backend.state, t->zero, r->ev0, &r->dev0) == 0 &&
        ops->elapsed(w->sch->backend.state, t->zero, r->ev1, &r->dev1) == 0)
      r->harvested = 1;
    if (r->ev0 != NULL) ops->event_release(w->sch->backend.state, r->ev0);
    if (r->ev1 != NULL) ops->event_release(w->sch->backend.state, r->ev1);
    r->ev0 = r->ev1 = NULL;
  }
}

#define HARVEST_EVERY 32u

void ruda__trace_end(ruda__worker *w, ruda__trace *t, int rc) {
  if (t->n == t->cap) return; /* dropped at begin */
  trace_rec *r = &t->recs[t->n++];
  r->t1 = ruda__now_ns();
  r->rc = rc;
  r->harvested = 0;
  if (t->open_cmds >= RUDA__TRACE_SPAN_MAX) ruda__trace_batch_end(w, t);
  if (t->zero != NULL && t->n - t->harvest >= HARVEST_EVERY) harvest(w, t);
  sample_memory(w, t, r->t1);
}

void ruda__trace_batch_end(ruda__worker *w, ruda__trace *t) {
  if (t == NULL || t->open == 0) return;
  trace_rec *r = &t->recs[t->open - 1];
  if ((r->ev1 = stamp(w, t->open_ws)) != NULL) {
    r->span_cmds = t->open_cmds;
  } else { /* no span: the record keeps no event */
    w->sch->backend.ops->event_release(w->sch->backend.state, r->ev0);
    r->ev0 = NULL;
  }
  t->open = 0;
  t->open_cmds = 0;
}

/* The device span of r in us since the trace's start, from its events,
 * timed against t's zero: one zero (see write_file) for every worker, so
 * spans of different streams share the device's clock and compare
 * exactly; only the whole device lane's placement against the host's
 * carries the zero's wake-up error. 0 when r has no events or they cannot
 * be timed (a failed command). */
static int device_span(struct ruda__sched *sch, const ruda__trace *t, const trace_rec *r, double own_ms, double *ts,
                       double *dur) {
  double a, b;
  if (r->harvested) { /* against this worker's zero, own_ms after t's */
    a = r->dev0 + own_ms;
    b = r->dev1 + own_ms;
  } else if (r->ev0 == NULL || r->ev1 == NULL || sch->backend.ops->elapsed(sch->backend.state, t->zero, r->ev0, &a) != 0 ||
             sch->backend.ops->elapsed(sch->backend.state, t->zero, r->ev1, &b) != 0) {
    return 0;
  }
  const double zero_us = t->zero_ns >= sch->trace_start_ns ? (double)(t->zero_ns - sch->trace_start_ns) / 1000.0 : 0;
  *ts = zero_us + a * 1000.0;
  *dur = (b - a) * 1000.0;
  return 1;
}

/* Writes s as a JSON string body: quotes, backslashes and control bytes
 * escaped (kernel names may be any C++ name). */
static void put_json_string(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
}

static double us_since(uint64_t t, uint64_t start) { return t >= start ? (double)(t - start) / 1000.0 : 0.0; }

static int write_file(struct ruda__sched *sch) {
  FILE *f = sch->trace_file;
  sch->trace_file = NULL;
  uint64_t dropped = 0;
  fputs("{\"traceEvents\":[\n", f);
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"ruda-w%u\"}},\n",
            i, i);
    if (sch->traces[i]->zero != NULL)
      fprintf(f,
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":2,\"tid\":%u,\"args\":{\"name\":\"ruda-w%u stream on the "
              "device\"}},\n",
              i, i);
  }
  if (sch->backend.ops->stamp != NULL)
    fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"ruda workers (host)\"}},\n"
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"args\":{\"name\":\"device\"}},\n",
          f);
  /* The first worker's zero times every worker's events: all are events
   * of one context, and per-worker zeros would each add their own host
   * wake-up error, shifting streams against each other. */
  const ruda__trace *ref = NULL;
  for (uint32_t i = 0; i < sch->nworkers && ref == NULL; i++)
    if (sch->traces[i]->zero != NULL) ref = sch->traces[i];
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    const ruda__trace *t = sch->traces[i];
    dropped += t->dropped;
    /* Harvested spans count from this worker's own zero. */
    double own_ms = 0;
    if (ref != NULL && t->zero != NULL && t != ref && sch->backend.ops->elapsed(sch->backend.state, ref->zero, t->zero, &own_ms) != 0)
      own_ms = 0;
    for (uint32_t k = 0; k < t->n; k++) {
      const trace_rec *r = &t->recs[k];
      if (r->kind == RUDA__CMD_STOP || r->kind == RUDA__CMD_FENCE || r->kind == RUDA__CMD_TRACE) continue;
      const char *stream = r->stream == RUDA__TRACE_INTERNAL ? "internal" : RUDA__SNAME(r->stream);
      fputs("{\"name\":\"", f);
      put_json_string(f, r->name);
      fprintf(f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,", kind_name[r->kind], i,
              us_since(r->t0, sch->trace_start_ns), (double)(r->t1 - r->t0) / 1000.0);
      fprintf(f, "\"args\":{\"stream\":\"%s\",\"cmd\":%llu", stream, (unsigned long long)r->seq);
      if (r->bytes) fprintf(f, ",\"bytes\":%llu", (unsigned long long)r->bytes);
      if (r->queued) fprintf(f, ",\"queued_us\":%.3f", (double)r->queued / 1000.0);
      fputs("}},\n", f);
      double ts, dur;
      if (ref != NULL && device_span(sch, ref, r, own_ms, &ts, &dur)) {
        /* A span of several commands is named after its first. */
        fputs("{\"name\":\"", f);
        put_json_string(f, r->name);
        if (r->span_cmds > 1) fprintf(f, " +%u", r->span_cmds - 1);
        fprintf(f,
                "\",\"cat\":\"device\",\"ph\":\"X\",\"pid\":2,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"stream\":\"%s\",\"cmd\":%llu,\"kind\":\"%s\",\"commands\":%u}},\n",
                i, ts, dur, stream, (unsigned long long)r->seq, kind_name[r->kind], r->span_cmds);
      }
      if (r->rc != 0) {
        fprintf(f, "{\"name\":\"error: %s\",\"cat\":\"error\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":%u,"
                   "\"ts\":%.3f,\"args\":{\"stream\":\"%s\",\"cmd\":%llu}},\n",
                ruda_err_name(r->rc), i, us_since(r->t1, sch->trace_start_ns), stream,
                (unsigned long long)r->seq);
      }
    }
  }
  for (uint32_t i = 0; i < sch->nworkers; i++) {
    const ruda__trace *t = sch->traces[i];
    for (uint32_t k = 0; k < t->nsamples; k++)
      fprintf(f,
              "{\"name\":\"device memory held\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"MiB\":%.3f}},\n"
              "{\"name\":\"staging page-locked\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"MiB\":%.3f}},\n",
              us_since(t->samples[k].t, sch->trace_start_ns), (double)t->samples[k].held / 1048576.0,
              us_since(t->samples[k].t, sch->trace_start_ns), (double)t->samples[k].pinned / 1048576.0);
  }
  /* The last element closes the list without a trailing comma. */
  fprintf(f, "{\"name\":\"dropped\",\"ph\":\"M\",\"pid\":1,\"args\":{\"commands\":%llu}}\n",
          (unsigned long long)dropped);
  fputs("],\"displayTimeUnit\":\"ns\"}\n", f);
  return fclose(f) == 0 ? 0 : -1;
}

static void free_traces(struct ruda__sched *sch) {
  for (uint32_t i = 0; sch->traces != NULL && i < sch->nworkers; i++) {
    ruda__trace *t = sch->traces[i];
    if (t == NULL) continue;
    if (sch->backend.ops->event_release != NULL) {
      for (uint32_t k = 0; k < t->n; k++) {
        if (t->recs[k].ev0 != NULL) sch->backend.ops->event_release(sch->backend.state, t->recs[k].ev0);
        if (t->recs[k].ev1 != NULL) sch->backend.ops->event_release(sch->backend.state, t->recs[k].ev1);
      }
      if (t->zero != NULL) sch->backend.ops->event_release(sch->backend.state, t->zero);
    }
    free(t->recs);
    free(t->samples);
    free(t);
  }
  free(sch->traces);
  sch->traces = NULL;
  if (sch->trace_file != NULL) fclose(sch->trace_file);
  sch->trace_file = NULL;
  free(sch->trace_path);
  sch->trace_path = NULL;
}

void ruda__trace_close(struct ruda__sched *sch, int write) {
  if (sch->traces == NULL) return;
  for (uint32_t i = 0; i < sch->nworkers; i++) sch->workers[i].trace = NULL;
  atomic_store_explicit(&sch->tracing, 0, memory_order_relaxed);
  if (write && write_file(sch) != 0)
    ruda__log(sch->cfg.log_level, RUDA_LOG_WARN, "RUDA_TRACE: cannot write %s", sch->trace_path);
  free_traces(sch);
}

/* Hands each worker its buffer, or takes it back (stop), in the order of
 * its queue: a TRACE command, which the worker runs like any other. A stop
 * waits until every worker ran it; after that no worker writes a buffer.
 * Pushed outside the queue bound, like close's commands. All or nothing:
 * every command (and a stop's futures) is allocated before the first
 * push, so a failure (RUDA_ENOMEM) leaves every worker as it was and
 * there is nothing to undo; once pushing starts nothing can fail. */
static int tell_workers(struct ruda__sched *sch, int stop, const char *fn) {
  const uint32_t n = sch->nworkers;
  ruda__cmd **cmds = calloc(n, sizeof *cmds);
  ruda_future **f = stop ? calloc(n, sizeof *f) : NULL;
  int ok = cmds != NULL && (!stop || f != NULL);
  for (uint32_t i = 0; ok && i < n; i++) {
    ok = (cmds[i] = ruda__cmd_alloc(0)) != NULL;
    if (ok && stop) ok = (f[i] = ruda__future_new(sch, NULL, 0)) != NULL;
  }
  if (!ok) {
    for (uint32_t i = 0; cmds != NULL && i < n; i++)
      if (cmds[i] != NULL) ruda__cmd_free(cmds[i]);
    for (uint32_t i = 0; f != NULL && i < n; i++) free(f[i]); /* never pushed: a plain block */
    free(cmds);
    free(f);
    return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  }
  for (uint32_t i = 0; i < n; i++) {
    ruda__cmd *cmd = cmds[i];
    cmd->kind = RUDA__CMD_TRACE;
    cmd->stream = NULL; /* the device's own command */
    cmd->seq = 0;
    cmd->u.trace.t = stop ? NULL : sch->traces[i];
    cmd->future = stop ? f[i] : NULL;
    ruda__queue_push_unbounded(&sch->workers[i], cmd);
  }
  for (uint32_t i = 0; stop && i < n; i++) {
    ruda_future_wait(f[i], NULL);
    ruda_future_free(f[i]);
  }
  free(cmds);
  free(f);
  return 0;
}

int ruda__trace_start(struct ruda__sched *sch, const char *path, const char *fn) {
  pthread_mutex_lock(&sch->trace_lock);
  int rc = 0;
  if (sch->traces != NULL)
    rc = ruda__fail(RUDA_EBUSY, "%s: already tracing to %s (ruda_trace_stop first)", fn, sch->trace_path);
  else if ((rc = make_traces(sch, path, fn)) == 0) {
    atomic_store_explicit(&sch->tracing, 1, memory_order_release);
    if ((rc = tell_workers(sch, 0, fn)) != 0) { /* no worker has its buffer */
      atomic_store_explicit(&sch->tracing, 0, memory_order_relaxed);
      free_traces(sch);
    }
  }
  pthread_mutex_unlock(&sch->trace_lock);
  return rc;
}

int ruda__trace_stop(struct ruda__sched *sch, const char *fn) {
  pthread_mutex_lock(&sch->trace_lock);
  int rc = 0;
  if (sch->traces == NULL) {
    rc = ruda__fail(RUDA_EINVAL, "%s: not tracing", fn);
  } else {
    atomic_store_explicit(&sch->tracing, 0, memory_order_relaxed);
    if ((rc = tell_workers(sch, 1, fn)) != 0) { /* every worker still traces */
      atomic_store_explicit(&sch->tracing, 1, memory_order_relaxed);
    } else {
      char path[512];
      snprintf(path, sizeof path, "%s", sch->trace_path);
      if (write_file(sch) != 0) rc = ruda__fail(RUDA_EIO, "%s: writing the trace file %s failed", fn, path);
      free_traces(sch);
    }
  }
  pthread_mutex_unlock(&sch->trace_lock);
  return rc;
}

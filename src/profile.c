/* profile.c - device time between two points of a stream.
 *
 * A point is a RUDA__CMD_STAMP command with a future: the worker records
 * a timing event (cuda) and its own clock (host, where work is done once
 * the worker ran it). begin keeps the future under a token in the
 * stream's list; end pushes a second stamp, waits for it like a sync, and
 * subtracts. */
#include <stdlib.h>

#include "src/device.h"
#include "scheduler/nvtx.h"
#include "scheduler/submit.h"
#include "scheduler/trace.h"
#include "src/api.h"

typedef struct ruda__profile {
  struct ruda__profile *next;
  uint64_t id;
  ruda_future *start;
} ruda__profile;

static _Atomic uint64_t next_token = 1;

static int usable(ruda__stream *s, const char *fn) {
  if (atomic_load_explicit(&s->capturing, memory_order_acquire))
    return ruda__fail(RUDA_EGRAPHSTATE, "%s: %s is capturing a graph; nothing runs to be timed", fn,
                      RUDA__SNAME(s->id));
  return 0;
}

int ruda_profile_begin(ruda_device *dev, ruda_stream_id stream, ruda_profile_token *token) {
  static const char fn[] = "ruda_profile_begin";
  RUDA__CHECK_DEV(dev, fn);
  if (token == NULL) return ruda__fail(RUDA_EINVAL, "%s: token is NULL", fn);
  token->id = 0;
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if ((rc = usable(s, fn)) != 0) return rc;
  uint32_t nerr = atomic_load_explicit(&s->nerr, memory_order_acquire);
  if (nerr > 0 || atomic_load_explicit(&dev->sched.faulted, memory_order_acquire))
    return ruda__fail(RUDA_EUNHEALTHY, "%s: %s holds %u unreported error(s); drain them with ruda_flush",
                      fn, RUDA__SNAME(s->id), nerr);
  ruda__profile *p = malloc(sizeof *p);
  if (p == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  if ((rc = ruda__push_control(&dev->sched, s, RUDA__CMD_STAMP, 0, fn, &p->start)) != 0) {
    free(p);
    return rc;
  }
  p->id = atomic_fetch_add_explicit(&next_token, 1, memory_order_relaxed);
  pthread_mutex_lock(&s->err_lock);
  p->next = s->profiles;
  s->profiles = p;
  pthread_mutex_unlock(&s->err_lock);
  token->id = p->id;
  return 0;
}

int ruda_profile_end(ruda_device *dev, ruda_stream_id stream, ruda_profile_token token, uint64_t *ns,
                     ruda_error **errors) {
  static const char fn[] = "ruda_profile_end";
  if (errors) *errors = NULL;
  if (ns) *ns = 0;
  RUDA__CHECK_DEV(dev, fn);
  if (ns == NULL) return ruda__fail(RUDA_EINVAL, "%s: ns is NULL", fn);
  int rc = 0;
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, fn, &rc);
  if (s == NULL) return rc;
  if ((rc = usable(s, fn)) != 0) return rc;
  pthread_mutex_lock(&s->err_lock);
  ruda__profile **link = &s->profiles;
  while (*link != NULL && (*link)->id != token.id) link = &(*link)->next;
  ruda__profile *p = *link;
  if (p != NULL) *link = p->next;
  pthread_mutex_unlock(&s->err_lock);
  if (p == NULL)
    return ruda__fail(RUDA_EPROFILETOKEN, "%s: token %llu was not handed out by %s, or was ended already",
                      fn, (unsigned long long)token.id, RUDA__SNAME(s->id));
  ruda_future *end = NULL;
  if ((rc = ruda__push_control(&dev->sched, s, RUDA__CMD_STAMP, 1, fn, &end)) != 0) {
    ruda_future_free(p->start);
    free(p);
    return rc;
  }
  ruda_error *errs = NULL;
  int wrc = ruda_future_wait(end, &errs);
  /* The start completed before the end (stream order): this returns at once. */
  int src = ruda_future_wait(p->start, NULL);
  if (wrc == 0 && src == 0) {
    void *e0 = p->start->completion.event, *e1 = end->completion.event;
    if (e0 != NULL && e1 != NULL && dev->sched.backend.ops->elapsed != NULL) {
      double ms = 0;
      if ((rc = dev->sched.backend.ops->elapsed(dev->sched.backend.state, e0, e1, &ms)) == 0) *ns = (uint64_t)(ms * 1e6 + 0.5);
    } else {
      *ns = end->stamp_ns - p->start->stamp_ns;
    }
  } else {
    rc = ruda__fail(RUDA_EPROFILE, "%s: %s failed while profiled (%s); its errors are in *errors", fn,
                    RUDA__SNAME(s->id), ruda_err_name(wrc != 0 ? wrc : src));
  }
  if (errors) *errors = errs;
  else ruda_error_free(errs);
  ruda_future_free(end);
  ruda_future_free(p->start);
  free(p);
  return rc;
}

void ruda__profiles_free(ruda__stream *s, void *arg) {
  (void)arg;
  while (s->profiles != NULL) {
    ruda__profile *p = s->profiles;
    s->profiles = p->next;
    ruda_future_free(p->start);
    free(p);
  }
}

int ruda_range_push(const char *name) {
  if (name == NULL) return ruda__fail(RUDA_EINVAL, "ruda_range_push: name is NULL");
  ruda__nvtx_range_push(name);
  return 0;
}

void ruda_range_pop(void) { ruda__nvtx_range_pop(); }

int ruda_trace_start(ruda_device *dev, const char *path) {
  static const char fn[] = "ruda_trace_start";
  RUDA__CHECK_DEV(dev, fn);
  if (path == NULL || *path == '\0') return ruda__fail(RUDA_EINVAL, "%s: path is %s", fn, path ? "empty" : "NULL");
  return ruda__trace_start(&dev->sched, path, fn);
}

int ruda_trace_stop(ruda_device *dev) {
  static const char fn[] = "ruda_trace_stop";
  RUDA__CHECK_DEV(dev, fn);
  return ruda__trace_stop(&dev->sched, fn);
}

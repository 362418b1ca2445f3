/* call.c - ruda_call (ruda/call.h): the caller's library function as a
 * stream command. Built like a launch (each buffer pinned and ordered by
 * its access mode, recorded while the stream captures); the worker runs
 * it (scheduler/libcall.c). ruda_library_register: the registry there. */
#include <stdio.h>
#include <string.h>

#include "scheduler/graph.h"
#include "scheduler/libcall.h"
#include "scheduler/submit.h"
#include "src/api.h"

/* Messages name the call: `ruda_call "gemm1": ...`. */
#define WHO "ruda_call \"%.*s\""
#define WHO_ARGS(name) RUDA_CALL_NAME_MAX - 1, (name)

/* What can be checked without a stream: 0, or a failure naming the call. */
static int check_desc(const ruda_call_desc *d, const char *name) {
  if (d->fn == NULL) return ruda__fail(RUDA_EINVAL, WHO ": fn is NULL", WHO_ARGS(name));
  if (d->nbuffers > RUDA_MAX_ARGS)
    return ruda__fail(RUDA_EINVAL, WHO ": %u buffers, at most %d", WHO_ARGS(name), d->nbuffers, RUDA_MAX_ARGS);
  if (d->nbuffers > 0 && d->buffers == NULL)
    return ruda__fail(RUDA_EINVAL, WHO ": buffers is NULL with nbuffers %u", WHO_ARGS(name), d->nbuffers);
  if (d->data_size > RUDA_CALL_MAX_DATA)
    return ruda__fail(RUDA_EINVAL, WHO ": data_size %u exceeds %d bytes", WHO_ARGS(name), d->data_size,
                      RUDA_CALL_MAX_DATA);
  if (d->data_size > 0 && d->data == NULL)
    return ruda__fail(RUDA_EINVAL, WHO ": data is NULL with data_size %u", WHO_ARGS(name), d->data_size);
  if (d->flags & ~RUDA_CALL_NOT_CAPTURABLE)
    return ruda__fail(RUDA_EINVAL, WHO ": unknown flags 0x%x", WHO_ARGS(name), d->flags);
  for (int i = 1; i < 4; i++) /* reserved[0] is library */
    if (d->reserved[i] != 0) return ruda__fail(RUDA_EINVAL, WHO ": reserved[%d] is not zero", WHO_ARGS(name), i);
  for (uint32_t i = 0; i < d->nbuffers; i++) {
    const ruda_arg_kind k = d->buffers[i].kind;
    if (k != RUDA_ARG_BUFFER && k != RUDA_ARG_BUFFER_IN && k != RUDA_ARG_BUFFER_OUT)
      return ruda__fail(RUDA_EINVAL,
                        WHO ": buffer %u has kind %d; a call takes buffers only (ruda_arg_in, ruda_arg_out, "
                        "ruda_arg_buffer), its other bytes through data",
                        WHO_ARGS(name), i, (int)k);
  }
  return 0;
}

/* A failure recorded by code shared with the other calls, which names the
 * call "ruda_call": again with the call's name. Only on failure, so the
 * name is never formatted on the way of a call that is accepted. */
static int named(int rc, const char *name) {
  const ruda_error *e = ruda_last_error();
  const char *m = ruda_error_message(e);
  if (strncmp(m, "ruda_call: ", 11) == 0) m += 11;
  char rest[RUDA__MSG_MAX];
  snprintf(rest, sizeof rest, "%s", m); /* ruda__fail rewrites what m points at */
  return ruda__fail_backend(rc, ruda_error_backend_code(e), WHO ": %s", WHO_ARGS(name), rest);
}

int ruda_call(ruda_device *dev, ruda_stream_id stream, const ruda_call_desc *d) {
  RUDA__CHECK_DEV(dev, "ruda_call");
  if (d == NULL) return ruda__fail(RUDA_EINVAL, "ruda_call: desc is NULL");
  const char *name = d->name != NULL ? d->name : "call";
  int rc = check_desc(d, name);
  if (rc != 0) return rc;
  if (d->library != 0 && (d->library > RUDA_LIBRARY_MAX || !ruda__library_known(&dev->sched, (uint32_t)d->library)))
    return ruda__fail(RUDA_EINVAL, WHO ": library %llu is not registered on this device", WHO_ARGS(name),
                      (unsigned long long)d->library);
  ruda__stream *s = ruda__stream_for(&dev->sched, stream, "ruda_call", &rc);
  if (s == NULL) return named(rc, name);
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  if (capturing && (d->flags & RUDA_CALL_NOT_CAPTURABLE))
    return ruda__fail(RUDA_EGRAPHSTATE,
                      WHO ": %s is capturing a graph, and the call is marked RUDA_CALL_NOT_CAPTURABLE; nothing "
                          "was recorded or run (the capture stays open)",
                      WHO_ARGS(name), RUDA__SNAME(s->id));

  /* One allocation: header, pins, addresses, sizes, data (its address
   * rounded up to RUDA_CALL_DATA_ALIGN, the slack allocated). */
  const uint32_t n = d->nbuffers;
  const size_t addr_off = ((size_t)n * sizeof(uint32_t) + 7) & ~(size_t)7;
  const size_t size_off = addr_off + (size_t)n * sizeof(uint64_t);
  const size_t data_min = size_off + (size_t)n * sizeof(uint64_t);
  ruda__cmd *cmd = ruda__cmd_alloc(data_min + (d->data_size ? RUDA_CALL_DATA_ALIGN - 1 + d->data_size : 0));
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, WHO ": out of host memory", WHO_ARGS(name));
  unsigned char *extra = ruda__cmd_extra(cmd);
  const size_t data_off =
      data_min + ((RUDA_CALL_DATA_ALIGN - ((uintptr_t)(extra + data_min) % RUDA_CALL_DATA_ALIGN)) % RUDA_CALL_DATA_ALIGN);
  cmd->pins = (uint32_t *)extra;
  uint64_t *addr = (uint64_t *)(extra + addr_off), *size = (uint64_t *)(extra + size_off);
  uint32_t pinned = 0;
  ruda__order o;
  ruda__order_init(&o);
  for (uint32_t i = 0; i < n; i++) {
    const ruda_arg *a = &d->buffers[i];
    const int read = a->kind == RUDA_ARG_BUFFER_IN;
    if ((rc = ruda__pin_binding(&dev->sched, s, a->binding, "ruda_call", "buffer", (int)i, &addr[i], &size[i], &o,
                                capturing, read ? RUDA__USE_READ : RUDA__USE_WRITE)) != 0) {
      rc = named(rc, name);
      goto fail;
    }
    cmd->pins[pinned++] = a->binding.handle.slot | (read ? RUDA__PIN_READ : 0);
  }
  cmd->kind = RUDA__CMD_CALL;
  cmd->npins = (uint8_t)pinned;
  ruda__libcall_cmd *c = &cmd->u.call;
  c->fn = d->fn;
  c->user = d->user;
  c->addr = addr;
  c->size = size;
  c->nbuf = n;
  c->stream = s->id;
  c->data_size = d->data_size;
  c->library = (uint32_t)d->library;
  c->data = NULL;
  if (d->data_size > 0) {
    memcpy(extra + data_off, d->data, d->data_size);
    c->data = extra + data_off;
  }
  size_t len = strnlen(name, RUDA_CALL_NAME_MAX - 1);
  memcpy(c->name, name, len);
  c->name[len] = '\0';
  if (capturing && (rc = ruda__capture_record(s, cmd)) <= 0) {
    ruda__order_abandon(&o); /* recorded, not pushed: replays order themselves */
    if (rc == 0) return 0;
    goto fail;
  }
  if ((rc = ruda__submit(&dev->sched, s, cmd, &o)) == 0) return 0;
fail:
  ruda__order_abandon(&o);
  ruda__unpin_all(&dev->sched, cmd->pins, pinned);
  ruda__cmd_free(cmd);
  return rc;
}

int ruda_library_register(ruda_device *dev, const ruda_library_desc *d, uint32_t *id) {
  RUDA__CHECK_DEV(dev, "ruda_library_register");
  if (d == NULL || id == NULL) return ruda__fail(RUDA_EINVAL, "ruda_library_register: desc or id is NULL");
  const char *name = d->name != NULL ? d->name : "library";
  if (d->create == NULL)
    return ruda__fail(RUDA_EINVAL, "ruda_library_register \"%.*s\": create is NULL", WHO_ARGS(name));
  for (int i = 0; i < 4; i++)
    if (d->reserved[i] != 0)
      return ruda__fail(RUDA_EINVAL, "ruda_library_register \"%.*s\": reserved[%d] is not zero", WHO_ARGS(name), i);
  return ruda__library_add(&dev->sched, d, id);
}

/* call.c - ruda_call (ruda/call.h): the caller's library function as a
 * stream command. Built like a launch (each buffer pinned and ordered by
 * its access mode, recorded while the stream captures); the worker runs
 * it (scheduler/libcall.c). */
#include <stdio.h>
#include <string.h>

#include "scheduler/graph.h"
#include "scheduler/submit.h"
#include "src/api.h"

static void unpin(ruda_device *dev, const uint32_t *pins, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) ruda__handles_unpin(&dev->handles, ruda__pin_slot(pins[i]), NULL);
}

/* What can be checked without a stream: 0, or a failure naming the call. */
static int check_desc(const ruda_call_desc *d, const char *who) {
  if (d->fn == NULL) return ruda__fail(RUDA_EINVAL, "%s: fn is NULL", who);
  if (d->nbuffers > RUDA_MAX_ARGS)
    return ruda__fail(RUDA_EINVAL, "%s: %u buffers, at most %d", who, d->nbuffers, RUDA_MAX_ARGS);
  if (d->nbuffers > 0 && d->buffers == NULL)
    return ruda__fail(RUDA_EINVAL, "%s: buffers is NULL with nbuffers %u", who, d->nbuffers);
  if (d->data_size > RUDA_CALL_MAX_DATA)
    return ruda__fail(RUDA_EINVAL, "%s: data_size %u exceeds %d bytes", who, d->data_size, RUDA_CALL_MAX_DATA);
  if (d->data_size > 0 && d->data == NULL)
    return ruda__fail(RUDA_EINVAL, "%s: data is NULL with data_size %u", who, d->data_size);
  if (d->flags & ~RUDA_CALL_NOT_CAPTURABLE)
    return ruda__fail(RUDA_EINVAL, "%s: unknown flags 0x%x", who, d->flags);
  for (int i = 0; i < 4; i++)
    if (d->reserved[i] != 0) return ruda__fail(RUDA_EINVAL, "%s: reserved[%d] is not zero", who, i);
  for (uint32_t i = 0; i < d->nbuffers; i++) {
    const ruda_arg_kind k = d->buffers[i].kind;
    if (k != RUDA_ARG_BUFFER && k != RUDA_ARG_BUFFER_IN && k != RUDA_ARG_BUFFER_OUT)
      return ruda__fail(RUDA_EINVAL,
                        "%s: buffer %u has kind %d; a call takes buffers only (ruda_arg_in, ruda_arg_out, "
                        "ruda_arg_buffer), its other bytes through data",
                        who, i, (int)k);
  }
  return 0;
}

int ruda_call(ruda_device *dev, ruda_stream_id stream, const ruda_call_desc *d) {
  RUDA__CHECK_DEV(dev, "ruda_call");
  if (d == NULL) return ruda__fail(RUDA_EINVAL, "ruda_call: desc is NULL");
  const char *name = d->name != NULL ? d->name : "call";
  char who[RUDA_CALL_NAME_MAX + 16];
  snprintf(who, sizeof who, "ruda_call \"%.*s\"", RUDA_CALL_NAME_MAX - 1, name);
  int rc = check_desc(d, who);
  if (rc != 0) return rc;
  ruda__stream *s = ruda__stream_for(dev, stream, who, &rc);
  if (s == NULL) return rc;
  const int capturing = atomic_load_explicit(&s->capturing, memory_order_acquire);
  if (capturing && (d->flags & RUDA_CALL_NOT_CAPTURABLE))
    return ruda__fail(RUDA_EGRAPHSTATE,
                      "%s: %s is capturing a graph, and the call is marked RUDA_CALL_NOT_CAPTURABLE; nothing was "
                      "recorded or run (the capture stays open)",
                      who, RUDA__SNAME(s->id));

  /* One allocation: header, pins, addresses, sizes, data. */
  const uint32_t n = d->nbuffers;
  const size_t addr_off = ((size_t)n * sizeof(uint32_t) + 7) & ~(size_t)7;
  const size_t size_off = addr_off + (size_t)n * sizeof(uint64_t);
  const size_t data_off = size_off + (size_t)n * sizeof(uint64_t);
  ruda__cmd *cmd = ruda__cmd_alloc(data_off + d->data_size);
  if (cmd == NULL) return ruda__fail(RUDA_ENOMEM, "%s: out of host memory", who);
  unsigned char *extra = ruda__cmd_extra(cmd);
  cmd->pins = (uint32_t *)extra;
  uint64_t *addr = (uint64_t *)(extra + addr_off), *size = (uint64_t *)(extra + size_off);
  uint32_t pinned = 0;
  ruda__order o;
  ruda__order_init(&o);
  for (uint32_t i = 0; i < n; i++) {
    const ruda_arg *a = &d->buffers[i];
    const int read = a->kind == RUDA_ARG_BUFFER_IN;
    if ((rc = ruda__pin_binding(dev, s, a->binding, who, "buffer", (int)i, &addr[i], &size[i], &o, capturing,
                                read ? RUDA__USE_READ : RUDA__USE_WRITE)) != 0)
      goto fail;
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
  c->data_size = d->data_size;
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
  if ((rc = ruda__submit(dev, s, cmd, &o)) == 0) return 0;
fail:
  ruda__order_abandon(&o);
  unpin(dev, cmd->pins, pinned);
  ruda__cmd_free(cmd);
  return rc;
}

/* graph.h - graph capture and replay (scheduler/graph.c; the public
 * calls are in src/graph.c).
 *
 * Capture happens on the client side: while a stream captures, a launch or
 * copy built for it is appended to the stream's recording, with its pins,
 * instead of being pushed. end_capture turns the recording into a graph;
 * a replay is one RUDA__CMD_GRAPH command that the worker runs through
 * the backend's graph_replay op (cuda: capture the recorded commands on
 * the worker's stream once, instantiate, then cuGraphLaunch), or, where
 * the backend has none (host), by running the recorded commands in order.
 *
 * Memory: every buffer a recorded command pins is marked held by the pin
 * itself (handles.h), so a free never hands its memory back at once; the
 * graph's pins drop when its last reference does, and the memory then
 * follows the usual rules (pool.c), with each worker that replayed the
 * graph counted as a user. */
#ifndef RUDA_CAPTURE_H
#define RUDA_CAPTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "memory/handles.h"
#include "scheduler/scheduler.h"

struct ruda__sched;

/* A stream's recording. Made at its first begin_capture, freed with the
 * stream, so a client that saw `capturing` set may always lock it. */
typedef struct ruda__capture {
  pthread_mutex_t lock;
  int open;
  ruda__cmd **cmds;
  uint32_t n, cap;
} ruda__capture;

/* One patch of a replay (ruda_graph_replay_with), checked and resolved by
 * the client: what the worker applies to recorded command `cmd`. */
typedef struct ruda__graph_fix {
  uint32_t cmd;
  uint32_t kind;  /* ruda_graph_patch_kind */
  uint32_t index; /* RUDA_GRAPH_PATCH_ARG: the argument */
  uint32_t size;  /* a scalar's bytes */
  uint64_t addr;  /* a buffer's device address */
  void *host;     /* an upload's source or a download's destination */
  const unsigned char *bytes; /* a scalar's, in the replay command */
  ruda_dim3 grid;
} ruda__graph_fix;

/* A patch the backend's graph holds (fix.bytes NULL). A scalar's bytes
 * are kept by value up to sizeof bytes; a longer one is never taken as
 * held, so the next replay sets it again. */
typedef struct ruda__graph_held {
  ruda__graph_fix fix;
  int kept; /* a scalar's bytes are in bytes */
  unsigned char bytes[16];
} ruda__graph_held;

struct ruda_graph {
  struct ruda_graph *next, *prev; /* the device's list, for close */
  struct ruda__sched *sch;
  _Atomic uint32_t refs; /* the owner's, and one per queued replay */
  ruda__cmd **cmds;
  uint32_t n;
  uint32_t *slots; /* every buffer the commands use, once */
  uint32_t nslots;
  /* For replays with patches: command i's pins are pins[pin_base[i] ..
   * pin_base[i + 1]) of the commands in order, pin k's buffer is
   * slots[pin_slot[k]], and slot_uses[u] counts the pins of slots[u]. */
  uint32_t *pin_base, *pin_slot, *slot_uses;
  pthread_mutex_t exec_lock; /* the backend's graph is made at first replay */
  void *exec;
  /* Under exec_lock: the patches the backend's graph holds (the last
   * replay's, sorted by command; a scalar's bytes by value), which the
   * next replay puts back unless it patches them too, and leaves where it
   * patches a command exactly so again (graph.c, changed_list). */
  ruda__graph_held held[RUDA_GRAPH_MAX_PATCHES];
  uint32_t nheld;
  ruda_stream_id stream; /* captured on, for messages */
  /* A use record of the graph itself (memory/handles.h's words),
   * which every replay writes: replays of one graph are ordered one after
   * another like writes of one buffer, whatever streams issue them. The
   * lock makes each replay's issue (note, queue, publish) whole, so two
   * threads replaying at once still see each other. */
  _Atomic uint64_t replays[RUDA__USE_WORDS];
  pthread_mutex_t issue_lock;
  /* An automatic graph's template on a backend with graph_build: made by
   * the device's builder (scheduler/builder.c), RUDA__BUILD_*; replayed
   * only once READY. build_next: the builder's queue, under its lock. */
  _Atomic int build;
  struct ruda_graph *build_next;
};

enum { RUDA__BUILD_NONE = 0, RUDA__BUILD_QUEUED, RUDA__BUILD_READY, RUDA__BUILD_FAILED };

/* The builder: makes g's backend graph with the backend's graph_build on
 * ws (the builder's own worker state), unless it has one. Takes
 * g->exec_lock. */
int ruda__graph_build(struct ruda__sched *sch, void *ws, ruda_graph *g, ruda_error **err);

/* The stream's recording, made at first use (NULL without memory). */
ruda__capture *ruda__capture_get(ruda__stream *s);
/* Drops the pins of recorded commands and frees them. */
void ruda__capture_discard(struct ruda__sched *sch, ruda__cmd **cmds, uint32_t n, void *wstate);

/* Client, with s capturing when the command's buffers were pinned: appends
 * cmd to the recording. 1 when the capture ended meanwhile (the caller
 * then submits cmd as usual), 0 when recorded, or a failure. */
int ruda__capture_record(ruda__stream *s, ruda__cmd *cmd);

/* Exec holder of ln's worker: issues g's commands on lane ln with
 * fix[0..nfix) (sorted by command) applied: in order on a backend without
 * graph_replay (stopping at a failure), else as one backend graph,
 * captured at the first run and patched after. 0, or a code with *err and
 * in *failed the command that failed (from 1; 0: none in particular). */
int ruda__graph_run(ruda__lane *ln, struct ruda_graph *g, const ruda__graph_fix *fix, uint32_t nfix,
                    uint32_t *failed, ruda_error **err);
/* Exec holder: runs a RUDA__CMD_GRAPH command on its stream's lane.
 * Returns 0 or a code with *err. */
int ruda__graph_execute(ruda__cmd *cmd, ruda_error **err);
/* A graph with no commands yet: sch, the stream it is of (for messages),
 * one reference (its owner's), its locks. NULL without host memory. Any
 * thread, non-blocking. */
struct ruda_graph *ruda__graph_new(struct ruda__sched *sch, ruda_stream_id stream);
/* Frees a graph nobody references (NULL: nothing): the backend's graph,
 * the commands and their pins, the pin tables, the locks. wstate: the
 * calling worker's, or NULL on a client. */
void ruda__graph_free(struct ruda_graph *g, void *wstate);
/* Drops one reference; the last frees the graph (its pins go). wstate:
 * the calling worker's, or NULL on a client. */
void ruda__graph_unref(struct ruda_graph *g, void *wstate);

/* Device close, after the workers stopped: ruda__capture_close discards
 * stream s's open recording (sch: the struct ruda__sched, for walking the
 * stream table with ruda__streams_each), then ruda__graphs_close destroys
 * every graph the application did not. */
void ruda__capture_close(ruda__stream *s, void *sch);
void ruda__graphs_close(struct ruda__sched *sch);
/* Frees a stream's recording (empty by then). */
void ruda__capture_free(ruda__capture *c);

#endif /* RUDA_CAPTURE_H */

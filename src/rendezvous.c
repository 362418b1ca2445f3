/* rendezvous.c - how the ranks of a communicator in several processes
 * find each other without MPI: the id rank 0 made reaches the others
 * through a file or a TCP connection, and the environment a launcher such
 * as torchrun sets names the rank (ruda/comm.h).
 *
 * Blocking, every wait bounded by RUDA_COMM_TIMEOUT; thread-safe (no
 * shared state). Integers are little endian on every machine ruda builds
 * for.
 *
 * tcp: rank 0 listens on the address given, and nothing else. Each
 * connection is challenged first (a fresh nonce); a peer proves it belongs
 * to the job with an HMAC-SHA-256, under the job's key, of both nonces and
 * its hello (nranks, rank); rank 0 answers with a tag of its own, and the
 * id travels encrypted under a key stream of the same key. Anything that
 * does not prove itself within HANDSHAKE_MS (or at once, if it sends a bad
 * tag) is dropped and never holds a rank's place. Rank 0 keeps each
 * joined rank's connection open, so a rank that gave up (closed) no longer
 * counts; once every rank joined it sends the id, collects an
 * acknowledgement from each (with the time each has left) and then one
 * verdict for all: commit, only if every rank still has time to receive it,
 * else the reason it gave up. A rank returns 0 only on a commit, so all
 * ranks return the same. The key: RUDA_COMM_SECRET when set, else the
 * launcher's job id (docs/collectives.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/comm_timeout.h"
#include "base/parse.h"
#include "base/sha256.h"
#include "base/sync.h"
#include "src/device.h"

#define MAGIC 0x41445552u /* "RUDA" */
#define NONCE 16
#define TAG RUDA__SHA256_BYTES
#define HANDSHAKE_MS 1000u /* a connection that has not proved itself by then is dropped */
#define MAX_PENDING 64      /* connections proving themselves at once; the oldest goes first */
#define COMMIT_MARGIN_MS 100u

static uint64_t now_ms(void) { return ruda__now_ns() / 1000000u; }

static void pause_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The deadline limit ms from now; UINT64_MAX for 0 (for ever). */
static uint64_t deadline(uint64_t limit) { return limit ? now_ms() + limit : UINT64_MAX; }

/* ---- file ---- */

/* The file the others read: a file: rendezvous carries only the id and
 * nranks (the file system's permissions guard it). */
typedef struct file_answer {
  uint32_t magic, nranks;
  uint32_t refused; /* unused; kept so files stay the same size */
  ruda_comm_id id;
} file_answer;

static int file_publish(const char *path, const file_answer *a, const char *fn) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return ruda__fail(RUDA_EINVAL, "%s: path too long", fn);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ruda__fail(RUDA_EIO, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
  int ok = write(fd, a, sizeof *a) == (ssize_t)sizeof *a;
  ok = close(fd) == 0 && ok;
  /* Whole or not at all: the others never read half an id. */
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return ruda__fail(RUDA_EIO, "%s: cannot write %s: %s", fn, path, strerror(e));
  }
  return 0;
}

static int file_read(const char *path, file_answer *a, uint64_t limit, const char *fn) {
  const uint64_t until = deadline(limit);
  for (unsigned wait = 1;; wait = wait < 50 ? 2 * wait : 50) {
    /* Non-blocking: opening a FIFO nobody writes would wait for ever. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ruda__fail(RUDA_EINVAL, "%s: %s is not a regular file (rank 0 writes the id there)", fn, path);
      }
      ssize_t got = read(fd, a, sizeof *a);
      close(fd);
      if (got == (ssize_t)sizeof *a && a->magic == MAGIC) return 0;
      return ruda__fail(RUDA_EINVAL, "%s: %s is not a ruda rendezvous file (or rank 0 is writing it)", fn, path);
    }
    if (errno != ENOENT) return ruda__fail(RUDA_EIO, "%s: cannot read %s: %s", fn, path, strerror(errno));
    if (now_ms() > until)
      return ruda__fail(RUDA_ETIMEDOUT, "%s: rank 0 did not write %s within %llu ms (RUDA_COMM_TIMEOUT)", fn, path,
                        (unsigned long long)limit);
    pause_ms(wait);
  }
}

/* ---- tcp: messages ---- */

enum { MSG_CHALLENGE = 1, MSG_HELLO, MSG_ANSWER, MSG_ACK, MSG_VERDICT, MSG_STRANGER };
enum { ANSWER_OK = 0, ANSWER_WRONG_SIZE, ANSWER_NO_RANK, ANSWER_TWICE };

typedef struct challenge {
  uint32_t magic, kind;
  uint8_t nonce[NONCE]; /* rank 0's */
} challenge;

typedef struct hello {
  uint32_t magic, kind, nranks, rank;
  uint8_t nonce[NONCE]; /* the peer's */
  uint8_t tag[TAG];     /* over rank 0's nonce and the fields above */
} hello;

typedef struct ack {
  uint32_t magic, kind;
  uint32_t left_ms; /* the peer's time left when it sent this; UINT32_MAX: for ever */
  uint32_t pad;
  uint8_t tag[TAG];
} ack;

/* Everything rank 0 sends after its challenge: an answer, a verdict, or
 * (untagged) the word that the peer did not prove itself. */
typedef struct reply {
  uint32_t magic, kind, nranks;
  uint32_t status;        /* answer: ANSWER_*; verdict: 0 (commit) or the RUDA_E* code rank 0 failed with */
  uint8_t id[sizeof(ruda_comm_id)]; /* answer: encrypted */
  uint8_t tag[TAG];
} reply;

typedef struct job_key {
  uint8_t k[TAG];
  const char *source; /* for messages */
} job_key;

/* RUDA_COMM_SECRET, else the first job id a launcher set. */
static void job_key_get(job_key *key) {
  static const char *const vars[] = {"RUDA_COMM_SECRET", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE",
                                     "OMPI_MCA_ess_base_jobid"};
  const char *v = "";
  key->source = "no RUDA_COMM_SECRET nor launcher job id (an empty key)";
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *x = getenv(vars[i]);
    if (x != NULL && *x != '\0') {
      v = x;
      key->source = vars[i];
      break;
    }
  }
  ruda__sha256 s;
  ruda__sha256_init(&s);
  ruda__sha256_update(&s, "ruda rendezvous key v1", 23);
  ruda__sha256_update(&s, key->source, strlen(key->source) + 1);
  ruda__sha256_update(&s, v, strlen(v));
  ruda__sha256_final(&s, key->k);
}

/* The tag of a message: both nonces (n1 NULL before the peer has one)
 * and the message's bytes before its tag. */
static void tag_of(const job_key *key, const uint8_t *n0, const uint8_t *n1, const void *msg, size_t len,
                   uint8_t out[TAG]) {
  ruda__hmac m;
  ruda__hmac_init(&m, key->k, sizeof key->k);
  ruda__hmac_update(&m, n0, NONCE);
  if (n1 != NULL) ruda__hmac_update(&m, n1, NONCE);
  ruda__hmac_update(&m, msg, len);
  ruda__hmac_final(&m, out);
}

/* XORs the id with a key stream bound to both nonces (its own inverse). */
static void id_crypt(const job_key *key, const uint8_t *n0, const uint8_t *n1, uint8_t *id) {
  for (uint32_t blk = 0; blk * TAG < sizeof(ruda_comm_id); blk++) {
    uint8_t ks[TAG];
    ruda__hmac m;
    ruda__hmac_init(&m, key->k, sizeof key->k);
    ruda__hmac_update(&m, "id", 2);
    ruda__hmac_update(&m, n0, NONCE);
    ruda__hmac_update(&m, n1, NONCE);
    ruda__hmac_update(&m, &blk, sizeof blk);
    ruda__hmac_final(&m, ks);
    for (uint32_t i = 0; i < TAG && blk * TAG + i < sizeof(ruda_comm_id); i++) id[blk * TAG + i] ^= ks[i];
  }
}

static int nonce_new(uint8_t n[NONCE]) {
  size_t got = 0;
  while (got < NONCE) {
    ssize_t k = getrandom(n + got, NONCE - got, 0);
    if (k < 0 && errno != EINTR) return -1;
    if (k > 0) got += (size_t)k;
  }
  return 0;
}

/* ---- tcp: sockets ---- */

/* Reads or writes all n bytes before the deadline: 0, ETIMEDOUT, or why
 * not (ECONNRESET when the other side closed). */
static int io_all(int fd, void *p, size_t n, int out, uint64_t until) {
  char *b = p;
  while (n > 0) {
    struct pollfd pf = {fd, (short)(out ? POLLOUT : POLLIN), 0};
    uint64_t now = now_ms();
    if (now > until) return ETIMEDOUT;
    int left = until == UINT64_MAX ? 1000 : (int)(until - now > 1000 ? 1000 : until - now);
    int r = poll(&pf, 1, left);
    if (r < 0 && errno != EINTR) return errno;
    if (r <= 0) continue;
    ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, n, MSG_DONTWAIT);
    if (k == 0) return ECONNRESET;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno;
    }
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* One message to a socket with room for it: all of it now, or -1. */
static int send_now(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n ? 0 : -1;
}

/* "HOST:PORT" into an address; the host may be a name. */
static int resolve(const char *hostport, int passive, struct addrinfo **ai, const char *fn) {
  char host[256];
  const char *colon = strrchr(hostport, ':');
  if (colon == NULL || colon == hostport || (size_t)(colon - hostport) >= sizeof host || colon[1] == '\0')
    return ruda__fail(RUDA_EINVAL, "%s: \"%s\" is not HOST:PORT", fn, hostport);
  memcpy(host, hostport, (size_t)(colon - hostport));
  host[colon - hostport] = '\0';
  /* [v6]: the brackets are not part of the address. */
  char *h = host;
  size_t hl = strlen(h);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h[hl - 1] = '\0';
    h++;
  }
  struct addrinfo hints = {0};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  /* The host given, also for rank 0: it listens on that address only. */
  int e = getaddrinfo(h, colon + 1, &hints, ai);
  if (e == 0) return 0;
  const int code = e == EAI_MEMORY ? RUDA_ENOMEM : e == EAI_AGAIN || e == EAI_FAIL || e == EAI_SYSTEM ? RUDA_EIO : RUDA_EINVAL;
  return ruda__fail(code, "%s: cannot resolve %s: %s", fn, hostport,
                    e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
}

/* ---- tcp: rank 0 ---- */

enum { C_FREE = 0, C_PROVING, C_JOINED, C_ANSWERED, C_ACKED };

typedef struct conn {
  int fd, state;
  uint32_t rank;
  uint64_t until; /* C_PROVING: when it is dropped */
  uint64_t acked_at, left_ms;
  uint8_t n0[NONCE], n1[NONCE];
  size_t got;
  union {
    hello h;
    ack a;
  } in;
} conn;

typedef struct server {
  const char *fn, *hostport;
  uint32_t nranks, joined, acked;
  const ruda_comm_id *id;
  const job_key *key;
  conn pending[MAX_PENDING];
  conn *ranks; /* by rank; [0] unused */
} server;

static void conn_close(conn *c) {
  if (c->fd >= 0) close(c->fd);
  memset(c, 0, sizeof *c);
  c->fd = -1;
}

/* A rank that joined has gone (closed, or broke the protocol): its place
 * is free again. */
static void rank_gone(server *sv, conn *c) {
  if (c->state == C_ACKED) sv->acked--;
  sv->joined--;
  conn_close(c);
}

/* The same verdict for every rank that joined, then every socket closed:
 * code 0 commits. */
static void verdict_all(server *sv, int code) {
  for (uint32_t r = 1; r < sv->nranks; r++) {
    conn *c = &sv->ranks[r];
    if (c->state == C_FREE) continue;
    reply v;
    memset(&v, 0, sizeof v);
    v.magic = MAGIC;
    v.kind = MSG_VERDICT;
    v.nranks = sv->nranks;
    v.status = (uint32_t)code;
    tag_of(sv->key, c->n0, c->n1, &v, offsetof(reply, tag), v.tag);
    (void)send_now(c->fd, &v, sizeof v);
    conn_close(c);
  }
}

static int answer(server *sv, conn *c, uint32_t status) {
  reply a;
  memset(&a, 0, sizeof a);
  a.magic = MAGIC;
  a.kind = MSG_ANSWER;
  a.nranks = sv->nranks;
  a.status = status;
  if (status == ANSWER_OK) {
    memcpy(a.id, sv->id->bytes, sizeof a.id);
    id_crypt(sv->key, c->n0, c->n1, a.id);
  }
  tag_of(sv->key, c->n0, c->n1, &a, offsetof(reply, tag), a.tag);
  return send_now(c->fd, &a, sizeof a);
}

/* A connection just accepted: challenged at once (a fresh socket has room
 * for it), then it has HANDSHAKE_MS to prove itself. */
static void admit(server *sv, int fd, uint64_t until) {
  conn *slot = NULL, *oldest = NULL;
  for (int i = 0; i < MAX_PENDING && slot == NULL; i++) {
    conn *c = &sv->pending[i];
    if (c->state == C_FREE) slot = c;
    else if (oldest == NULL || c->until < oldest->until) oldest = c;
  }
  if (slot == NULL) { /* a flood: the oldest stranger makes room */
    conn_close(oldest);
    slot = oldest;
  }
  challenge ch = {MAGIC, MSG_CHALLENGE, {0}};
  uint64_t now = now_ms();
  if (nonce_new(ch.nonce) != 0 || send_now(fd, &ch, sizeof ch) != 0) {
    close(fd);
    return;
  }
  slot->fd = fd;
  slot->state = C_PROVING;
  slot->got = 0;
  memcpy(slot->n0, ch.nonce, NONCE);
  slot->until = now + HANDSHAKE_MS < until ? now + HANDSHAKE_MS : until;
}

/* Reads what a connection has sent: 1 once its message is whole, 0 while
 * not, -1 when it closed or errs. */
static int take(conn *c, size_t want) {
  for (;;) {
    ssize_t k = recv(c->fd, (char *)&c->in + c->got, want - c->got, MSG_DONTWAIT);
    if (k == 0) return -1;
    if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno == EINTR ? take(c, want) : -1;
    c->got += (size_t)k;
    if (c->got == want) return 1;
  }
}

/* A proving connection's whole hello: a stranger is dropped (told so,
 * untagged), a peer of the job either takes its rank's place or fails
 * the rendezvous (wrong size, no such rank, a rank joined twice). */
static int hello_in(server *sv, conn *c) {
  hello *h = &c->in.h;
  uint8_t t[TAG];
  tag_of(sv->key, c->n0, NULL, h, offsetof(hello, tag), t);
  if (h->magic != MAGIC || h->kind != MSG_HELLO || !ruda__bytes_equal(t, h->tag, TAG)) {
    reply no;
    memset(&no, 0, sizeof no);
    no.magic = MAGIC;
    no.kind = MSG_STRANGER;
    (void)send_now(c->fd, &no, sizeof no);
    conn_close(c);
    return 0;
  }
  memcpy(c->n1, h->nonce, NONCE);
  const uint32_t rank = h->rank, n = h->nranks;
  if (n != sv->nranks) {
    (void)answer(sv, c, ANSWER_WRONG_SIZE);
    conn_close(c);
    return ruda__fail(RUDA_EINVAL, "%s: rank %u was started for %u ranks, rank 0 for %u", sv->fn, rank, n,
                      sv->nranks);
  }
  if (rank == 0 || rank >= n) {
    (void)answer(sv, c, ANSWER_NO_RANK);
    conn_close(c);
    return ruda__fail(RUDA_EINVAL, "%s: a peer claims rank %u, which is no rank of %u but 0's", sv->fn, rank, n);
  }
  conn *place = &sv->ranks[rank];
  if (place->state != C_FREE) {
    /* Still there (quiet until answered), or gone without our noticing
     * yet: a closed socket polls readable. */
    struct pollfd pf = {place->fd, POLLIN, 0};
    if (poll(&pf, 1, 0) == 0) {
      (void)answer(sv, c, ANSWER_TWICE);
      conn_close(c);
      return ruda__fail(RUDA_EINVAL, "%s: rank %u joined twice", sv->fn, rank);
    }
    rank_gone(sv, place);
  }
  *place = *c;
  place->state = C_JOINED;
  place->rank = rank;
  place->got = 0;
  sv->joined++;
  memset(c, 0, sizeof *c);
  c->fd = -1;
  return 0;
}

static int ack_in(server *sv, conn *c, uint64_t now) {
  ack *a = &c->in.a;
  uint8_t t[TAG];
  tag_of(sv->key, c->n0, c->n1, a, offsetof(ack, tag), t);
  if (a->magic != MAGIC || a->kind != MSG_ACK || !ruda__bytes_equal(t, a->tag, TAG)) {
    rank_gone(sv, c);
    return 0;
  }
  c->state = C_ACKED;
  c->acked_at = now;
  c->left_ms = a->left_ms;
  sv->acked++;
  return 0;
}

/* Every rank has the id and is waiting: commit, if each still has time
 * to receive the verdict. */
static int decide(server *sv, uint64_t now) {
  for (uint32_t r = 1; r < sv->nranks; r++) {
    const conn *c = &sv->ranks[r];
    if (c->left_ms == UINT32_MAX) continue;
    if (c->acked_at + c->left_ms < now + COMMIT_MARGIN_MS)
      return ruda__fail(RUDA_ETIMEDOUT,
                        "%s: rank %u's RUDA_COMM_TIMEOUT ran out as the last rank joined at %s; every rank fails", sv->fn,
                        r, sv->hostport);
  }
  return 0;
}

static int serve_loop(server *sv, int ls, uint64_t limit) {
  const uint64_t until = deadline(limit);
  const nfds_t cap = 1 + MAX_PENDING + sv->nranks;
  struct pollfd *pf = calloc(cap, sizeof *pf);
  conn **who = calloc(cap, sizeof *who);
  int rc = pf == NULL || who == NULL ? ruda__fail(RUDA_ENOMEM, "%s: out of host memory", sv->fn) : 0;
  while (rc == 0) {
    uint64_t now = now_ms();
    if (now > until) {
      rc = sv->joined < sv->nranks - 1
               ? ruda__fail(RUDA_ETIMEDOUT, "%s: rank 0 heard from %u of %u ranks on %s within %llu ms (RUDA_COMM_TIMEOUT)",
                            sv->fn, sv->joined + 1, sv->nranks, sv->hostport, (unsigned long long)limit)
               : ruda__fail(RUDA_ETIMEDOUT,
                            "%s: %u of %u ranks confirmed the id on %s within %llu ms (RUDA_COMM_TIMEOUT)", sv->fn,
                            sv->acked + 1, sv->nranks, sv->hostport, (unsigned long long)limit);
      break;
    }
    /* Every rank joined: send the id to those that do not have it. */
    if (sv->joined == sv->nranks - 1)
      for (uint32_t r = 1; r < sv->nranks; r++) {
        conn *c = &sv->ranks[r];
        if (c->state != C_JOINED) continue;
        if (answer(sv, c, ANSWER_OK) != 0) rank_gone(sv, c);
        else c->state = C_ANSWERED;
      }
    if (sv->acked == sv->nranks - 1) {
      rc = decide(sv, now);
      break;
    }
    uint64_t next = until;
    nfds_t n = 0;
    pf[n] = (struct pollfd){ls, POLLIN, 0};
    who[n++] = NULL;
    for (int i = 0; i < MAX_PENDING; i++) {
      conn *c = &sv->pending[i];
      if (c->state == C_FREE) continue;
      if (c->until < now) { /* did not prove itself in time */
        conn_close(c);
        continue;
      }
      if (c->until < next) next = c->until;
      pf[n] = (struct pollfd){c->fd, POLLIN, 0};
      who[n++] = c;
    }
    for (uint32_t r = 1; r < sv->nranks; r++) {
      conn *c = &sv->ranks[r];
      if (c->state == C_FREE) continue;
      pf[n] = (struct pollfd){c->fd, POLLIN, 0};
      who[n++] = c;
    }
    uint64_t wait = next > now ? next - now : 0;
    int r = poll(pf, n, (int)(wait > 1000 ? 1000 : wait));
    if (r < 0 && errno != EINTR) {
      rc = ruda__fail(RUDA_EIO, "%s: rank 0 cannot wait on %s: %s", sv->fn, sv->hostport, strerror(errno));
      break;
    }
    if (r <= 0) continue;
    now = now_ms();
    for (nfds_t i = 1; i < n && rc == 0; i++) {
      conn *c = who[i];
      if (pf[i].revents == 0 || c->state == C_FREE) continue;
      if (c->state == C_PROVING) {
        int t = take(c, sizeof(hello));
        if (t < 0) conn_close(c);
        else if (t > 0) rc = hello_in(sv, c);
      } else if (c->state == C_ANSWERED) {
        int t = take(c, sizeof(ack));
        if (t < 0) rank_gone(sv, c);
        else if (t > 0) rc = ack_in(sv, c, now);
      } else {
        /* Joined or acked ranks send nothing more: this is their close. */
        rank_gone(sv, c);
      }
    }
    if (rc == 0 && (pf[0].revents & POLLIN))
      for (int k = 0; k < MAX_PENDING; k++) { /* take what the backlog holds, a bounded batch at a time */
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        admit(sv, fd, until);
      }
  }
  for (int i = 0; i < MAX_PENDING; i++) conn_close(&sv->pending[i]);
  verdict_all(sv, rc);
  free(pf);
  free(who);
  return rc;
}

/* Rank 0: listens on hostport's address and serves every other rank. */
static int tcp_serve(const char *hostport, uint32_t nranks, const ruda_comm_id *id, uint64_t limit, const char *fn) {
  struct addrinfo *ai = NULL;
  int rc = resolve(hostport, 1, &ai, fn);
  if (rc != 0) return rc;
  int ls = -1, err = 0;
  for (struct addrinfo *p = ai; p != NULL && ls < 0; p = p->ai_next) {
    ls = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol);
    if (ls < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* The kernel's largest backlog: a flood of strangers waits there
     * rather than turning the ranks away. */
    if (bind(ls, p->ai_addr, p->ai_addrlen) != 0 || listen(ls, SOMAXCONN) != 0) {
      err = errno;
      close(ls);
      ls = -1;
    }
  }
  freeaddrinfo(ai);
  if (ls < 0) return ruda__fail(RUDA_EIO, "%s: rank 0 cannot listen on %s: %s", fn, hostport, strerror(err ? err : EINVAL));
  job_key key;
  job_key_get(&key);
  server sv;
  memset(&sv, 0, sizeof sv);
  sv.fn = fn;
  sv.hostport = hostport;
  sv.nranks = nranks;
  sv.id = id;
  sv.key = &key;
  for (int i = 0; i < MAX_PENDING; i++) sv.pending[i].fd = -1;
  sv.ranks = calloc(nranks, sizeof *sv.ranks);
  if (sv.ranks == NULL) rc = ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn);
  else {
    for (uint32_t r = 0; r < nranks; r++) sv.ranks[r].fd = -1;
    rc = serve_loop(&sv, ls, limit);
  }
  free(sv.ranks);
  close(ls);
  return rc;
}

/* ---- tcp: the other ranks ---- */

/* A connection to rank 0 by the deadline, or -1 (refused, unreachable:
 * the caller retries). */
static int dial(const struct addrinfo *ai, uint64_t until) {
  for (const struct addrinfo *p = ai; p != NULL; p = p->ai_next) {
    int s = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol);
    if (s < 0) continue;
    if (connect(s, p->ai_addr, p->ai_addrlen) == 0) return s;
    if (errno == EINPROGRESS) {
      struct pollfd pf = {s, POLLOUT, 0};
      for (;;) {
        uint64_t now = now_ms();
        if (now > until) break;
        int r = poll(&pf, 1, until == UINT64_MAX ? 1000 : (int)(until - now > 1000 ? 1000 : until - now));
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        int e = 0;
        socklen_t el = sizeof e;
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0) return s;
        break;
      }
    }
    close(s);
  }
  return -1;
}

enum { ASK_DONE = 0, ASK_AGAIN = 1, ASK_LATE = 2 };

/* One conversation with rank 0: ASK_DONE with *id filled (committed),
 * ASK_AGAIN (rank 0 dropped us before answering: try again), ASK_LATE (the
 * deadline passed), or a failure every rank shares (negative, via
 * ruda__fail). */
static int ask_once(int s, uint32_t nranks, uint32_t rank, ruda_comm_id *id, const job_key *key, uint64_t until,
                    const char *hostport, const char *fn) {
  challenge ch;
  int e = io_all(s, &ch, sizeof ch, 0, until);
  if (e != 0) return e == ETIMEDOUT ? ASK_LATE : ASK_AGAIN;
  if (ch.magic != MAGIC || ch.kind != MSG_CHALLENGE)
    return ruda__fail(RUDA_EINVAL, "%s: %s answered, but is not a ruda rank 0", fn, hostport);
  hello h;
  memset(&h, 0, sizeof h);
  h.magic = MAGIC;
  h.kind = MSG_HELLO;
  h.nranks = nranks;
  h.rank = rank;
  if (nonce_new(h.nonce) != 0) return ruda__fail(RUDA_EIO, "%s: no random bytes for a nonce: %s", fn, strerror(errno));
  tag_of(key, ch.nonce, NULL, &h, offsetof(hello, tag), h.tag);
  reply a;
  if ((e = io_all(s, &h, sizeof h, 1, until)) != 0 || (e = io_all(s, &a, sizeof a, 0, until)) != 0)
    return e == ETIMEDOUT ? ASK_LATE : ASK_AGAIN;
  if (a.magic == MAGIC && a.kind == MSG_STRANGER)
    return ruda__fail(RUDA_EINVAL, "%s: rank 0 at %s did not accept rank %u's proof of membership: the ranks' keys "
                      "differ (this rank's: %s; set RUDA_COMM_SECRET alike on every rank)", fn, hostport, rank, key->source);
  uint8_t t[TAG];
  tag_of(key, ch.nonce, h.nonce, &a, offsetof(reply, tag), t);
  if (a.magic != MAGIC || !ruda__bytes_equal(t, a.tag, TAG) || (a.kind != MSG_ANSWER && a.kind != MSG_VERDICT))
    return ruda__fail(RUDA_EINVAL, "%s: %s answered rank %u, but not as this job's rank 0 (its key differs)", fn,
                      hostport, rank);
  if (a.kind == MSG_VERDICT) goto verdict; /* rank 0 gave up before everyone joined */
  if (a.status != ANSWER_OK)
    return ruda__fail(RUDA_EINVAL, "%s: rank 0 at %s refused rank %u of %u (it expects %u ranks, each once)", fn,
                      hostport, rank, nranks, a.nranks);
  memcpy(id->bytes, a.id, sizeof id->bytes);
  id_crypt(key, ch.nonce, h.nonce, id->bytes);
  ack k;
  memset(&k, 0, sizeof k);
  k.magic = MAGIC;
  k.kind = MSG_ACK;
  uint64_t now = now_ms();
  k.left_ms = until == UINT64_MAX ? UINT32_MAX : until > now ? (uint32_t)(until - now) : 0;
  tag_of(key, ch.nonce, h.nonce, &k, offsetof(ack, tag), k.tag);
  if ((e = io_all(s, &k, sizeof k, 1, until)) != 0 || (e = io_all(s, &a, sizeof a, 0, until)) != 0) {
    if (e == ETIMEDOUT) return ASK_LATE;
    return ruda__fail(RUDA_EIO, "%s: rank 0 at %s went away before confirming the id to rank %u", fn, hostport, rank);
  }
  tag_of(key, ch.nonce, h.nonce, &a, offsetof(reply, tag), t);
  if (a.magic != MAGIC || a.kind != MSG_VERDICT || !ruda__bytes_equal(t, a.tag, TAG))
    return ruda__fail(RUDA_EINVAL, "%s: %s answered rank %u, but not as this job's rank 0 (its key differs)", fn,
                      hostport, rank);
verdict:
  if (a.status == 0) return ASK_DONE;
  return ruda__fail((int)a.status, "%s: rank 0 at %s gave up (%s); so does rank %u", fn, hostport,
                    ruda_err_name((int)a.status), rank);
}

static int tcp_ask(const char *hostport, uint32_t nranks, uint32_t rank, ruda_comm_id *id, uint64_t limit,
                   const char *fn) {
  const uint64_t until = deadline(limit);
  struct addrinfo *ai = NULL;
  int rc = resolve(hostport, 0, &ai, fn);
  if (rc != 0) return rc;
  job_key key;
  job_key_get(&key);
  for (unsigned wait = 5;; wait = wait < 200 ? 2 * wait : 200) {
    int s = dial(ai, until);
    rc = ASK_AGAIN;
    if (s >= 0) {
      ruda_comm_id got;
      rc = ask_once(s, nranks, rank, &got, &key, until, hostport, fn);
      close(s);
      if (rc == ASK_DONE) *id = got;
    }
    if (rc <= 0) break; /* done, or a failure every rank shares */
    if (rc == ASK_LATE || now_ms() > until) {
      rc = ruda__fail(RUDA_ETIMEDOUT, "%s: rank %u could not reach rank 0 at %s within %llu ms (RUDA_COMM_TIMEOUT)",
                      fn, rank, hostport, (unsigned long long)limit);
      break;
    }
    pause_ms(wait);
  }
  freeaddrinfo(ai);
  return rc;
}

int ruda_comm_rendezvous(const char *where, uint32_t nranks, uint32_t rank, ruda_comm_id *id) {
  static const char fn[] = "ruda_comm_rendezvous";
  if (where == NULL || id == NULL) return ruda__fail(RUDA_EINVAL, "%s: %s is NULL", fn, where ? "id" : "where");
  if (nranks == 0 || rank >= nranks) return ruda__fail(RUDA_EINVAL, "%s: rank %u of %u ranks", fn, rank, nranks);
  int rc = ruda__comm_timeout_check(fn);
  if (rc != 0) return rc;
  const uint64_t limit = ruda__comm_timeout_ms();
  if (strncmp(where, "file:", 5) == 0 && where[5] != '\0') {
    const char *path = where + 5;
    if (rank != 0) {
      file_answer a;
      rc = file_read(path, &a, limit, fn);
      if (rc == 0 && a.nranks != nranks)
        rc = ruda__fail(RUDA_EINVAL, "%s: rank 0 wrote %s for %u ranks, rank %u was started for %u", fn, path, a.nranks,
                        rank, nranks);
      if (rc == 0) *id = a.id;
      return rc;
    }
    file_answer a = {MAGIC, nranks, 0, *id};
    return file_publish(path, &a, fn);
  }
  if (strncmp(where, "tcp:", 4) == 0) {
    if (nranks == 1) return 0; /* nobody to tell */
    return rank == 0 ? tcp_serve(where + 4, nranks, id, limit, fn) : tcp_ask(where + 4, nranks, rank, id, limit, fn);
  }
  return ruda__fail(RUDA_EINVAL, "%s: \"%s\" is neither file:PATH nor tcp:HOST:PORT", fn, where);
}

/* ---- the environment ---- */

static int env_u32(const char *name, uint32_t *out, int required, const char *fn) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') {
    if (!required) return 1;
    return ruda__fail(RUDA_EINVAL, "%s: %s is not set (the launcher sets RANK and WORLD_SIZE; torchrun and "
                      "mpirun-style launchers do)", fn, name);
  }
  uint64_t x;
  if (ruda__parse_u64(v, UINT32_MAX, &x) != 0)
    return ruda__fail(RUDA_EINVAL, "%s: %s=\"%s\" is not a number", fn, name, v);
  *out = (uint32_t)x;
  return 0;
}

int ruda_comm_env(uint32_t *rank, uint32_t *nranks, uint32_t *local_rank) {
  static const char fn[] = "ruda_comm_env";
  if (rank == NULL || nranks == NULL || local_rank == NULL)
    return ruda__fail(RUDA_EINVAL, "%s: an output pointer is NULL", fn);
  uint32_t r = 0, n = 0, l = 0;
  int rc;
  if ((rc = env_u32("RANK", &r, 1, fn)) != 0) return rc;
  if ((rc = env_u32("WORLD_SIZE", &n, 1, fn)) != 0) return rc;
  if ((rc = env_u32("LOCAL_RANK", &l, 0, fn)) < 0) return rc;
  if (n == 0 || r >= n) return ruda__fail(RUDA_EINVAL, "%s: RANK=%u with WORLD_SIZE=%u", fn, r, n);
  *rank = r;
  *nranks = n;
  *local_rank = l;
  return 0;
}

int ruda_comm_init_env(ruda_device *dev, ruda_comm **out) {
  static const char fn[] = "ruda_comm_init_env";
  if (out != NULL) *out = NULL;
  RUDA__CHECK_DEV(dev, fn);
  if (out == NULL) return ruda__fail(RUDA_EINVAL, "%s: out is NULL", fn);
  if (dev->sched.backend.ops->comm_id == NULL)
    return ruda__fail(RUDA_ENOBACKEND,
                      "%s: the %s backend reaches ranks in other processes only through a transport: launch with "
                      "mpirun and use ruda_mpi_comm_init (ruda/mpi.h)",
                      fn, dev->sched.backend.ops->name);
  uint32_t rank, nranks, local;
  int rc = ruda_comm_env(&rank, &nranks, &local);
  if (rc != 0) return rc;
  char where[600];
  const char *rv = getenv("RUDA_COMM_RENDEZVOUS");
  if (rv != NULL && *rv != '\0') {
    snprintf(where, sizeof where, "%s", rv);
  } else {
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (addr == NULL || *addr == '\0' || port == NULL || *port == '\0')
      return ruda__fail(RUDA_EINVAL, "%s: set RUDA_COMM_RENDEZVOUS (file:PATH or tcp:HOST:PORT), or MASTER_ADDR "
                        "and MASTER_PORT", fn);
    /* MASTER_PORT itself may be the launcher's own store: the next one. */
    uint64_t p;
    if (ruda__parse_u64(port, 65534, &p) != 0 || p == 0)
      return ruda__fail(RUDA_EINVAL, "%s: MASTER_PORT=\"%s\" is not a port", fn, port);
    snprintf(where, sizeof where, "tcp:%s:%llu", addr, (unsigned long long)p + 1);
  }
  ruda_comm_id id;
  memset(&id, 0, sizeof id);
  if (rank == 0 && (rc = ruda_comm_unique_id(dev, &id)) != 0) return rc;
  if ((rc = ruda_comm_rendezvous(where, nranks, rank, &id)) != 0) return rc;
  return ruda_comm_init_rank(dev, nranks, rank, &id, NULL, out);
}

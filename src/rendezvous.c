/* rendezvous.c - how the ranks of a communicator in several processes
 * find each other without MPI: the id rank 0 made reaches the others
 * through a file or a TCP connection, and the environment a launcher such
 * as torchrun sets names the rank (ruda/comm.h).
 *
 * Blocking, bounded by RUDA_COMM_TIMEOUT; thread-safe (no shared state).
 * The wire: a peer sends its hello (magic, nranks, rank), rank 0 answers
 * (magic, its nranks, refused or not, the id); a file holds the answer. Integers are little
 * endian on every machine ruda builds for; the magic catches anything else
 * listening on the port.
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/comm_timeout.h"
#include "base/sync.h"
#include "src/device.h"

#define MAGIC 0x41445552u /* "RUDA" */

typedef struct hello {
  uint32_t magic, nranks, rank;
} hello;

typedef struct answer {
  uint32_t magic, nranks; /* the ranks rank 0 was started for */
  uint32_t refused;       /* tcp: this peer's hello did not fit */
  ruda_comm_id id;
} answer;

static uint64_t now_ms(void) { return ruda__now_ns() / 1000000u; }

static void pause_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- file ---- */

static int file_publish(const char *path, const answer *a, const char *fn) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return ruda__fail(RUDA_EINVAL, "%s: path too long", fn);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

static int file_read(const char *path, answer *a, uint64_t limit, const char *fn) {
  const uint64_t until = limit ? now_ms() + limit : UINT64_MAX;
  for (unsigned wait = 1;; wait = wait < 50 ? 2 * wait : 50) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
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

/* ---- tcp ---- */

/* Reads or writes all n bytes before the deadline. */
static int io_all(int fd, void *p, size_t n, int out, uint64_t until) {
  char *b = p;
  while (n > 0) {
    struct pollfd pf = {fd, (short)(out ? POLLOUT : POLLIN), 0};
    uint64_t now = now_ms();
    if (now > until) return ETIMEDOUT;
    int left = until == UINT64_MAX ? -1 : (int)(until - now > 1000 ? 1000 : until - now);
    int r = poll(&pf, 1, left);
    if (r < 0 && errno != EINTR) return errno;
    if (r <= 0) continue;
    ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
    if (k == 0) return ECONNRESET;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno;
    }
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* "HOST:PORT" into an address; the host may be a name. */
static int resolve(const char *hostport, int passive, struct addrinfo **ai, const char *fn) {
  char host[256];
  const char *colon = strrchr(hostport, ':');
  if (colon == NULL || colon == hostport || (size_t)(colon - hostport) >= sizeof host || colon[1] == '\0')
    return ruda__fail(RUDA_EINVAL, "%s: \"%s\" is not HOST:PORT", fn, hostport);
  memcpy(host, hostport, (size_t)(colon - hostport));
  host[colon - hostport] = '\0';
  struct addrinfo hints = {0};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  int e = getaddrinfo(passive ? NULL : host, colon + 1, &hints, ai);
  if (e != 0) return ruda__fail(RUDA_EINVAL, "%s: cannot resolve %s: %s", fn, hostport, gai_strerror(e));
  return 0;
}

/* Rank 0: listens and answers every other rank once. */
static int tcp_serve(const char *hostport, uint32_t nranks, const ruda_comm_id *id, uint64_t limit, const char *fn) {
  struct addrinfo *ai = NULL;
  int rc = resolve(hostport, 1, &ai, fn);
  if (rc != 0) return rc;
  int ls = -1;
  for (struct addrinfo *p = ai; p != NULL && ls < 0; p = p->ai_next) {
    ls = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
    if (ls < 0) continue;
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, p->ai_addr, p->ai_addrlen) != 0 || listen(ls, (int)(nranks < 128 ? nranks : 128)) != 0) {
      rc = errno;
      close(ls);
      ls = -1;
    }
  }
  freeaddrinfo(ai);
  if (ls < 0) return ruda__fail(RUDA_EIO, "%s: rank 0 cannot listen on %s: %s", fn, hostport, strerror(rc ? rc : EINVAL));
  const uint64_t until = limit ? now_ms() + limit : UINT64_MAX;
  uint8_t *seen = calloc(nranks, 1);
  uint32_t served = 1;
  rc = seen == NULL ? ruda__fail(RUDA_ENOMEM, "%s: out of host memory", fn) : 0;
  while (rc == 0 && served < nranks) {
    struct pollfd pf = {ls, POLLIN, 0};
    uint64_t now = now_ms();
    if (now > until) {
      rc = ruda__fail(RUDA_ETIMEDOUT, "%s: rank 0 heard from %u of %u ranks on %s within %llu ms (RUDA_COMM_TIMEOUT)",
                      fn, served, nranks, hostport, (unsigned long long)limit);
      break;
    }
    if (poll(&pf, 1, until == UINT64_MAX ? 1000 : (int)(until - now > 1000 ? 1000 : until - now)) <= 0) continue;
    int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) continue;
    hello h;
    answer a = {MAGIC, nranks, 0, *id};
    /* Something other than a rank (a port scan, a stale peer): drop it. */
    if (io_all(s, &h, sizeof h, 0, now_ms() + 5000) == 0 && h.magic == MAGIC) {
      if (h.nranks != nranks) {
        a.refused = 1;
        rc = ruda__fail(RUDA_EINVAL, "%s: rank %u was started for %u ranks, rank 0 for %u", fn, h.rank, h.nranks, nranks);
      } else if (h.rank == 0 || h.rank >= nranks || seen[h.rank]) {
        a.refused = 1;
        rc = ruda__fail(RUDA_EINVAL, "%s: rank %u joined twice, or is no rank of %u", fn, h.rank, nranks);
      } else {
        seen[h.rank] = 1;
        served++;
      }
      io_all(s, &a, sizeof a, 1, now_ms() + 5000);
    }
    close(s);
  }
  free(seen);
  close(ls);
  return rc;
}

/* Any other rank: connects (rank 0 may not listen yet) and asks. */
static int tcp_ask(const char *hostport, uint32_t nranks, uint32_t rank, ruda_comm_id *id, uint64_t limit,
                   const char *fn) {
  const uint64_t until = limit ? now_ms() + limit : UINT64_MAX;
  for (unsigned wait = 5;; wait = wait < 200 ? 2 * wait : 200) {
    struct addrinfo *ai = NULL;
    int rc = resolve(hostport, 0, &ai, fn);
    if (rc != 0) return rc;
    int s = -1;
    for (struct addrinfo *p = ai; p != NULL && s < 0; p = p->ai_next) {
      s = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
      if (s >= 0 && connect(s, p->ai_addr, p->ai_addrlen) != 0) {
        close(s);
        s = -1;
      }
    }
    freeaddrinfo(ai);
    if (s >= 0) {
      hello h = {MAGIC, nranks, rank};
      answer a;
      int e = io_all(s, &h, sizeof h, 1, until);
      if (e == 0) e = io_all(s, &a, sizeof a, 0, until);
      close(s);
      if (e == 0 && a.magic == MAGIC) {
        if (a.refused)
          return ruda__fail(RUDA_EINVAL, "%s: rank 0 at %s refused rank %u of %u (it expects %u ranks, each once)", fn,
                            hostport, rank, nranks, a.nranks);
        *id = a.id;
        return 0;
      }
      if (e == 0) return ruda__fail(RUDA_EINVAL, "%s: %s answered, but is not a ruda rank 0", fn, hostport);
    }
    if (now_ms() > until)
      return ruda__fail(RUDA_ETIMEDOUT, "%s: rank %u could not reach rank 0 at %s within %llu ms (RUDA_COMM_TIMEOUT)",
                        fn, rank, hostport, (unsigned long long)limit);
    pause_ms(wait);
  }
}

int ruda_comm_rendezvous(const char *where, uint32_t nranks, uint32_t rank, ruda_comm_id *id) {
  static const char fn[] = "ruda_comm_rendezvous";
  if (where == NULL || id == NULL) return ruda__fail(RUDA_EINVAL, "%s: %s is NULL", fn, where ? "id" : "where");
  if (nranks == 0 || rank >= nranks) return ruda__fail(RUDA_EINVAL, "%s: rank %u of %u ranks", fn, rank, nranks);
  const uint64_t limit = ruda__comm_timeout_ms();
  if (strncmp(where, "file:", 5) == 0 && where[5] != '\0') {
    const char *path = where + 5;
    if (rank != 0) {
      answer a;
      int rc = file_read(path, &a, limit, fn);
      if (rc == 0 && a.nranks != nranks)
        rc = ruda__fail(RUDA_EINVAL, "%s: rank 0 wrote %s for %u ranks, rank %u was started for %u", fn, path, a.nranks,
                        rank, nranks);
      if (rc == 0) *id = a.id;
      return rc;
    }
    answer a = {MAGIC, nranks, 0, *id};
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
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (errno != 0 || *end != '\0' || x > UINT32_MAX || *v == '-')
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
  if (dev->ops->comm_id == NULL)
    return ruda__fail(RUDA_ENOBACKEND,
                      "%s: the %s backend reaches ranks in other processes only through a transport: launch with "
                      "mpirun and use ruda_mpi_comm_init (ruda/mpi.h)",
                      fn, dev->ops->name);
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
    char *end;
    unsigned long p = strtoul(port, &end, 10);
    if (*end != '\0' || p == 0 || p >= 65535)
      return ruda__fail(RUDA_EINVAL, "%s: MASTER_PORT=\"%s\" is not a port", fn, port);
    snprintf(where, sizeof where, "tcp:%s:%lu", addr, p + 1);
  }
  ruda_comm_id id;
  memset(&id, 0, sizeof id);
  if (rank == 0 && (rc = ruda_comm_unique_id(dev, &id)) != 0) return rc;
  if ((rc = ruda_comm_rendezvous(where, nranks, rank, &id)) != 0) return rc;
  return ruda_comm_init_rank(dev, nranks, rank, &id, NULL, out);
}

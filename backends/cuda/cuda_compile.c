/* cuda_compile.c - CUDA C sources to loaded functions.
 *
 * Kernels compile when they are registered (ruda_kernel_source), not at
 * first launch: compile errors then come back from the registration call
 * with the NVRTC log, a launch never stalls its stream behind NVRTC, and
 * a dry-run launch has nothing left to compile - it only validates.
 *
 * Three levels, cheapest first:
 *  1. the in-memory module cache, one module per hash of (source, NVRTC
 *     options, target arch, NVRTC version, driver version). Concurrent
 *     registrations of one source wait for the first one's build, so it
 *     compiles once; if that build fails, each waiter builds (and fails)
 *     itself, getting its own log.
 *  2. the on-disk cubin cache, <cache dir>/<hash>.cubin with a header that
 *     repeats the key and checksums the image. Files are written to a
 *     temporary name and renamed into place, so processes sharing the
 *     directory never see half a file; a corrupt or unloadable file counts
 *     as a miss and is overwritten.
 *  3. NVRTC, straight to cubin for the device's sm_XY.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/cuda/cuda_internal.h"

struct ruda__cu_module {
  ruda__cu_module *next;
  uint64_t key[2];
  int ready;
  CUmodule mod;
};

/* ---- key ---- */

typedef struct hasher {
  uint64_t a, b;
} hasher;

static void h_bytes(hasher *h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) {
    h->a = (h->a ^ s[i]) * 0x100000001b3ull; /* FNV-1a */
    h->b = (h->b + s[i] + 1) * 0x9e3779b97f4a7c15ull;
    h->b ^= h->b >> 29;
  }
}

/* Length-prefixed, so ("ab","c") and ("a","bc") differ. */
static void h_str(hasher *h, const char *s) {
  uint64_t n = strlen(s);
  h_bytes(h, &n, sizeof n);
  h_bytes(h, s, n);
}

static uint64_t fmix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static void make_key(const ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                     uint64_t key[2]) {
  hasher h = {0xcbf29ce484222325ull, 0x6a09e667f3bcc909ull};
  h_str(&h, "ruda-cubin-1");
  h_str(&h, b->arch);
  int v[3] = {ruda__nvrtc.major, ruda__nvrtc.minor, ruda__cu.driver_version};
  h_bytes(&h, v, sizeof v);
  for (int i = 0; i < nopts; i++) h_str(&h, opts[i]);
  h_str(&h, k->source);
  key[0] = fmix(h.a);
  key[1] = fmix(h.b ^ h.a);
}

/* ---- disk cache ---- */

#define DISK_MAGIC "RUDACBN1"

typedef struct disk_header {
  char magic[8];
  uint64_t key[2];
  uint64_t size;
  uint64_t check; /* FNV-1a of the image */
} disk_header;

static uint64_t checksum(const void *p, size_t n) {
  hasher h = {0xcbf29ce484222325ull, 0};
  h_bytes(&h, p, n);
  return h.a;
}

static void disk_path(const ruda__cu_backend *b, const uint64_t key[2], char *out, size_t len) {
  snprintf(out, len, "%s/%016llx%016llx.cubin", b->cache_dir, (unsigned long long)key[0],
           (unsigned long long)key[1]);
}

/* Returns a malloc'd image on a valid hit, else NULL. */
static void *disk_load(const ruda__cu_backend *b, const uint64_t key[2], size_t *size) {
  char path[4096];
  disk_path(b, key, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  disk_header hdr;
  void *img = NULL;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof hdr ||
      read(fd, &hdr, sizeof hdr) != (ssize_t)sizeof hdr || memcmp(hdr.magic, DISK_MAGIC, 8) != 0 ||
      hdr.key[0] != key[0] || hdr.key[1] != key[1] || hdr.size != (uint64_t)st.st_size - sizeof hdr ||
      (img = malloc(hdr.size ? hdr.size : 1)) == NULL)
    goto miss;
  size_t got = 0;
  while (got < hdr.size) {
    ssize_t n = read(fd, (char *)img + got, hdr.size - got);
    if (n <= 0) goto miss;
    got += (size_t)n;
  }
  if (checksum(img, hdr.size) != hdr.check) goto miss;
  close(fd);
  *size = hdr.size;
  return img;
miss:
  free(img);
  close(fd);
  return NULL;
}

static int mkdir_p(const char *dir) {
  char buf[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof buf) return -1;
  memcpy(buf, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) return -1;
    buf[i] = c;
  }
  return 0;
}

static void disk_store(ruda__cu_backend *b, const uint64_t key[2], const void *img, size_t size) {
  static _Atomic unsigned counter;
  char path[4096], tmp[4200];
  if (mkdir_p(b->cache_dir) != 0) goto fail;
  disk_path(b, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(), atomic_fetch_add(&counter, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) goto fail;
  disk_header hdr;
  memcpy(hdr.magic, DISK_MAGIC, 8);
  hdr.key[0] = key[0];
  hdr.key[1] = key[1];
  hdr.size = size;
  hdr.check = checksum(img, size);
  int ok = write(fd, &hdr, sizeof hdr) == (ssize_t)sizeof hdr;
  for (size_t done = 0; ok && done < size;) {
    ssize_t n = write(fd, (const char *)img + done, size - done);
    if (n <= 0) ok = 0;
    else done += (size_t)n;
  }
  if (close(fd) != 0) ok = 0;
  /* rename() is atomic: readers see the old file, none, or all of this. */
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    goto fail;
  }
  return;
fail:
  ruda__log(b->log_level, RUDA_LOG_DEBUG, "kernel cache: could not write to %s (%s)", b->cache_dir, strerror(errno));
}

/* ---- NVRTC ---- */

static int nvrtc_build(ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                       void **image, size_t *size, int *is_cubin) {
  const ruda__nvrtc_api *nv = &ruda__nvrtc;
  nvrtcProgram prog;
  char fname[96];
  snprintf(fname, sizeof fname, "%.80s.cu", k->name);
  nvrtcResult res = nv->nvrtcCreateProgram(&prog, k->source, fname, 0, NULL, NULL);
  if (res != NVRTC_SUCCESS)
    return ruda__fail_backend(res == NVRTC_ERROR_OUT_OF_MEMORY ? RUDA_ENOMEM : RUDA_ECOMPILE, res,
                              "ruda_kernel_source: kernel \"%s\": nvrtcCreateProgram: %s", k->name,
                              nv->nvrtcGetErrorString(res));
  res = nv->nvrtcCompileProgram(prog, nopts, opts);
  size_t log_size = 0;
  char *log = NULL;
  if (nv->nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1 &&
      (log = malloc(log_size)) != NULL && nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
    log[0] = '\0';
  if (res != NVRTC_SUCCESS) {
    ruda__set_compile_log(log ? log : "");
    int rc = ruda__fail_backend(RUDA_ECOMPILE, res,
                                "ruda_kernel_source: kernel \"%s\": NVRTC %d.%d compiling for %s failed "
                                "(%s); log (full text: ruda_compile_log()):\n%s",
                                k->name, nv->major, nv->minor, b->arch, nv->nvrtcGetErrorString(res),
                                log ? log : "(empty)");
    free(log);
    nv->nvrtcDestroyProgram(&prog);
    return rc;
  }
  if (log != NULL && log[0] != '\0')
    ruda__log(b->log_level, RUDA_LOG_DEBUG, "kernel \"%s\": NVRTC log:\n%s", k->name, log);
  free(log);
  /* A cubin when the options target a real arch (ours do); PTX when the
   * caller asked for a virtual one, which the driver then JIT-compiles. */
  size_t n = 0;
  *is_cubin = nv->nvrtcGetCUBINSize(prog, &n) == NVRTC_SUCCESS && n > 0;
  if (!*is_cubin && (nv->nvrtcGetPTXSize(prog, &n) != NVRTC_SUCCESS || n == 0)) {
    nv->nvrtcDestroyProgram(&prog);
    return ruda__fail(RUDA_ECOMPILE, "ruda_kernel_source: kernel \"%s\": NVRTC produced neither cubin nor PTX",
                      k->name);
  }
  void *img = malloc(n);
  if (img == NULL) {
    nv->nvrtcDestroyProgram(&prog);
    return ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: kernel \"%s\": out of host memory", k->name);
  }
  res = *is_cubin ? nv->nvrtcGetCUBIN(prog, img) : nv->nvrtcGetPTX(prog, img);
  nv->nvrtcDestroyProgram(&prog);
  if (res != NVRTC_SUCCESS) {
    free(img);
    return ruda__fail_backend(RUDA_ECOMPILE, res, "ruda_kernel_source: kernel \"%s\": reading NVRTC output: %s",
                              k->name, nv->nvrtcGetErrorString(res));
  }
  *image = img;
  *size = n;
  return 0;
}

/* Disk, else NVRTC (then store on disk); then load into the context. */
static int build_module(ruda__cu_backend *b, ruda__cu_module *m, const ruda__kernel *k,
                        const char *const *opts, int nopts) {
  size_t size = 0;
  void *img = b->cache_dir ? disk_load(b, m->key, &size) : NULL;
  if (img != NULL) {
    CUresult r = ruda__cu.cuModuleLoadData(&m->mod, img);
    free(img);
    if (r == CUDA_SUCCESS) {
      atomic_fetch_add_explicit(&b->disk_hits, 1, memory_order_relaxed);
      return 0;
    }
    ruda__log(b->log_level, RUDA_LOG_INFO, "kernel \"%s\": cached cubin did not load; recompiling", k->name);
  }
  int is_cubin = 0;
  int rc = nvrtc_build(b, k, opts, nopts, &img, &size, &is_cubin);
  if (rc != 0) return rc;
  atomic_fetch_add_explicit(&b->compiles, 1, memory_order_relaxed);
  CUresult r = ruda__cu.cuModuleLoadData(&m->mod, img);
  if (r == CUDA_SUCCESS && is_cubin && b->cache_dir) disk_store(b, m->key, img, size);
  free(img);
  if (r != CUDA_SUCCESS)
    return ruda__cu_fail(r, "ruda_kernel_source: kernel \"%s\": cuModuleLoadData", k->name);
  return 0;
}

static ruda__cu_module *find(ruda__cu_backend *b, const uint64_t key[2]) {
  for (ruda__cu_module *m = b->modules; m != NULL; m = m->next)
    if (m->key[0] == key[0] && m->key[1] == key[1]) return m;
  return NULL;
}

static int module_get(ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                      ruda__cu_module **out) {
  uint64_t key[2];
  make_key(b, k, opts, nopts, key);
  pthread_mutex_lock(&b->mod_lock);
  ruda__cu_module *m;
  while ((m = find(b, key)) != NULL && !m->ready) pthread_cond_wait(&b->mod_cond, &b->mod_lock);
  if (m != NULL) {
    pthread_mutex_unlock(&b->mod_lock);
    atomic_fetch_add_explicit(&b->mem_hits, 1, memory_order_relaxed);
    *out = m;
    return 0;
  }
  m = calloc(1, sizeof *m);
  if (m == NULL) {
    pthread_mutex_unlock(&b->mod_lock);
    return ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  }
  m->key[0] = key[0];
  m->key[1] = key[1];
  m->next = b->modules;
  b->modules = m; /* others now wait for it instead of compiling too */
  pthread_mutex_unlock(&b->mod_lock);

  int rc = build_module(b, m, k, opts, nopts);

  pthread_mutex_lock(&b->mod_lock);
  if (rc != 0) {
    ruda__cu_module **pp = &b->modules;
    while (*pp != m) pp = &(*pp)->next;
    *pp = m->next;
    free(m);
    m = NULL;
  } else {
    m->ready = 1;
  }
  pthread_cond_broadcast(&b->mod_cond);
  pthread_mutex_unlock(&b->mod_lock);
  *out = m;
  return rc;
}

void ruda__cu_modules_destroy(ruda__cu_backend *b) {
  for (ruda__cu_module *m = b->modules; m != NULL;) {
    ruda__cu_module *n = m->next;
    ruda__cu.cuModuleUnload(m->mod);
    free(m);
    m = n;
  }
  b->modules = NULL;
}

/* ---- registration ---- */

static int has_arch_option(const char *const *opts) {
  for (; opts && *opts; opts++)
    if (!strncmp(*opts, "-arch", 5) || !strncmp(*opts, "--gpu-architecture", 18)) return 1;
  return 0;
}

/* The function's own limits, read once; the dynamic shared memory cap is
 * raised to everything the device allows here, once per function, so no
 * launch ever has to set it. */
static int setup_function(ruda__cu_backend *b, const ruda__kernel *k, ruda__cu_kernel *ck) {
  CUresult r = ruda__cu.cuModuleGetFunction(&ck->fn, ck->module->mod, k->name);
  if (r == CUDA_ERROR_NOT_FOUND)
    return ruda__fail_backend(RUDA_EKERNEL, r,
                              "ruda_kernel_source: the source defines no extern \"C\" __global__ function "
                              "named \"%s\"",
                              k->name);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "ruda_kernel_source: kernel \"%s\": cuModuleGetFunction", k->name);
  int threads = 0, st = 0;
  if ((r = ruda__cu.cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, ck->fn)) ||
      (r = ruda__cu.cuFuncGetAttribute(&st, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, ck->fn)))
    return ruda__cu_fail(r, "ruda_kernel_source: kernel \"%s\": cuFuncGetAttribute", k->name);
  ck->max_threads = (uint32_t)threads;
  ck->static_shared = (uint32_t)st;
  const uint32_t dflt = b->limits.max_shared;
  ck->max_dyn_shared = b->max_shared_optin > ck->static_shared ? b->max_shared_optin - ck->static_shared : 0;
  if (ck->max_dyn_shared > 0 &&
      ruda__cu.cuFuncSetAttribute(ck->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  (int)ck->max_dyn_shared) != CUDA_SUCCESS)
    ck->max_dyn_shared = dflt > ck->static_shared ? dflt - ck->static_shared : 0;
  /* Parameter sizes let launches with the wrong arguments fail at the
   * call instead of reading garbage on the device. */
  ck->nparams = -1;
  if (ruda__cu.cuFuncGetParamInfo != NULL) {
    int n = 0;
    for (;; n++) {
      size_t off = 0, sz = 0;
      r = ruda__cu.cuFuncGetParamInfo(ck->fn, (size_t)n, &off, &sz);
      if (r != CUDA_SUCCESS) break;
      if (n < RUDA_MAX_ARGS) ck->param_size[n] = (uint32_t)sz;
    }
    if (r == CUDA_ERROR_INVALID_VALUE) ck->nparams = n;
  }
  return 0;
}

int ruda__cu_kernel_prepare(void *state, ruda__kernel *k) {
  ruda__cu_backend *b = state;
  if (k->source == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "kernel \"%s\": the cuda backend runs CUDA C sources (ruda_kernel_source)",
                      k->name);
  int rc = ruda__nvrtc_load();
  if (rc != 0) {
    char why[RUDA__MSG_MAX];
    snprintf(why, sizeof why, "%s", ruda_last_error()->msg);
    return ruda__fail(rc, "ruda_kernel_source: kernel \"%s\": %.400s", k->name, why);
  }
  int nuser = 0;
  while (k->options && k->options[nuser]) nuser++;
  const char **opts = calloc((size_t)nuser + 3, sizeof *opts);
  ruda__cu_kernel *ck = calloc(1, sizeof *ck);
  char arch[64];
  if (opts == NULL || ck == NULL) {
    free(opts);
    free(ck);
    return ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  }
  int n = 0;
  for (int i = 0; i < nuser; i++) opts[n++] = k->options[i];
  if (!has_arch_option((const char *const *)k->options)) {
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", b->arch);
    opts[n++] = arch;
  }
  if (b->bounds_checked) opts[n++] = "-DRUDA_BOUNDS_CHECKED";

  ruda__cu_guard g;
  if ((rc = ruda__cu_enter(b, &g)) == 0) {
    rc = module_get(b, k, opts, n, &ck->module);
    if (rc == 0) rc = setup_function(b, k, ck);
    ruda__cu_leave(&g);
  }
  free(opts);
  if (rc != 0) {
    free(ck);
    return rc;
  }
  k->impl = ck;
  return 0;
}

void ruda__cu_kernel_release(void *state, ruda__kernel *k) {
  (void)state;
  free(k->impl); /* the module stays cached until close */
  k->impl = NULL;
}

char *ruda__cu_cache_dir(const ruda_config *cfg) {
  if (cfg->cache_dir != NULL) return cfg->cache_dir[0] ? strdup(cfg->cache_dir) : NULL;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char buf[4096];
  /* The XDG spec ignores relative paths. */
  if (xdg && xdg[0] == '/') snprintf(buf, sizeof buf, "%s/ruda", xdg);
  else if (home && home[0]) snprintf(buf, sizeof buf, "%s/.cache/ruda", home);
  else return NULL;
  return strdup(buf);
}

void ruda__cu_cache_stats(void *state, uint64_t *compiles, uint64_t *disk_hits, uint64_t *mem_hits) {
  ruda__cu_backend *b = state;
  *compiles = atomic_load(&b->compiles);
  *disk_hits = atomic_load(&b->disk_hits);
  *mem_hits = atomic_load(&b->mem_hits);
}

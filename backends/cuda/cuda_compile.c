/* cuda_compile.c - CUDA C sources to loaded functions.
 *
 * Kernels compile when they are registered (ruda_kernel_source), not at
 * first launch: compile errors then come back from the registration call
 * with the NVRTC log, a launch never stalls its stream behind NVRTC, and
 * a dry-run launch has nothing left to compile - it only validates.
 *
 * Three levels, cheapest first:
 *  1. the in-memory module cache, one module per hash of (source, NVRTC
 *     options, the name expressions compiled with it, target arch, NVRTC
 *     version, driver version), or of an image's bytes. Concurrent
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
  /* The lowered (mangled) symbol of each name expression it was compiled
   * with, in the order of the expressions; none for a plain source. */
  char **lowered;
  int nlowered;
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

/* exprs: the name expressions compiled with the source (NULL: none). An
 * image is keyed by its bytes alone. */
static void make_key(const ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                     const char *const *exprs, uint64_t key[2]) {
  hasher h = {0xcbf29ce484222325ull, 0x6a09e667f3bcc909ull};
  if (k->image != NULL) {
    h_str(&h, "ruda-image-1");
    h_bytes(&h, k->image, k->image_size);
  } else {
    h_str(&h, "ruda-cubin-2");
    h_str(&h, b->arch);
    int v[3] = {ruda__nvrtc.major, ruda__nvrtc.minor, ruda__cu.driver_version};
    h_bytes(&h, v, sizeof v);
    for (int i = 0; i < nopts; i++) h_str(&h, opts[i]);
    for (; exprs && *exprs; exprs++) h_str(&h, *exprs);
    h_str(&h, "--");
    h_str(&h, k->source);
  }
  key[0] = fmix(h.a);
  key[1] = fmix(h.b ^ h.a);
}

/* The disk cache keeps a module's lowered names in front of its cubin:
 * u32 count, then the names, each NUL-terminated. */
static void *pack_names(char *const *names, int n, const void *img, size_t size, size_t *out) {
  size_t len = 4;
  for (int i = 0; i < n; i++) len += strlen(names[i]) + 1;
  unsigned char *p = malloc(len + size);
  if (p == NULL) return NULL;
  uint32_t c = (uint32_t)n;
  memcpy(p, &c, 4);
  size_t at = 4;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(names[i]) + 1;
    memcpy(p + at, names[i], l);
    at += l;
  }
  memcpy(p + at, img, size);
  *out = len + size;
  return p;
}

/* The inverse: *names (malloc'd copies) and where the image starts. -1 on
 * a malformed payload. */
static int unpack_names(const unsigned char *p, size_t size, char ***names, int *n, size_t *img_at) {
  uint32_t c;
  if (size < 4) return -1;
  memcpy(&c, p, 4);
  if (c > RUDA_MAX_ARGS * 64u) return -1;
  char **v = c ? calloc(c, sizeof *v) : NULL;
  if (c && v == NULL) return -1;
  size_t at = 4;
  for (uint32_t i = 0; i < c; i++) {
    const unsigned char *end = memchr(p + at, 0, size - at);
    if (end == NULL || (v[i] = strdup((const char *)p + at)) == NULL) {
      for (uint32_t j = 0; j < i; j++) free(v[j]);
      free(v);
      return -1;
    }
    at = (size_t)(end - p) + 1;
  }
  *names = v;
  *n = (int)c;
  *img_at = at;
  return 0;
}

/* ---- disk cache ---- */

#define DISK_MAGIC "RUDACBN2"

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

/* What a compile is named in messages: the file name the caller gave a
 * module, else the kernel's. */
static const char *what_of(const ruda__kernel *k, char *buf, size_t len) {
  if (k->file_name != NULL) snprintf(buf, len, "source \"%s\"", k->file_name);
  else snprintf(buf, len, "kernel \"%s\"", k->name);
  return buf;
}

/* Compiles k's source with the name expressions exprs (NULL: none); fills
 * *lowered with the mangled symbol of each. */
static int nvrtc_build(ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                       const char *const *exprs, void **image, size_t *size, int *is_cubin, char ***lowered,
                       int *nlowered) {
  const ruda__nvrtc_api *nv = &ruda__nvrtc;
  nvrtcProgram prog;
  char fname[128], what[160];
  if (k->file_name != NULL) snprintf(fname, sizeof fname, "%.120s", k->file_name);
  else snprintf(fname, sizeof fname, "%.80s.cu", k->name);
  what_of(k, what, sizeof what);
  nvrtcResult res = nv->nvrtcCreateProgram(&prog, k->source, fname, 0, NULL, NULL);
  if (res != NVRTC_SUCCESS)
    return ruda__fail_backend(res == NVRTC_ERROR_OUT_OF_MEMORY ? RUDA_ENOMEM : RUDA_ECOMPILE, res,
                              "ruda_kernel_source: %s: nvrtcCreateProgram: %s", what, nv->nvrtcGetErrorString(res));
  int nexpr = 0;
  for (; exprs && exprs[nexpr]; nexpr++)
    if ((res = nv->nvrtcAddNameExpression(prog, exprs[nexpr])) != NVRTC_SUCCESS) {
      nv->nvrtcDestroyProgram(&prog);
      return ruda__fail_backend(RUDA_ECOMPILE, res, "ruda_kernel_source: %s: name \"%s\": %s", what, exprs[nexpr],
                                nv->nvrtcGetErrorString(res));
    }
  res = nv->nvrtcCompileProgram(prog, nopts, opts);
  size_t log_size = 0;
  char *log = NULL;
  if (nv->nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1 &&
      (log = malloc(log_size)) != NULL && nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
    log[0] = '\0';
  if (res != NVRTC_SUCCESS) {
    ruda__set_compile_log(log ? log : "");
    int rc = ruda__fail_backend(RUDA_ECOMPILE, res,
                                "ruda_kernel_source: %s: NVRTC %d.%d compiling %s for %s failed (%s); log (full "
                                "text: ruda_compile_log()):\n%s",
                                what, nv->major, nv->minor, fname, b->arch, nv->nvrtcGetErrorString(res),
                                log ? log : "(empty)");
    free(log);
    nv->nvrtcDestroyProgram(&prog);
    return rc;
  }
  if (log != NULL && log[0] != '\0') ruda__log(b->log_level, RUDA_LOG_DEBUG, "%s: NVRTC log:\n%s", what, log);
  free(log);
  char **low = nexpr ? calloc((size_t)nexpr, sizeof *low) : NULL;
  int rc = nexpr && low == NULL ? ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory") : 0;
  for (int i = 0; rc == 0 && i < nexpr; i++) {
    const char *name = NULL;
    if ((res = nv->nvrtcGetLoweredName(prog, exprs[i], &name)) != NVRTC_SUCCESS || name == NULL)
      rc = ruda__fail_backend(RUDA_EKERNEL, res, "ruda_kernel_source: %s: \"%s\" names no __global__ function (%s)",
                              what, exprs[i], nv->nvrtcGetErrorString(res));
    else if ((low[i] = strdup(name)) == NULL)
      rc = ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  }
  /* A cubin when the options target a real arch (ours do); PTX when the
   * caller asked for a virtual one, which the driver then JIT-compiles. */
  size_t n = 0;
  void *img = NULL;
  if (rc == 0) {
    *is_cubin = nv->nvrtcGetCUBINSize(prog, &n) == NVRTC_SUCCESS && n > 0;
    if (!*is_cubin && (nv->nvrtcGetPTXSize(prog, &n) != NVRTC_SUCCESS || n == 0))
      rc = ruda__fail(RUDA_ECOMPILE, "ruda_kernel_source: %s: NVRTC produced neither cubin nor PTX", what);
  }
  if (rc == 0 && (img = malloc(n)) == NULL) rc = ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  if (rc == 0 && (res = *is_cubin ? nv->nvrtcGetCUBIN(prog, img) : nv->nvrtcGetPTX(prog, img)) != NVRTC_SUCCESS)
    rc = ruda__fail_backend(RUDA_ECOMPILE, res, "ruda_kernel_source: %s: reading NVRTC output: %s", what,
                            nv->nvrtcGetErrorString(res));
  nv->nvrtcDestroyProgram(&prog);
  if (rc != 0) {
    free(img);
    for (int i = 0; low && i < nexpr; i++) free(low[i]);
    free(low);
    return rc;
  }
  *image = img;
  *size = n;
  *lowered = low;
  *nlowered = nexpr;
  return 0;
}

/* Disk, else NVRTC (then store on disk); then load into the context. An
 * image is loaded as it is. */
static int build_module(ruda__cu_backend *b, ruda__cu_module *m, const ruda__kernel *k,
                        const char *const *opts, int nopts, const char *const *exprs) {
  char what[160];
  what_of(k, what, sizeof what);
  if (k->image != NULL) {
    CUresult r = ruda__cu.cuModuleLoadData(&m->mod, k->image);
    if (r != CUDA_SUCCESS)
      return ruda__cu_fail(r, "ruda_module_image: cuModuleLoadData of a %zu-byte image (cubin, PTX or fatbin "
                              "for %s expected)", k->image_size, b->arch);
    return 0;
  }
  size_t size = 0;
  unsigned char *payload = b->cache_dir ? disk_load(b, m->key, &size) : NULL;
  size_t at = 0;
  if (payload != NULL && unpack_names(payload, size, &m->lowered, &m->nlowered, &at) == 0) {
    CUresult r = ruda__cu.cuModuleLoadData(&m->mod, payload + at);
    free(payload);
    if (r == CUDA_SUCCESS) {
      atomic_fetch_add_explicit(&b->disk_hits, 1, memory_order_relaxed);
      return 0;
    }
    for (int i = 0; i < m->nlowered; i++) free(m->lowered[i]);
    free(m->lowered);
    m->lowered = NULL;
    m->nlowered = 0;
    ruda__log(b->log_level, RUDA_LOG_INFO, "%s: cached cubin did not load; recompiling", what);
  } else {
    free(payload);
  }
  int is_cubin = 0;
  void *img = NULL;
  int rc = nvrtc_build(b, k, opts, nopts, exprs, &img, &size, &is_cubin, &m->lowered, &m->nlowered);
  if (rc != 0) return rc;
  atomic_fetch_add_explicit(&b->compiles, 1, memory_order_relaxed);
  CUresult r = ruda__cu.cuModuleLoadData(&m->mod, img);
  if (r == CUDA_SUCCESS && is_cubin && b->cache_dir) {
    size_t psize = 0;
    void *p = pack_names(m->lowered, m->nlowered, img, size, &psize);
    if (p != NULL) disk_store(b, m->key, p, psize);
    free(p);
  }
  free(img);
  if (r != CUDA_SUCCESS) return ruda__cu_fail(r, "ruda_kernel_source: %s: cuModuleLoadData", what);
  return 0;
}

static ruda__cu_module *find(ruda__cu_backend *b, const uint64_t key[2]) {
  for (ruda__cu_module *m = b->modules; m != NULL; m = m->next)
    if (m->key[0] == key[0] && m->key[1] == key[1]) return m;
  return NULL;
}

static void module_free(ruda__cu_module *m) {
  for (int i = 0; i < m->nlowered; i++) free(m->lowered[i]);
  free(m->lowered);
  free(m);
}

static int module_get(ruda__cu_backend *b, const ruda__kernel *k, const char *const *opts, int nopts,
                      const char *const *exprs, ruda__cu_module **out) {
  uint64_t key[2];
  make_key(b, k, opts, nopts, exprs, key);
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

  int rc = build_module(b, m, k, opts, nopts, exprs);

  pthread_mutex_lock(&b->mod_lock);
  if (rc != 0) {
    ruda__cu_module **pp = &b->modules;
    while (*pp != m) pp = &(*pp)->next;
    *pp = m->next;
    module_free(m);
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
    module_free(m);
    m = n;
  }
  b->modules = NULL;
}

/* The kernels a module defines, for a message: "a, b, c" (mangled names
 * for C++ functions), or why they cannot be listed. */
static void list_functions(CUmodule mod, char *out, size_t len) {
  unsigned count = 0;
  if (ruda__cu.cuModuleGetFunctionCount == NULL || ruda__cu.cuModuleEnumerateFunctions == NULL ||
      ruda__cu.cuFuncGetName == NULL || ruda__cu.cuModuleGetFunctionCount(&count, mod) != CUDA_SUCCESS) {
    snprintf(out, len, "(this driver cannot list a module's functions)");
    return;
  }
  CUfunction fns[64];
  unsigned n = count < 64 ? count : 64;
  if (n == 0 || ruda__cu.cuModuleEnumerateFunctions(fns, n, mod) != CUDA_SUCCESS) {
    snprintf(out, len, n == 0 ? "none" : "(the driver did not list them)");
    return;
  }
  size_t at = 0;
  out[0] = '\0';
  for (unsigned i = 0; i < n && at + 8 < len; i++) {
    const char *name = NULL;
    if (ruda__cu.cuFuncGetName(&name, fns[i]) != CUDA_SUCCESS || name == NULL) continue;
    at += (size_t)snprintf(out + at, len - at, "%s%s", at ? ", " : "", name);
  }
  if (count > n && at + 8 < len) snprintf(out + at, len - at, ", ... (%u in all)", count);
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
static int setup_function(ruda__cu_backend *b, const ruda__kernel *k, ruda__cu_kernel *ck, const char *symbol) {
  CUresult r = ruda__cu.cuModuleGetFunction(&ck->fn, ck->module->mod, symbol);
  if (r == CUDA_ERROR_NOT_FOUND) {
    char defined[1024];
    list_functions(ck->module->mod, defined, sizeof defined);
    return ruda__fail_backend(RUDA_EKERNEL, r,
                              "ruda_kernel_source: the %s defines no __global__ function \"%s\"; it defines: %s",
                              k->image ? "image" : "source", k->name, defined);
  }
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

/* Whether the last build failed on a name expression, not on the source:
 * NVRTC reports names it cannot resolve from its own "__nv_name_map"; an
 * instance that does not compile (a static_assert) is a compile error. */
static int name_failed(void) {
  int code = ruda_error_code(ruda_last_error());
  if (code == RUDA_EKERNEL) return 1;
  return code == RUDA_ECOMPILE && strstr(ruda_compile_log(), "Error in parsing name expression") != NULL;
}

/* The toolkit's headers (and CCCL's, which cooperative_groups and
 * cuda/std need), searched by default as CuPy does: $CUDA_HOME,
 * $CUDA_PATH, the toolkit ruda was built with, /usr/local/cuda, and the
 * tree the loaded NVRTC came from. The first root holding cuda_runtime.h
 * wins. Writes up to two -I options into inc (each 4096 bytes). */
static int default_includes(char inc[2][4096]) {
  char roots[5][4096];
  int n = 0;
  const char *env;
  if ((env = getenv("CUDA_HOME")) != NULL && *env) snprintf(roots[n++], 4096, "%s", env);
  if ((env = getenv("CUDA_PATH")) != NULL && *env) snprintf(roots[n++], 4096, "%s", env);
#ifdef RUDA_CUDA_ROOT_DIR
  snprintf(roots[n++], 4096, "%s", RUDA_CUDA_ROOT_DIR);
#endif
  snprintf(roots[n++], 4096, "/usr/local/cuda");
  const char *lib = ruda__nvrtc.path, *slash = strrchr(lib, '/');
  if (slash != NULL) snprintf(roots[n++], 4096, "%.*s/..", (int)(slash - lib), lib);
  for (int i = 0; i < n; i++) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%.4000s/include/cuda_runtime.h", roots[i]);
    if (access(probe, R_OK) != 0) continue;
    int k = 0;
    snprintf(inc[k++], 4096, "-I%.4000s/include", roots[i]);
    snprintf(probe, sizeof probe, "%.4000s/include/cccl/cuda/std/type_traits", roots[i]);
    if (access(probe, R_OK) == 0) snprintf(inc[k++], 4096, "-I%.4000s/include/cccl", roots[i]);
    return k;
  }
  return 0;
}

static char inc_dirs[2][4096];
static int ninc_dirs;
static void init_inc(void) { ninc_dirs = default_includes(inc_dirs); }

int ruda__cu_kernel_prepare(void *state, ruda__kernel *k) {
  ruda__cu_backend *b = state;
  if (k->source == NULL && k->image == NULL)
    return ruda__fail(RUDA_ENOBACKEND, "kernel \"%s\": the cuda backend runs CUDA C sources (ruda_kernel_source)",
                      k->name);
  int rc = k->image != NULL ? 0 : ruda__nvrtc_load();
  if (rc != 0) {
    char why[RUDA__MSG_MAX];
    snprintf(why, sizeof why, "%s", ruda_last_error()->msg);
    return ruda__fail(rc, "ruda_kernel_source: kernel \"%s\": %.400s", k->name, why);
  }
  int nuser = 0;
  while (k->options && k->options[nuser]) nuser++;
  const char **opts = calloc((size_t)nuser + 5, sizeof *opts);
  ruda__cu_kernel *ck = calloc(1, sizeof *ck);
  char arch[64];
  static pthread_once_t inc_once = PTHREAD_ONCE_INIT; /* the include directories, once */
  if (opts == NULL || ck == NULL) {
    free(opts);
    free(ck);
    return ruda__fail(RUDA_ENOMEM, "ruda_kernel_source: out of host memory");
  }
  int n = 0;
  for (int i = 0; i < nuser; i++) opts[n++] = k->options[i];
  if (k->image == NULL) {
    if (!has_arch_option((const char *const *)k->options)) {
      snprintf(arch, sizeof arch, "--gpu-architecture=%s", b->arch);
      opts[n++] = arch;
    }
    if (b->bounds_checked) opts[n++] = "-DRUDA_BOUNDS_CHECKED";
    /* After the caller's: their -I directories are searched first. */
    pthread_once(&inc_once, init_inc);
    for (int i = 0; i < ninc_dirs; i++) opts[n++] = inc_dirs[i];
  }

  ruda__cu_guard g;
  if ((rc = ruda__cu_enter(b, &g)) == 0) {
    const char *symbol = k->name;
    if (k->module_names != NULL) {
      /* A module: one compile for all its names, each a name expression. */
      rc = module_get(b, k, opts, n, (const char *const *)k->module_names, &ck->module);
      if (rc != 0 && name_failed()) {
        /* Does the source compile without the names? Then one of them is
         * what the source does not define. */
        char why[RUDA__MSG_MAX];
        snprintf(why, sizeof why, "%s", ruda_last_error()->msg);
        ruda__cu_module *plain = NULL;
        if (module_get(b, k, opts, n, NULL, &plain) == 0) {
          char defined[1024];
          list_functions(plain->mod, defined, sizeof defined);
          rc = ruda__fail(RUDA_EKERNEL,
                          "ruda_module_source: source \"%s\": a name it was given is no __global__ function it "
                          "defines; it defines: %s; NVRTC on the names: %.200s",
                          k->file_name ? k->file_name : "module.cu", defined, strstr(why, "log") ? strstr(why, "log") : why);
        } else {
          ruda__fail(RUDA_ECOMPILE, "%s", why);
        }
      }
      for (int i = 0; rc == 0 && k->module_names[i]; i++)
        if (strcmp(k->module_names[i], k->name) == 0 && i < ck->module->nlowered) symbol = ck->module->lowered[i];
    } else if (k->image != NULL) {
      rc = module_get(b, k, opts, n, NULL, &ck->module);
    } else {
      /* An extern "C" name is found as it is; anything else (a C++ name,
       * a template instance) is compiled again as a name expression. */
      rc = module_get(b, k, opts, n, NULL, &ck->module);
      CUfunction f;
      if (rc == 0 && ruda__cu.cuModuleGetFunction(&f, ck->module->mod, k->name) == CUDA_ERROR_NOT_FOUND) {
        ruda__cu_module *plain = ck->module;
        const char *one[2] = {k->name, NULL};
        rc = module_get(b, k, opts, n, one, &ck->module);
        if (rc == 0 && ck->module->nlowered == 1) {
          symbol = ck->module->lowered[0];
        } else if (rc != 0 && name_failed()) {
          /* The source compiles alone and NVRTC could not parse the name. */
          char defined[1024];
          list_functions(plain->mod, defined, sizeof defined);
          rc = ruda__fail(RUDA_EKERNEL,
                          "ruda_kernel_source: the source defines no __global__ function \"%s\" (extern \"C\" "
                          "names, C++ names as the source spells them such as \"ns::f<float, 4>\", or mangled "
                          "names); it defines: %s (NVRTC's view: ruda_compile_log())",
                          k->name, defined);
        }
      }
    }
    if (rc == 0) rc = setup_function(b, k, ck, symbol);
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

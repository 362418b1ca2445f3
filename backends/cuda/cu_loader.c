/* cu_loader.c - dlopen the CUDA driver and NVRTC; CUresult mapping. */
#include "backends/cuda/cu_loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ruda__cu_api ruda__cu;
ruda__nvrtc_api ruda__nvrtc;

/* Outcome of the one-time loads, replayed into each caller's last error. */
typedef struct load_result {
  pthread_once_t once;
  int code;
  char msg[RUDA__MSG_MAX];
} load_result;

static load_result cu_result = {PTHREAD_ONCE_INIT, 0, ""};
static load_result nvrtc_result = {PTHREAD_ONCE_INIT, 0, ""};
static ruda__cu_status cu_status = RUDA__CU_LOADED; /* written once, under cu_result.once */
static char cu_tried[256]; /* the driver the one load tried; written under cu_result.once */

/* The driver this process asks for now: $RUDA_CUDA_DRIVER, else the system's. */
static const char *cu_wanted(void) {
  const char *env = getenv("RUDA_CUDA_DRIVER");
  return env && *env ? env : "libcuda.so.1";
}

static void set_result(load_result *r, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  r->code = code;
}

static void cu_load_once(void) {
  const char *path = cu_wanted();
  snprintf(cu_tried, sizeof cu_tried, "%s", path);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *why = dlerror();
    cu_status = RUDA__CU_NO_LIBRARY;
    set_result(&cu_result, RUDA_ENODRIVER,
               "no CUDA driver: dlopen(\"%s\") failed (%s): the NVIDIA driver is not installed",
               path, why ? why : "unknown reason");
    return;
  }
  snprintf(ruda__cu.path, sizeof ruda__cu.path, "%s", path);
  /* The CUDA 12 form of cuGetProcAddress (with the query result) is the
   * one whose symbol versions we ask for; older drivers lack it. */
  __typeof__(&cuGetProcAddress) getproc = (__typeof__(&cuGetProcAddress))dlsym(lib, "cuGetProcAddress_v2");
  __typeof__(&cuDriverGetVersion) getver = (__typeof__(&cuDriverGetVersion))dlsym(lib, "cuDriverGetVersion");
  int ver = 0;
  if (getproc == NULL || getver == NULL || getver(&ver) != CUDA_SUCCESS || ver < 12000) {
    /* Drivers before CUDA 12 lack cuGetProcAddress_v2; a newer one
     * without it (or without cuDriverGetVersion) is a broken library. */
    cu_status = getver != NULL && ver > 0 && ver < 12000 ? RUDA__CU_TOO_OLD : RUDA__CU_NO_SYMBOL;
    set_result(&cu_result, RUDA_ENODRIVER,
               "no usable CUDA driver: %s reports CUDA %d.%d; ruda needs a driver for CUDA 12.0 or "
               "newer",
               path, ver / 1000, ver % 1000 / 10);
    dlclose(lib);
    return;
  }
  ruda__cu.driver_version = ver;
  /* Ask for each symbol as of the older of our headers and the driver:
   * that is the ABI the header declarations describe (none of the calls
   * used here changed signature between 12.0 and the headers' version). */
  const int want = ver < CUDA_VERSION ? ver : CUDA_VERSION;
  CUdriverProcAddressQueryResult q;
#define RUDA__CU_GET(name)                                                                         \
  if (getproc(#name, (void **)&ruda__cu.name, want, CU_GET_PROC_ADDRESS_DEFAULT, &q) !=            \
          CUDA_SUCCESS ||                                                                          \
      ruda__cu.name == NULL) {                                                                     \
    cu_status = RUDA__CU_NO_SYMBOL;                                                                \
    set_result(&cu_result, RUDA_ENODRIVER,                                                         \
               "CUDA driver %s (CUDA %d.%d) lacks %s; update the driver", path, ver / 1000,       \
               ver % 1000 / 10, #name);                                                            \
    return;                                                                                        \
  }
  RUDA__CU_FUNCS(RUDA__CU_GET)
#undef RUDA__CU_GET
#define RUDA__CU_GET_OPT(name)                                                                     \
  if (getproc(#name, (void **)&ruda__cu.name, want, CU_GET_PROC_ADDRESS_DEFAULT, &q) !=            \
      CUDA_SUCCESS)                                                                                \
    ruda__cu.name = NULL;
  RUDA__CU_OPTIONAL(RUDA__CU_GET_OPT)
#undef RUDA__CU_GET_OPT
  /* The one call here whose signature changed after 12.0: the headers'
   * form (with edge data) is 12.3's; an older driver's would not match. */
  if (ver < 12030) ruda__cu.cuStreamGetCaptureInfo = NULL;
  CUresult r = ruda__cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    char d[160];
    ruda__cu_describe(r, d, sizeof d);
    /* The toolkit's stub libcuda stands in for a driver that is not
     * installed. */
    cu_status = r == CUDA_ERROR_NO_DEVICE         ? RUDA__CU_NO_DEVICE
                : r == CUDA_ERROR_STUB_LIBRARY ? RUDA__CU_NO_LIBRARY
                                               : RUDA__CU_INIT_FAILED;
    /* A driver without a device is a different fix from a missing driver. */
    set_result(&cu_result, r == CUDA_ERROR_NO_DEVICE ? RUDA_ENOBACKEND : RUDA_ENODRIVER,
               "cuInit failed: %s (driver %s, CUDA %d.%d)", d, path, ver / 1000, ver % 1000 / 10);
    return;
  }
  cu_result.code = 0;
}

int ruda__cu_load(void) {
  pthread_once(&cu_result.once, cu_load_once);
  /* A process has one driver: pointers, contexts and streams of one are
   * garbage to another, so a device asking for a different one is refused
   * rather than silently given the first. */
  const char *now = cu_wanted();
  if (strncmp(now, cu_tried, sizeof cu_tried - 1) != 0)
    return ruda__fail(RUDA_ENODRIVER,
                      "the CUDA driver is loaded once per process: this process loaded \"%s\" for "
                      "its first cuda device, and RUDA_CUDA_DRIVER now asks for \"%s\"; open "
                      "devices of another driver in another process",
                      cu_tried, now);
  if (cu_result.code != 0) return ruda__fail(cu_result.code, "%s", cu_result.msg);
  return 0;
}

ruda__cu_status ruda__cu_load_status(void) {
  pthread_once(&cu_result.once, cu_load_once);
  return cu_status;
}

/* NVRTC opens its builtins library (libnvrtc-builtins.so.X.Y) by name
 * when it compiles. A toolkit's lib directory is on the loader's path; a
 * copy elsewhere (NVIDIA's wheel) is not and has no RPATH, so the builtins
 * beside it are loaded first: a later open by that name finds them. */
static void preload_builtins(const char *nvrtc_path) {
  const char *slash = strrchr(nvrtc_path, '/');
  if (slash == NULL) return;
  char dir[512];
  snprintf(dir, sizeof dir, "%.*s", (int)(slash - nvrtc_path), nvrtc_path);
  DIR *d = opendir(dir);
  if (d == NULL) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strncmp(e->d_name, "libnvrtc-builtins.so.", 21) != 0) continue;
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    (void)dlopen(p, RTLD_NOW | RTLD_GLOBAL); /* kept for the process's life */
  }
  closedir(d);
}

static void *try_nvrtc(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib != NULL) {
    snprintf(ruda__nvrtc.path, sizeof ruda__nvrtc.path, "%s", path);
    preload_builtins(path);
  }
  return lib;
}

static void nvrtc_load_once(void) {
  const char *env = getenv("RUDA_NVRTC");
  void *lib = NULL;
  if (env && *env) {
    /* An explicit choice is not second-guessed by the fallbacks. */
    lib = try_nvrtc(env);
  } else {
    /* The system's first (a toolkit on the library path or at
     * /usr/local/cuda), then the tree ruda was built against (e.g. the
     * wheels tools/deps.sh unpacks on machines with only the driver). */
    static const char *names[] = {"libnvrtc.so.13",
                                  "libnvrtc.so.12",
                                  "libnvrtc.so",
                                  "/usr/local/cuda/lib64/libnvrtc.so.13",
                                  "/usr/local/cuda/lib64/libnvrtc.so.12",
                                  "/usr/local/cuda/lib64/libnvrtc.so",
#ifdef RUDA_CUDA_ROOT_DIR
                                  RUDA_CUDA_ROOT_DIR "/lib/libnvrtc.so.13",
                                  RUDA_CUDA_ROOT_DIR "/lib/libnvrtc.so.12",
                                  RUDA_CUDA_ROOT_DIR "/lib64/libnvrtc.so.13",
                                  RUDA_CUDA_ROOT_DIR "/lib64/libnvrtc.so.12",
#endif
    };
    for (size_t i = 0; lib == NULL && i < sizeof names / sizeof *names; i++) lib = try_nvrtc(names[i]);
  }
  if (lib == NULL) {
    set_result(&nvrtc_result, RUDA_ENONVRTC,
               "NVRTC not found (tried %s); install the CUDA toolkit's NVRTC or set RUDA_NVRTC to "
               "libnvrtc.so's path",
               env && *env ? env
#ifdef RUDA_CUDA_ROOT_DIR
                           : "libnvrtc.so.13, .so.12, .so, /usr/local/cuda/lib64 and " RUDA_CUDA_ROOT_DIR);
#else
                           : "libnvrtc.so.13, .so.12, .so and /usr/local/cuda/lib64");
#endif
    return;
  }
#define RUDA__NVRTC_GET(name)                                                                      \
  if ((*(void **)&ruda__nvrtc.name = dlsym(lib, #name)) == NULL) {                                 \
    set_result(&nvrtc_result, RUDA_ENONVRTC, "NVRTC %s lacks %s", ruda__nvrtc.path, #name);        \
    dlclose(lib);                                                                                  \
    return;                                                                                        \
  }
  RUDA__NVRTC_FUNCS(RUDA__NVRTC_GET)
#undef RUDA__NVRTC_GET
  if (ruda__nvrtc.nvrtcVersion(&ruda__nvrtc.major, &ruda__nvrtc.minor) != NVRTC_SUCCESS) {
    set_result(&nvrtc_result, RUDA_ENONVRTC, "NVRTC %s: nvrtcVersion failed", ruda__nvrtc.path);
    return;
  }
  nvrtc_result.code = 0;
}

int ruda__nvrtc_load(void) {
  pthread_once(&nvrtc_result.once, nvrtc_load_once);
  if (nvrtc_result.code != 0) return ruda__fail(nvrtc_result.code, "%s", nvrtc_result.msg);
  return 0;
}

int ruda__cu_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
      return 1;
    default:
      return 0;
  }
}

int ruda__cu_code(CUresult r) {
  if (ruda__cu_sticky(r)) return RUDA_EFAULTED;
  switch (r) {
    case CUDA_SUCCESS:
      return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return RUDA_EOUTOFMEMORY;
    case CUDA_ERROR_INVALID_VALUE:
      return RUDA_EINVAL;
    case CUDA_ERROR_NOT_READY:
      return RUDA_EAGAIN;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return RUDA_ENOBACKEND;
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_JIT_COMPILATION_DISABLED:
    case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED:
      return RUDA_ECOMPILE;
    case CUDA_ERROR_NOT_FOUND:
      return RUDA_EKERNEL;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
      return RUDA_ELAUNCH;
    default:
      return RUDA_ECUDA;
  }
}

const char *ruda__cu_describe(CUresult r, char *buf, size_t len) {
  const char *name = NULL, *text = NULL;
  /* Usable before the table is loaded only if it was loaded: guard. */
  if (ruda__cu.cuGetErrorName) ruda__cu.cuGetErrorName(r, &name);
  if (ruda__cu.cuGetErrorString) ruda__cu.cuGetErrorString(r, &text);
  if (name) snprintf(buf, len, "%s (%s)", name, text ? text : "no description");
  else snprintf(buf, len, "CUresult %d", (int)r);
  return buf;
}

/* "what: CUDA_ERROR_X (description)": what is cut, never the driver's
 * error, which the message must end with whole. */
static void vformat(char *out, size_t len, CUresult r, const char *fmt, va_list ap) {
  char what[RUDA__MSG_MAX], d[160];
  vsnprintf(what, sizeof what, fmt, ap);
  ruda__cu_describe(r, d, sizeof d);
  const size_t room = len > strlen(d) + 3 ? len - strlen(d) - 3 : 0;
  snprintf(out, len, "%.*s: %s", (int)room, what, d);
}

ruda_error *ruda__cu_error(CUresult r, const char *fmt, ...) {
  char msg[RUDA__MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vformat(msg, sizeof msg, r, fmt, ap);
  va_end(ap);
  return ruda__error_new(ruda__cu_code(r), (long)r, "%s", msg);
}

int ruda__cu_fail(CUresult r, const char *fmt, ...) {
  char msg[RUDA__MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vformat(msg, sizeof msg, r, fmt, ap);
  va_end(ap);
  return ruda__fail_backend(ruda__cu_code(r), (long)r, "%s", msg);
}

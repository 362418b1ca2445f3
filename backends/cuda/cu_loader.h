/* cu_loader.h - the CUDA driver and NVRTC, loaded at run time.
 *
 * libruda never links libcuda or libnvrtc: it dlopens them, so the library
 * loads and runs (host backend) on machines with neither. Driver entry
 * points come from cuGetProcAddress for the ABI of the headers we were
 * built with, so each table field has exactly the type of the declaration
 * in <cuda.h> (`cuMemAlloc` there is a macro for `cuMemAlloc_v2`, and the
 * field is named the same way, so `ruda__cu.cuMemAlloc(...)` reads like a
 * plain driver call).
 */
#ifndef RUDA_CU_LOADER_H
#define RUDA_CU_LOADER_H

#include <cuda.h>
#include <nvrtc.h>

#include "base/error.h"

/* Driver calls every cuda device needs. */
#define RUDA__CU_FUNCS(X)                                                                          \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)            \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                          \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)           \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)                     \
  X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)         \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo)           \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync)          \
  X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpy2DAsync) X(cuMemcpy3DAsync)                  \
  X(cuMemsetD8Async) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                  \
  X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuGetErrorName)                  \
  X(cuGetErrorString)

/* Newer calls: NULL when the driver lacks them; callers check. */
#define RUDA__CU_OPTIONAL(X)                                                                       \
  X(cuFuncGetParamInfo) X(cuTensorMapEncodeTiled) X(cuTensorMapEncodeIm2col) X(cuMemAllocAsync)    \
  X(cuMemFreeAsync) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags)     \
  X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuModuleGetFunctionCount)              \
  X(cuModuleEnumerateFunctions) X(cuFuncGetName) X(cuStreamGetCaptureInfo) X(cuGraphNodeGetType)       \
  X(cuGraphMemcpyNodeGetParams) X(cuGraphExecKernelNodeSetParams) X(cuGraphExecMemcpyNodeSetParams)   \
  X(cuPointerGetAttribute) X(cuGraphCreate) X(cuGraphAddKernelNode) X(cuGraphAddMemcpyNode)           \
  X(cuGraphKernelNodeSetParams) X(cuGraphMemcpyNodeSetParams) X(cuGraphExecUpdate)

#define RUDA__NVRTC_FUNCS(X)                                                                       \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram)              \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize)      \
  X(nvrtcGetCUBIN) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcAddNameExpression) X(nvrtcGetLoweredName)

typedef struct ruda__cu_api {
#define RUDA__CU_FIELD(name) __typeof__(&name) name;
  RUDA__CU_FUNCS(RUDA__CU_FIELD)
  RUDA__CU_OPTIONAL(RUDA__CU_FIELD)
#undef RUDA__CU_FIELD
  int driver_version; /* cuDriverGetVersion, e.g. 13000 */
  char path[256];     /* what was dlopened */
} ruda__cu_api;

typedef struct ruda__nvrtc_api {
#define RUDA__NVRTC_FIELD(name) __typeof__(&name) name;
  RUDA__NVRTC_FUNCS(RUDA__NVRTC_FIELD)
#undef RUDA__NVRTC_FIELD
  int major, minor;
  char path[256];
} ruda__nvrtc_api;

/* Filled by ruda__cu_load(); read-only afterwards. */
extern ruda__cu_api ruda__cu;
extern ruda__nvrtc_api ruda__nvrtc;

/* Loads libcuda.so.1 (or $RUDA_CUDA_DRIVER) and calls cuInit, once per
 * process. Returns 0, RUDA_ENODRIVER (no loadable driver, or one older
 * than CUDA 12) or RUDA_ENOBACKEND (driver present, no usable device),
 * with the reason in the thread's last error every time it is called.
 * RUDA_ENODRIVER too when RUDA_CUDA_DRIVER names another driver than the
 * one this process loaded. Thread-safe. */
int ruda__cu_load(void);

/* What ruda__cu_load() found, finer than its code: RUDA_ENODRIVER covers
 * a machine without a driver as well as a driver (or a stand-in) that is
 * broken, which a caller deciding "no GPU here" must tell apart. */
typedef enum ruda__cu_status {
  RUDA__CU_LOADED = 0,  /* loaded, cuInit succeeded */
  RUDA__CU_NO_LIBRARY,  /* dlopen failed, or the toolkit's stub libcuda */
  RUDA__CU_TOO_OLD,     /* the driver reports a CUDA version before 12.0 */
  RUDA__CU_NO_SYMBOL,   /* an entry point ruda needs is missing */
  RUDA__CU_NO_DEVICE,   /* cuInit: CUDA_ERROR_NO_DEVICE (RUDA_ENOBACKEND) */
  RUDA__CU_INIT_FAILED, /* cuInit failed otherwise */
} ruda__cu_status;

/* Loads the driver as ruda__cu_load() does (once per process) and says
 * what happened; the last error is not touched. Thread-safe. */
ruda__cu_status ruda__cu_load_status(void);

/* Loads NVRTC ($RUDA_NVRTC, else libnvrtc.so.13, .so.12, .so, then the
 * toolkit's lib64), once per process. RUDA_ENONVRTC when absent. */
int ruda__nvrtc_load(void);

/* CUresult -> ruda taxonomy. Out of memory is RUDA_EOUTOFMEMORY, faults
 * that poison the context are RUDA_EFAULTED, the rest as named. */
int ruda__cu_code(CUresult r);

/* Whether r leaves the context unusable (every later call fails). */
int ruda__cu_sticky(CUresult r);

/* "CUDA_ERROR_X (description)" for r, into buf. */
const char *ruda__cu_describe(CUresult r, char *buf, size_t len);

/* An owned error for a failed driver call: the message is fmt's text, ": ",
 * then the CUresult's name and description; backend_code is r. */
ruda_error *ruda__cu_error(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The same, into the thread's last error; returns the ruda code. */
int ruda__cu_fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* RUDA_CU_LOADER_H */

/* cublaslt_abi.c - examples/cublaslt_dl.h restates cuBLASLt's ABI (the
 * constants, the heuristic result's layout) so the examples build without
 * its headers; built where cublasLt.h is installed, this fails to compile
 * when a value or a layout differs. Running it only says so. */
#include <cublasLt.h>
#include <stddef.h>
#include <stdio.h>

#include "cublaslt_dl.h"

_Static_assert((int)CUBLASLT_DL_R_32F == (int)CUDA_R_32F, "CUDA_R_32F");
_Static_assert((int)CUBLASLT_DL_COMPUTE_32F == (int)CUBLAS_COMPUTE_32F, "CUBLAS_COMPUTE_32F");
_Static_assert((int)CUBLASLT_DL_DESC_EPILOGUE == (int)CUBLASLT_MATMUL_DESC_EPILOGUE, "EPILOGUE");
_Static_assert((int)CUBLASLT_DL_DESC_BIAS_POINTER == (int)CUBLASLT_MATMUL_DESC_BIAS_POINTER, "BIAS_POINTER");
_Static_assert((int)CUBLASLT_DL_PREF_MAX_WORKSPACE_BYTES == (int)CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, "MAX_WORKSPACE");
_Static_assert((int)CUBLASLT_DL_EPILOGUE_BIAS == (int)CUBLASLT_EPILOGUE_BIAS, "EPILOGUE_BIAS");
_Static_assert((int)CUBLASLT_DL_EPILOGUE_GELU_BIAS == (int)CUBLASLT_EPILOGUE_GELU_BIAS, "EPILOGUE_GELU_BIAS");
_Static_assert(sizeof(cublaslt_dl_algo) == sizeof(cublasLtMatmulAlgo_t), "algo");
_Static_assert(sizeof(cublaslt_dl_heur) == sizeof(cublasLtMatmulHeuristicResult_t), "heuristic result");
_Static_assert(offsetof(cublaslt_dl_heur, workspace_size) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize),
               "workspaceSize");
_Static_assert(offsetof(cublaslt_dl_heur, state) == offsetof(cublasLtMatmulHeuristicResult_t, state), "state");

int main(void) {
  printf("cublaslt_dl.h matches cublasLt.h\n");
  return 0;
}

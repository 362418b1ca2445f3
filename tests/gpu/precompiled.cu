// precompiled.cu - built ahead of time with nvcc -cubin on the GPU machine
// (tools/gpu_run.sh) and loaded by gpu_kernels' precompiled_images_run
// through ruda_module_file; the same vectorAdd as SRC_CXX.
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

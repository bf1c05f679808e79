/* A C/CUDA program that uses the NCCL backend through mpu and calls the CUDA
 * runtime itself, built with find_package(mpu COMPONENTS nccl) and mpu::nccl
 * alone (which brings CUDA::cudart, NCCL and their headers). It asks whether
 * the backend is there (it is: this program's libmpu_nccl registered it when
 * it loaded) and how many GPUs CUDA sees (none is fine: it must only link). */
#include <stdio.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "mpu.h"

int main(void) {
  int gpus = 0;
  cudaError_t e = cudaGetDeviceCount(&gpus);
  printf("CUDA: %d GPU(s) (%s), nccl.h %d.%d.%d\n", e == cudaSuccess ? gpus : 0,
         cudaGetErrorString(e), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  if (!mpu_nccl_available()) {
    fprintf(stderr, "no NCCL backend: %s\n", mpu_last_error());
    return 1;
  }
  printf("nccl backend ok\n");
  return 0;
}

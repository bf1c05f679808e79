/*
 * managed.c - the cases' buffers in CUDA managed memory, for the drivers
 * that run the suite on NCCL (a GPU, or the test double): the host fills and
 * checks them, NCCL moves them.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "conformance/conformance.h"

void *conf_managed_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal) != cudaSuccess) return NULL;
  memset(p, 0, bytes ? bytes : 1);
  return p;
}

void conf_managed_free(void *p) { cudaFree(p); }

/*
 * runtime.h - what the test double pretends the libraries and the device
 * are (runtime.c), for tests of how mpu copes with the NCCL and the CUDA it
 * meets at run time. These are not forgiving shortcuts (switches.h): each
 * models a real machine.
 *
 *   - NCCL's version: ncclGetVersion answers DOUBLE_NCCL_CODE (a compile
 *     definition; default the nccl.h it is built with), or the environment
 *     variable MPU_DOUBLE_NCCL_VERSION ("2.17.1"). ncclAlltoAll is exported
 *     only when DOUBLE_NCCL_CODE is 2.28.3 or newer, as in NCCL: a library
 *     built with an older code is an older libnccl.so.2 (tests/CMakeLists.txt
 *     builds one, NCCL 2.27.7, as libnccl.so.2 alone without mpu's backend).
 *   - cuMemGetAddressRange, reached through cudaGetDriverEntryPointByVersion:
 *     the base and size of the allocation holding a pointer (memory.c's
 *     registry), CUDA_ERROR_NOT_FOUND outside every allocation.
 *   - cudaMallocAsync / cudaFreeAsync: stream-ordered; the free happens when
 *     the stream reaches it, without synchronising the device.
 *   - cudaLaunchHostFunc: the stream runs the function when it reaches it.
 *   - double_pretend_host_alias(1): the device maps registered host memory
 *     at another address (cudaDevAttrCanUseHostPointerForRegisteredMem 0):
 *     cudaPointerGetAttributes' devicePointer differs from the host pointer.
 */
#ifndef MPU_TESTS_NCCL_DOUBLE_RUNTIME_H
#define MPU_TESTS_NCCL_DOUBLE_RUNTIME_H

#include <cuda_runtime.h>
#include <stddef.h>

/* How many calls of a CUDA allocation function ("cudaMalloc", "cudaFree",
 * "cudaMallocAsync", "cudaFreeAsync") this process made; -1 for a name it
 * does not count. Exported. */
long double_cuda_count(const char *function);
void double_cuda_tally(const char *function); /* memory.c, runtime.c */

/* Registered host memory mapped at another device address (1) or at its own
 * (0, the default). Exported. */
void double_pretend_host_alias(int on);
/* The device address of registered host memory at p (memory.c). */
void *double_host_device_pointer(void *p);

/* memory.c: device memory as cudaMalloc makes it, uncounted (cudaMallocAsync) */
cudaError_t double_mem_alloc_device(void **p, size_t bytes);
/* memory.c: free a device allocation made by cudaMalloc/cudaMallocAsync
 * now, without synchronising (cudaFreeAsync's task); 0, or -1 if p is none. */
int double_mem_release_now(void *p);

#endif

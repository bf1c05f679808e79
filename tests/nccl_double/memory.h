/*
 * memory.h - the test double's memory (memory.c): every allocation the CUDA
 * runtime hands out or registers, by address range and kind, and the
 * "sticky" faults of a device whose kernel touched memory outside them.
 *
 * What it keeps of CUDA 13's behaviour:
 *   - cudaMalloc is device memory of the current device, cudaMallocManaged
 *     managed memory, cudaMallocHost / cudaHostAlloc and cudaHostRegister
 *     page-locked host memory that the device can address;
 *   - cudaPointerGetAttributes answers from them: plain host memory is
 *     cudaMemoryTypeUnregistered with cudaSuccess (CUDA 11 onwards);
 *   - a kernel (here: an NCCL call) that reads or writes outside every such
 *     allocation faults as an illegal address would, and the fault is
 *     sticky: every later runtime call on that device returns
 *     cudaErrorIllegalAddress (real CUDA: until the process exits);
 *   - the host cannot read or write device memory (cudaMalloc,
 *     cudaMallocAsync): the address handed out is one mapping of a memory
 *     file with no access, so a host dereference faults (SIGSEGV) as on a
 *     GPU; the double's copies, memsets and NCCL calls reach the bytes
 *     through a second mapping of the same file (double_mem_view). Managed
 *     and page-locked host memory stay readable, as on CUDA;
 *   - cudaFree and cudaFreeHost wait for every stream of the device first.
 * The switches (switches.h) "pointers" take any pointer as device memory,
 * "host_access" makes device memory ordinary heap memory, "free_nowait"
 * frees without waiting.
 */
#ifndef MPU_TESTS_NCCL_DOUBLE_MEMORY_H
#define MPU_TESTS_NCCL_DOUBLE_MEMORY_H

#include <cuda_runtime.h>
#include <stddef.h>

typedef struct double_alloc {
  char *base;
  size_t bytes;
  enum cudaMemoryType type; /* Device, Managed or Host (page-locked / registered) */
  int device;               /* the device current when it was made */
  int registered;           /* 1: cudaHostRegister (the caller owns the bytes) */
  char *view;               /* where the double's own kernels reach the bytes: base, or for
                               device memory a second mapping of them (base is PROT_NONE) */
  size_t mapped;            /* the length of both mappings; 0 when base is heap memory */
} double_alloc;

/* The allocation holding all of [p, p + bytes) (bytes 0: holding p); 1 and
 * *out filled, or 0 when none does. */
int double_mem_find(const void *p, size_t bytes, double_alloc *out);

/* Where the double's own kernels read and write p: inside device memory, the
 * second, accessible mapping at the same offset; anywhere else p itself. */
void *double_mem_view(const void *p);

/* Whether a device kernel may touch [p, p + bytes): inside one device,
 * managed or registered allocation (or the "pointers" switch is on). */
int double_mem_usable(const void *p, size_t bytes);

/* A kernel on device touched memory it may not: the device's context is
 * broken from now on (what names the access, for double_fault_message). */
void double_fault(int device, const char *what);

/* cudaSuccess, or the sticky error of device. */
cudaError_t double_sticky(int device);

/* The first fault's description ("" when none). */
const char *double_fault_message(void);

/* Forget every fault (tests only: real CUDA needs a new process). Exported. */
void double_clear_faults(void);

#endif

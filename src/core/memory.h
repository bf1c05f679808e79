/*
 * memory.h - zeroed buffers for the training state (parameters, gradients,
 * optimizer moments), on 2 MiB pages where the kernel gives them.
 *
 * A step reads each of these buffers once or twice from beyond the caches
 * (the weights for every micro-batch's products, the gradients and moments
 * for AdamW), megabytes apart: on 4 KiB pages every 4 KiB is a TLB miss.
 * A buffer of 2 MiB or more starts on a 2 MiB boundary and is advised to
 * transparent huge pages (Linux's MADV_HUGEPAGE: advice only, a kernel that
 * declines it gives ordinary pages), then zeroed; a smaller one is calloc's.
 */
#ifndef MPU_CORE_MEMORY_H
#define MPU_CORE_MEMORY_H

#include <stddef.h>

/* n elements of size bytes, zeroed, for free(); NULL if n x size overflows
 * or the memory is not there. */
void *mpu__zalloc_large(size_t n, size_t size);

#endif

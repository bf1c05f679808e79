/*
 * memory.c - the training state's zeroed buffers (memory.h says why).
 */
#include "core/memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *mpu__zalloc_large(size_t n, size_t size) {
  const size_t huge = (size_t)2 << 20;
  if (size && n > SIZE_MAX / size) return NULL;
  size_t bytes = n * size;
  if (bytes < huge) return calloc(n ? n : 1, size ? size : 1);
  if (bytes > SIZE_MAX - (huge - 1)) return NULL;
  size_t rounded = (bytes + huge - 1) & ~(huge - 1);
  void *p = NULL;
  if (posix_memalign(&p, huge, rounded)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE); /* before the first touch: the zeroing faults huge pages */
#endif
  memset(p, 0, bytes);
  return p;
}

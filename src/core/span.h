/*
 * span.h - byte ranges in memory: the one overlap rule that copies
 * (mpu_comm_copy2d) and the tensor split/concat share.
 */
#ifndef MPU_CORE_SPAN_H
#define MPU_CORE_SPAN_H

#include <stddef.h>
#include <stdint.h>

/* Do [a, a + an) and [b, b + bn) share a byte? Empty ranges share none.
 * Callers have checked that neither range wraps the address space. */
static inline int mpu__spans_overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

/* The bytes a strided block spans: rows - 1 pitches and one row of width,
 * in *out; 0 if that overflows, leaves PTRDIFF_MAX or wraps past p's end of
 * the address space (rows >= 1, pitch >= width). */
static inline int mpu__span2d(const void *p, size_t pitch, size_t width, size_t rows,
                              size_t *out) {
  size_t lead;
  if (width > (size_t)PTRDIFF_MAX || __builtin_mul_overflow(rows - 1, pitch, &lead) ||
      lead > (size_t)PTRDIFF_MAX - width || (uintptr_t)p > UINTPTR_MAX - (lead + width))
    return 0;
  *out = lead + width;
  return 1;
}

#endif

/*
 * simd.h - function multiversioning for the hot element-wise loops.
 *
 * MPU_SIMD_CLONES on a function makes the compiler emit it three times, for
 * x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline x86-64 (SSE2),
 * and pick one when the library loads (an ifunc). One binary runs on every
 * x86-64 and uses the widest vectors the machine has. Elsewhere (other
 * architectures, compilers without the attribute) the function is compiled
 * once, for the build's target.
 *
 * The loops are written so that every clone computes the same values element
 * by element: no -ffast-math, no contraction of a * b + c (C11 mode keeps
 * -ffp-contract=off), so only the width of the vectors changes. Reductions
 * over a row (LayerNorm's mean) may add in a different order per clone.
 */
#ifndef MPU_CORE_SIMD_H
#define MPU_CORE_SIMD_H

/* ThreadSanitizer instruments the ifunc resolver, which the dynamic linker
 * runs before TSan's runtime is up: a TSan build gets the baseline only. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11 && !defined(MPU_NO_SIMD_CLONES) && !defined(__SANITIZE_THREAD__)
#define MPU_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MPU_SIMD_CLONES
#endif

#endif

/*
 * gemm.c - dx = dy W without packing W (gemm.h says why).
 *
 * The kernel keeps a tile of C, 8 rows by 32 columns, in 16 AVX-512
 * registers and walks k: two loads of B's row k (32 floats, in place) and
 * eight broadcasts of A's column k, sixteen fused multiply-adds. A panel of
 * B's 32 columns stays in cache while the tiles of A's rows pass it, so
 * each element of the weight is read once per product; while the first
 * tile of a panel runs, the next panel's rows are prefetched.
 */
#include "layers/gemm.h"

#include <cblas.h>
#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define GEMM_AVX512 1
#include <immintrin.h>
#endif

#ifdef GEMM_AVX512

enum { MR = 8, NR = 32 };

#define AVX512 __attribute__((target("avx512f")))

/* acc (mr x 32) = sum over l < k of a[r * lda + l] b[l * ldb + 0..31]: B's
 * columns past the masks' read as zero (full: no mask); pf (or NULL): the
 * next panel, a row of which is prefetched at each l. Inlined with mr and
 * full constants, so acc stays in registers. */
static inline __attribute__((always_inline)) AVX512 void
tile(int mr, int full, int k, const float *a, size_t lda, const float *b, size_t ldb,
     const char *pf, __mmask16 m0, __mmask16 m1, __m512 acc[MR][2]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int l = 0; l < k; l++) {
    const float *bl = b + (size_t)l * ldb;
    if (pf) {
      _mm_prefetch(pf + (size_t)l * ldb * sizeof(float), _MM_HINT_T0);
      _mm_prefetch(pf + (size_t)l * ldb * sizeof(float) + 64, _MM_HINT_T0);
    }
    __m512 b0 = full ? _mm512_loadu_ps(bl) : _mm512_maskz_loadu_ps(m0, bl);
    __m512 b1 = full ? _mm512_loadu_ps(bl + 16) : _mm512_maskz_loadu_ps(m1, bl + 16);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      __m512 x = _mm512_set1_ps(a[(size_t)r * lda + l]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
}

/* one tile of C: mr rows (1..8) by nr columns (1..32) */
static AVX512 void one_tile(int mr, int nr, int k, const float *a, size_t lda, const float *b,
                            size_t ldb, const char *pf, float *c, size_t ldc) {
  __m512 acc[MR][2];
  __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
  __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
  if (mr == MR && nr == NR) {
    tile(MR, 1, k, a, lda, b, ldb, pf, m0, m1, acc); /* the hot one */
  } else {
    switch (mr) { /* the edges of C */
#define ROWS(R) \
  case R: tile(R, 0, k, a, lda, b, ldb, pf, m0, m1, acc); break;
      ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    }
  }
  for (int r = 0; r < mr; r++) {
    _mm512_mask_storeu_ps(c + (size_t)r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_ps(c + (size_t)r * ldc + 16, m1, acc[r][1]);
  }
}

static AVX512 void kernel(int m, int n, int k, const float *a, size_t lda, const float *b,
                          size_t ldb, float *c, size_t ldc) {
  for (int j0 = 0; j0 < n; j0 += NR) {
    const char *next = j0 + NR < n ? (const char *)(b + j0 + NR) : NULL;
    for (int i0 = 0; i0 < m; i0 += MR)
      one_tile(m - i0 < MR ? m - i0 : MR, n - j0 < NR ? n - j0 : NR, k, a + (size_t)i0 * lda,
               lda, b + j0, ldb, i0 == 0 ? next : NULL, c + (size_t)i0 * ldc + j0, ldc);
  }
}

/* whether this CPU runs AVX-512 (1), or not (0); -1 until asked. Every
 * thread that asks finds the same answer. */
static int have_avx512 = -1;

static int use_kernel(void) {
  int have = __atomic_load_n(&have_avx512, __ATOMIC_RELAXED);
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") != 0;
    __atomic_store_n(&have_avx512, have, __ATOMIC_RELAXED);
  }
  return have;
}

#endif

void mpu__gemm_nn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                  int ldc) {
#ifdef GEMM_AVX512
  if (m > 0 && n > 0 && k > 0 && use_kernel()) {
    kernel(m, n, k, a, (size_t)lda, b, (size_t)ldb, c, (size_t)ldc);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
              ldc);
}

/*
 * gemm.c - the linears' products without BLAS's packing (gemm.h says why).
 *
 * The kernel keeps a tile of C, 8 rows by 32 columns, in 16 AVX-512
 * registers and walks k: two loads of B's row k (32 floats, in place) and
 * eight broadcasts of A's column k, sixteen fused multiply-adds. A panel of
 * B's 32 columns stays in cache while the tiles of A's rows pass it, so
 * each element of the weight is read once per product; while the first
 * tile of a panel runs, the next panel's rows are prefetched. From 64 rows
 * of A on (the linears' 128 tokens) the panel is first copied, 256 of B's
 * rows at a time, into 32 KiB of its own (kernel_packed): in place its rows
 * are the weight's row length apart and evict one another from the caches.
 * The forward's sums are cut in OpenBLAS's blocks of k (blas_block): the
 * partial chains of a block longer than a packed piece wait in a buffer of
 * 128 rows while C holds the blocks before.
 */
#include "layers/gemm.h"

#include <cblas.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define GEMM_AVX512 1
#include <immintrin.h>
#endif

#ifdef GEMM_AVX512

enum { MR = 8, NR = 32 };

/* from this many rows of A on, B's panels are packed (kernel_packed): the
 * linears' 128 tokens, not the attention's blocks of 32 rows */
enum { PACK_ROWS = 64 };

#define AVX512 __attribute__((target("avx512f")))

/* acc (mr x 32) = sum over l < k of a[r * lda + l] b[l * ldb + 0..31]: B's
 * columns past the masks' read as zero (full: no mask); pf (or NULL): the
 * next panel, a row of which is prefetched at each l. Inlined with mr and
 * full constants, so acc stays in registers. */
static inline __attribute__((always_inline)) AVX512 void
tile(int mr, int full, int k, const float *a, size_t lda, const float *b, size_t ldb,
     const char *pf, size_t pfs, __mmask16 m0, __mmask16 m1, __m512 acc[MR][2]) {
  for (int l = 0; l < k; l++) {
    const float *bl = b + (size_t)l * ldb;
    if (pf) { /* as an address, not a pointer: the next block may have fewer than k rows,
                 and a prefetch past B's end is harmless where pointer arithmetic is not */
      uintptr_t pa = (uintptr_t)pf + (uintptr_t)l * pfs;
      _mm_prefetch((const char *)pa, _MM_HINT_T0);
      _mm_prefetch((const char *)(pa + 64), _MM_HINT_T0);
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

/* the masks of a row of nr (1..32) of a tile's 32 columns: its two halves */
static inline __attribute__((always_inline)) void col_masks(int nr, __mmask16 *m0,
                                                            __mmask16 *m1) {
  *m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
  *m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
}

/* how one_tile ends a chain: C = the sums (or, with from, the chain so far
 * and these terms: the same chain of fused multiply-adds, cut where memory
 * holds it exactly); C += the sums (BLAS's beta 1, and each of OpenBLAS's
 * blocks of k after the first); C = 0 + the sums (OpenBLAS's first block on
 * the C it zeroed for beta 0: an underflowed -0 comes out +0) */
enum { KEEP, ADD, FRESH };

/* one tile of C: mr rows (1..8) by nr columns (1..32); the chain starts
 * from 0 or, with from (ldf apart), from the sums there; end as above. B's
 * rows are whole (full) where B is a packed panel, its columns past nr zero. */
static AVX512 void one_tile(int mr, int nr, int k, const float *a, size_t lda, const float *b,
                            size_t ldb, const char *pf, size_t pfs, int full, const float *from,
                            size_t ldf, int end, float *c, size_t ldc) {
  __m512 acc[MR][2];
  __mmask16 m0, m1;
  col_masks(nr, &m0, &m1);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
    if (from && r < mr) {
      acc[r][0] = _mm512_maskz_loadu_ps(m0, from + (size_t)r * ldf);
      acc[r][1] = _mm512_maskz_loadu_ps(m1, from + (size_t)r * ldf + 16);
    } else {
      acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
  if (mr == MR && (nr == NR || full)) {
    tile(MR, 1, k, a, lda, b, ldb, pf, pfs, m0, m1, acc); /* the hot one */
  } else {
    switch (mr) { /* the edges of C */
#define ROWS(R) \
  case R: tile(R, full, k, a, lda, b, ldb, pf, pfs, m0, m1, acc); break;
      ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    }
  }
  /* unrolled, as the loads above, so that acc stays in registers */
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    if (r >= mr) break;
    if (end != KEEP) {
      __m512 c0 = end == ADD ? _mm512_maskz_loadu_ps(m0, c + (size_t)r * ldc) : _mm512_setzero_ps();
      __m512 c1 =
          end == ADD ? _mm512_maskz_loadu_ps(m1, c + (size_t)r * ldc + 16) : _mm512_setzero_ps();
      acc[r][0] = _mm512_add_ps(c0, acc[r][0]);
      acc[r][1] = _mm512_add_ps(c1, acc[r][1]);
    }
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
               lda, b + j0, ldb, i0 == 0 ? next : NULL, ldb * sizeof(float), 0, NULL, 0, KEEP,
               c + (size_t)i0 * ldc + j0, ldc);
  }
}

/* KC rows of a panel of B, packed: 32 KiB, in L1 beside A's rows */
enum { KC = 256 };

/* r[t] = column t of the 16 x 16 block whose rows were r[0..15] */
static inline __attribute__((always_inline)) AVX512 void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 4) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    t[i + 2] = _mm512_unpacklo_ps(r[i + 2], r[i + 3]);
    t[i + 3] = _mm512_unpackhi_ps(r[i + 2], r[i + 3]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

/* pb (kc x 32) = rows k0.. of columns j0.. of B, where B is given
 * transposed (b[j * ldb + l]: the weight W of x W^T), 16 x 16 at a time;
 * past nr columns zero */
static AVX512 void pack_transposed(float *pb, const float *b, size_t ldb, int j0, int nr, int k0,
                                   int kc) {
  for (int l0 = 0; l0 < kc; l0 += 16) {
    int nl = kc - l0 < 16 ? kc - l0 : 16;
    __mmask16 ml = nl == 16 ? 0xFFFF : (__mmask16)((1u << nl) - 1);
    for (int h = 0; h < NR; h += 16) {
      __m512 r[16];
      for (int t = 0; t < 16; t++)
        r[t] = h + t < nr ? _mm512_maskz_loadu_ps(ml, b + (size_t)(j0 + h + t) * ldb + k0 + l0)
                          : _mm512_setzero_ps();
      transpose16(r);
      for (int t = 0; t < nl; t++) _mm512_store_ps(pb + (size_t)(l0 + t) * NR + h, r[t]);
    }
  }
}

/* OpenBLAS 0.3.21's blocks of k (driver/level3/level3.c, with GEMM_Q 448 and
 * GEMM_UNROLL_M 16 of param.h's SKYLAKEX): of the k left, 448 while 896 or
 * more are left, then past 448 half of them rounded up to 16, then the
 * rest. Its kernel sums each block as one chain from 0 and adds it to C. */
enum { BLAS_Q = 448, BLAS_UNROLL_M = 16 };

static int blas_block(int left) {
  if (left >= 2 * BLAS_Q) return BLAS_Q;
  if (left > BLAS_Q) return (left / 2 + BLAS_UNROLL_M - 1) / BLAS_UNROLL_M * BLAS_UNROLL_M;
  return left;
}

/* rows of C whose chains wait in part (16 KiB) while a block of k longer
 * than KC is packed piece by piece: C itself holds the blocks before */
enum { MB = 128 };

/* The same products with B's panels copied, at most KC rows at a time, into
 * a buffer of their own first. B's rows in place are ldb apart, 1 or 4 KiB
 * at the linears' shapes: a panel's rows then fall in a few sets of the
 * caches and evict one another, so each tile of A's rows read the panel from
 * further out. Worth its copy where many tiles of A pass each panel.
 * Without bt each element is one chain over all of k, cut where C holds it.
 * bt: B is given transposed (pack_transposed), and the sums are OpenBLAS's
 * (blas_block): each block's chain added to C (add: BLAS's beta 1) or, the
 * first without add, to 0. */
static AVX512 void kernel_packed(int m, int n, int k, const float *a, size_t lda,
                                 const float *b, size_t ldb, int bt, int add, float *c,
                                 size_t ldc) {
  float pb[KC * NR] __attribute__((aligned(64)));
  float part[MB * NR] __attribute__((aligned(64)));
  int rows = bt && k > KC ? MB : m; /* rows of A per pass over a panel's blocks */
  for (int j0 = 0; j0 < n; j0 += NR) {
    int nr = n - j0 < NR ? n - j0 : NR;
    __mmask16 m0, m1;
    col_masks(nr, &m0, &m1);
    for (int g0 = 0, g1; g0 < m; g0 = g1) {
      g1 = m - g0 < rows ? m : g0 + rows;
      for (int b0 = 0, len; b0 < k; b0 += len) {
        len = bt ? blas_block(k - b0) : k;
        int end = !bt ? KEEP : add || b0 > 0 ? ADD : FRESH;
        int pieces = len / KC + (len % KC != 0); /* even pieces, whole vectors of the transpose */
        int piece = (len / pieces + (len % pieces != 0) + 15) / 16 * 16;
        for (int k0 = b0, kc; k0 < b0 + len; k0 += kc) {
          kc = b0 + len - k0 < piece ? b0 + len - k0 : piece;
          int first = k0 == b0, last = k0 + kc == b0 + len;
          if (bt) pack_transposed(pb, b, ldb, j0, nr, k0, kc);
          else
            for (int l = 0; l < kc; l++) {
              const float *bl = b + (size_t)(k0 + l) * ldb + j0;
              _mm512_store_ps(pb + l * NR, _mm512_maskz_loadu_ps(m0, bl));
              _mm512_store_ps(pb + l * NR + 16, _mm512_maskz_loadu_ps(m1, bl + 16));
            }
          /* the first tile fetches the rows that are packed next (at most kc of them), from
           * pages the caches' own prefetchers do not cross; B^T's rows are whole lines */
          const char *next = bt ? NULL
                             : k0 + kc < k ? (const char *)(b + (size_t)(k0 + kc) * ldb + j0)
                             : j0 + NR < n ? (const char *)(b + j0 + NR)
                                           : NULL;
          for (int i0 = g0; i0 < g1; i0 += MR) {
            /* where the chain waits between pieces: in C where the block's sums are C's, in
             * part (rows = MB) where C holds the blocks before; a block of one piece waits not */
            int in_c = end == KEEP || (first && last);
            float *ci = c + (size_t)i0 * ldc + j0, *wait = in_c ? ci : part + (size_t)(i0 - g0) * NR;
            size_t ldw = in_c ? ldc : NR;
            one_tile(g1 - i0 < MR ? g1 - i0 : MR, nr, kc, a + (size_t)i0 * lda + k0, lda, pb, NR,
                     i0 == g0 ? next : NULL, ldb * sizeof(float), 1, first ? NULL : wait, ldw,
                     last ? end : KEEP, last ? ci : wait, last ? ldc : ldw);
          }
        }
      }
    }
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
    if (m >= PACK_ROWS)
      kernel_packed(m, n, k, a, (size_t)lda, b, (size_t)ldb, 0, 0, c, (size_t)ldc);
    else kernel(m, n, k, a, (size_t)lda, b, (size_t)ldb, c, (size_t)ldc);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
              ldc);
}

void mpu__gemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, int add,
                  float *c, int ldc) {
#ifdef GEMM_AVX512
  if (m >= PACK_ROWS && n > 0 && k > 0 && use_kernel()) {
    kernel_packed(m, n, k, a, (size_t)lda, b, (size_t)ldb, 1, add, c, (size_t)ldc);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, lda, b, ldb,
              add ? 1.0f : 0.0f, c, ldc);
}

/*
 * gemm.h - the linears' products on mpu's own kernel where it beats BLAS.
 *
 * cblas_sgemm (OpenBLAS) copies ("packs") both operands of every product
 * into its own layout first. At the linears' shapes (a micro-batch's 128
 * tokens against a weight of 256 x 1024, say) the weight is the bigger
 * operand, and its packing took about a seventh of a training step
 * (docs/train.md). The kernel (gemm.c) keeps a tile of C in registers and
 * walks k over a panel of B's 32 columns: in place where the product is
 * small (four of the attention's six per-head products, transformer.c), or
 * copied into 32 KiB of its own where many rows of A pass it: the input
 * gradient dx = dy W (the weight's rows as they are) and the forward x W^T
 * (the weight's rows transposed into the panel, 16 x 16 at a time, its sums
 * cut where OpenBLAS cuts them). The weight gradient dy^T x stays with
 * cblas_sgemm, which ran faster there.
 */
#ifndef MPU_LAYERS_GEMM_H
#define MPU_LAYERS_GEMM_H

/* c (m, n) = a (m, k) b (k, n), row-major float32 (cblas_sgemm's NoTrans,
 * NoTrans, alpha 1, beta 0). On a CPU with AVX-512 (and not under a tool
 * that hides it, valgrind) each element is one fused multiply-add per k, k
 * ascending, from 0: the same bits whatever the shapes around it. */
void mpu__gemm_nn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                  int ldc);

/* c (m, n) = a (m, k) b^T, b (n, k) row-major, or (add) c += that
 * (cblas_sgemm's NoTrans, Trans, alpha 1, beta 0 or 1): the linears'
 * forward, x W^T. On a CPU with AVX-512, from 64 rows on, the sums are
 * OpenBLAS 0.3.21's on one thread with its SkylakeX kernel, where its
 * level-3 driver runs (more than 100^3 multiply-adds): k cut in its blocks
 * (448 while 896 are left, then past 448 half the rest rounded up to 16,
 * then the rest), each block one chain of fused multiply-adds, k ascending,
 * from 0, added to c (to 0 for the first block without add). The demo's
 * losses are the same to the last digit with either; another BLAS, another
 * OpenBLAS kernel, its threaded driver (which halves without rounding) or
 * its small-matrix kernel may round differently. */
void mpu__gemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, int add,
                  float *c, int ldc);

#endif

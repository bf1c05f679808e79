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
 * (the weight's rows transposed into the panel, 16 x 16 at a time). The
 * weight gradient dy^T x stays with cblas_sgemm, which ran faster there.
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
 * forward, x W^T. On a CPU with AVX-512, from 64 rows on and for k up to 256,
 * each element is one chain of fused multiply-adds over k, k ascending, from
 * 0 (added to c with add). That is how OpenBLAS 0.3's SkylakeX kernel
 * sums at these shapes (the demo's losses are the same to the last digit
 * with either); another BLAS, or another OpenBLAS kernel, may round
 * differently. Longer k (fc2's 1024) stays with cblas_sgemm, which cuts its
 * sums in blocks of its own. */
void mpu__gemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, int add,
                  float *c, int ldc);

#endif

/*
 * gemm.h - the linears' input gradient, dx = dy W, without packing W.
 *
 * cblas_sgemm (OpenBLAS) copies ("packs") both operands of every product
 * into its own layout first. At the linears' shapes (a micro-batch's 128
 * tokens against a weight of 256 x 1024, say) the weight is the bigger
 * operand, and its packing took about a seventh of a training step
 * (docs/train.md). In dx = dy W the weight is the right operand in its own
 * row-major layout, which is what an AVX-512 kernel wants: it reads W's
 * rows where they are. The forward (x W^T) and the weight gradient (dy^T x)
 * stay with cblas_sgemm: on the same kernel (W x^T transposed, dW a tile
 * at a time) the step was no faster (docs/train.md). Four of the
 * attention's six small per-head products run on it too (transformer.c).
 */
#ifndef MPU_LAYERS_GEMM_H
#define MPU_LAYERS_GEMM_H

/* c (m, n) = a (m, k) b (k, n), row-major float32 (cblas_sgemm's NoTrans,
 * NoTrans, alpha 1, beta 0). On a CPU with AVX-512 (and not under a tool
 * that hides it, valgrind) each element is one fused multiply-add per k, k
 * ascending, from 0: the same bits whatever the shapes around it. */
void mpu__gemm_nn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                  int ldc);

#endif

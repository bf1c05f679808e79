/*
 * mpu/layers.h - Megatron's tensor-parallel layers (layers.py,
 * cross_entropy.py, data.py) on the regions, with explicit forward and
 * backward calls in llm.c's style.
 *
 * Activations are float32, row-major, N tokens per row; shapes are given in
 * the comments as (rows, cols). Each layer owns its parameters and their
 * gradients; backward *adds* into the gradients (zero them with
 * mpu_*_zero_grad between steps) and saves nothing but what forward keeps.
 *
 * Weights are initialised as Megatron's CPU path does: the whole (master)
 * weight is drawn from a seeded stream, identical on every rank, then this
 * rank keeps its slice. So a layer with tp = T holds exactly the slices of
 * the single-rank layer made with the same seed. Biases start at zero.
 * Matrix products use BLAS (cblas_sgemm). The layers are their own library,
 * libmpu_layers (pkg-config mpu-layers, CMake mpu::layers), so that programs
 * without layers do not load BLAS.
 */
#ifndef MPU_LAYERS_H
#define MPU_LAYERS_H

#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/regions.h"
#include "mpu/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- initialisation and options -------------------------------------------------------- */

/* Fill a master weight (rows, cols), row-major, from rng (torch's init
 * functions on a CPU tensor). Megatron-DeepSpeed's layers (mpu/layers.py) default
 * to xavier_normal; Megatron's init_method_normal(sigma) is mpu_init_normal
 * with arg pointing at sigma. */
typedef void (*mpu_init_method)(float *master, int rows, int cols, mpu_rng *rng, void *arg);
MPU_API void mpu_init_xavier_normal(float *master, int rows, int cols, mpu_rng *rng, void *arg);
MPU_API void mpu_init_normal(float *master, int rows, int cols, mpu_rng *rng, void *arg);

/*
 * mpu/layers.py's layer arguments by name (ColumnParallelLinear(input_size,
 * output_size, bias, gather_output, init_method, stride,
 * keep_master_weight_for_test, skip_bias_add), RowParallelLinear(...,
 * input_is_parallel, ...)), plus sequence parallelism and the memory:
 *   stride        the weight is split in tp x stride pieces along the
 *                 partition dim and a rank keeps pieces rank, rank + tp, ...
 *                 (a fused QKV weight: stride 3), as _initialize_affine_weight_cpu
 *   skip_bias_add forward leaves the bias out and backward leaves its
 *                 gradient to the caller (who adds l->bias where Megatron
 *                 returns output_bias, and accumulates into l->dbias)
 *   keep_master_weight_for_test  keep the whole (out, in) master weight in
 *                 l->master_weight
 *   weight, weight_grad, bias_data, bias_grad  views into the caller's
 *                 buffers (mpu_param_buffer), all or none: the layer then
 *                 owns no parameter memory; init writes the weight, zeroes the bias
 */
typedef struct mpu_linear_options {
  size_t size;                       /* sizeof, set by the initializer */
  int bias;                          /* 1 */
  int gather_output;                 /* column: 1 */
  int input_is_parallel;             /* row: 0 */
  int sequence_parallel;             /* 0 */
  int stride;                        /* 1 */
  int keep_master_weight_for_test;   /* 0 */
  int skip_bias_add;                 /* 0 */
  mpu_init_method init_method;       /* NULL: xavier normal */
  void *init_arg;
  uint64_t seed;                     /* the master weight's stream */
  float *weight, *weight_grad, *bias_data, *bias_grad;
} mpu_linear_options;

#define MPU_LINEAR_OPTIONS_INIT \
  {.size = sizeof(mpu_linear_options), .bias = 1, .gather_output = 1, .stride = 1}

/* ---- ColumnParallelLinear: Y = X A^T + b, A (out, in) split along out ------------------ */

typedef struct mpu_column_linear {
  mpu_comm *tp;
  int tp_size, tp_rank;
  int in, out, out_local;    /* out_local = out / tp_size */
  int has_bias, gather_output, sequence_parallel;
  float *weight, *dweight;   /* (out_local, in): rows [tp_rank * out_local, ...) of A */
  float *bias, *dbias;       /* (out_local) */
  float *x_total;            /* saved: the forward's full input (N, in) */
  int n;                     /* tokens of the last forward (all of them, N) */
  int stride, skip_bias_add, owns_params;
  float *master_weight;      /* (out, in) with keep_master_weight_for_test */
} mpu_column_linear;

/* ColumnParallelLinear(input_size, output_size, **options); options NULL: defaults. */
MPU_API mpu_result_t mpu_column_linear_create(mpu_column_linear *l, mpu_comm *tp, int input_size,
                                              int output_size, const mpu_linear_options *options);

/* The short form: bias, gather_output and sequence parallelism as flags, the
 * master weight (out, in) from N(0, init_std) with a stream seeded by seed
 * (mpu_init_normal), this rank's rows kept. out must divide by the group size. */
MPU_API mpu_result_t mpu_column_linear_init(mpu_column_linear *l, mpu_comm *tp, int in, int out,
                                            int has_bias, int gather_output,
                                            int sequence_parallel, uint64_t seed, float init_std);
MPU_API void mpu_column_linear_free(mpu_column_linear *l);
MPU_API void mpu_column_linear_zero_grad(mpu_column_linear *l);

/* x: (N, in), or (N / tp, in) this rank's rows with sequence parallelism.
 * y: (N, out) with gather_output, else (N, out_local). n_local = x's rows. */
MPU_API mpu_result_t mpu_column_linear_forward(mpu_column_linear *l, const float *x, int n_local,
                                               float *y);
/* dy shaped as y; dx shaped as x. */
MPU_API mpu_result_t mpu_column_linear_backward(mpu_column_linear *l, const float *dy, float *dx);
/* The buffer the layer saves its forward's input in (x_total), sized for n
 * rows, in *x: a caller that writes the next forward's input there and
 * passes it as x saves the forward's copy of it (PyTorch's autograd keeps a
 * reference where mpu keeps a copy). It is the input the next backward
 * reads: writing it, or calling this again, between a forward and its
 * backward changes what that backward computes. Not with sequence
 * parallelism, where the saved input is gathered from every rank's rows. */
MPU_API mpu_result_t mpu_column_linear_input(mpu_column_linear *l, int n, float **x);

/* ---- RowParallelLinear: Y = X A^T + b, A (out, in) split along in --------------------- */

typedef struct mpu_row_linear {
  mpu_comm *tp;
  int tp_size, tp_rank;
  int in, out, in_local;     /* in_local = in / tp_size */
  int has_bias, input_is_parallel, sequence_parallel;
  float *weight, *dweight;   /* (out, in_local): columns [tp_rank * in_local, ...) of A */
  float *bias, *dbias;       /* (out), not split; its gradient is summed over the group
                                with sequence parallelism (Megatron's sequence-parallel
                                gradient all-reduce) */
  float *x_local;            /* saved: this rank's input part (N, in_local) */
  int n;
  int stride, skip_bias_add, owns_params;
  float *master_weight;      /* (out, in) with keep_master_weight_for_test */
} mpu_row_linear;

/* RowParallelLinear(input_size, output_size, **options): input_is_parallel
 * and the rest by name; gather_output is not its (ignored). */
MPU_API mpu_result_t mpu_row_linear_create(mpu_row_linear *l, mpu_comm *tp, int input_size,
                                           int output_size, const mpu_linear_options *options);

MPU_API mpu_result_t mpu_row_linear_init(mpu_row_linear *l, mpu_comm *tp, int in, int out,
                                         int has_bias, int input_is_parallel,
                                         int sequence_parallel, uint64_t seed, float init_std);
MPU_API void mpu_row_linear_free(mpu_row_linear *l);
MPU_API void mpu_row_linear_zero_grad(mpu_row_linear *l);

/* x: (N, in_local) if input_is_parallel else (N, in). y: (N / tp, out) with
 * sequence parallelism (reduce-scatter), else (N, out) (all-reduce). */
MPU_API mpu_result_t mpu_row_linear_forward(mpu_row_linear *l, const float *x, int n, float *y);
MPU_API mpu_result_t mpu_row_linear_backward(mpu_row_linear *l, const float *dy, float *dx);
/* The buffer the layer saves its forward's input in (x_local), sized for n
 * rows, in *x, as mpu_column_linear_input: with input_is_parallel only, where
 * the input is saved as it comes. */
MPU_API mpu_result_t mpu_row_linear_input(mpu_row_linear *l, int n, float **x);

/* ---- VocabParallelEmbedding: rows of a (vocab, hidden) table split along vocab ------- */

typedef struct mpu_vocab_embedding {
  mpu_comm *tp;
  int tp_size, tp_rank;
  int vocab, hidden, vocab_start, vocab_end; /* this rank holds ids [start, end) */
  float *weight, *dweight;                   /* (vocab_end - vocab_start, hidden) */
  const int64_t *ids;                        /* saved by forward (not owned) */
  int n;
  int owns_params;
} mpu_vocab_embedding;

/* VocabParallelEmbedding(num_embeddings, embedding_dim, init_method): the
 * master table drawn by init_method (NULL: xavier normal) from a stream
 * seeded by seed, this rank's rows kept; weight and weight_grad may be views
 * into the caller's buffers (both or neither). */
typedef struct mpu_embedding_options {
  size_t size;
  mpu_init_method init_method;
  void *init_arg;
  uint64_t seed;
  float *weight, *weight_grad;
} mpu_embedding_options;

#define MPU_EMBEDDING_OPTIONS_INIT {.size = sizeof(mpu_embedding_options)}

MPU_API mpu_result_t mpu_vocab_embedding_create(mpu_vocab_embedding *e, mpu_comm *tp,
                                                int num_embeddings, int embedding_dim,
                                                const mpu_embedding_options *options);

MPU_API mpu_result_t mpu_vocab_embedding_init(mpu_vocab_embedding *e, mpu_comm *tp, int vocab,
                                              int hidden, uint64_t seed, float init_std);
MPU_API void mpu_vocab_embedding_free(mpu_vocab_embedding *e);
MPU_API void mpu_vocab_embedding_zero_grad(mpu_vocab_embedding *e);
/* out (n, hidden): ids outside this rank's range give zeros, then the group
 * all-reduces (reduce_from). An id outside 0..vocab-1 is an error. ids must
 * stay valid until backward. */
MPU_API mpu_result_t mpu_vocab_embedding_forward(mpu_vocab_embedding *e, const int64_t *ids,
                                                 int n, float *out);
MPU_API mpu_result_t mpu_vocab_embedding_backward(mpu_vocab_embedding *e, const float *dout);

/* ---- vocab-parallel cross entropy (Megatron core) ------------------------------------- */

typedef struct mpu_vocab_cross_entropy {
  mpu_comm *tp;
  int n, vocab_local, vocab_start;
  float label_smoothing;
  float *softmax;       /* (n, vocab_local), saved by forward */
  int64_t *targets;     /* (n) copy */
} mpu_vocab_cross_entropy;

/*
 * loss[i] for logits (n, vocab_local) split along vocab over tp: max, sum of
 * exponentials and the target's logit all-reduced across the group. With
 * label_smoothing in (0, 1) the loss is (1 - s) loss - s mean(log_probs) with
 * s = smoothing * V / (V - 1), where V and the mean are over *this rank's*
 * partition, exactly as Megatron core computes it.
 */
MPU_API mpu_result_t mpu_vocab_cross_entropy_forward(mpu_vocab_cross_entropy *ce, mpu_comm *tp,
                                                     const float *logits, const int64_t *targets,
                                                     int n, int vocab_local,
                                                     float label_smoothing, float *loss);
/* dlogits (n, vocab_local) for dloss (n). */
MPU_API mpu_result_t mpu_vocab_cross_entropy_backward(mpu_vocab_cross_entropy *ce,
                                                      const float *dloss, float *dlogits);
MPU_API void mpu_vocab_cross_entropy_free(mpu_vocab_cross_entropy *ce);

/* ---- GeLU (tanh approximation, as Megatron's fused bias_gelu) ------------------------- */

MPU_API void mpu_gelu_forward(const float *x, float *y, size_t n);
MPU_API void mpu_gelu_backward(const float *x, const float *dy, float *dx, size_t n);
/* The same, keeping the forward's tanh (t, n floats) so the backward needs
 * none: what a training step does when it stores its activations. */
MPU_API void mpu_gelu_forward_keep(const float *x, float *y, float *t, size_t n);
MPU_API void mpu_gelu_backward_kept(const float *x, const float *t, const float *dy, float *dx,
                                    size_t n);
/* Megatron's bias_gelu with the tanh kept, for a column layer made with
 * skip_bias_add: y = gelu(x + bias), the bias added row by row (bias NULL:
 * none), t its tanh; x (rows, cols) is only read, and the backward takes it
 * and the bias again and adds them as the forward did (Megatron's
 * bias_gelu_back(g, bias, y) recomputes bias + y the same way), so the
 * forward stores y and t alone. The backward gives dx = gelu'(x + bias) dy
 * and adds dx's column sums, row by row, to dbias (NULL: none): the sums the
 * layer's backward would have made, in the same order, in the same pass.
 * The arrays do not overlap (dx may not be dy). */
MPU_API void mpu_bias_gelu_forward_keep(const float *x, const float *bias, size_t rows,
                                        size_t cols, float *y, float *t);
MPU_API void mpu_bias_gelu_backward_kept(const float *x, const float *bias, const float *t,
                                         const float *dy, float *dx, size_t rows, size_t cols,
                                         float *dbias);
/* y = tanh(x) element-wise, branch-free and vectorised (the GeLU's tanh):
 * within 1.5 ulp of the exact value for every float (glibc's tanhf: 2.2). */
MPU_API void mpu_tanh(const float *x, float *y, size_t n);

/* ---- LayerNorm (a duplicate on every tensor-parallel rank) ------------------------------- */

typedef struct mpu_layer_norm {
  int hidden;
  float eps;
  float *weight, *bias, *dweight, *dbias; /* (hidden) each */
  int owns_params;
  float *xhat, *rstd;                     /* saved by forward: (n, hidden), (n) */
  int n;
} mpu_layer_norm;

/* weight/bias/dweight/dbias: views into the caller's buffers (all four) or
 * all NULL to own them; either way the weight starts at 1, the bias at 0. */
MPU_API mpu_result_t mpu_layer_norm_init(mpu_layer_norm *ln, int hidden, float eps, float *weight,
                                         float *bias, float *dweight, float *dbias);
MPU_API void mpu_layer_norm_free(mpu_layer_norm *ln);
/* y (n, hidden) = (x - mean) / sqrt(var + eps) * weight + bias, per row */
MPU_API mpu_result_t mpu_layer_norm_forward(mpu_layer_norm *ln, const float *x, int n, float *y);
/* dx for dy; adds to dweight and dbias. With sequence parallelism each rank
 * sees its rows only: all-reduce dweight and dbias over the tensor-parallel
 * group before the optimizer (Megatron's sequence-parallel grad all-reduce). */
MPU_API mpu_result_t mpu_layer_norm_backward(mpu_layer_norm *ln, const float *dy, float *dx);
/* The same, adding the input's gradient to dx instead of writing it: the
 * gradient of a pre-LayerNorm block's residual x + f(LayerNorm(x)), where dx
 * holds the residual's (the block's output gradient) and gets both, in the
 * LayerNorm's own pass: dx[i] + d[i], the bits of adding them apart. dy and
 * dx must not overlap (MPU_ERR_INVALID_ARGUMENT where they do). */
MPU_API mpu_result_t mpu_layer_norm_backward_add(mpu_layer_norm *ln, const float *dy, float *dx);

/* ---- causal self-attention on this rank's heads -------------------------------------- */

/*
 * The core of Megatron's attention for the heads a rank holds after a
 * column-parallel QKV projection with stride 3: qkv (T, 3 x heads x d) rows
 * laid out [q | k | v], head h at columns h d .. h d + d - 1 of each;
 * out (T, heads x d). softmax(q k^T / sqrt(d)) with a causal mask, times an
 * optional dropout mask (heads, T, T) of 0 or 1/(1-p) (NULL: none), times v.
 */
typedef struct mpu_attention {
  int T, heads, head_dim;
  float *qkv, *probs, *dropped; /* saved: (T, 3 heads d), (heads, T, T) x 2 (the second
                                   only with a dropout mask) */
  int has_mask;                 /* the last forward had a dropout mask */
} mpu_attention;

MPU_API mpu_result_t mpu_attention_forward(mpu_attention *a, const float *qkv, int T, int heads,
                                           int head_dim, const float *dropout_mask, float *out);
/* The buffer the attention saves its input in for the backward, sized for
 * (T, heads, head_dim) (kept if it is): what computes qkv may write it there
 * and pass it to mpu_attention_forward, which then copies nothing (as
 * mpu_column_linear_input). A forward with that buffer and another shape is
 * MPU_ERR_INVALID_ARGUMENT. *qkv NULL on error. */
MPU_API mpu_result_t mpu_attention_input(mpu_attention *a, int T, int heads, int head_dim,
                                         float **qkv);
MPU_API mpu_result_t mpu_attention_backward(mpu_attention *a, const float *dout, float *dqkv);
MPU_API void mpu_attention_free(mpu_attention *a);

/* ---- broadcast_data (data.py) ------------------------------------------------------------ */

/*
 * Broadcast int64 tensors from the group's rank 0 to the group: first every
 * tensor's shape, then all data in one buffer, as Megatron's broadcast_data.
 * On rank 0, tensors[k] are the inputs (kept); on the others each
 * tensors[k] is filled with a newly allocated tensor (free with
 * mpu_tensor_free). keys name the tensors in errors.
 */
MPU_API mpu_result_t mpu_broadcast_data(mpu_comm *tp, int nkeys, const char *const *keys,
                                        mpu_tensor *tensors);

#ifdef __cplusplus
}
#endif

#endif

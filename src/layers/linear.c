/*
 * linear.c - ColumnParallelLinear and RowParallelLinear (layers.py), and the
 * GeLU between them (kernels.c).
 *
 *   column: forward  x --(copy_to, or gather along dim 0 with sequence
 *           parallelism)--> x A_r^T + b_r --(gather along the last dim if
 *           gather_output)--> y;  backward runs the regions' backward in
 *           reverse: all-reduce (or reduce-scatter) of dx.
 *   row:    forward  x --(scatter_to unless input_is_parallel)--> x_r A_r^T
 *           --(all-reduce, or reduce-scatter with sequence parallelism)--> + b.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/error.h"
#include "core/span.h"
#include "core/options.h"
#include "layers/gemm.h"
#include "layers/layers_internal.h"
#include "mpu/layers.h"
#include "mpu/shard.h"

mpu_result_t mpu__layer_comm(const char *fn, mpu_comm **tp, int *size, int *rank) {
  MPU_CHECK(mpu__comm_for_host(*tp, fn, tp));
  MPU_CHECK(mpu_comm_size(*tp, size));
  return mpu_comm_rank(*tp, rank);
}

/* ---- initialisation ---------------------------------------------------------------------- */

void mpu_init_normal(float *w, int rows, int cols, mpu_rng *rng, void *arg) {
  float std = arg ? *(const float *)arg : 0.02f;
  for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) w[i] = mpu_rng_normal(rng, 0.0f, std);
}

void mpu_init_xavier_normal(float *w, int rows, int cols, mpu_rng *rng, void *arg) {
  (void)arg; /* torch: gain 1, std = sqrt(2 / (fan_in + fan_out)) of a (fan_out, fan_in) weight */
  float std = sqrtf(2.0f / (float)(rows + cols));
  mpu_init_normal(w, rows, cols, rng, &std);
}

mpu_result_t mpu__init_partition(mpu_init_method init, void *arg, uint64_t seed, int rows,
                                 int cols, int dim, int stride, int tp_size, int tp_rank,
                                 float *out, float **keep_master) {
  float *master = malloc((size_t)rows * (size_t)cols * sizeof(float));
  if (!master) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "master weight %d x %d", rows, cols);
  mpu_rng g;
  mpu_rng_seed(&g, seed);
  (init ? init : mpu_init_xavier_normal)(master, rows, cols, &g, arg);
  /* weight_list[rank::world_size]: this rank's boxes of the master weight, by Megatron's rule */
  int64_t shape[2] = {rows, cols};
  mpu_shard sh;
  mpu_result_t r = mpu_shard_megatron(2, shape, dim, stride, tp_size, tp_rank, &sh);
  if (r) {
    free(master);
    return r;
  }
  for (int k = 0; k < sh.nboxes; k++)
    mpu_shard_copy_box(sizeof(float), out, sh.local_shape, sh.boxes[k].local_offset, master, shape,
                       sh.boxes[k].global_offset, sh.boxes[k].length, 2);
  if (keep_master) *keep_master = master;
  else free(master);
  return MPU_SUCCESS;
}

/* Options as given (NULL: defaults), checked where both layers agree. */
static mpu_result_t take_linear(const char *fn, const mpu_linear_options *given,
                                mpu_linear_options *o) {
  mpu_linear_options d = MPU_LINEAR_OPTIONS_INIT;
  *o = d;
  if (given)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_LINEAR_OPTIONS_INIT", given, sizeof d,
                                sizeof d, o));
  if (o->stride < 1) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: stride %d", fn, o->stride);
  int views = (o->weight != NULL) + (o->weight_grad != NULL);
  int bias_views = (o->bias_data != NULL) + (o->bias_grad != NULL);
  if (views == 1 || (views == 2 && o->bias && bias_views != 2) || (views == 0 && bias_views))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: give the weight, its gradient, the bias and its gradient as views all "
                      "together (or none)", fn);
  return MPU_SUCCESS;
}

/* Parameters: the caller's views, or this layer's memory. */
static mpu_result_t take_params(const char *fn, const mpu_linear_options *o, size_t w, size_t b,
                                float **weight, float **dweight, float **bias, float **dbias,
                                int *owns) {
  *owns = o->weight == NULL;
  if (!*owns) {
    *weight = o->weight, *dweight = o->weight_grad;
    if (o->bias) *bias = o->bias_data, *dbias = o->bias_grad;
    else *bias = *dbias = NULL;
    if (*bias) memset(*bias, 0, b * sizeof(float));
    return MPU_SUCCESS;
  }
  *weight = malloc(w * sizeof(float));
  *dweight = calloc(w, sizeof(float));
  *bias = calloc(b, sizeof(float));
  *dbias = calloc(b, sizeof(float));
  return *weight && *dweight && *bias && *dbias ? MPU_SUCCESS
                                                : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
}

static void free_params(int owns, float *w, float *dw, float *b, float *db) {
  if (owns) free(w), free(dw), free(b), free(db);
}

/* A (rows, cols) float32 view over p. */
mpu_tensor mpu__view(float *p, int rows, int cols) {
  mpu_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = MPU_FLOAT32;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

mpu_result_t mpu__run(mpu_primitive prim, mpu_comm *tp, float *in, int in_rows, int in_cols,
                      float *out, int out_rows, int out_cols) {
  mpu_tensor a = mpu__view(in, in_rows, in_cols), b = mpu__view(out, out_rows, out_cols);
  return mpu_primitive_run(prim, tp, &a, &b);
}

static mpu_result_t need(void *p, const char *what) {
  return p ? MPU_SUCCESS : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", what);
}

/* ---- column ---------------------------------------------------------------------------- */

mpu_result_t mpu_column_linear_create(mpu_column_linear *l, mpu_comm *tp, int in, int out,
                                      const mpu_linear_options *options) {
  static const char fn[] = "mpu_column_linear_create";
  if (!l) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
  memset(l, 0, sizeof *l);
  mpu_linear_options o;
  MPU_CHECK(take_linear(fn, options, &o));
  MPU_CHECK(mpu__layer_comm(fn, &tp, &l->tp_size, &l->tp_rank));
  if (in < 1 || out < 1 || out % l->tp_size || (out / l->tp_size) % o.stride)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: input_size %d, output_size %d (out must divide by the %d "
                      "tensor-parallel ranks x stride %d)",
                      fn, in, out, l->tp_size, o.stride);
  l->tp = tp, l->in = in, l->out = out, l->out_local = out / l->tp_size;
  l->has_bias = o.bias, l->gather_output = o.gather_output;
  l->sequence_parallel = o.sequence_parallel, l->stride = o.stride;
  l->skip_bias_add = o.skip_bias_add;
  mpu_result_t r = take_params(fn, &o, (size_t)l->out_local * in, (size_t)l->out_local, &l->weight,
                               &l->dweight, &l->bias, &l->dbias, &l->owns_params);
  if (!r)
    r = mpu__init_partition(o.init_method, o.init_arg, o.seed, out, in, 0, o.stride, l->tp_size,
                            l->tp_rank, l->weight, o.keep_master_weight_for_test ? &l->master_weight : NULL);
  if (r) mpu_column_linear_free(l);
  return r;
}

mpu_result_t mpu_column_linear_init(mpu_column_linear *l, mpu_comm *tp, int in, int out,
                                    int has_bias, int gather_output, int sequence_parallel,
                                    uint64_t seed, float init_std) {
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.bias = has_bias, o.gather_output = gather_output, o.sequence_parallel = sequence_parallel;
  o.seed = seed, o.init_method = mpu_init_normal, o.init_arg = &init_std;
  return mpu_column_linear_create(l, tp, in, out, &o);
}

void mpu_column_linear_free(mpu_column_linear *l) {
  if (!l) return;
  free_params(l->owns_params, l->weight, l->dweight, l->bias, l->dbias);
  free(l->x_total), free(l->master_weight);
  memset(l, 0, sizeof *l);
}

void mpu_column_linear_zero_grad(mpu_column_linear *l) {
  memset(l->dweight, 0, (size_t)l->out_local * l->in * sizeof(float));
  if (l->dbias) memset(l->dbias, 0, (size_t)l->out_local * sizeof(float));
}

mpu_result_t mpu_column_linear_forward(mpu_column_linear *l, const float *x, int n_local,
                                       float *y) {
  static const char fn[] = "mpu_column_linear_forward";
  if (!l || !l->weight || !x || !y || n_local < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d rows", fn, n_local);
  int N = l->sequence_parallel ? n_local * l->tp_size : n_local;
  if (x != l->x_total) {
    float *saved = realloc(l->x_total, (size_t)N * l->in * sizeof(float));
    MPU_CHECK(need(saved, fn));
    l->x_total = saved;
    l->n = N;
    /* the input every rank multiplies: gathered along the sequence, or copied */
    MPU_CHECK(mpu__run(l->sequence_parallel ? MPU_PRIM_GATHER_FIRST : MPU_PRIM_IDENTITY, l->tp,
                       (float *)x, n_local, l->in, l->x_total, N, l->in));
  } else if (l->sequence_parallel || n_local != l->n) { /* written by the caller in place */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: x is the layer's input buffer, for %d rows%s; %d given", fn, l->n,
                      l->sequence_parallel ? " and not with sequence parallelism" : "", n_local);
  }
  float *yl = l->gather_output && l->tp_size > 1 ? malloc((size_t)N * l->out_local * sizeof(float)) : y;
  MPU_CHECK(need(yl, fn));
  int add_bias = l->has_bias && !l->skip_bias_add; /* skip_bias_add: the caller adds it */
  if (add_bias)
    for (int i = 0; i < N; i++) /* y = b, then += x A^T */
      memcpy(yl + (size_t)i * l->out_local, l->bias, (size_t)l->out_local * sizeof(float));
  mpu__gemm_nt(N, l->out_local, l->in, l->x_total, l->in, l->weight, l->in, add_bias, yl,
               l->out_local);
  mpu_result_t r = MPU_SUCCESS;
  if (yl != y) {
    r = mpu__run(MPU_PRIM_GATHER_LAST, l->tp, yl, N, l->out_local, y, N, l->out);
    free(yl);
  }
  return r;
}

/* The saved input's buffer, sized for n rows (mpu_column_linear_input, mpu_row_linear_input). */
static mpu_result_t input_buffer(const char *fn, float **saved, int *rows, int n, int cols,
                                 float **x) {
  if (!x) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
  *x = NULL;
  if (n < 1) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d rows", fn, n);
  float *p = realloc(*saved, (size_t)n * (size_t)cols * sizeof(float));
  MPU_CHECK(need(p, fn));
  *saved = *x = p;
  *rows = n;
  return MPU_SUCCESS;
}

mpu_result_t mpu_column_linear_input(mpu_column_linear *l, int n, float **x) {
  static const char fn[] = "mpu_column_linear_input";
  if (!l || !l->weight) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
  if (l->sequence_parallel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: with sequence parallelism the saved input is gathered from every "
                      "rank's rows, not written by the caller", fn);
  return input_buffer(fn, &l->x_total, &l->n, n, l->in, x);
}

mpu_result_t mpu_column_linear_backward(mpu_column_linear *l, const float *dy, float *dx) {
  static const char fn[] = "mpu_column_linear_backward";
  if (!l || !l->x_total || !dy || !dx)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or no forward yet", fn);
  int N = l->n;
  const float *dyl = dy;
  /* without sequence parallelism dx takes the product itself and is all-reduced
   * in place, unless it overlaps dy; with it, dx is a reduce-scatter's output */
  size_t dx_bytes = (size_t)N * l->in * sizeof(float);
  size_t dy_bytes = (size_t)N * (l->gather_output ? l->out : l->out_local) * sizeof(float);
  int direct = !l->sequence_parallel && !mpu__spans_overlap(dx, dx_bytes, dy, dy_bytes);
  float *split = NULL, *dxp = direct ? dx : malloc(dx_bytes);
  mpu_result_t r = need(dxp, fn);
  if (!r && l->gather_output && l->tp_size > 1) { /* gather_output's backward: keep my columns */
    split = malloc((size_t)N * l->out_local * sizeof(float));
    r = need(split, fn);
    if (!r) r = mpu__run(MPU_PRIM_SPLIT_LAST, l->tp, (float *)dy, N, l->out, split, N, l->out_local);
    dyl = split;
  }
  if (!r) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l->out_local, l->in, N, 1.0f, dyl,
                l->out_local, l->x_total, l->in, 1.0f, l->dweight, l->in);
    if (l->has_bias && !l->skip_bias_add)
      for (int i = 0; i < N; i++)
        for (int j = 0; j < l->out_local; j++) l->dbias[j] += dyl[(size_t)i * l->out_local + j];
    mpu__gemm_nn(N, l->in, l->out_local, dyl, l->out_local, l->weight, l->in, dxp, l->in);
    /* copy_to's backward (all-reduce), or the sequence gather's (reduce-scatter) */
    if (l->sequence_parallel)
      r = mpu__run(MPU_PRIM_REDUCE_SCATTER_FIRST, l->tp, dxp, N, l->in, dx, N / l->tp_size, l->in);
    else
      r = mpu__run(MPU_PRIM_ALL_REDUCE, l->tp, dxp, N, l->in, dx, N, l->in);
  }
  free(split);
  if (dxp != dx) free(dxp);
  return r;
}

/* ---- row -------------------------------------------------------------------------------- */

mpu_result_t mpu_row_linear_create(mpu_row_linear *l, mpu_comm *tp, int in, int out,
                                   const mpu_linear_options *options) {
  static const char fn[] = "mpu_row_linear_create";
  if (!l) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
  memset(l, 0, sizeof *l);
  mpu_linear_options o;
  MPU_CHECK(take_linear(fn, options, &o));
  MPU_CHECK(mpu__layer_comm(fn, &tp, &l->tp_size, &l->tp_rank));
  if (in < 1 || out < 1 || in % l->tp_size || (in / l->tp_size) % o.stride)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: input_size %d, output_size %d (in must divide by the %d "
                      "tensor-parallel ranks x stride %d)",
                      fn, in, out, l->tp_size, o.stride);
  if (o.sequence_parallel && !o.input_is_parallel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: sequence parallelism needs input_is_parallel (as Megatron asserts)", fn);
  l->tp = tp, l->in = in, l->out = out, l->in_local = in / l->tp_size;
  l->has_bias = o.bias, l->input_is_parallel = o.input_is_parallel;
  l->sequence_parallel = o.sequence_parallel, l->stride = o.stride;
  l->skip_bias_add = o.skip_bias_add;
  mpu_result_t r = take_params(fn, &o, (size_t)out * l->in_local, (size_t)out, &l->weight,
                               &l->dweight, &l->bias, &l->dbias, &l->owns_params);
  if (!r)
    r = mpu__init_partition(o.init_method, o.init_arg, o.seed, out, in, 1, o.stride, l->tp_size,
                            l->tp_rank, l->weight, o.keep_master_weight_for_test ? &l->master_weight : NULL);
  if (r) mpu_row_linear_free(l);
  return r;
}

mpu_result_t mpu_row_linear_init(mpu_row_linear *l, mpu_comm *tp, int in, int out, int has_bias,
                                 int input_is_parallel, int sequence_parallel, uint64_t seed,
                                 float init_std) {
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.bias = has_bias, o.input_is_parallel = input_is_parallel;
  o.sequence_parallel = sequence_parallel, o.seed = seed;
  o.init_method = mpu_init_normal, o.init_arg = &init_std;
  return mpu_row_linear_create(l, tp, in, out, &o);
}

void mpu_row_linear_free(mpu_row_linear *l) {
  if (!l) return;
  free_params(l->owns_params, l->weight, l->dweight, l->bias, l->dbias);
  free(l->x_local), free(l->master_weight);
  memset(l, 0, sizeof *l);
}

void mpu_row_linear_zero_grad(mpu_row_linear *l) {
  memset(l->dweight, 0, (size_t)l->out * l->in_local * sizeof(float));
  if (l->dbias) memset(l->dbias, 0, (size_t)l->out * sizeof(float));
}

mpu_result_t mpu_row_linear_forward(mpu_row_linear *l, const float *x, int n, float *y) {
  static const char fn[] = "mpu_row_linear_forward";
  if (!l || !l->weight || !x || !y || n < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d rows", fn, n);
  if (l->sequence_parallel && n % l->tp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %d rows do not divide by the %d ranks of the sequence split", fn, n,
                      l->tp_size);
  if (x != l->x_local) {
    float *saved = realloc(l->x_local, (size_t)n * l->in_local * sizeof(float));
    MPU_CHECK(need(saved, fn));
    l->x_local = saved;
    l->n = n;
    MPU_CHECK(mpu__run(l->input_is_parallel ? MPU_PRIM_IDENTITY : MPU_PRIM_SPLIT_LAST, l->tp,
                       (float *)x, n, l->input_is_parallel ? l->in_local : l->in, l->x_local, n,
                       l->in_local));
  } else if (!l->input_is_parallel || n != l->n) { /* written by the caller in place */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: x is the layer's input buffer, for %d rows%s; %d given", fn, l->n,
                      l->input_is_parallel ? "" : " and with input_is_parallel only", n);
  }
  /* the all-reduce sums the partial products in place in y (the same sums,
   * one pass over the output less); the reduce-scatter's input is N rows
   * where y holds N / tp */
  float *yp = l->sequence_parallel ? malloc((size_t)n * l->out * sizeof(float)) : y;
  MPU_CHECK(need(yp, fn));
  mpu__gemm_nt(n, l->out, l->in_local, l->x_local, l->in_local, l->weight, l->in_local, 0, yp,
               l->out);
  int rows = l->sequence_parallel ? n / l->tp_size : n;
  mpu_result_t r = mpu__run(l->sequence_parallel ? MPU_PRIM_REDUCE_SCATTER_FIRST : MPU_PRIM_ALL_REDUCE,
                            l->tp, yp, n, l->out, y, rows, l->out);
  if (yp != y) free(yp);
  if (!r && l->has_bias && !l->skip_bias_add) /* the bias is added once, after the reduction */
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < l->out; j++) y[(size_t)i * l->out + j] += l->bias[j];
  return r;
}

mpu_result_t mpu_row_linear_input(mpu_row_linear *l, int n, float **x) {
  static const char fn[] = "mpu_row_linear_input";
  if (!l || !l->weight) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
  if (!l->input_is_parallel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: without input_is_parallel the saved input is this rank's columns of "
                      "the input, not written by the caller", fn);
  return input_buffer(fn, &l->x_local, &l->n, n, l->in_local, x);
}

mpu_result_t mpu_row_linear_backward(mpu_row_linear *l, const float *dy, float *dx) {
  static const char fn[] = "mpu_row_linear_backward";
  if (!l || !l->x_local || !dy || !dx)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or no forward yet", fn);
  int n = l->n, rows = l->sequence_parallel ? n / l->tp_size : n;
  size_t dy_bytes = (size_t)rows * l->out * sizeof(float);
  size_t dx_bytes = (size_t)n * (l->input_is_parallel ? l->in_local : l->in) * sizeof(float);
  /* the reduction's backward: a gather along the sequence, or the identity,
   * which reads dy where it is; dx is written in place of a scratch copy
   * where the input was parallel and dx does not overlap what is read */
  const float *dyf = dy;
  float *gathered = NULL, *dxl = dx;
  mpu_result_t r = MPU_SUCCESS;
  if (l->sequence_parallel) {
    gathered = malloc((size_t)n * l->out * sizeof(float));
    r = need(gathered, fn);
    if (!r) r = mpu__run(MPU_PRIM_GATHER_FIRST, l->tp, (float *)dy, rows, l->out, gathered, n, l->out);
    dyf = gathered;
  }
  if (!r && (!l->input_is_parallel || mpu__spans_overlap(dx, dx_bytes, dyf, dy_bytes))) {
    dxl = malloc((size_t)n * l->in_local * sizeof(float));
    r = need(dxl, fn);
  }
  if (!r && l->has_bias && !l->skip_bias_add) {
    float *db = calloc((size_t)l->out, sizeof(float));
    r = need(db, fn);
    for (int i = 0; !r && i < rows; i++)
      for (int j = 0; j < l->out; j++) db[j] += dy[(size_t)i * l->out + j];
    if (!r && l->sequence_parallel) /* each rank saw its rows only */
      r = mpu_comm_all_reduce(l->tp, db, db, (size_t)l->out, MPU_FLOAT32, MPU_SUM);
    for (int j = 0; !r && j < l->out; j++) l->dbias[j] += db[j];
    free(db);
  }
  if (!r) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l->out, l->in_local, n, 1.0f, dyf,
                l->out, l->x_local, l->in_local, 1.0f, l->dweight, l->in_local);
    mpu__gemm_nn(n, l->in_local, l->out, dyf, l->out, l->weight, l->in_local, dxl, l->in_local);
    if (dxl != dx)
      r = mpu__run(l->input_is_parallel ? MPU_PRIM_IDENTITY : MPU_PRIM_GATHER_LAST, l->tp, dxl, n,
                   l->in_local, dx, n, l->input_is_parallel ? l->in_local : l->in);
  }
  free(gathered);
  if (dxl != dx) free(dxl);
  return r;
}

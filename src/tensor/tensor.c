/*
 * tensor.c - the tensor view: making one, sizes, and the split / concat
 * along a dim that Megatron's _split and _gather do locally.
 *
 * Along dim d a contiguous tensor is [outer][shape[d]][inner] with outer the
 * product of the dims before d and inner of those after; split and concat copy
 * one block of (rows along d) * inner elements per outer index.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/span.h"
#include "mpu/tensor.h"
#include "tensor/tensor_internal.h"

static mpu_result_t check_shape(mpu_dtype dtype, int ndim, const int64_t *shape, size_t *bytes) {
  if (!mpu_dtype_size(dtype))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "tensor: invalid dtype %d", (int)dtype);
  if (ndim < 0 || ndim > MPU_TENSOR_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "tensor: ndim %d outside 0..%d", ndim,
                      MPU_TENSOR_MAX_DIMS);
  if (ndim > 0 && !shape)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "tensor: shape is NULL for ndim %d", ndim);
  size_t n = mpu_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "tensor: shape[%d] = %lld is negative", i,
                        (long long)shape[i]);
    if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n) || n > (size_t)PTRDIFF_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "tensor: size overflows at shape[%d] = %lld",
                        i, (long long)shape[i]);
  }
  *bytes = n;
  return MPU_SUCCESS;
}

static void set_view(mpu_tensor *t, void *data, mpu_dtype dtype, int ndim, const int64_t *shape,
                     int owns) {
  memset(t, 0, sizeof *t);
  t->data = data;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->owns_data = owns;
}

mpu_result_t mpu_tensor_init(mpu_tensor *t, void *data, mpu_dtype dtype, int ndim,
                             const int64_t *shape) {
  size_t bytes;
  if (!t) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_init: tensor is NULL");
  MPU_CHECK(check_shape(dtype, ndim, shape, &bytes));
  if (!data && bytes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_init: data is NULL for %zu bytes",
                      bytes);
  set_view(t, data, dtype, ndim, shape, 0);
  return MPU_SUCCESS;
}

mpu_result_t mpu_tensor_alloc(mpu_tensor *t, mpu_dtype dtype, int ndim, const int64_t *shape) {
  size_t bytes;
  if (!t) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_alloc: tensor is NULL");
  MPU_CHECK(check_shape(dtype, ndim, shape, &bytes));
  size_t rounded = (bytes + 63) & ~(size_t)63;
  if (rounded < bytes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_alloc: %zu bytes", bytes);
  void *data = NULL;
  if (rounded) {
    data = aligned_alloc(64, rounded);
    if (!data)
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_tensor_alloc: cannot allocate %zu bytes",
                        bytes);
    memset(data, 0, rounded);
  }
  set_view(t, data, dtype, ndim, shape, data != NULL);
  return MPU_SUCCESS;
}

void mpu_tensor_free(mpu_tensor *t) {
  if (!t) return;
  if (t->owns_data) free(t->data);
  memset(t, 0, sizeof *t);
}

size_t mpu_tensor_numel(const mpu_tensor *t) {
  if (!t) return 0;
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

size_t mpu_tensor_nbytes(const mpu_tensor *t) {
  return t ? mpu_tensor_numel(t) * mpu_dtype_size(t->dtype) : 0;
}

int mpu_tensor_same_shape(const mpu_tensor *a, const mpu_tensor *b) {
  if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

char *mpu_tensor_describe(const mpu_tensor *t, char *buf, size_t len) {
  if (!buf || !len) return buf;
  if (!t) {
    snprintf(buf, len, "(null)");
    return buf;
  }
  size_t used = (size_t)snprintf(buf, len, "%s[", mpu_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                             (long long)t->shape[i]);
  if (used < len) snprintf(buf + used, len - used, "]");
  return buf;
}

/* Validate a tensor argument of split/concat (shape and storage). */
static mpu_result_t check_tensor(const char *what, const mpu_tensor *t) {
  size_t bytes;
  if (!t) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  MPU_CHECK(check_shape(t->dtype, t->ndim, t->shape, &bytes));
  if (!t->data && bytes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s has NULL data for %zu bytes", what, bytes);
  return MPU_SUCCESS;
}

static mpu_result_t resolve_dim(const char *fn, const mpu_tensor *t, int dim, int *out) {
  int d = dim < 0 ? dim + t->ndim : dim;
  if (d < 0 || d >= t->ndim)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dim %d out of range for a %d-d tensor", fn,
                      dim, t->ndim);
  *out = d;
  return MPU_SUCCESS;
}

static void outer_inner(const mpu_tensor *t, int d, size_t *outer, size_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < d; i++) *outer *= (size_t)t->shape[i];
  for (int i = d + 1; i < t->ndim; i++) *inner *= (size_t)t->shape[i];
}

/* The host's strided copy: height rows of width bytes. */
static mpu_result_t host_copy2d(void *ctx, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t height) {
  (void)ctx;
  for (size_t o = 0; o < height; o++)
    memcpy((char *)dst + o * dpitch, (const char *)src + o * spitch, width);
  return MPU_SUCCESS;
}

mpu_result_t mpu_tensor_split(const mpu_tensor *in, int dim, int parts, int index,
                              mpu_tensor *out) {
  return mpu__tensor_split_with(in, dim, parts, index, out, host_copy2d, NULL);
}

mpu_result_t mpu_tensor_concat(const mpu_tensor *parts, int nparts, int dim, mpu_tensor *out) {
  return mpu__tensor_concat_with(parts, nparts, dim, out, host_copy2d, NULL);
}

/* Do the storage of a and b overlap? */
static int overlaps(const mpu_tensor *a, const mpu_tensor *b) {
  return mpu__spans_overlap(a->data, mpu_tensor_nbytes(a), b->data, mpu_tensor_nbytes(b));
}

mpu_result_t mpu__tensor_split_with(const mpu_tensor *in, int dim, int parts, int index,
                                    mpu_tensor *out, mpu__copy2d_fn copy2d, void *ctx) {
  char a[128], b[128];
  int d = 0;
  MPU_CHECK(check_tensor("mpu_tensor_split: input", in));
  MPU_CHECK(check_tensor("mpu_tensor_split: output", out));
  MPU_CHECK(resolve_dim("mpu_tensor_split", in, dim, &d));
  if (parts <= 0 || index < 0 || index >= parts)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_tensor_split: part %d of %d (want 0 <= index < parts)", index, parts);
  if (in->shape[d] % parts)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_tensor_split: dim %d of %s (size %lld) is not divisible by %d", d,
                      mpu_tensor_describe(in, a, sizeof a), (long long)in->shape[d], parts);
  mpu_tensor want = *in;
  want.shape[d] /= parts;
  if (!mpu_tensor_same_shape(&want, out))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_split: output is %s, want %s",
                      mpu_tensor_describe(out, a, sizeof a),
                      mpu_tensor_describe(&want, b, sizeof b));
  if (overlaps(in, out))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_split: the output overlaps the input");
  size_t outer, inner, es = mpu_dtype_size(in->dtype);
  outer_inner(in, d, &outer, &inner);
  size_t rows = (size_t)want.shape[d], block = rows * inner * es;
  if (!block) return MPU_SUCCESS;
  const char *src = (const char *)in->data + (size_t)index * block;
  return copy2d(ctx, out->data, block, src, block * (size_t)parts, block, outer);
}

mpu_result_t mpu__tensor_concat_with(const mpu_tensor *parts, int nparts, int dim, mpu_tensor *out,
                                     mpu__copy2d_fn copy2d, void *ctx) {
  char a[128], b[128];
  int d = 0;
  if (!parts || nparts <= 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_concat: %d parts (want >= 1)",
                      nparts);
  MPU_CHECK(check_tensor("mpu_tensor_concat: output", out));
  MPU_CHECK(resolve_dim("mpu_tensor_concat", &parts[0], dim, &d));
  mpu_tensor want = parts[0], like = parts[0]; /* like: a part's shape outside dim */
  want.shape[d] = like.shape[d] = 0;
  for (int k = 0; k < nparts; k++) {
    MPU_CHECK(check_tensor("mpu_tensor_concat: part", &parts[k]));
    mpu_tensor p = parts[k];
    int64_t rows = p.shape[d];
    p.shape[d] = 0;
    if (!mpu_tensor_same_shape(&p, &like))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "mpu_tensor_concat: part %d is %s, which does not match part 0 (%s) "
                        "outside dim %d",
                        k, mpu_tensor_describe(&parts[k], a, sizeof a),
                        mpu_tensor_describe(&parts[0], b, sizeof b), d);
    want.shape[d] += rows;
  }
  if (!mpu_tensor_same_shape(&want, out))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_tensor_concat: output is %s, want %s",
                      mpu_tensor_describe(out, a, sizeof a),
                      mpu_tensor_describe(&want, b, sizeof b));
  for (int k = 0; k < nparts; k++)
    if (overlaps(&parts[k], out))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "mpu_tensor_concat: the output overlaps part %d (concatenate into new "
                        "storage)",
                        k);
  size_t outer, inner, es = mpu_dtype_size(out->dtype);
  outer_inner(out, d, &outer, &inner);
  size_t out_block = (size_t)want.shape[d] * inner * es;
  char *dst = out->data;
  size_t offset = 0;
  for (int k = 0; k < nparts; k++) { /* part k fills its columns of every row */
    size_t block = (size_t)parts[k].shape[d] * inner * es;
    if (block && outer) MPU_CHECK(copy2d(ctx, dst + offset, out_block, parts[k].data, block, block, outer));
    offset += block;
  }
  return MPU_SUCCESS;
}

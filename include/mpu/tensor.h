/*
 * mpu/tensor.h - data types and a small tensor view.
 *
 * A tensor is a view: a data pointer, a dtype and a shape of up to eight dims,
 * contiguous and row-major (the last dim varies fastest). A view made with
 * mpu_tensor_init() borrows the caller's memory; one made with
 * mpu_tensor_alloc() owns zeroed memory that mpu_tensor_free() releases.
 *
 * The split/concat helpers are the local halves of Megatron's _split and
 * _gather: cutting a tensor into equal parts along a dim, and joining parts
 * back along it.
 */
#ifndef MPU_TENSOR_H
#define MPU_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/result.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mpu_dtype {
  MPU_FLOAT32 = 0,
  MPU_FLOAT64,
  MPU_FLOAT16, /* IEEE binary16, stored as uint16_t */
  MPU_BFLOAT16, /* bfloat16, stored as uint16_t */
  MPU_INT32,
  MPU_INT64,
  MPU_UINT8,
  /* appended: the values above are ABI */
  MPU_INT8,
  MPU_UINT32,
  MPU_UINT64,
  MPU_DTYPE_COUNT
} mpu_dtype;

/* Bytes per element; 0 for a value that is not a dtype. */
MPU_API size_t mpu_dtype_size(mpu_dtype dt);

/* "float32", "bfloat16", ...; "invalid" for a value that is not a dtype. */
MPU_API const char *mpu_dtype_name(mpu_dtype dt);

/* Parse a dtype name ("float32", also "fp32", "f32", "half", "bf16", ...).
 * MPU_ERR_INVALID_ARGUMENT if unknown; *out is then unchanged. */
MPU_API mpu_result_t mpu_dtype_from_name(const char *name, mpu_dtype *out);

/* Non-zero for float32, float64, float16 and bfloat16. */
MPU_API int mpu_dtype_is_float(mpu_dtype dt);

/* Conversions between float32 and the 16-bit floats, rounding to nearest even
 * (NaN stays NaN, overflow becomes infinity, subnormals are kept). */
MPU_API uint16_t mpu_float_to_half(float f);
MPU_API float mpu_half_to_float(uint16_t h);
MPU_API uint16_t mpu_float_to_bfloat16(float f);
MPU_API float mpu_bfloat16_to_float(uint16_t b);

#define MPU_TENSOR_MAX_DIMS 8

typedef struct mpu_tensor {
  void *data;                           /* first element; NULL only when numel == 0 */
  mpu_dtype dtype;
  int ndim;                             /* 0 (a scalar) .. MPU_TENSOR_MAX_DIMS */
  int64_t shape[MPU_TENSOR_MAX_DIMS];   /* shape[0..ndim-1], each >= 0 */
  int owns_data;                        /* set by mpu_tensor_alloc */
} mpu_tensor;

/* A view over caller memory. Checks dtype, ndim, dims >= 0, that the byte
 * size fits in size_t, and that data is non-NULL unless the tensor is empty.
 * On error *t is unchanged. */
MPU_API mpu_result_t mpu_tensor_init(mpu_tensor *t, void *data, mpu_dtype dtype, int ndim,
                                     const int64_t *shape);

/* Like mpu_tensor_init, with zeroed memory (64-byte aligned) owned by the view. */
MPU_API mpu_result_t mpu_tensor_alloc(mpu_tensor *t, mpu_dtype dtype, int ndim,
                                      const int64_t *shape);

/* Release memory owned by the view (no-op for borrowed memory or NULL) and
 * reset the view to an empty one. */
MPU_API void mpu_tensor_free(mpu_tensor *t);

/* Number of elements (1 for a scalar) and bytes. */
MPU_API size_t mpu_tensor_numel(const mpu_tensor *t);
MPU_API size_t mpu_tensor_nbytes(const mpu_tensor *t);

/* Non-zero if a and b have the same dtype and shape. */
MPU_API int mpu_tensor_same_shape(const mpu_tensor *a, const mpu_tensor *b);

/* Write "float32[4, 3]" into buf (always terminated). Returns buf. */
MPU_API char *mpu_tensor_describe(const mpu_tensor *t, char *buf, size_t len);

/*
 * Copy part `index` of `parts` equal parts of `in` along `dim` into `out`
 * (negative dim counts from the end, -1 = last, as torch does). `out` must
 * have in's dtype and shape with shape[dim] / parts along dim; in.shape[dim]
 * must divide by parts. On error out's data is unchanged.
 */
MPU_API mpu_result_t mpu_tensor_split(const mpu_tensor *in, int dim, int parts, int index,
                                      mpu_tensor *out);

/*
 * Concatenate nparts tensors along `dim` into `out`. All parts share dtype and
 * every dim but `dim`; out's shape is theirs with the sizes along dim added up.
 * `out` must not overlap any part. On error out's data is unchanged.
 */
MPU_API mpu_result_t mpu_tensor_concat(const mpu_tensor *parts, int nparts, int dim,
                                       mpu_tensor *out);

#ifdef __cplusplus
}
#endif

#endif /* MPU_TENSOR_H */

/*
 * data.c - broadcast_data (data.py): int64 tensors from the tensor-parallel
 * group's rank 0 to the group, shapes first, then all data in one buffer.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/error.h"
#include "mpu/layers.h"

#define SLOTS (MPU_TENSOR_MAX_DIMS + 1) /* ndim, then the dims */

mpu_result_t mpu_broadcast_data(mpu_comm *tp, int nkeys, const char *const *keys,
                                mpu_tensor *tensors) {
  static const char fn[] = "mpu_broadcast_data";
  int rank;
  MPU_CHECK(mpu__comm_for_host(tp, fn, &tp)); /* an NCCL group: its host twin */
  MPU_CHECK(mpu_comm_rank(tp, &rank));
  if (nkeys < 1 || !tensors)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d keys and no tensors", fn, nkeys);
  int64_t *sizes = calloc((size_t)nkeys * SLOTS, sizeof(int64_t));
  if (!sizes) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);

  if (rank == 0)
    for (int k = 0; k < nkeys; k++) {
      const mpu_tensor *t = &tensors[k];
      if (t->dtype != MPU_INT64 || t->ndim < 0 || t->ndim > MPU_TENSOR_MAX_DIMS ||
          (!t->data && mpu_tensor_numel(t))) {

        sizes[k * SLOTS] = -1; /* tells the others to stop too */
        continue;
      }
      sizes[k * SLOTS] = t->ndim;
      for (int d = 0; d < t->ndim; d++) sizes[k * SLOTS + 1 + d] = t->shape[d];
    }
  mpu_result_t r = mpu_comm_broadcast(tp, sizes, (size_t)nkeys * SLOTS, MPU_INT64, 0);
  size_t total = 0;
  for (int k = 0; !r && k < nkeys; k++) {
    if (sizes[k * SLOTS] < 0) {
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                     "%s: key '%s' on the source rank is not an int64 tensor", fn,
                     keys && keys[k] ? keys[k] : "?");
      break;
    }
    size_t numel = 1;
    for (int d = 0; d < sizes[k * SLOTS]; d++) numel *= (size_t)sizes[k * SLOTS + 1 + d];
    total += numel;
  }
  int64_t *flat = r ? NULL : malloc((total ? total : 1) * sizeof(int64_t));
  if (!r && !flat) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu values", fn, total);
  if (!r && rank == 0) { /* pack */
    size_t at = 0;
    for (int k = 0; k < nkeys; k++) {
      size_t numel = mpu_tensor_numel(&tensors[k]);
      if (numel) memcpy(flat + at, tensors[k].data, numel * sizeof(int64_t));
      at += numel;
    }
  }
  if (!r) r = mpu_comm_broadcast(tp, flat, total, MPU_INT64, 0);
  if (!r && rank != 0) { /* unpack into new tensors */
    size_t at = 0;
    int k = 0;
    for (; k < nkeys && !r; k++) {
      int64_t shape[MPU_TENSOR_MAX_DIMS];
      int nd = (int)sizes[k * SLOTS];
      for (int d = 0; d < nd; d++) shape[d] = sizes[k * SLOTS + 1 + d];
      r = mpu_tensor_alloc(&tensors[k], MPU_INT64, nd, shape);
      size_t numel = r ? 0 : mpu_tensor_numel(&tensors[k]);
      if (numel) memcpy(tensors[k].data, flat + at, numel * sizeof(int64_t));
      at += numel;
    }
    if (r)
      while (--k >= 0) mpu_tensor_free(&tensors[k]);
  }

  free(flat);
  free(sizes);
  return r;
}

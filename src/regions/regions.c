/*
 * regions.c - mappings.py's primitives over a communicator, and the regions
 * as one table of (forward, backward) primitives.
 *
 * Gathers along the first dim are a plain all_gather (rank blocks stacked is
 * concatenation along dim 0 for a contiguous tensor); along the last dim the
 * gathered blocks are concatenated with mpu_tensor_concat, as Megatron's
 * torch.cat does. Splits copy this rank's part (.contiguous() in Megatron).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/error.h"
#include "tensor/tensor_internal.h"
#include "mpu/regions.h"

static const struct {
  const char *name;
  mpu_primitive forward, backward;
} regions[MPU_REGION_COUNT] = {
    [MPU_COPY_TO_TP] = {"copy_to_tp", MPU_PRIM_IDENTITY, MPU_PRIM_ALL_REDUCE},
    [MPU_REDUCE_FROM_TP] = {"reduce_from_tp", MPU_PRIM_ALL_REDUCE, MPU_PRIM_IDENTITY},
    [MPU_SCATTER_TO_TP] = {"scatter_to_tp", MPU_PRIM_SPLIT_LAST, MPU_PRIM_GATHER_LAST},
    [MPU_GATHER_FROM_TP] = {"gather_from_tp", MPU_PRIM_GATHER_LAST, MPU_PRIM_SPLIT_LAST},
    [MPU_SCATTER_TO_SP] = {"scatter_to_sp", MPU_PRIM_SPLIT_FIRST, MPU_PRIM_GATHER_FIRST},
    [MPU_GATHER_FROM_SP] = {"gather_from_sp", MPU_PRIM_GATHER_FIRST, MPU_PRIM_REDUCE_SCATTER_FIRST},
    [MPU_REDUCE_SCATTER_TO_SP] = {"reduce_scatter_to_sp", MPU_PRIM_REDUCE_SCATTER_FIRST,
                                  MPU_PRIM_GATHER_FIRST},
    [MPU_ALL_TO_ALL] = {"all_to_all", MPU_PRIM_ALL_TO_ALL_FIRST, MPU_PRIM_ALL_TO_ALL_FIRST},
};

static const char *const prim_names[MPU_PRIM_COUNT] = {
    "identity", "all_reduce", "split (last dim)", "gather (last dim)", "split (first dim)",
    "gather (first dim)", "reduce_scatter (first dim)", "all_to_all (first dim)"};

const char *mpu_region_name(mpu_region r) {
  return (unsigned)r < MPU_REGION_COUNT ? regions[r].name : "invalid";
}

mpu_primitive mpu_region_forward_op(mpu_region r) {
  return (unsigned)r < MPU_REGION_COUNT ? regions[r].forward : MPU_PRIM_COUNT;
}

mpu_primitive mpu_region_backward_op(mpu_region r, int flags) {
  if ((unsigned)r >= MPU_REGION_COUNT) return MPU_PRIM_COUNT;
  if (r == MPU_GATHER_FROM_SP && (flags & MPU_NO_TP_OUTPUT_GRAD)) return MPU_PRIM_SPLIT_FIRST;
  return regions[r].backward;
}

mpu_result_t mpu_primitive_shape(mpu_primitive prim, int size, const mpu_tensor *in,
                                 mpu_tensor *out) {
  char d[128];
  if (!in || !out || size < 1 || (unsigned)prim >= MPU_PRIM_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_primitive_shape: bad argument");
  *out = *in;
  out->data = NULL;
  out->owns_data = 0;
  if (prim == MPU_PRIM_IDENTITY || prim == MPU_PRIM_ALL_REDUCE) return MPU_SUCCESS;
  if (in->ndim < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s needs a tensor with a dim, not %s",
                      prim_names[prim], mpu_tensor_describe(in, d, sizeof d));
  int dim = prim == MPU_PRIM_SPLIT_LAST || prim == MPU_PRIM_GATHER_LAST ? in->ndim - 1 : 0;
  if (prim == MPU_PRIM_ALL_TO_ALL_FIRST) { /* same shape; dim 0 must divide */
    if (in->shape[0] % size)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s of %s over %d ranks: dim 0 (size %lld) is not divisible by %d",
                        prim_names[prim], mpu_tensor_describe(in, d, sizeof d), size,
                        (long long)in->shape[0], size);
    return MPU_SUCCESS;
  }
  int splits = prim == MPU_PRIM_SPLIT_LAST || prim == MPU_PRIM_SPLIT_FIRST ||
               prim == MPU_PRIM_REDUCE_SCATTER_FIRST;
  if (splits) {
    if (in->shape[dim] % size)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s of %s over %d ranks: dim %d (size %lld) is not divisible by %d",
                        prim_names[prim], mpu_tensor_describe(in, d, sizeof d), size, dim,
                        (long long)in->shape[dim], size);
    out->shape[dim] /= size;
  } else {
    out->shape[dim] *= size;
  }
  return MPU_SUCCESS;
}

static mpu_result_t check_view(const char *what, const mpu_tensor *t) {
  if (!t) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "region: %s tensor is NULL", what);
  if (!mpu_dtype_size(t->dtype) || t->ndim < 0 || t->ndim > MPU_TENSOR_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "region: %s tensor has a bad dtype or ndim", what);
  if (!t->data && mpu_tensor_numel(t))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "region: %s tensor has NULL data", what);
  return MPU_SUCCESS;
}

/* Copies in the communicator's memory (device copies for device buffers),
 * enqueued on its stream where the primitive is stream-ordered. */
typedef struct prim_ctx {
  mpu_comm *comm;
  int ordered; /* mpu__comm_ordered: enqueue, the host not waiting */
} prim_ctx;

static mpu_result_t comm_copy2d(void *ctx, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t height) {
  const prim_ctx *x = ctx;
  return x->ordered ? mpu__comm_copy2d_enqueue(x->comm, dst, dpitch, src, spitch, width, height)
                    : mpu_comm_copy2d(x->comm, dst, dpitch, src, spitch, width, height);
}

/* One collective of a primitive: blocking, or (stream-ordered) its
 * non-blocking form with the request freed, the caller's stream ordered
 * after it at the primitive's end. */
static mpu_result_t collective(const prim_ctx *x, mpu_primitive prim, const mpu_tensor *in,
                               void *out, size_t count) {
  mpu_comm *c = x->comm;
  mpu_request *req = NULL, **rq = x->ordered ? &req : NULL;
  mpu_result_t r;
  switch (prim) {
  case MPU_PRIM_ALL_REDUCE:
    r = rq ? mpu_comm_iall_reduce(c, in->data, out, count, in->dtype, MPU_SUM, rq)
           : mpu_comm_all_reduce(c, in->data, out, count, in->dtype, MPU_SUM);
    break;
  case MPU_PRIM_REDUCE_SCATTER_FIRST:
    r = rq ? mpu_comm_ireduce_scatter(c, in->data, out, count, in->dtype, MPU_SUM, rq)
           : mpu_comm_reduce_scatter(c, in->data, out, count, in->dtype, MPU_SUM);
    break;
  case MPU_PRIM_ALL_TO_ALL_FIRST:
    r = rq ? mpu_comm_iall_to_all(c, in->data, out, count, in->dtype, rq)
           : mpu_comm_all_to_all(c, in->data, out, count, in->dtype);
    break;
  default: /* the gathers */
    r = rq ? mpu_comm_iall_gather(c, in->data, out, count, in->dtype, rq)
           : mpu_comm_all_gather(c, in->data, out, count, in->dtype);
    break;
  }
  return !r && req ? mpu_request_free(req) : r;
}

static mpu_result_t run_primitive(const prim_ctx *x, mpu_primitive prim, int n, int rank,
                                  const mpu_tensor *in, mpu_tensor *out) {
  mpu_comm *comm = x->comm;
  size_t count = mpu_tensor_numel(in), bytes = mpu_tensor_nbytes(in);
  if (n == 1 || prim == MPU_PRIM_IDENTITY) { /* a group of one: every primitive is the identity */
    if (out->data != in->data && bytes)
      return comm_copy2d((void *)x, out->data, bytes, in->data, bytes, bytes, 1);
    return MPU_SUCCESS;
  }
  switch (prim) {
  case MPU_PRIM_ALL_REDUCE:
  case MPU_PRIM_GATHER_FIRST: return collective(x, prim, in, out->data, count);
  case MPU_PRIM_SPLIT_LAST: return mpu__tensor_split_with(in, -1, n, rank, out, comm_copy2d, (void *)x);
  case MPU_PRIM_SPLIT_FIRST: return mpu__tensor_split_with(in, 0, n, rank, out, comm_copy2d, (void *)x);
  case MPU_PRIM_REDUCE_SCATTER_FIRST: return collective(x, prim, in, out->data, mpu_tensor_numel(out));
  case MPU_PRIM_ALL_TO_ALL_FIRST: return collective(x, prim, in, out->data, count / (size_t)n);
  default: { /* gather along the last dim: all_gather the blocks, then concatenate */
    void *mem = NULL;
    if (bytes > SIZE_MAX / (size_t)n)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "gather (last dim): %d blocks of %zu bytes", n,
                        bytes);
    /* the blocks are staged in the communicator's scratch, kept between calls
     * (in stream order: the next call's use of it comes after these copies) */
    mpu_result_t r = mpu__comm_scratch(comm, bytes * (size_t)n, &mem);
    char *stacked = mem;
    mpu_tensor parts[64], *p = n <= 64 ? parts : malloc((size_t)n * sizeof *p);
    if (!r && !p) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "gather (last dim): %d parts", n);
    if (!r) {
      r = collective(x, MPU_PRIM_GATHER_FIRST, in, stacked, count);
      for (int k = 0; k < n && !r; k++) {
        p[k] = *in;
        p[k].data = stacked + (size_t)k * bytes;
        p[k].owns_data = 0;
      }
      if (!r) r = mpu__tensor_concat_with(p, n, -1, out, comm_copy2d, (void *)x);
    }
    if (p != parts) free(p);
    return r;
  }
  }
}

/* On a communicator with streams (NCCL) the primitive is stream-ordered
 * (mpu__comm_ordered): its calls and copies are enqueued on the
 * communicator's stream and the caller's later kernels ordered after them,
 * without the host waiting for the device. */
mpu_result_t mpu_primitive_run(mpu_primitive prim, mpu_comm *comm, const mpu_tensor *in,
                               mpu_tensor *out) {
  int n, rank;
  char a[128], b[128];
  MPU_CHECK(mpu_comm_size(comm, &n));
  MPU_CHECK(mpu_comm_rank(comm, &rank));
  MPU_CHECK(check_view("input", in));
  MPU_CHECK(check_view("output", out));
  mpu_tensor want;
  MPU_CHECK(mpu_primitive_shape(prim, n, in, &want));
  if (!mpu_tensor_same_shape(&want, out))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: output is %s, want %s", prim_names[prim],
                      mpu_tensor_describe(out, a, sizeof a), mpu_tensor_describe(&want, b, sizeof b));
  prim_ctx x = {comm, mpu__comm_ordered(comm, out->data, mpu_tensor_nbytes(out))};
  mpu_result_t r = run_primitive(&x, prim, n, rank, in, out);
  if (x.ordered) { /* whatever was enqueued, the caller's work comes after it */
    mpu_result_t o = mpu__comm_order_caller(comm);
    if (!r) r = o;
  }
  return r;
}

mpu_result_t mpu_region_forward(mpu_region r, mpu_comm *tp, const mpu_tensor *in,
                                mpu_tensor *out) {
  if ((unsigned)r >= MPU_REGION_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_region_forward: region %d", (int)r);
  mpu_result_t res = mpu_primitive_run(regions[r].forward, tp, in, out);
  if (res) mpu__error_prefix("%s forward", regions[r].name);
  return res;
}

mpu_result_t mpu_region_backward(mpu_region r, mpu_comm *tp, const mpu_tensor *grad_out,
                                 mpu_tensor *grad_in, int flags) {
  if ((unsigned)r >= MPU_REGION_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_region_backward: region %d", (int)r);
  mpu_result_t res = mpu_primitive_run(mpu_region_backward_op(r, flags), tp, grad_out, grad_in);
  if (res) mpu__error_prefix("%s backward", regions[r].name);
  return res;
}

/*
 * signature.c - describing and comparing collective calls across ranks.
 */
#include "comm/base/signature.h"

#include <stdio.h>

#include "core/error.h"

static const char *const kind_names[] = {
    [MPU__ALL_REDUCE] = "all_reduce", [MPU__ALL_GATHER] = "all_gather",
    [MPU__REDUCE_SCATTER] = "reduce_scatter", [MPU__BROADCAST] = "broadcast",
    [MPU__REDUCE] = "reduce",         [MPU__ALL_TO_ALL] = "all_to_all",
    [MPU__BARRIER] = "barrier",
};

static int has_op(int k) {
  return k == MPU__ALL_REDUCE || k == MPU__REDUCE_SCATTER || k == MPU__REDUCE;
}

static int has_root(int k) { return k == MPU__BROADCAST || k == MPU__REDUCE; }

const char *mpu__kind_name(int kind) {
  return kind >= MPU__ALL_REDUCE && kind <= MPU__BARRIER ? kind_names[kind] : "(no call)";
}

mpu__sig mpu__sig_make(mpu__kind kind, size_t count, mpu_dtype dtype, mpu_op op, int root) {
  mpu__sig s = {(int32_t)kind, (int32_t)dtype, (int32_t)op, (int32_t)root, (uint64_t)count};
  if (!has_op(kind)) s.op = MPU_SUM;
  if (!has_root(kind)) s.root = -1;
  if (kind == MPU__BARRIER) s.dtype = MPU_UINT8, s.count = 0;
  return s;
}

void mpu__sig_describe(const mpu__sig *s, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s(count=%llu, %s", mpu__kind_name(s->kind),
                   (unsigned long long)s->count, mpu_dtype_name((mpu_dtype)s->dtype));
  if (s->kind == MPU__BARRIER) n = snprintf(buf, len, "barrier(");
  if (has_op(s->kind) && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", mpu_op_name((mpu_op)s->op));
  if (has_root(s->kind) && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", root=%d", s->root);
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, ")");
}

static int differs(const mpu__sig *a, const mpu__sig *b, mpu__check_level level) {
  if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype) return 1;
  if (level == MPU__CHECK_SAFETY) return 0;
  return (has_op(a->kind) && a->op != b->op) || (has_root(a->kind) && a->root != b->root);
}

static const mpu__sig *at(const void *sigs, size_t stride, int m) {
  return (const mpu__sig *)(const void *)((const char *)sigs + (size_t)m * stride);
}

mpu_result_t mpu__sig_compare(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level) {
  const mpu__sig *first_sig = at(sigs, stride, 0);
  int first = -1, count = 0;
  char ranks[256] = "";
  size_t used = 0;
  for (int m = 1; m < n; m++) {
    if (!differs(first_sig, at(sigs, stride, m), level)) continue;
    if (first < 0) first = m;
    count++;
    if (used < sizeof ranks)
      used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", count > 1 ? ", " : "",
                               m);
  }
  if (first < 0) return MPU_SUCCESS;
  char a[128], b[128];
  mpu__sig_describe(first_sig, a, sizeof a);
  mpu__sig_describe(at(sigs, stride, first), b, sizeof b);
  return mpu__error(MPU_ERR_MISMATCH,
                    "%s: mismatched calls on a communicator of %d ranks: rank 0 (world %d) "
                    "called %s but rank %d (world %d) called %s; ranks differing from rank 0: %s",
                    fn, n, world ? world[0] : 0, a, first, world ? world[first] : first, b,
                    ranks);
}

/*
 * signature.c - describing and comparing calls across ranks (what each kind
 * takes is collective.c's table).
 */
#include "comm/base/signature.h"

#include <stdio.h>

#include "core/error.h"

/* The row of a signature's kind; a kind outside the table (bytes from another
 * process) reads as a call with no op and no root. */
static const mpu__coll *row(const mpu__sig *s) {
  static const mpu__coll none = {.name = "invalid"};
  const mpu__coll *k = mpu__coll_of(s->kind);
  return k ? k : &none;
}

void mpu__sig_describe(const mpu__sig *s, char *buf, size_t len) {
  const mpu__coll *k = row(s);
  int n = snprintf(buf, len, "%s(%s=%llu, %s", k->name, k->listed ? "total" : "count",
                   (unsigned long long)s->count, mpu_dtype_name((mpu_dtype)s->dtype));
  if (s->kind == MPU_COLL_BARRIER) n = snprintf(buf, len, "barrier(");
  if (s->kind == MPU_COLL_ALL_TO_ALL_V) n = snprintf(buf, len, "all_to_all_v(%s",
                                                     mpu_dtype_name((mpu_dtype)s->dtype));
  if (k->listed && s->kind != MPU_COLL_ALL_TO_ALL_V && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", counts #%016llx", (unsigned long long)s->digest);
  if (k->has_op && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", mpu_op_name((mpu_op)s->op));
  if (k->has_root && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", root=%d", s->root);
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, ")");
}

static int differs(const mpu__sig *a, const mpu__sig *b, mpu__check_level level) {
  if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype ||
      a->digest != b->digest)
    return 1;
  if (level == MPU__CHECK_SAFETY) return 0;
  return (row(a)->has_op && a->op != b->op) || (row(a)->has_root && a->root != b->root);
}

static const mpu__sig *at(const void *sigs, size_t stride, int m) {
  return (const mpu__sig *)(const void *)((const char *)sigs + (size_t)m * stride);
}

mpu_result_t mpu__sig_compare(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level) {
  const mpu__sig *first_sig = at(sigs, stride, 0);
  int first = -1, count = 0;
  char ranks[256]; /* written only on a mismatch: not cleared on every call */
  size_t used = 0;
  ranks[0] = 0;
  for (int m = 1; m < n; m++) {
    if (!differs(first_sig, at(sigs, stride, m), level)) continue;
    if (first < 0) first = m;
    count++;
    if (used < sizeof ranks)
      used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", count > 1 ? ", " : "",
                               m);
  }
  if (first < 0) return MPU_SUCCESS;
  char a[160], b[160];
  mpu__sig_describe(first_sig, a, sizeof a);
  mpu__sig_describe(at(sigs, stride, first), b, sizeof b);
  return mpu__error(MPU_ERR_MISMATCH,
                    "%s: mismatched calls on a communicator of %d ranks: rank 0 (world %d) "
                    "called %s but rank %d (world %d) called %s; ranks differing from rank 0: %s",
                    fn, n, world ? world[0] : 0, a, first, world ? world[first] : first, b,
                    ranks);
}

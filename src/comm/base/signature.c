/*
 * signature.c - the collectives' names, and describing and comparing calls
 * across ranks.
 */
#include "comm/base/signature.h"

#include <stdio.h>
#include <strings.h>

#include "core/error.h"

/* the one list of names: the calls' messages, the checks and mpu bench */
static const char *const names[MPU_COLL_KINDS] = {
    [MPU_COLL_ALL_REDUCE] = "all_reduce",
    [MPU_COLL_ALL_GATHER] = "all_gather",
    [MPU_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [MPU_COLL_BROADCAST] = "broadcast",
    [MPU_COLL_REDUCE] = "reduce",
    [MPU_COLL_ALL_TO_ALL] = "all_to_all",
    [MPU_COLL_BARRIER] = "barrier",
    [MPU_COLL_ALL_GATHER_V] = "all_gather_v",
    [MPU_COLL_REDUCE_SCATTER_V] = "reduce_scatter_v",
    [MPU_COLL_ALL_TO_ALL_V] = "all_to_all_v",
};

const char *mpu_collective_name(mpu_collective c) {
  return (unsigned)c < MPU_COLL_KINDS ? names[c] : "invalid";
}

mpu_result_t mpu_collective_from_name(const char *name, mpu_collective *out) {
  if (!name || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_collective_from_name: NULL");
  for (int i = 0; i < MPU_COLL_KINDS; i++)
    if (!strcasecmp(name, names[i])) return *out = (mpu_collective)i, MPU_SUCCESS;
  char list[256];
  size_t used = 0;
  for (int i = 0; i < MPU_COLL_KINDS && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "unknown collective '%s' (want one of %s)", name,
                    list);
}

int mpu__coll_has_op(int k) {
  return k == MPU_COLL_ALL_REDUCE || k == MPU_COLL_REDUCE_SCATTER || k == MPU_COLL_REDUCE ||
         k == MPU_COLL_REDUCE_SCATTER_V;
}

int mpu__coll_has_root(int k) { return k == MPU_COLL_BROADCAST || k == MPU_COLL_REDUCE; }

static int uneven(int k) {
  return k == MPU_COLL_ALL_GATHER_V || k == MPU_COLL_REDUCE_SCATTER_V ||
         k == MPU_COLL_ALL_TO_ALL_V;
}

void mpu__sig_describe(const mpu__sig *s, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s(%s=%llu, %s", mpu_collective_name((mpu_collective)s->kind),
                   uneven(s->kind) ? "total" : "count", (unsigned long long)s->count,
                   mpu_dtype_name((mpu_dtype)s->dtype));
  if (s->kind == MPU_COLL_BARRIER) n = snprintf(buf, len, "barrier(");
  if (s->kind == MPU_COLL_ALL_TO_ALL_V) n = snprintf(buf, len, "all_to_all_v(%s",
                                                     mpu_dtype_name((mpu_dtype)s->dtype));
  if (uneven(s->kind) && s->kind != MPU_COLL_ALL_TO_ALL_V && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", counts #%016llx", (unsigned long long)s->digest);
  if (mpu__coll_has_op(s->kind) && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", mpu_op_name((mpu_op)s->op));
  if (mpu__coll_has_root(s->kind) && n > 0 && (size_t)n < len)
    n += snprintf(buf + n, len - (size_t)n, ", root=%d", s->root);
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, ")");
}

static int differs(const mpu__sig *a, const mpu__sig *b, mpu__check_level level) {
  if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype ||
      a->digest != b->digest)
    return 1;
  if (level == MPU__CHECK_SAFETY) return 0;
  return (mpu__coll_has_op(a->kind) && a->op != b->op) ||
         (mpu__coll_has_root(a->kind) && a->root != b->root);
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
  char a[160], b[160];
  mpu__sig_describe(first_sig, a, sizeof a);
  mpu__sig_describe(at(sigs, stride, first), b, sizeof b);
  return mpu__error(MPU_ERR_MISMATCH,
                    "%s: mismatched calls on a communicator of %d ranks: rank 0 (world %d) "
                    "called %s but rank %d (world %d) called %s; ranks differing from rank 0: %s",
                    fn, n, world ? world[0] : 0, a, first, world ? world[first] : first, b,
                    ranks);
}

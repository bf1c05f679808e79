/*
 * names.c - what a checkpoint may name and record, one check for the set,
 * the writer and the reader alike: tensor names and kinds, metadata pairs,
 * the layout's sizes, the optimizer's numbers.
 */
#include <math.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

mpu_result_t mpu__ckpt_adamw_numbers(const char *fn, const mpu_adamw_options *o) {
  static const char *const names[6] = {"lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad"};
  const float v[6] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->clip_grad};
  for (int i = 0; i < 6; i++)
    if (!isfinite(v[i]))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: the optimizer's %s is %g; an index records finite numbers", fn,
                        names[i], (double)v[i]);
  return MPU_SUCCESS;
}

mpu_result_t mpu__ckpt_layout_check(const char *fn, const mpu_ckpt_layout *l) {
  const int sizes[7] = {l->world, l->tp, l->pp, l->vp, l->dp, l->cp, l->ep};
  static const char *const names[7] = {"world", "tp", "pp", "vp", "dp", "cp", "ep"};
  for (int i = 0; i < 7; i++) {
    int least = i == 3 ? 0 : 1; /* vp 0: no virtual stages */
    if (sizes[i] < least || sizes[i] > CKPT_SIZE_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layout %s %d out of range (%d..%d)", fn,
                        names[i], sizes[i], least, CKPT_SIZE_MAX);
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu__ckpt_meta_check(const char *fn, const char *key, size_t key_cap,
                                  const char *value, size_t value_cap) {
  static const size_t most = sizeof ((mpu_ckpt_set *)0)->meta[0][0];
  size_t kn = strnlen(key, key_cap), vn = strnlen(value, value_cap);
  if (kn == key_cap || vn == value_cap || kn >= most || vn >= most || mpu__ckpt_name_ok(key))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: metadata key '%.*s' or its value too long (%zu bytes) or not printable",
                      fn, (int)(kn < most ? kn : most - 1), key, most - 1);
  for (size_t c = 0; c < vn; c++)
    if (value[c] < 0x20 || value[c] > 0x7e)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the value of metadata key '%s' is not printable",
                        fn, key);
  return MPU_SUCCESS;
}

int mpu__ckpt_name_ok(const char *name) {
  if (!name || !*name || strlen(name) >= MPU_CKPT_NAME_MAX) return -1;
  for (const char *c = name; *c; c++)
    if (*c <= 0x20 || *c > 0x7e || *c == '"' || *c == '\\') return -1;
  return 0;
}

static const char *const kind_names[] = {"param", "exp_avg", "exp_avg_sq"};

const char *mpu_ckpt_kind_name(mpu_ckpt_kind kind) {
  return (unsigned)kind < 3 ? kind_names[kind] : "?";
}

int mpu__ckpt_kind_from_name(const char *name, mpu_ckpt_kind *out) {
  for (int k = 0; k < 3; k++)
    if (name && !strcmp(name, kind_names[k])) return *out = (mpu_ckpt_kind)k, 0;
  return -1;
}


/*
 * adamw.h - the one AdamW element update and the one clipping coefficient
 * that the plain, the distributed (ZeRO-1) and the sharded (ZeRO-2/3, HSDP)
 * optimizers all apply, so that every strategy gives the same parameters.
 */
#ifndef MPU_TRAIN_ADAMW_H
#define MPU_TRAIN_ADAMW_H

#include <math.h>

#include "mpu/train.h"

/* lr, betas, eps, weight decay and clip finite and in range (the message names fn) */
mpu_result_t mpu__adamw_check(const char *fn, const mpu_adamw_options *o);

/* A choice every rank must make alike besides the floats (the ZeRO-1 flag,
 * FSDP's strategy and layout): its name in messages, its value, and how to
 * print a value (NULL: as a number). */
typedef struct mpu__agree_choice {
  const char *what;
  int value;
  const char *(*name)(int value);
} mpu__agree_choice;

#define MPU__AGREE_CHOICES 2

/* Collective over group: every rank was given the same options (the floats
 * bit for bit, the averaging rule, the bucket size, the choices: at most
 * MPU__AGREE_CHOICES) and a buffer of the same shape; else MPU_ERR_MISMATCH
 * on every rank naming the first rank that differs from rank 0 and the
 * field. */
mpu_result_t mpu__adamw_agree(const char *fn, mpu_comm *group, const mpu_adamw_options *o,
                              int sum, size_t bucket_bytes, const mpu__agree_choice *choices,
                              int nchoices, const mpu_param_buffer *b);

/* The gradient norm from this rank's sum of squares: summed over norm_group
 * (NULL: none), its square root into *norm and *grad_norm (may be NULL);
 * MPU_ERR_INVALID_ARGUMENT (no update is to be made) if it is not finite. */
mpu_result_t mpu__grad_norm(const char *fn, double sq, mpu_comm *norm_group, float *grad_norm,
                            float *norm);

/* One entry of a step of several: its buffer and the steps it has done. */
typedef struct mpu__stepped {
  const mpu_param_buffer *b;
  int64_t step;
  int index; /* set by mpu__step_all_check */
} mpu__stepped;

/* What a step of the n entries needs before it changes anything: every step
 * count in [0, INT64_MAX) (the next one is counted, and bias-corrected, in
 * int64), and no parameter buffer twice (it would be updated twice and its
 * gradient counted twice in the norm). `what` names an entry in the message
 * ("buffer", "optimizer"). Reorders e. */
mpu_result_t mpu__step_all_check(const char *fn, const char *what, mpu__stepped *e, int n);

/* Parameter i of b as a shard of its global tensor g (mpu_shard_megatron by
 * its attributes over tp_size ranks, b's tp rank) keeping no element yet;
 * MPU_ERR_INVALID_ARGUMENT if g's local part is not the parameter's size. */
mpu_result_t mpu__param_shard(const char *fn, const mpu_param_buffer *b, int i,
                              const mpu_shard_global *g, int tp_size, mpu_shard *out);

/* Parameter i of b as a shard of its own local tensor (its shape, or 1-d of
 * its numel; one box, the whole of it) keeping no element yet: what the
 * optimizers' held ranges are spans of. MPU_ERR_INVALID_ARGUMENT naming fn
 * for no such parameter. */
mpu_result_t mpu__param_local_shard(const char *fn, const mpu_param_buffer *b, int i,
                                    mpu_shard *out);

/* Append tensor name + suffix of that kind, keeping keep's spans of data and
 * saving save's (NULL: none) to out. */
mpu_result_t mpu__describe(const char *fn, mpu_shard_list *out, const char *name,
                           const char *suffix, mpu_shard_kind kind, const mpu_shard *keep,
                           float *data, const mpu_shard *save);

/* torch's AdamW on one element: decoupled decay, then the bias-corrected step
 * grouped as torch/optim/adam.py's single-tensor step groups it (step_size =
 * lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps, p + (-step_size m) / denom as
 * its addcdiv computes self + value * t1 / t2). step_size and
 * sqrt(bc2) are the same for every element (hoisted out of the callers'
 * loops), so an element costs one square root and two divisions, where
 * lr (m / bc1) / (sqrt(v / bc2) + eps) cost three: the divider bounds the
 * optimizer's loop. The values agree with torch's to rounding, not bit for
 * bit: torch moves m by lerp, decays p by one factor (1 - lr wd) and forms
 * its scalars in double. */
static inline void mpu__adamw_element(float *p, float g, float *m, float *v, float decay,
                                      const mpu_adamw_options *o, float bc1, float bc2) {
  float step_size = o->lr / bc1, bc2_sqrt = sqrtf(bc2);
  *p -= o->lr * o->weight_decay * decay * *p;
  *m = o->beta1 * *m + (1 - o->beta1) * g;
  *v = o->beta2 * *v + (1 - o->beta2) * g * g;
  *p -= step_size * *m / (sqrtf(*v) / bc2_sqrt + o->eps); /* addcdiv: value * t1 / t2 */
}

/* clip_grad_by_total_norm_fp32: the factor every gradient is multiplied by */
static inline float mpu__clip_coeff(float clip_grad, float norm) {
  if (clip_grad <= 0) return 1.0f;
  float coeff = clip_grad / (norm + 1.0e-6f);
  return coeff < 1.0f ? coeff : 1.0f;
}

#endif

/*
 * ckpt_helpers.h - what the checkpoint tests share: their folders (made in
 * the build directory, named by the test and the process) and a one-rank
 * set of two small whole tensors, "a" (3 x 4) and another (b_len elements).
 */
#ifndef MPU_TEST_CKPT_HELPERS_H
#define MPU_TEST_CKPT_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpu.h"

static inline __attribute__((unused)) void make_dir(const char *tag, char *out, size_t cap) {
  snprintf(out, cap, "test_checkpoint_%s_%d", tag, (int)getpid());
}

static inline __attribute__((unused)) void remove_dir(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* the memory of one_rank_set's tensors */
static __attribute__((unused)) float one_a[12], one_b[6];

static inline __attribute__((unused)) void one_rank_set(mpu_ckpt_set *set, const char *b_name,
                                                        int64_t b_len) {
  mpu_ckpt_set_init(set);
  int64_t sa[2] = {3, 4}, sb[1] = {b_len ? b_len : 1};
  mpu_shard whole_a, whole_b; /* whole tensors: Megatron's partition of a duplicate */
  assert_int_equal(mpu_shard_megatron(2, sa, -1, 1, 1, 0, &whole_a), 0);
  assert_int_equal(mpu_shard_megatron(1, sb, -1, 1, 1, 0, &whole_b), 0);
  mpu_shard_mem a = {0, 12, one_a}, b = {0, (size_t)b_len, one_b};
  assert_int_equal(mpu_ckpt_add(set, "a", MPU_CKPT_PARAM, 2, sa, whole_a.local_shape,
                                whole_a.boxes, 1, &a, 1, &a, 1), 0);
  if (b_name)
    assert_int_equal(mpu_ckpt_add(set, b_name, MPU_CKPT_PARAM, 1, sb, whole_b.local_shape,
                                  whole_b.boxes, 1, &b, 1, &b, 1), 0);
}

#endif

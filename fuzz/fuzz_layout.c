/*
 * fuzz_layout.c - libFuzzer target over layout configs: "key=value" text
 * (flavour, sizes, order string) is parsed, checked, and when accepted every
 * group kind and getter of a few ranks is computed. Nothing may crash, leak
 * or read out of bounds, whatever the text.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[512];
  if (size >= sizeof text) size = sizeof text - 1;
  memcpy(text, data, size);
  text[size] = '\0';
  mpu_layout_config cfg;
  if (mpu_layout_config_parse(text, &cfg) != MPU_SUCCESS) return 0;
  if (cfg.world_size > 4096) cfg.world_size = 4096; /* keep each run cheap */
  mpu_layout *l = NULL;
  if (mpu_layout_create(&cfg, &l) != MPU_SUCCESS) return 0;
  int W = mpu_layout_config_of(l)->world_size;
  int *buf = malloc(((size_t)W + 3) * sizeof(int));
  if (!buf) {
    mpu_layout_free(l);
    return 0;
  }
  int ranks[3] = {0, W / 2, W - 1};
  for (int i = 0; i < 3; i++) {
    mpu_rank_info info = MPU_RANK_INFO_INIT;
    if (mpu_layout_rank_info(l, ranks[i], &info) != MPU_SUCCESS) abort(); /* accepted: must answer */
    for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
      int n, count;
      if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
      if (mpu_layout_group(l, (mpu_group_kind)k, ranks[i], buf, (size_t)W + 3, &n)) abort();
      if (mpu_layout_num_groups(l, (mpu_group_kind)k, &count) || count < 1) abort();
      if (mpu_layout_group_at(l, (mpu_group_kind)k, count - 1, buf, (size_t)W + 3, &n)) abort();
    }
  }
  free(buf);
  mpu_layout_free(l);
  return 0;
}

/* A program that uses the layers: one column-parallel linear on 2 thread ranks. */
#include <stdio.h>

#include "mpu.h"

static mpu_result_t rank_main(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_column_linear l;
  float x[4] = {1, 2, 3, 4}, y[4];
  mpu_result_t r = mpu_column_linear_init(&l, world, 4, 4, 1, 1, 0, 7, 0.02f);
  if (r != MPU_SUCCESS) return r;
  r = mpu_column_linear_forward(&l, x, 1, y); /* gather_output: y is the whole (1, 4) */
  mpu_column_linear_free(&l);
  return r;
}

int main(void) {
  mpu_result_t r = mpu_launch(2, rank_main, NULL, NULL, NULL);
  if (r != MPU_SUCCESS) fprintf(stderr, "%s\n", mpu_last_error());
  else printf("layers ok\n");
  return r != MPU_SUCCESS;
}

/*
 * allreduce.c - the smallest mpu program: four ranks as threads of this
 * process, each contributing its rank; every rank gets the sum.
 *
 *   cc allreduce.c $(pkg-config --cflags --libs mpu) -o allreduce && ./allreduce
 */
#include <stdio.h>

#include "mpu.h"

static mpu_result_t rank_main(mpu_comm *world, void *arg) {
  (void)arg;
  int rank, size;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  float x[3] = {(float)rank, 1.0f, (float)(rank * rank)}, sum[3];
  mpu_result_t r = mpu_comm_all_reduce(world, x, sum, 3, MPU_FLOAT32, MPU_SUM);
  if (r != MPU_SUCCESS) return r;
  printf("rank %d of %d: sum = [%g, %g, %g]\n", rank, size, sum[0], sum[1], sum[2]);
  return MPU_SUCCESS;
}

int main(void) {
  mpu_result_t r = mpu_launch(4, rank_main, NULL, NULL, NULL);
  if (r != MPU_SUCCESS) {
    fprintf(stderr, "allreduce: %s: %s\n", mpu_result_name(r), mpu_last_error());
    return 1;
  }
  return 0;
}

/* A program that uses the NCCL backend through mpu alone: it links the
 * backend library and asks whether the backend is there (it is: this
 * program's libmpu_nccl registered it when it loaded). */
#include <stdio.h>

#include "mpu.h"

int main(void) {
  if (!mpu_nccl_available()) {
    fprintf(stderr, "no NCCL backend: %s\n", mpu_last_error());
    return 1;
  }
  printf("nccl backend ok\n");
  return 0;
}

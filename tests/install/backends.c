/* Which backends load, and in one line why one does not. */
#include <stdio.h>

#include "mpu.h"

int main(void) {
  if (mpu_mpi_available()) printf("mpi: yes\n");
  else printf("mpi: no: %s\n", mpu_last_error());
  if (mpu_nccl_available()) printf("nccl: yes\n");
  else printf("nccl: no: %s\n", mpu_last_error());
  return 0;
}

/*
 * options.c - taking a caller's options struct of any version up to ours.
 */
#include "core/options.h"

#include <string.h>

#include "core/error.h"

mpu_result_t mpu__check_size(const char *fn, const char *what, const char *init, size_t size,
                             size_t min_size, size_t full_size) {
  if (size >= min_size && size <= full_size) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s.size is %zu; want %zu..%zu (start from %s)",
                    fn, what, size, min_size, full_size, init);
}

mpu_result_t mpu__take_options(const char *fn, const char *what, const char *init,
                               const void *given, size_t full_size, size_t min_size, void *full) {
  size_t size;
  memcpy(&size, given, sizeof size);
  MPU_CHECK(mpu__check_size(fn, what, init, size, min_size, full_size));
  memcpy(full, given, size);
  memcpy(full, &full_size, sizeof full_size);
  return MPU_SUCCESS;
}

mpu_result_t mpu__give_out(const char *fn, const char *what, const char *init, void *out,
                           const void *full, size_t full_size, size_t min_size) {
  size_t size;
  memcpy(&size, out, sizeof size);
  MPU_CHECK(mpu__check_size(fn, what, init, size, min_size, full_size));
  memcpy(out, full, size);
  memcpy(out, &size, sizeof size);
  return MPU_SUCCESS;
}

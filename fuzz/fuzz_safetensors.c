/*
 * fuzz_safetensors.c - libFuzzer target over the safetensors header reader
 * (mpu ckpt inspect, the merge's tests): the bytes are a whole file; it is
 * refused with a message, or every tensor it lists has a known dtype, a
 * shape whose bytes are its data_offsets' span, and the spans tile the data
 * after the header exactly.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  st_header h;
  if (mpu__st_parse(data, size, size, "fuzz", &h)) return 0;
  if (h.data_start > size) abort();
  uint64_t total = 0;
  for (int i = 0; i < h.n; i++) {
    const st_entry *e = &h.entries[i];
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) numel *= (uint64_t)e->shape[d];
    if (!mpu__st_dtype_size(e->dtype) || e->end - e->begin != numel * mpu__st_dtype_size(e->dtype) ||
        e->end > size - h.data_start)
      abort();
    total += e->end - e->begin;
  }
  if (total != size - h.data_start) abort();
  mpu__st_free(&h);
  return 0;
}

/*
 * memory.c - the global memory buffer (Megatron's GlobalMemoryBuffer): named
 * scratch tensors per state, grown on demand, freed with the state.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "state/state_internal.h"

void mpu__state_scratch_free(scratch *b) {
  while (b) {
    scratch *next = b->next;
    free(b->data);
    free(b);
    b = next;
  }
}

/* ---- the global memory buffer ---------------------------------------------------------- */

mpu_result_t mpu_state_memory_buffer(mpu_state *s, const char *name, mpu_dtype dtype, int ndim,
                                     const int64_t *shape, mpu_tensor *out) {
  static const char fn[] = "mpu_state_memory_buffer";
  mpu_state *st = NULL;
  MPU_CHECK(mpu__state_mutable(fn, s, &st));
  if (!name || !*name || strlen(name) >= sizeof st->buffers->name || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: want a name of 1..63 characters and an out",
                      fn);
  /* the shape's checks (dims, byte size in size_t) are the tensor view's */
  static char probe;
  mpu_tensor want;
  MPU_CHECK(mpu_tensor_init(&want, &probe, dtype, ndim, shape));
  size_t numel = mpu_tensor_numel(&want), bytes = mpu_tensor_nbytes(&want);
  scratch *b = st->buffers;
  while (b && (b->dtype != dtype || strcmp(b->name, name))) b = b->next;
  if (!b || b->numel < numel) {
    scratch *grown = calloc(1, sizeof *grown);
    void *data = grown ? aligned_alloc(64, (bytes + 63) / 64 * 64 + 64) : NULL;
    if (!data) {
      free(grown);
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes for '%s'", fn, bytes, name);
    }
    strcpy(grown->name, name); /* length checked above */
    grown->dtype = dtype, grown->numel = numel, grown->data = data;
    if (b) { /* retire the smaller one: views of it stay valid until destroy */
      scratch **p = &st->buffers;
      while (*p != b) p = &(*p)->next;
      *p = b->next;
      b->next = st->retired;
      st->retired = b;
    }
    grown->next = st->buffers;
    st->buffers = b = grown;
  }
  return mpu_tensor_init(out, b->data, dtype, ndim, shape);
}


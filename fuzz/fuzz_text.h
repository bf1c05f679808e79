/*
 * fuzz_text.h - the targets whose first byte picks something and whose rest
 * is text: that text, cut to fit and NUL-terminated.
 */
#ifndef MPU_FUZZ_TEXT_H
#define MPU_FUZZ_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 0 when there is no first byte; else text holds data[1..] (at most cap - 1 bytes). */
static inline int fuzz_text_after_first(const uint8_t *data, size_t size, char *text, size_t cap) {
  if (size < 1 || cap < 1) return 0;
  size_t n = size - 1 < cap - 1 ? size - 1 : cap - 1;
  memcpy(text, data + 1, n);
  text[n] = '\0';
  return 1;
}

#endif

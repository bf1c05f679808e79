/*
 * safetensors.h - the safetensors file format (huggingface/safetensors):
 * 8 bytes of little-endian header length N, N bytes of a JSON object (each
 * tensor's "dtype", "shape" and "data_offsets" [begin, end) relative to the
 * byte after the header, plus an optional "__metadata__" object of string
 * values), padded with spaces so that the data starts on an 8-byte boundary,
 * then the data, every byte of it belonging to exactly one tensor. Internal
 * to libmpu; the header reader is fuzzed by fuzz/fuzz_safetensors.c.
 */
#ifndef MPU_CHECKPOINT_SAFETENSORS_H
#define MPU_CHECKPOINT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/json.h"
#include "mpu/result.h"

#define ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define ST_MAX_DIMS 8

/* Bytes per element of a safetensors dtype name ("F32"), 0 if unknown. */
size_t mpu__st_dtype_size(const char *dtype);

typedef struct st_entry {
  const char *name;        /* into the parsed header */
  const char *dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  uint64_t begin, end;     /* data offsets, relative to the data start */
} st_entry;

typedef struct st_header {
  json root;
  size_t header_len;       /* N */
  uint64_t data_start;     /* 8 + N */
  int n;
  st_entry *entries;
} st_header;

/* Check the first bytes of a file (head[0, len): at least 8 + N of them)
 * against the format, for a file of file_size bytes: header length, JSON,
 * dtypes, shapes, offsets that tile the data exactly. what names the file. */
mpu_result_t mpu__st_parse(const uint8_t *head, size_t len, uint64_t file_size, const char *what,
                           st_header *out);
void mpu__st_free(st_header *h);

/* One tensor to write: its name, shape and byte length (float32 data). */
typedef struct st_item {
  const char *name;
  int ndim;
  const int64_t *shape;
  uint64_t bytes;
} st_item;

/* The 8 length bytes and the padded JSON header for items laid out in
 * order; meta: n_meta key/value string pairs for __metadata__. *data_start
 * gets where the data begins. Free the result with free(). */
mpu_result_t mpu__st_header(const st_item *items, int n, const char *const *meta, int n_meta,
                            char **out, size_t *out_len);

#endif

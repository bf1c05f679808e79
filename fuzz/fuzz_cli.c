/*
 * fuzz_cli.c - libFuzzer target over every parser of the command line and of
 * names: sizes (64M), whole numbers and their lists (-n, --shape), list
 * separators, RxS meshes, --lr, --format, and the *_from_name of dtypes, ops,
 * collectives and flavours. The first byte picks the parser, the rest is the
 * text. Whatever the text: no crash, no overflow, and an accepted value lies
 * in the range the parser promises.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/mpu/cli.h"
#include "fuzz_text.h"
#include "mpu.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[256];
  if (!fuzz_text_after_first(data, size, text, sizeof text)) return 0;
  size_t bytes;
  long v, r, s, list[8];
  int count;
  double d;
  cli_format f;
  mpu_dtype dt;
  mpu_op op;
  mpu_collective coll;
  mpu_flavor fl;
  switch (data[0] % 10) {
  case 0:
    if (!cli_parse_size(text, &bytes) && bytes > SIZE_MAX / 2) abort();
    break;
  case 1:
    if (!cli_parse_int(text, 1, 1 << 30, &v) && (v < 1 || v > 1 << 30)) abort();
    break;
  case 2:
    if (!cli_parse_int_list(text, 1, INT32_MAX, list, 8, &count))
      for (int i = 0; i < count; i++)
        if (count > 8 || list[i] < 1 || list[i] > INT32_MAX) abort();
    break;
  case 3:
    if (!cli_list_ok(text) && (!text[0] || strstr(text, ",,"))) abort();
    break;
  case 4:
    if (!cli_parse_rxs(text, 256, &r, &s) && (r < 1 || s < 1 || r * s > 256)) abort();
    break;
  case 5:
    if (!cli_parse_double(text, 0, 100, &d) && !(d > 0 && d <= 100)) abort();
    break;
  case 6:
    if (!cli_parse_format(text, &f) && f != CLI_TEXT && f != CLI_JSON) abort();
    if (!cli_parse_picture_format(text, &f) && (f < CLI_TEXT || f > CLI_HTML)) abort();
    break;
  case 7:
    if (!mpu_dtype_from_name(text, &dt) && !mpu_dtype_size(dt)) abort();
    break;
  case 8:
    if (!mpu_op_from_name(text, &op) && (unsigned)op >= MPU_OP_COUNT) abort();
    if (!mpu_collective_from_name(text, &coll) && (unsigned)coll >= MPU_COLL_KINDS) abort();
    break;
  default:
    mpu_flavor_from_name(text, &fl);
    break;
  }
  return 0;
}

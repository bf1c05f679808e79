/*
 * fuzz_compare.c - libFuzzer target over `mpu plan --compare`: the first
 * byte picks text or JSON, the rest is a layout config as "key=value" text
 * (any sizes: a world of a billion ranks too, never clamped here). The
 * compare must answer with bounded work and output: every group listed up
 * to PLAN_LIST_MAX_RANKS ranks, a summary past it; status 2 exactly when
 * every flavour refuses; JSON that parses, in which each kind's groups hold
 * ranks of the world, none twice, and a summary's count x size fits the
 * world. Nothing may crash, leak or overflow (ASan, UBSan).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/mpu/plan_compare.h"
#include "checkpoint/json.h"
#include "fuzz_text.h"
#include "mpu.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* the library exports only the parser: its lookups, here */
static const json *get(const json *obj, const char *key) {
  for (size_t i = 0; obj->type == JSON_OBJECT && i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

static int get_int(const json *obj, const char *key, int64_t *out) {
  const json *v = get(obj, key);
  if (!v || v->type != JSON_NUMBER || !v->is_int) return -1;
  *out = v->integer;
  return 0;
}

/* the most a compare may print: every rank of every kind of three flavours
 * listed (with room for the brackets), or a page of summary */
#define LISTED_MAX_BYTES ((size_t)3 * 9 * (PLAN_LIST_MAX_RANKS + 1) * 16 + 4096)
#define SUMMARY_MAX_BYTES ((size_t)16 << 10)

static void check_kind(const json *k, int64_t world, int listed, unsigned char *seen) {
  if (!listed) {
    int64_t groups = -1, gsize = -1, rank = -1;
    const json *first = get(k, "first_members");
    if (k->type != JSON_OBJECT || get_int(k, "groups", &groups) ||
        (get_int(k, "size", &gsize) && get_int(k, "size_at_most", &gsize)) || get_int(k, "rank", &rank) || !first ||
        first->type != JSON_ARRAY || groups < 0 || gsize < 0 || groups * gsize > world ||
        first->n > PLAN_PEEK_MEMBERS_MAX || (int64_t)first->n > gsize)
      abort();
    for (size_t i = 0; i < first->n; i++)
      if (first->items[i].type != JSON_NUMBER || !first->items[i].is_int ||
          first->items[i].integer < 0 ||
          first->items[i].integer >= world)
        abort();
    return;
  }
  if (k->type != JSON_ARRAY) abort();
  memset(seen, 0, (size_t)world);
  for (size_t g = 0; g < k->n; g++) {
    const json *grp = &k->items[g];
    if (grp->type != JSON_ARRAY) abort();
    for (size_t i = 0; i < grp->n; i++) {
      const json *r = &grp->items[i];
      if (r->type != JSON_NUMBER || !r->is_int || r->integer < 0 || r->integer >= world ||
          seen[r->integer]++)
        abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[512];
  if (!fuzz_text_after_first(data, size, text, sizeof text)) return 0;
  int as_json = data[0] & 1;
  mpu_layout_config cfg;
  if (mpu_layout_config_parse(text, &cfg) != MPU_SUCCESS) return 0;
  int accepted = 0; /* by any flavour: then the compare answers */
  for (int f = 0; f < 3; f++) {
    mpu_layout_config c = cfg;
    mpu_layout *l = NULL;
    c.flavor = f == 0 ? MPU_FLAVOR_DEEPSPEED : f == 1 ? MPU_FLAVOR_CORE : MPU_FLAVOR_CORE_019;
    if (mpu_layout_create(&c, &l) == MPU_SUCCESS) accepted = 1;
    mpu_layout_free(l);
  }
  char *out = NULL, *err = NULL;
  size_t out_len = 0, err_len = 0;
  FILE *fo = open_memstream(&out, &out_len), *fe = open_memstream(&err, &err_len);
  if (!fo || !fe) abort();
  int status = plan_compare(fo, fe, &cfg, as_json);
  fclose(fo), fclose(fe);
  if (status != (accepted ? 0 : 2)) abort();
  if (status) { /* one line on err, nothing on out */
    if (out_len || !err_len || memchr(err, '\n', err_len) != err + err_len - 1) abort();
  } else {
    int listed = cfg.world_size <= PLAN_LIST_MAX_RANKS;
    if (err_len || out_len > (listed ? LISTED_MAX_BYTES : SUMMARY_MAX_BYTES)) abort();
  }
  if (!status && as_json) {
    json v;
    int64_t world = 0;
    int listed = cfg.world_size <= PLAN_LIST_MAX_RANKS;
    if (mpu__json_parse(out, out_len, "compare", &v)) abort();
    const json *fl = get(&v, "flavors");
    if (get_int(&v, "world_size", &world) || world != cfg.world_size || !fl ||
        fl->type != JSON_OBJECT || fl->n != 3 || (get(&v, "summary") == NULL) != listed)
      abort();
    unsigned char *seen = listed ? malloc((size_t)world + 1) : NULL;
    if (listed && !seen) abort();
    for (size_t f = 0; f < fl->n; f++) {
      const json *kinds = &fl->items[f];
      if (kinds->type != JSON_OBJECT) abort();
      if (get(kinds, "refused")) continue;
      for (size_t k = 0; k < kinds->n; k++) check_kind(&kinds->items[k], world, listed, seen);
    }
    free(seen);
    mpu__json_free(&v);
  }
  free(out), free(err);
  return 0;
}

/*
 * export.c - whole tensors out of a checkpoint, for readers other than mpu:
 * the merge into one safetensors file, and the export in transformers'
 * sharded layout (model-0000k-of-0000n.safetensors plus
 * model.safetensors.index.json, as modeling_utils.save_pretrained writes
 * it). Both write files of whole tensors through write_whole, each tensor
 * assembled by the reader's one routine (mpu__ckpt_read_whole).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt_internal.h"
#include "checkpoint/json.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "core/options.h"

#define EXPORT_INDEX "model.safetensors.index.json"
#define EXPORT_MAX_FILES 99999 /* five digits in the file names */
#define EXPORT_DEFAULT_SHARD (5ull * 1000 * 1000 * 1000) /* transformers' "5GB" */

/* Tensors idx[0, n) of ck (mpu_ckpt_tensor_at's order) whole into one
 * safetensors file at path, tensor k named names[k]; "format": "pt" in its
 * metadata, as transformers expects, and the checkpoint's step. The file is
 * written as every output of the tools is (core/files.h): never over one of
 * the checkpoint's own files. */
static mpu_result_t write_whole(mpu_ckpt *ck, const char *fn, const int *idx,
                                const char *const *names, int n, const char *path) {
  mpu_ckpt_tensor_info *info = calloc((size_t)n + 1, sizeof *info);
  st_item *items = calloc((size_t)n + 1, sizeof *items);
  float **data = calloc((size_t)n + 1, sizeof *data);
  const void **parts = calloc((size_t)n + 2, sizeof *parts);
  size_t *lens = calloc((size_t)n + 2, sizeof *lens);
  char *head = NULL;
  mpu_result_t r = info && items && data && parts && lens
                       ? MPU_SUCCESS
                       : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d tensors", fn, n);
  for (int k = 0; k < n && !r; k++) {
    r = mpu_ckpt_tensor_at(ck, idx[k], &info[k]);
    if (r) break;
    uint64_t numel = mpu__ckpt_numel(info[k].ndim, info[k].shape);
    if (numel > SIZE_MAX / sizeof(float) - 1) {
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has too many elements", fn,
                     info[k].name);
      break;
    }
    if (!(data[k] = malloc((size_t)numel * sizeof(float) + 1))) {
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: '%s'", fn, info[k].name);
      break;
    }
    r = mpu__ckpt_read_whole(ck, idx[k], data[k]);
    items[k].name = names[k], items[k].ndim = info[k].ndim, items[k].shape = info[k].shape;
    items[k].bytes = numel * sizeof(float);
    parts[k + 1] = data[k], lens[k + 1] = (size_t)items[k].bytes;
  }
  mpu_ckpt_info ci;
  if (!r) r = mpu_ckpt_get_info(ck, &ci);
  char step[32];
  snprintf(step, sizeof step, "%" PRId64, r ? (int64_t)0 : ci.step);
  const char *meta[4] = {"format", "pt", "step", step};
  size_t hlen = 0;
  if (!r) r = mpu__st_header(items, n, meta, 2, &head, &hlen);
  if (!r) {
    parts[0] = head, lens[0] = hlen;
    const mpu__file_id *ids;
    int nids;
    mpu__ckpt_inputs(ck, &ids, &nids);
    r = mpu__output_write(fn, path, parts, lens, n + 1, ids, nids);
  }
  for (int k = 0; k < n && data; k++) free(data[k]);
  free(info), free(items), free(data), free(parts), free(lens), free(head);
  return r;
}

/* The tensors the tools write: parameters, and with all the moments too. */
static mpu_result_t select_tensors(mpu_ckpt *ck, const char *fn, int all, int **idx, int *n) {
  mpu_ckpt_info ci;
  MPU_CHECK(mpu_ckpt_get_info(ck, &ci));
  *idx = calloc((size_t)ci.ntensors + 1, sizeof **idx);
  if (!*idx) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  *n = 0;
  for (int i = 0; i < ci.ntensors; i++) {
    mpu_ckpt_tensor_info t;
    MPU_CHECK(mpu_ckpt_tensor_at(ck, i, &t));
    if (all || t.kind == MPU_CKPT_PARAM) (*idx)[(*n)++] = i;
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_merge(mpu_ckpt *ck, const char *out_path, int all) {
  static const char fn[] = "mpu_ckpt_merge";
  if (!ck || !out_path || !*out_path)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  /* before the work: never over the checkpoint's own index or files, never a device */
  const mpu__file_id *ids;
  int nids;
  mpu__ckpt_inputs(ck, &ids, &nids);
  MPU_CHECK(mpu__output_check(fn, out_path, ids, nids));
  int *idx = NULL, n = 0;
  const char **names = NULL;
  mpu_result_t r = select_tensors(ck, fn, all, &idx, &n);
  if (!r && !(names = calloc((size_t)n + 1, sizeof *names)))
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  for (int k = 0; k < n && !r; k++) {
    mpu_ckpt_tensor_info t;
    r = mpu_ckpt_tensor_at(ck, idx[k], &t);
    names[k] = t.name;
  }
  if (!r) r = write_whole(ck, fn, idx, names, n, out_path);
  free(idx), free(names);
  return r;
}

/* ---- transformers' sharded layout -------------------------------------------------------- */

typedef struct out_tensor {
  const char *name; /* as exported */
  int shard;
} out_tensor;

static int by_name(const void *a, const void *b) {
  return strcmp(((const out_tensor *)a)->name, ((const out_tensor *)b)->name);
}

/* Each exported tensor's name: its own, or the map's. */
static mpu_result_t map_names(mpu_ckpt *ck, const char *fn, const mpu_ckpt_export_options *o,
                              const int *idx, int n, const char **names) {
  for (int k = 0; k < n; k++) {
    mpu_ckpt_tensor_info t;
    MPU_CHECK(mpu_ckpt_tensor_at(ck, idx[k], &t));
    names[k] = t.name;
  }
  if (o->nnames < 0 || (o->nnames > 0 && !o->names))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: a name map of %d entries at %p", fn,
                      o->nnames, (const void *)o->names);
  for (int m = 0; m < o->nnames; m++) {
    const char *from = o->names[2 * m], *to = o->names[2 * m + 1];
    if (!from || !to || mpu__ckpt_name_ok(to) || strlen(to) >= MPU_CKPT_NAME_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: name map entry %d: want two names of printable ASCII without "
                        "spaces or quotes, under %d bytes",
                        fn, m + 1, MPU_CKPT_NAME_MAX);
    int found = -1;
    for (int k = 0; k < n && found < 0; k++) {
      mpu_ckpt_tensor_info t;
      MPU_CHECK(mpu_ckpt_tensor_at(ck, idx[k], &t));
      if (!strcmp(t.name, from)) found = k;
    }
    if (found < 0)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: name map entry %d: the export has no tensor '%s' (%s)", fn, m + 1,
                        from, o->all ? "parameters and moments" : "parameters only");
    if (names[found] != NULL && strcmp(names[found], from))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: name map: '%s' is mapped twice", fn, from);
    names[found] = to;
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_export(mpu_ckpt *ck, const char *dir, const mpu_ckpt_export_options *options) {
  static const char fn[] = "mpu_ckpt_export";
  if (!ck || !dir || !*dir || !options)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_ckpt_export_options o = MPU_CKPT_EXPORT_OPTIONS_INIT;
  MPU_CHECK(mpu__take_options(fn, "options", "MPU_CKPT_EXPORT_OPTIONS_INIT", options, sizeof o,
                              sizeof o, &o));
  uint64_t max = o.max_shard_bytes ? o.max_shard_bytes : EXPORT_DEFAULT_SHARD;
  int *idx = NULL, n = 0, nshards = 0;
  const char **names = NULL;
  out_tensor *out = NULL;
  int *in_shard = NULL, *shard_of = NULL;
  const char **shard_names = NULL;
  json_buf ix = {0};
  mpu_result_t r = select_tensors(ck, fn, o.all, &idx, &n);
  if (!r && n == 0) r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the checkpoint has no tensors to export", fn);
  if (!r) {
    names = calloc((size_t)n, sizeof *names);
    out = calloc((size_t)n, sizeof *out);
    in_shard = calloc((size_t)n, sizeof *in_shard);
    shard_names = calloc((size_t)n, sizeof *shard_names);
    shard_of = calloc((size_t)n, sizeof *shard_of);
    if (!names || !out || !in_shard || !shard_names || !shard_of) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  if (!r) r = map_names(ck, fn, &o, idx, n, names);
  /* shards as huggingface_hub's split_state_dict_into_shards cuts them: in order, a new
   * shard when the next tensor would pass the limit (a larger tensor alone) */
  uint64_t total = 0, cur = 0;
  for (int k = 0; k < n && !r; k++) {
    mpu_ckpt_tensor_info t;
    r = mpu_ckpt_tensor_at(ck, idx[k], &t);
    if (nshards == 0 || (cur > 0 && cur + t.bytes > max)) nshards++, cur = 0;
    cur += t.bytes, total += t.bytes;
    out[k].name = names[k], out[k].shard = shard_of[k] = nshards - 1;
  }
  if (!r && nshards > EXPORT_MAX_FILES)
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d files at %" PRIu64 " bytes each; at most %d",
                   fn, nshards, max, EXPORT_MAX_FILES);
  if (!r) {
    qsort(out, (size_t)n, sizeof *out, by_name);
    for (int k = 1; k < n && !r; k++)
      if (!strcmp(out[k].name, out[k - 1].name))
        r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: two tensors would be named '%s'", fn,
                       out[k].name);
  }
  if (!r && mkdir(dir, 0755) && errno != EEXIST)
    r = mpu__error(MPU_ERR_SYSTEM, "%s: cannot create %s: %s", fn, dir, strerror(errno));
  char path[4200];
  if (!r && mpu__ckpt_path(path, sizeof path, dir, EXPORT_INDEX))
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, dir);
  if (!r && unlink(path) && errno != ENOENT)
    r = mpu__error(MPU_ERR_SYSTEM, "%s: cannot remove the old %s: %s", fn, path, strerror(errno));
  char file[64];
  for (int s = 0, k = 0; s < nshards && !r; s++) { /* a shard's tensors are consecutive */
    int m = 0;
    for (; k < n && shard_of[k] == s; k++, m++) in_shard[m] = idx[k], shard_names[m] = names[k];
    snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, nshards);
    if (mpu__ckpt_path(path, sizeof path, dir, file))
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, dir);
    else
      r = write_whole(ck, fn, in_shard, shard_names, m, path);
  }
  if (!r) {
    mpu__jb_printf(&ix, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {",
                   total);
    for (int k = 0; k < n; k++) {
      mpu__jb_printf(&ix, "%s\n    ", k ? "," : "");
      mpu__jb_string(&ix, out[k].name);
      mpu__jb_printf(&ix, ": \"model-%05d-of-%05d.safetensors\"", out[k].shard + 1, nshards);
    }
    mpu__jb_printf(&ix, "\n  }\n}\n");
    if (ix.failed) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: the index", fn);
  }
  if (!r) {
    const void *parts[1] = {ix.s};
    size_t lens[1] = {ix.len};
    const mpu__file_id *ids;
    int nids;
    mpu__ckpt_inputs(ck, &ids, &nids);
    if (mpu__ckpt_path(path, sizeof path, dir, EXPORT_INDEX))
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, dir);
    else
      r = mpu__output_write(fn, path, parts, lens, 1, ids, nids);
  }
  mpu__jb_free(&ix);
  free(idx), free(names), free(out), free(in_shard), free(shard_names), free(shard_of);
  return r;
}

/*
 * fuzz_ckpt.c - libFuzzer target over reading a checkpoint folder: the
 * input up to its first NUL byte is index.json, the rest is the file r.bin,
 * both written to a folder of their own. Whatever they hold, mpu_ckpt_open
 * refuses with a message or opens; an opened checkpoint answers every query
 * of the inspection API; and one that also verifies (every piece's CRC-32)
 * loads into a layout - each tensor whole on one rank, and tensor-parallel
 * rank 0 of 2 where the first size is even - and merges, since open checked
 * that the pieces tile every tensor. A verified checkpoint that fails to
 * load is a bug (abort).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpu.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], index_path[96], file_path[96], out_path[96];

static int put(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = n ? fwrite(bytes, 1, n, f) : 0;
  return fclose(f) || w != n ? -1 : 0;
}

/* Each tensor of ck into set, tp rank 0 of tp (1: whole), with memory from *mem. */
static mpu_result_t describe(const mpu_ckpt *ck, int tp, mpu_ckpt_set *set, float **mem) {
  mpu_ckpt_info in;
  if (mpu_ckpt_get_info(ck, &in)) abort();
  size_t total = 0, at = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < in.ntensors; i++) {
      mpu_ckpt_tensor_info t;
      if (mpu_ckpt_tensor_at(ck, i, &t)) abort();
      int split = tp > 1 && t.shape[0] % tp == 0;
      mpu_shard s;
      mpu_result_t r = mpu_shard_megatron(t.ndim, t.shape, split ? 0 : -1, 1, split ? tp : 1, 0, &s);
      if (r) return r;
      size_t n = (size_t)(t.bytes / 4) / (split ? (size_t)tp : 1);
      if (pass == 0) {
        total += n;
        continue;
      }
      mpu_shard_mem sp = {0, n, *mem + at};
      at += n;
      if ((r = mpu_ckpt_add(set, t.name, t.kind, t.ndim, t.shape, s.local_shape, s.boxes, s.nboxes,
                            &sp, 1, NULL, 0)))
        return r;
    }
    if (pass == 0 && !(*mem = malloc((total + 1) * sizeof(float)))) return MPU_ERR_OUT_OF_MEMORY;
  }
  return MPU_SUCCESS;
}

static void inspect(const mpu_ckpt *ck) {
  mpu_ckpt_info in;
  if (mpu_ckpt_get_info(ck, &in)) abort();
  for (int f = 0; f < in.nfiles; f++) {
    const char *name;
    uint64_t bytes;
    if (mpu_ckpt_file_at(ck, f, &name, &bytes) || !name) abort();
  }
  for (int i = 0; i < in.ntensors; i++) {
    mpu_ckpt_tensor_info t;
    if (mpu_ckpt_tensor_at(ck, i, &t) || t.npieces < 1) abort();
    for (int k = 0; k < t.npieces; k++) {
      mpu_ckpt_piece_info p;
      if (mpu_ckpt_piece_at(ck, i, k, &p) || p.flat_lo >= p.flat_hi) abort();
    }
  }
  mpu_rng_states st;
  mpu_rng g;
  for (int r = 0; !mpu_ckpt_rng(ck, r, &st, &g); r++) {
  }
  (void)mpu_ckpt_meta(ck, "hidden");
}

static void remove_dir(void) { rmdir(dir); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fuzz_ckpt_XXXXXX", tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(dir)) abort();
    atexit(remove_dir);
    snprintf(index_path, sizeof index_path, "%s/index.json", dir);
    snprintf(file_path, sizeof file_path, "%s/r.bin", dir);
    snprintf(out_path, sizeof out_path, "%s/merged.safetensors", dir);
  }
  const uint8_t *nul = memchr(data, 0, size);
  size_t ilen = nul ? (size_t)(nul - data) : size;
  if (put(index_path, data, ilen)) abort();
  if (nul && put(file_path, nul + 1, size - ilen - 1)) abort();
  mpu_ckpt *ck = NULL;
  if (mpu_ckpt_open(dir, &ck) == MPU_SUCCESS) {
    inspect(ck);
    if (mpu_ckpt_verify(ck) == MPU_SUCCESS) {
      for (int tp = 1; tp <= 2; tp++) {
        mpu_ckpt_set set;
        mpu_ckpt_set_init(&set);
        float *mem = NULL;
        mpu_result_t r = describe(ck, tp, &set, &mem);
        if (!r && mpu_ckpt_load(ck, NULL, &set)) abort(); /* verified, so it tiles: it loads */
        mpu_ckpt_set_free(&set);
        free(mem);
      }
      if (mpu_ckpt_merge(ck, out_path, 1)) abort();
      unlink(out_path);
    }
    mpu_ckpt_free(ck);
  }
  unlink(index_path);
  unlink(file_path);
  return 0;
}

/*
 * load.c - reading a checkpoint: the index (checked field by field), the
 * pieces (pread, CRC-32), loading into any layout with all-or-nothing
 * semantics, and whole tensors for the merge and the export (export.c).
 */
#include <errno.h>
#include <float.h>
#include <fcntl.h>
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

typedef struct ck_piece {
  int file;
  int64_t off[MPU_CKPT_MAX_DIMS], len[MPU_CKPT_MAX_DIMS];
  uint64_t flat_lo, flat_hi, byte_lo, byte_hi;
  uint32_t crc;
} ck_piece;

typedef struct ck_tensor {
  const char *name; /* into the parsed index */
  mpu_ckpt_kind kind;
  int ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];
  int npieces;
  ck_piece *pieces;
} ck_tensor;

typedef struct ck_rng {
  mpu_rng_states states;
  mpu_rng def;
} ck_rng;

struct mpu_ckpt {
  char dir[4096];
  json root;
  mpu_ckpt_info info;
  uint32_t index_crc;       /* which index the ranks read: compared before a load commits */
  int nfiles;
  const char **files;
  uint64_t *file_bytes;
  mpu__file_id *ids;        /* the files, the index (ids[nfiles]) and the root's tracker that
                               named the folder (if any): never a merge's output */
  int nids;
  int *fds;
  int ntensors;
  ck_tensor *t;            /* sorted by name */
  int nrng;
  ck_rng *rng;
  uint64_t bytes_read;
};

/* ---- the index ------------------------------------------------------------------------- */

static mpu_result_t bad_index(const mpu_ckpt *ck, const char *tensor, const char *why) {
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: %s: %s%s%s%s", ck->dir, CKPT_INDEX,
                    tensor ? "tensor '" : "", tensor ? tensor : "", tensor ? "': " : "", why);
}

static int int_list(const json *a, int n, int64_t *out, int64_t lo) {
  if (!a || a->type != JSON_ARRAY || (int)a->n != n) return -1;
  for (int i = 0; i < n; i++) {
    if (a->items[i].type != JSON_NUMBER || !a->items[i].is_int || a->items[i].integer < lo) return -1;
    out[i] = a->items[i].integer;
  }
  return 0;
}

/* exactly `digits` hex digits (strtoull would take a sign, spaces or "0x") */
static int parse_hex(const char *s, int digits, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < digits; i++) {
    char c = s[i];
    int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (x < 0) return -1;
    v = v << 4 | (uint64_t)x;
  }
  if (s[digits]) return -1;
  *out = v;
  return 0;
}

static int parse_rng(const char *hex, mpu_rng *g) {
  if (!hex || strlen(hex) != 64) return -1;
  for (int i = 0; i < 4; i++) {
    char part[17];
    memcpy(part, hex + 16 * i, 16);
    part[16] = '\0';
    if (parse_hex(part, 16, &g->s[i])) return -1;
  }
  return 0;
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const ck_tensor *)a)->name, ((const ck_tensor *)b)->name);
}

static const ck_tensor *find(const mpu_ckpt *ck, const char *name) {
  ck_tensor key = {.name = name};
  return bsearch(&key, ck->t, (size_t)ck->ntensors, sizeof key, cmp_tensor);
}

/* A float option: a number a float holds (1e39 would be infinite); its range is AdamW's rule. */
static float num(const json *o, const char *key, int *ok) {
  const json *v = mpu__json_get(o, key);
  if (!v || v->type != JSON_NUMBER || !(v->number >= -FLT_MAX && v->number <= FLT_MAX)) {
    *ok = 0;
    return 0;
  }
  return (float)v->number;
}

static mpu_result_t read_layout(mpu_ckpt *ck) {
  const json *l = mpu__json_get(&ck->root, "layout");
  mpu_ckpt_layout *o = &ck->info.layout;
  int64_t v[7];
  const char *keys[7] = {"world", "tp", "pp", "vp", "dp", "cp", "ep"};
  for (int i = 0; i < 7; i++)
    if (mpu__json_int(l, keys[i], &v[i]) || v[i] < 0 || v[i] > CKPT_SIZE_MAX)
      return bad_index(ck, NULL, "the layout lacks a size or has one out of range (1 to 2^24; "
                                 "vp 0 to 2^24)");
  o->world = (int)v[0], o->tp = (int)v[1], o->pp = (int)v[2], o->vp = (int)v[3];
  o->dp = (int)v[4], o->cp = (int)v[5], o->ep = (int)v[6];
  if (mpu__ckpt_layout_check("checkpoint", o))
    return bad_index(ck, NULL, "the layout has a size out of range (1 to 2^24; vp 0 to 2^24)");
  const json *z = mpu__json_get(l, "zero1");
  const char *flavor = mpu__json_str(l, "flavor");
  if (!z || z->type != JSON_BOOL || !flavor || strlen(flavor) >= sizeof o->flavor)
    return bad_index(ck, NULL, "the layout lacks zero1 or flavor");
  o->zero1 = z->boolean;
  snprintf(o->flavor, sizeof o->flavor, "%s", flavor);
  const json *opt = mpu__json_get(&ck->root, "optimizer");
  if (!opt || (opt->type != JSON_NULL && opt->type != JSON_OBJECT))
    return bad_index(ck, NULL, "no optimizer entry (an object or null)");
  if (opt->type == JSON_OBJECT) {
    int ok = 1;
    mpu_adamw_options a = MPU_ADAMW_OPTIONS_INIT;
    const char *type = mpu__json_str(opt, "type");
    a.lr = num(opt, "lr", &ok), a.beta1 = num(opt, "beta1", &ok);
    a.beta2 = num(opt, "beta2", &ok), a.eps = num(opt, "eps", &ok);
    a.weight_decay = num(opt, "weight_decay", &ok);
    a.clip_grad = num(opt, "clip_grad", &ok);
    if (!ok || !type || strcmp(type, "adamw") || mpu__json_int(opt, "step", &ck->info.optimizer_step) ||
        ck->info.optimizer_step < 0)
      return bad_index(ck, NULL, "the optimizer entry wants type adamw, lr, beta1, beta2, eps, "
                                 "weight_decay, clip_grad (numbers a float holds) and step");
    if (mpu__ckpt_adamw_numbers("the optimizer entry", &a)) {
      char why[256];
      snprintf(why, sizeof why, "%s", mpu_last_error());
      return bad_index(ck, NULL, why);
    }
    ck->info.has_adamw = 1, ck->info.adamw = a;
  }
  const json *meta = mpu__json_get(&ck->root, "metadata");
  if (!meta || meta->type != JSON_OBJECT) return bad_index(ck, NULL, "no metadata object");
  if (meta->n > MPU_CKPT_META_MAX) /* a load would drop the rest */
    return bad_index(ck, NULL, "more metadata pairs than a set holds (32)");
  for (size_t i = 0; i < meta->n; i++)
    if (meta->items[i].type != JSON_STRING || mpu__ckpt_meta_check("checkpoint", meta->keys[i], strlen(meta->keys[i]) + 1,
                                                            meta->items[i].string,
                                                            strlen(meta->items[i].string) + 1))
      return bad_index(ck, NULL, "a metadata pair is not a printable key and string of at most 63 "
                                 "bytes each");
  const json *rng = mpu__json_get(&ck->root, "rng");
  if (!rng || rng->type != JSON_ARRAY) return bad_index(ck, NULL, "no rng list");
  ck->rng = calloc(rng->n + 1, sizeof *ck->rng);
  if (!ck->rng) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: rng");
  for (size_t i = 0; i < rng->n; i++) {
    const json *e = &rng->items[i], *streams = mpu__json_get(e, "streams");
    int64_t r;
    if (mpu__json_int(e, "rank", &r) || r != (int64_t)i || !streams ||
        streams->type != JSON_OBJECT || streams->n > MPU_RNG_TRACKER_MAX ||
        parse_rng(mpu__json_str(e, "default"), &ck->rng[i].def))
      return bad_index(ck, NULL, "an rng entry wants rank (in order), streams and default");
    ck->rng[i].states.n = (int)streams->n;
    for (size_t k = 0; k < streams->n; k++) {
      if (strlen(streams->keys[k]) >= sizeof ck->rng[i].states.names[k] ||
          streams->items[k].type != JSON_STRING ||
          parse_rng(streams->items[k].string, &ck->rng[i].states.rngs[k]))
        return bad_index(ck, NULL, "an rng stream is not 64 hex digits");
      snprintf(ck->rng[i].states.names[k], sizeof ck->rng[i].states.names[k], "%s", streams->keys[k]);
    }
  }
  ck->nrng = (int)rng->n;
  return MPU_SUCCESS;
}

static mpu_result_t read_files(mpu_ckpt *ck) {
  const json *files = mpu__json_get(&ck->root, "files");
  if (!files || files->type != JSON_ARRAY || files->n > (1u << 20))
    return bad_index(ck, NULL, "no files list");
  size_t n = files->n;
  ck->files = calloc(n + 1, sizeof *ck->files);
  ck->file_bytes = calloc(n + 1, sizeof *ck->file_bytes);
  ck->fds = malloc((n + 1) * sizeof *ck->fds);
  mpu__file_id *ids = realloc(ck->ids, (n + 1) * sizeof *ck->ids); /* ids[0]: the index's */
  if (ids) ck->ids = ids, ids[n] = ids[0];
  if (!ck->files || !ck->file_bytes || !ck->fds || !ids)
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: %zu files", n);
  for (size_t i = 0; i < n; i++) ck->fds[i] = -1;
  ck->nfiles = (int)n;
  for (size_t i = 0; i < n; i++) {
    const json *f = &files->items[i];
    const char *name = mpu__json_str(f, "name");
    int64_t bytes;
    if (!name || !*name || strchr(name, '/') || !strcmp(name, "..") || mpu__json_int(f, "bytes", &bytes) ||
        bytes < 8)
      return bad_index(ck, NULL, "a file entry wants a plain name and its bytes");
    ck->files[i] = name, ck->file_bytes[i] = (uint64_t)bytes;
    char path[4200];
    struct stat st;
    if (mpu__ckpt_path(path, sizeof path, ck->dir, name))
      return bad_index(ck, NULL, "a file's path is too long");
    if (stat(path, &st))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: file %s: %s", ck->dir, name,
                        strerror(errno));
    if (!S_ISREG(st.st_mode))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: file %s is not a regular file",
                        ck->dir, name);
    ck->ids[i] = mpu__file_id_of(&st);
    if ((uint64_t)st.st_size != (uint64_t)bytes)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "checkpoint %s: file %s has %lld bytes, the index says %lld (%s)", ck->dir,
                        name, (long long)st.st_size, (long long)bytes,
                        (uint64_t)st.st_size < (uint64_t)bytes ? "truncated" : "changed");
  }
  return MPU_SUCCESS;
}

static int file_index(const mpu_ckpt *ck, const char *name) {
  for (int i = 0; name && i < ck->nfiles; i++)
    if (!strcmp(ck->files[i], name)) return i;
  return -1;
}

static ckpt_piece_view view(const ck_tensor *t, int k, float *data) {
  const ck_piece *p = &t->pieces[k];
  ckpt_piece_view v = {t->ndim, p->off, p->len, p->flat_lo, p->flat_hi, data};
  return v;
}

/* as many elements as the tensor is not enough: no two pieces may overlap */
static mpu_result_t check_tiling(const mpu_ckpt *ck, const ck_tensor *t) {
  ckpt_piece_view *v = malloc(((size_t)t->npieces + 1) * sizeof *v);
  if (!v) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: pieces of %s", t->name);
  for (int k = 0; k < t->npieces; k++) v[k] = view(t, k, NULL);
  int a, b;
  mpu_result_t r = mpu__ckpt_tiles(t->ndim, t->shape, v, t->npieces, &a, &b);
  free(v);
  if (!r && a >= 0) {
    char why[128];
    snprintf(why, sizeof why, "pieces %d and %d overlap, so the pieces do not hold every element "
                              "once", a < b ? a : b, a < b ? b : a);
    r = bad_index(ck, t->name, why);
  }
  return r;
}

static mpu_result_t read_tensors(mpu_ckpt *ck) {
  const json *ts = mpu__json_get(&ck->root, "tensors");
  if (!ts || ts->type != JSON_OBJECT) return bad_index(ck, NULL, "no tensors object");
  ck->t = calloc(ts->n + 1, sizeof *ck->t);
  if (!ck->t) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: %zu tensors", ts->n);
  for (size_t i = 0; i < ts->n; i++) {
    ck_tensor *t = &ck->t[ck->ntensors++];
    const json *e = &ts->items[i], *shape = mpu__json_get(e, "shape"), *pieces = mpu__json_get(e, "pieces");
    const char *name = t->name = ts->keys[i], *dtype = mpu__json_str(e, "dtype");
    if (mpu__ckpt_name_ok(name)) return bad_index(ck, NULL, "a tensor name is not printable ASCII");
    if (mpu__ckpt_kind_from_name(mpu__json_str(e, "kind"), &t->kind))
      return bad_index(ck, name, "kind is not param, exp_avg or exp_avg_sq");
    if (!dtype || strcmp(dtype, "F32")) return bad_index(ck, name, "dtype is not F32");
    if (!shape || shape->type != JSON_ARRAY || shape->n < 1 || shape->n > MPU_CKPT_MAX_DIMS)
      return bad_index(ck, name, "the shape is not a list of 1 to 4 sizes");
    t->ndim = (int)shape->n;
    if (int_list(shape, t->ndim, t->shape, 1)) return bad_index(ck, name, "a size is not positive");
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] > ((int64_t)1 << 40) || numel > ((uint64_t)1 << 40) / (uint64_t)t->shape[d])
        return bad_index(ck, name, "more than 2^40 elements");
      numel *= (uint64_t)t->shape[d];
    }
    if (!pieces || pieces->type != JSON_ARRAY || pieces->n < 1)
      return bad_index(ck, name, "no pieces");
    t->pieces = calloc(pieces->n, sizeof *t->pieces);
    if (!t->pieces) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: pieces of %s", name);
    uint64_t held = 0;
    for (size_t k = 0; k < pieces->n; k++) {
      const json *pj = &pieces->items[k];
      ck_piece *p = &t->pieces[t->npieces++];
      int64_t flat[2], bytes[2];
      const char *crc = mpu__json_str(pj, "crc32");
      p->file = file_index(ck, mpu__json_str(pj, "file"));
      if (p->file < 0) return bad_index(ck, name, "a piece names a file not in the files list");
      if (int_list(mpu__json_get(pj, "offsets"), t->ndim, p->off, 0) ||
          int_list(mpu__json_get(pj, "lengths"), t->ndim, p->len, 1) ||
          int_list(mpu__json_get(pj, "flat"), 2, flat, 0) ||
          int_list(mpu__json_get(pj, "bytes"), 2, bytes, 8) || !crc || strlen(crc) != 8)
        return bad_index(ck, name, "a piece wants offsets, lengths, flat, bytes and crc32");
      uint64_t crc_value;
      if (parse_hex(crc, 8, &crc_value)) return bad_index(ck, name, "a piece's crc32 is not 8 hex digits");
      p->crc = (uint32_t)crc_value;
      for (int d = 0; d < t->ndim; d++) /* off + len would overflow near INT64_MAX */
        if (p->len[d] > t->shape[d] || p->off[d] > t->shape[d] - p->len[d])
          return bad_index(ck, name, "a piece leaves the tensor");
      p->flat_lo = (uint64_t)flat[0], p->flat_hi = (uint64_t)flat[1];
      p->byte_lo = (uint64_t)bytes[0], p->byte_hi = (uint64_t)bytes[1];
      if (p->flat_lo >= p->flat_hi || p->flat_hi > mpu__ckpt_numel(t->ndim, p->len))
        return bad_index(ck, name, "a piece's flat span is empty or leaves its box");
      if (p->byte_hi < p->byte_lo || p->byte_hi - p->byte_lo != (p->flat_hi - p->flat_lo) * 4 ||
          p->byte_hi > ck->file_bytes[p->file])
        return bad_index(ck, name, "a piece's bytes do not hold its elements or leave its file");
      held += p->flat_hi - p->flat_lo;
    }
    if (held != numel) return bad_index(ck, name, "the pieces do not hold every element once");
    MPU_CHECK(check_tiling(ck, t));
  }
  qsort(ck->t, (size_t)ck->ntensors, sizeof *ck->t, cmp_tensor);
  for (int i = 1; i < ck->ntensors; i++)
    if (!strcmp(ck->t[i].name, ck->t[i - 1].name)) return bad_index(ck, ck->t[i].name, "twice");
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_open(const char *dir, mpu_ckpt **out) {
  static const char fn[] = "mpu_ckpt_open";
  if (!dir || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  *out = NULL;
  char where[4096]; /* a root's newest complete iteration (root.c) */
  MPU_CHECK(mpu_ckpt_latest(dir, where, sizeof where));
  char tracker[4200]; /* read to choose the folder: an input too */
  struct stat tst;
  int has_tracker = !mpu__ckpt_path(tracker, sizeof tracker, dir, CKPT_TRACKER) &&
                    !stat(tracker, &tst) && S_ISREG(tst.st_mode);
  dir = where;
  {
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1)
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: checkpoints are little-endian; this host is not", fn);
  }
  mpu_ckpt *ck = calloc(1, sizeof *ck);
  if (!ck) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (strlen(dir) >= sizeof ck->dir - 64) {
    free(ck);
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, dir);
  }
  snprintf(ck->dir, sizeof ck->dir, "%s", dir);
  char path[4200];
  mpu__ckpt_path(path, sizeof path, dir, CKPT_INDEX);
  mpu_result_t r = MPU_SUCCESS;
  char *text = NULL;
  int fd = -1;
  struct stat st;
  if (access(path, F_OK) && errno == ENOENT) {
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: no %s (%s): not a checkpoint, or a "
                   "save that did not finish", dir, CKPT_INDEX, strerror(errno));
    goto out;
  }
  /* without blocking: an index that is a FIFO would wait for a writer forever */
  if ((r = mpu__input_open(fn, "checkpoint index", path, &fd, &st))) goto out;
  if (!(ck->ids = malloc(sizeof *ck->ids))) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    goto out;
  }
  ck->ids[0] = mpu__file_id_of(&st);
  if (st.st_size > (1 << 30)) {
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: %s is over 1 GiB", dir, CKPT_INDEX);
    goto out;
  }
  text = malloc((size_t)st.st_size + 1);
  if (!text) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %lld bytes", fn, (long long)st.st_size);
    goto out;
  }
  ssize_t read = mpu__ckpt_pread_all(fd, text, (size_t)st.st_size, 0);
  if (read < 0) {
    r = mpu__error(MPU_ERR_SYSTEM, "checkpoint %s: reading %s: %s", dir, CKPT_INDEX, strerror(errno));
    goto out;
  }
  size_t got = (size_t)read;
  ck->bytes_read += got, ck->info.index_bytes = got;
  ck->index_crc = mpu__ckpt_crc32(0, text, got);
  if ((r = mpu__json_parse(text, got, path, &ck->root))) goto out;
  int64_t version, step;
  const char *format = mpu__json_str(&ck->root, "format");
  if (!format || strcmp(format, CKPT_FORMAT) || mpu__json_int(&ck->root, "version", &version) ||
      version != CKPT_VERSION || mpu__json_int(&ck->root, "step", &step) || step < 0) {
    r = bad_index(ck, NULL, "not an mpu-checkpoint index of version 1 with a step");
    goto out;
  }
  ck->info.step = step;
  if ((r = read_layout(ck)) || (r = read_files(ck)) || (r = read_tensors(ck))) goto out;
  ck->info.ntensors = ck->ntensors, ck->info.nfiles = ck->nfiles;
  ck->nids = ck->nfiles + 1;
  if (has_tracker) {
    mpu__file_id *ids = realloc(ck->ids, ((size_t)ck->nids + 1) * sizeof *ids);
    if (!ids) {
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
      goto out;
    }
    ck->ids = ids, ck->ids[ck->nids++] = mpu__file_id_of(&tst);
  }
out:
  if (fd >= 0) close(fd);
  free(text);
  if (r) mpu_ckpt_free(ck);
  else *out = ck;
  return r;
}

void mpu_ckpt_free(mpu_ckpt *ck) {
  if (!ck) return;
  for (int i = 0; ck->fds && i < ck->nfiles; i++)
    if (ck->fds[i] >= 0) close(ck->fds[i]);
  for (int i = 0; ck->t && i < ck->ntensors; i++) free(ck->t[i].pieces);
  free(ck->t), free(ck->files), free(ck->file_bytes), free(ck->fds), free(ck->rng), free(ck->ids);
  mpu__json_free(&ck->root);
  free(ck);
}

void mpu_ckpt_close(mpu_ckpt *ck) { mpu_ckpt_free(ck); } /* the old name */

/* ---- pieces ------------------------------------------------------------------------------ */

/* Read piece p of t into buf ((flat_hi - flat_lo) floats) and check its CRC. */
static mpu_result_t read_piece(mpu_ckpt *ck, const ck_tensor *t, int k, float *buf) {
  const ck_piece *p = &t->pieces[k];
  const char *file = ck->files[p->file];
  if (ck->fds[p->file] < 0) {
    char path[4200];
    mpu__ckpt_path(path, sizeof path, ck->dir, file);
    mpu_result_t r = mpu__input_open("checkpoint", "file", path, &ck->fds[p->file], NULL);
    if (r) {
      mpu__error_prefix("checkpoint %s: tensor '%s'", ck->dir, t->name);
      return r;
    }
  }
  size_t n = (size_t)(p->byte_hi - p->byte_lo);
  ssize_t got = mpu__ckpt_pread_all(ck->fds[p->file], buf, n, p->byte_lo);
  if (got > 0) ck->bytes_read += (uint64_t)got;
  if (got < 0)
    return mpu__error(MPU_ERR_SYSTEM, "checkpoint %s: tensor '%s': reading %s: %s", ck->dir,
                      t->name, file, strerror(errno));
  if ((size_t)got < n)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "checkpoint %s: tensor '%s': file %s is truncated (%zu of the piece's %zu "
                      "bytes at %" PRIu64 ")",
                      ck->dir, t->name, file, (size_t)got, n, p->byte_lo);
  uint32_t crc = mpu__ckpt_crc32(0, buf, n);
  if (crc != p->crc)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "checkpoint %s: tensor '%s': piece %d in file %s is corrupted (CRC-32 %08" PRIx32
                      ", the index says %08" PRIx32 ")",
                      ck->dir, t->name, k, file, crc, p->crc);
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_verify(mpu_ckpt *ck) {
  if (!ck) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_verify: NULL checkpoint");
  for (int i = 0; i < ck->ntensors; i++)
    for (int k = 0; k < ck->t[i].npieces; k++) {
      const ck_piece *p = &ck->t[i].pieces[k];
      float *buf = malloc((size_t)(p->byte_hi - p->byte_lo) + 1);
      if (!buf) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_verify");
      mpu_result_t r = read_piece(ck, &ck->t[i], k, buf);
      free(buf);
      if (r) return r;
    }
  return MPU_SUCCESS;
}

/* Fill one local tensor (boxes, spans) from every piece of t that overlaps
 * it; hits counts each element's writers. */
static mpu_result_t fill(mpu_ckpt *ck, const ck_tensor *t, const mpu_ckpt_tensor *want,
                         const mpu_shard_mem *spans, uint8_t *const *hits) {
  for (int k = 0; k < t->npieces; k++) {
    ckpt_piece_view dry = view(t, k, NULL);
    if (!mpu_shard_transfer(&dry, t->ndim, want->local_shape, want->boxes, want->nboxes, spans,
                            want->nspans, 1, NULL))
      continue; /* not needed here: not read */
    const ck_piece *p = &t->pieces[k];
    float *buf = malloc((size_t)(p->byte_hi - p->byte_lo) + 1);
    if (!buf) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: a piece of '%s'", t->name);
    mpu_result_t r = read_piece(ck, t, k, buf);
    if (!r) {
      ckpt_piece_view v = view(t, k, buf);
      mpu_shard_transfer(&v, t->ndim, want->local_shape, want->boxes, want->nboxes, spans,
                         want->nspans, 1, hits);
    }
    free(buf);
    if (r) return r;
  }
  return MPU_SUCCESS;
}

/* fill, then check that every element the rank wants came from exactly one piece (messages
 * name t, the checkpoint's tensor: merge's w is an unnamed whole) */
static mpu_result_t fill_checked(mpu_ckpt *ck, const ck_tensor *t, const mpu_ckpt_tensor *w,
                                 const mpu_shard_mem *spans) {
  uint8_t **hits = calloc((size_t)w->nspans + 1, sizeof *hits);
  if (!hits) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: '%s'", t->name);
  mpu_result_t r = MPU_SUCCESS;
  for (int s = 0; s < w->nspans && !r; s++)
    if (!(hits[s] = calloc(w->spans[s].hi - w->spans[s].lo, 1)))
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: '%s'", t->name);
  if (!r) r = fill(ck, t, w, spans, hits);
  for (int s = 0; s < w->nspans && !r; s++)
    for (size_t e = 0; e < w->spans[s].hi - w->spans[s].lo && !r; e++)
      if (hits[s][e] != 1)
        r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                       "checkpoint %s: tensor '%s': element %zu is in %d pieces (want 1)",
                       ck->dir, t->name, w->spans[s].lo + e, hits[s][e]);
  for (int s = 0; s < w->nspans; s++) free(hits[s]);
  free(hits);
  return r;
}

/* Every tensor of the set into staging memory (spans[i][s] mirrors set span s of tensor i). */
static mpu_result_t load_local(mpu_ckpt *ck, mpu_ckpt_set *set, mpu_shard_mem **staging) {
  for (int i = 0; i < set->n; i++) {
    const mpu_ckpt_tensor *w = &set->t[i];
    const ck_tensor *t = find(ck, w->name);
    if (!t)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: tensor '%s' is missing", ck->dir,
                        w->name);
    if (t->ndim != w->ndim || memcmp(t->shape, w->shape, (size_t)t->ndim * sizeof *t->shape)) {
      char a[96] = "", b[96] = "";
      for (int d = 0; d < t->ndim; d++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
      for (int d = 0; d < w->ndim; d++)
        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? ", " : "", (long long)w->shape[d]);
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "checkpoint %s: tensor '%s' has shape [%s] in the checkpoint, [%s] here",
                        ck->dir, w->name, a, b);
    }
    MPU_CHECK(fill_checked(ck, t, w, staging[i]));
  }
  return MPU_SUCCESS;
}

/* strict: every tensor of the checkpoint is loaded by some rank (each rank
 * holds its pipeline stage's tensors only, so the ranks pool what they want) */
static mpu_result_t check_extra(mpu_ckpt *ck, mpu_comm *world, const mpu_ckpt_set *set) {
  uint8_t *wanted = calloc((size_t)ck->ntensors + 1, 1);
  if (!wanted) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: %d tensors", ck->ntensors);
  for (int k = 0; k < set->n; k++) {
    const ck_tensor *t = find(ck, set->t[k].name);
    if (t) wanted[t - ck->t] = 1;
  }
  mpu_result_t r = MPU_SUCCESS;
  if (world) r = mpu_comm_all_reduce(world, wanted, wanted, (size_t)ck->ntensors, MPU_UINT8, MPU_MAX);
  for (int i = 0; !r && i < ck->ntensors; i++)
    if (!wanted[i])
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                     "checkpoint %s: tensor '%s' (in %s) is not in the model being loaded",
                     ck->dir, ck->t[i].name, ck->files[ck->t[i].pieces[0].file]);
  free(wanted);
  return r;
}

static void free_staging(mpu_ckpt_set *set, mpu_shard_mem **staging, int commit) {
  for (int i = 0; i < set->n && staging; i++) {
    for (int s = 0; staging[i] && s < set->t[i].nspans; s++) {
      if (commit) memcpy(set->t[i].spans[s].data, staging[i][s].data,
                         (set->t[i].spans[s].hi - set->t[i].spans[s].lo) * sizeof(float));
      free(staging[i][s].data);
    }
    free(staging[i]);
  }
  free(staging);
}

mpu_result_t mpu_ckpt_load(mpu_ckpt *ck, mpu_comm *world, mpu_ckpt_set *set) {
  static const char fn[] = "mpu_ckpt_load";
  if (!set || (!ck && !world)) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_shard_mem **staging = calloc((size_t)set->n + 1, sizeof *staging);
  mpu_result_t r = !ck ? mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no checkpoint on this rank", fn)
                   : staging ? MPU_SUCCESS
                             : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  for (int i = 0; i < set->n && !r; i++) {
    const mpu_ckpt_tensor *w = &set->t[i];
    staging[i] = calloc((size_t)w->nspans + 1, sizeof **staging);
    if (!staging[i]) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    for (int s = 0; s < w->nspans && !r; s++) {
      staging[i][s] = w->spans[s];
      if (!(staging[i][s].data = malloc((w->spans[s].hi - w->spans[s].lo) * sizeof(float))))
        r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: '%s'", fn, w->name);
    }
  }
  if (!r) r = load_local(ck, set, staging);
  /* all or nothing: the ranks agree (and that they read one index: its step, size and CRC-32,
   * so that ranks that opened step 100 and step 200 do not mix them) before any memory of the
   * caller changes; a rank without a checkpoint (ck NULL) takes part as failed. Each value x
   * goes with -x: under MAX, the ranks agree when max(x) == -max(-x). */
  int64_t id[3] = {ck ? ck->info.step : 0, ck ? (int64_t)ck->info.index_bytes : 0,
                   ck ? (int64_t)ck->index_crc : 0};
  int64_t agree[7] = {r != MPU_SUCCESS, id[0], -id[0], id[1], -id[1], id[2], -id[2]};
  if (world) {
    mpu_result_t a = mpu_comm_all_reduce(world, agree, agree, 7, MPU_INT64, MPU_MAX);
    if (a && !r) r = a;
  }
  if (!r && agree[0])
    r = mpu__error(MPU_ERR_ABORTED, "%s: another rank could not load %s; nothing was changed", fn,
                   ck->dir);
  if (!r && (agree[1] != -agree[2] || agree[3] != -agree[4] || agree[5] != -agree[6]))
    r = mpu__error(MPU_ERR_MISMATCH,
                   "%s: the ranks opened different checkpoints (steps %" PRId64 " to %" PRId64
                   ", or indexes that differ; this rank: %s at step %" PRId64 "); nothing was "
                   "changed",
                   fn, -agree[2], agree[1], ck->dir, ck->info.step);
  if (!r && set->strict) r = check_extra(ck, world, set); /* the same answer on every rank */
  free_staging(set, staging, !r);
  /* the holders' memory changed: what they derived from it (FSDP's gathers) is stale */
  for (int i = 0; !r && i < set->nwritten; i++) r = set->written[i].fn(set->written[i].holder);
  if (r) return r;
  set->step = ck->info.step, set->layout = ck->info.layout;
  set->has_adamw = ck->info.has_adamw, set->adamw = ck->info.adamw;
  set->optimizer_step = ck->info.optimizer_step;
  const json *meta = mpu__json_get(&ck->root, "metadata");
  set->n_meta = 0;
  for (size_t i = 0; meta && i < meta->n; i++)
    if (mpu_ckpt_set_meta(set, meta->keys[i], meta->items[i].string)) break;
  return MPU_SUCCESS;
}

/* ---- what the index says -------------------------------------------------------------- */

mpu_result_t mpu_ckpt_get_info(const mpu_ckpt *ck, mpu_ckpt_info *out) {
  if (!ck || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_get_info: NULL argument");
  *out = ck->info;
  return MPU_SUCCESS;
}

const char *mpu_ckpt_meta(const mpu_ckpt *ck, const char *key) {
  return ck && key ? mpu__json_str(mpu__json_get(&ck->root, "metadata"), key) : NULL;
}

mpu_result_t mpu_ckpt_rng(const mpu_ckpt *ck, int rank, mpu_rng_states *states, mpu_rng *default_rng) {
  if (!ck || rank < 0 || rank >= ck->nrng)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_rng: no rank %d (the checkpoint has %d)",
                      rank, ck ? ck->nrng : 0);
  if (states) *states = ck->rng[rank].states;
  if (default_rng) *default_rng = ck->rng[rank].def;
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_tensor_at(const mpu_ckpt *ck, int i, mpu_ckpt_tensor_info *out) {
  if (!ck || !out || i < 0 || i >= ck->ntensors)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_tensor_at: no tensor %d", i);
  const ck_tensor *t = &ck->t[i];
  memset(out, 0, sizeof *out);
  out->name = t->name, out->kind = t->kind, out->dtype = "F32", out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof out->shape);
  out->npieces = t->npieces;
  out->bytes = mpu__ckpt_numel(t->ndim, t->shape) * sizeof(float);
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_piece_at(const mpu_ckpt *ck, int i, int k, mpu_ckpt_piece_info *out) {
  if (!ck || !out || i < 0 || i >= ck->ntensors || k < 0 || k >= ck->t[i].npieces)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_piece_at: no piece %d of tensor %d", k, i);
  const ck_piece *p = &ck->t[i].pieces[k];
  memset(out, 0, sizeof *out);
  out->file = ck->files[p->file];
  memcpy(out->offset, p->off, sizeof out->offset);
  memcpy(out->length, p->len, sizeof out->length);
  out->flat_lo = p->flat_lo, out->flat_hi = p->flat_hi;
  out->byte_lo = p->byte_lo, out->byte_hi = p->byte_hi, out->crc32 = p->crc;
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_file_at(const mpu_ckpt *ck, int f, const char **name, uint64_t *bytes) {
  if (!ck || f < 0 || f >= ck->nfiles)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_file_at: no file %d", f);
  if (name) *name = ck->files[f];
  if (bytes) *bytes = ck->file_bytes[f];
  return MPU_SUCCESS;
}

uint64_t mpu_ckpt_bytes_read(const mpu_ckpt *ck) { return ck ? ck->bytes_read : 0; }

/* ---- whole tensors (merge and export, export.c) ------------------------------------------ */

mpu_result_t mpu__ckpt_read_whole(mpu_ckpt *ck, int i, float *out) {
  if (!ck || i < 0 || i >= ck->ntensors || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint: no tensor %d", i);
  const ck_tensor *t = &ck->t[i];
  mpu_ckpt_tensor whole; /* the whole tensor as one local tensor */
  memset(&whole, 0, sizeof whole);
  snprintf(whole.name, sizeof whole.name, "%s", t->name);
  whole.ndim = t->ndim, whole.nboxes = 1, whole.nspans = 1;
  memcpy(whole.shape, t->shape, sizeof whole.shape);
  memcpy(whole.local_shape, t->shape, sizeof whole.shape);
  memcpy(whole.boxes[0].length, t->shape, sizeof whole.shape);
  mpu_shard_mem span = {0, (size_t)mpu__ckpt_numel(t->ndim, t->shape), out};
  whole.spans = &span;
  return fill_checked(ck, t, &whole, &span);
}

void mpu__ckpt_inputs(const mpu_ckpt *ck, const mpu__file_id **ids, int *n) {
  *ids = ck->ids, *n = ck->nids;
}

/*
 * save.c - mpu_ckpt_save: each rank writes its pieces into one safetensors
 * file and describes them in a few lines of text; rank 0 gathers the
 * descriptions, checks that every element of every tensor is saved exactly
 * once, and writes the index last; root.c puts the folder in place.
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

typedef struct piece {
  int tensor;
  int64_t off[MPU_CKPT_MAX_DIMS], len[MPU_CKPT_MAX_DIMS]; /* the global box it lies in */
  uint64_t flat_lo, flat_hi;
  uint64_t byte_lo;          /* relative to the data start until the header is known */
  uint32_t crc;
  float *data;
  char key[MPU_CKPT_NAME_MAX + 32];
} piece;

/* This rank's pieces: one per box and save span that overlap, the values
 * copied out. Where the span's part of the box is a box itself (whole rows:
 * a ZeRO-1 or FSDP span over a 2-d weight's rows), the piece is that box,
 * as DCP's chunks are; else the box and the span of its elements. */
static mpu_result_t cut_pieces(const mpu_ckpt_set *set, int rank, piece **out, int *n) {
  int cap = 0;
  *out = NULL, *n = 0;
  for (int i = 0; i < set->n; i++) {
    const mpu_ckpt_tensor *t = &set->t[i];
    int k = 0;
    for (int b = 0; b < t->nboxes; b++)
      for (int s = 0; s < t->nsave; s++) {
        uint64_t a = mpu_shard_box_count_below(t->ndim, t->local_shape, &t->boxes[b], t->save[s].lo);
        uint64_t z = mpu_shard_box_count_below(t->ndim, t->local_shape, &t->boxes[b], t->save[s].hi);
        if (a >= z) continue;
        if (*n == cap) {
          cap = cap ? 2 * cap : 64;
          piece *p = realloc(*out, (size_t)cap * sizeof *p);
          if (!p) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_save: %d pieces", cap);
          *out = p;
        }
        piece *p = &(*out)[(*n)++];
        memset(p, 0, sizeof *p);
        const mpu_shard_box *bx = &t->boxes[b];
        p->tensor = i, p->flat_lo = a, p->flat_hi = z;
        memcpy(p->off, bx->global_offset, sizeof p->off);
        memcpy(p->len, bx->length, sizeof p->len);
        if (mpu_shard_span_box(t->ndim, bx, a, z, p->off, p->len))
          p->flat_lo = 0, p->flat_hi = z - a;
        snprintf(p->key, sizeof p->key, "%s@%d.%d", t->name, rank, k++);
        p->data = malloc((z - a) * sizeof(float));
        if (!p->data) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_save: '%s'", t->name);
        ckpt_piece_view v = {t->ndim, p->off, p->len, p->flat_lo, p->flat_hi, p->data};
        mpu_shard_transfer(&v, t->ndim, t->local_shape, bx, 1, &t->save[s], 1, 0, NULL);
        p->crc = mpu__ckpt_crc32(0, p->data, (z - a) * sizeof(float));
      }
  }
  return MPU_SUCCESS;
}

static void free_pieces(piece *p, int n) {
  for (int i = 0; i < n; i++) free(p[i].data);
  free(p);
}

/* The rank file: header, then the pieces in order. */
static mpu_result_t write_rank_file(const char *dir, const char *file, const mpu_ckpt_set *set,
                                    piece *p, int n, int rank, uint64_t *bytes) {
  st_item *items = calloc((size_t)n + 1, sizeof *items);
  int64_t(*shapes)[MPU_CKPT_MAX_DIMS] = calloc((size_t)n + 1, sizeof *shapes);
  const void **parts = calloc((size_t)n + 1, sizeof *parts);
  size_t *lens = calloc((size_t)n + 1, sizeof *lens);
  mpu_result_t r = MPU_SUCCESS;
  if (!items || !shapes || !parts || !lens) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_save: %d pieces", n);
    goto out;
  }
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    const mpu_ckpt_tensor *t = &set->t[p[i].tensor];
    uint64_t cnt = p[i].flat_hi - p[i].flat_lo;
    items[i].name = p[i].key, items[i].bytes = cnt * sizeof(float), items[i].shape = shapes[i];
    if (cnt == mpu__ckpt_numel(t->ndim, p[i].len)) { /* the whole box: its shape */
      items[i].ndim = t->ndim;
      memcpy(shapes[i], p[i].len, sizeof shapes[i]);
    } else { /* part of a box (a ZeRO-1 shard): flat */
      items[i].ndim = 1, shapes[i][0] = (int64_t)cnt;
    }
    p[i].byte_lo = at;
    at += items[i].bytes;
    parts[i + 1] = p[i].data, lens[i + 1] = items[i].bytes;
  }
  char rank_text[16];
  snprintf(rank_text, sizeof rank_text, "%d", rank);
  const char *meta[4] = {"format", "mpu-checkpoint-piece", "rank", rank_text};
  char *head = NULL;
  size_t hlen = 0;
  if ((r = mpu__st_header(items, n, meta, 2, &head, &hlen))) goto out;
  for (int i = 0; i < n; i++) p[i].byte_lo += hlen;
  parts[0] = head, lens[0] = hlen;
  r = mpu__ckpt_write_file(dir, file, parts, lens, n + 1);
  *bytes = hlen + at;
  free(head);
out:
  free(items), free(shapes), free(parts), free(lens);
  return r;
}

static void put_rng(json_buf *b, const mpu_rng *g) {
  mpu__jb_printf(b, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, g->s[0], g->s[1],
                 g->s[2], g->s[3]);
}

/* This rank's description: "F file bytes", "T kind ndim shape.. name", "P
 * offsets.. lengths.. flat_lo flat_hi byte_lo byte_hi crc key" (after its
 * T), "R name state", "D state". */
static void describe(json_buf *b, const mpu_ckpt_set *set, const char *file, uint64_t bytes,
                     const piece *p, int n) {
  mpu__jb_printf(b, "F %s %" PRIu64 "\n", file, bytes);
  int i = 0; /* every tensor of the set, then its pieces (cut in tensor order) */
  for (int ti = 0; ti < set->n; ti++) {
    const mpu_ckpt_tensor *t = &set->t[ti];
    mpu__jb_printf(b, "T %d %d", (int)t->kind, t->ndim);
    for (int d = 0; d < t->ndim; d++) mpu__jb_printf(b, " %" PRId64, t->shape[d]);
    mpu__jb_printf(b, " %s\n", t->name);
    for (; i < n && p[i].tensor == ti; i++) {
      mpu__jb_printf(b, "P");
      for (int d = 0; d < t->ndim; d++) mpu__jb_printf(b, " %" PRId64, p[i].off[d]);
      for (int d = 0; d < t->ndim; d++) mpu__jb_printf(b, " %" PRId64, p[i].len[d]);
      mpu__jb_printf(b, " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %08" PRIx32 " %s\n",
                     p[i].flat_lo, p[i].flat_hi, p[i].byte_lo,
                     p[i].byte_lo + (p[i].flat_hi - p[i].flat_lo) * sizeof(float), p[i].crc,
                     p[i].key);
    }
  }
  for (int k = 0; k < set->rng.n; k++) {
    mpu__jb_printf(b, "R %s ", set->rng.names[k]);
    put_rng(b, &set->rng.rngs[k]);
    mpu__jb_append(b, "\n", 1);
  }
  mpu__jb_printf(b, "D ");
  put_rng(b, &set->default_rng);
  mpu__jb_append(b, "\n", 1);
}

/* ---- rank 0: the index ------------------------------------------------------------------- */

typedef struct gtensor {
  char name[MPU_CKPT_NAME_MAX];
  int kind, ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];
  uint64_t held;   /* elements over all pieces */
  json_buf pieces; /* the JSON objects of its pieces, comma separated */
} gtensor;

static int find_or_add(gtensor **ts, int *n, int *cap, const char *name) {
  for (int i = 0; i < *n; i++)
    if (!strcmp((*ts)[i].name, name)) return i;
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 64;
    gtensor *t = realloc(*ts, (size_t)c * sizeof *t);
    if (!t) return -1;
    *ts = t, *cap = c;
  }
  memset(&(*ts)[*n], 0, sizeof **ts);
  snprintf((*ts)[*n].name, sizeof (*ts)[*n].name, "%s", name);
  (*ts)[*n].kind = -1;
  return (*n)++;
}

static int cmp_gtensor(const void *a, const void *b) {
  return strcmp(((const gtensor *)a)->name, ((const gtensor *)b)->name);
}

static void put_f(json_buf *b, const char *key, double v) { mpu__jb_printf(b, "\"%s\": %.9g", key, v); }

static mpu_result_t build_index(const mpu_ckpt_set *set, char *const *texts, int world,
                                json_buf *ix) {
  gtensor *ts = NULL;
  int nt = 0, cap = 0;
  mpu_result_t r = MPU_SUCCESS;
  json_buf files = {0}, rng = {0};
  for (int rank = 0; rank < world && !r; rank++) {
    char *save = NULL, *line = strtok_r(texts[rank], "\n", &save);
    const char *file = "";
    int cur = -1, nstreams = 0;
    mpu__jb_printf(&rng, "%s\n  {\"rank\": %d, \"streams\": {", rank ? "," : "", rank);
    for (; line && !r; line = strtok_r(NULL, "\n", &save)) {
      if (line[0] == 'F') {
        char *sp = strchr(line + 2, ' ');
        if (!sp) break;
        *sp = '\0', file = line + 2;
        mpu__jb_printf(&files, "%s\n  {\"name\": \"%s\", \"bytes\": %s}", rank ? "," : "", file, sp + 1);
      } else if (line[0] == 'T') {
        int kind, ndim, used;
        int64_t shape[MPU_CKPT_MAX_DIMS] = {0};
        char *s = line + 2;
        if (sscanf(s, "%d %d%n", &kind, &ndim, &used) != 2) break;
        s += used;
        for (int d = 0; d < ndim; d++) shape[d] = strtoll(s, &s, 10);
        while (*s == ' ') s++;
        if ((cur = find_or_add(&ts, &nt, &cap, s)) < 0) {
          r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_save: the index");
          break;
        }
        gtensor *g = &ts[cur];
        if (g->kind < 0) {
          g->kind = kind, g->ndim = ndim;
          memcpy(g->shape, shape, sizeof shape);
        } else if (g->kind != kind || g->ndim != ndim || memcmp(g->shape, shape, sizeof shape)) {
          r = mpu__error(MPU_ERR_MISMATCH,
                         "mpu_ckpt_save: tensor '%s': rank %d gives another kind or global shape "
                         "than a rank before it",
                         g->name, rank);
        }
      } else if (line[0] == 'P' && cur >= 0) {
        gtensor *g = &ts[cur];
        int64_t off[MPU_CKPT_MAX_DIMS], len[MPU_CKPT_MAX_DIMS];
        char *s = line + 1;
        for (int d = 0; d < g->ndim; d++) off[d] = strtoll(s, &s, 10);
        for (int d = 0; d < g->ndim; d++) len[d] = strtoll(s, &s, 10);
        uint64_t a = strtoull(s, &s, 10), z = strtoull(s, &s, 10);
        uint64_t blo = strtoull(s, &s, 10), bhi = strtoull(s, &s, 10);
        char crc[16] = "", key[MPU_CKPT_NAME_MAX + 32] = "";
        if (sscanf(s, " %15s %159s", crc, key) != 2) break;
        g->held += z - a;
        json_buf *pb = &g->pieces;
        mpu__jb_printf(pb, "%s\n     {\"file\": \"%s\", \"key\": \"%s\", \"offsets\": [",
                       pb->len ? "," : "", file, key);
        for (int d = 0; d < g->ndim; d++) mpu__jb_printf(pb, "%s%" PRId64, d ? ", " : "", off[d]);
        mpu__jb_printf(pb, "], \"lengths\": [");
        for (int d = 0; d < g->ndim; d++) mpu__jb_printf(pb, "%s%" PRId64, d ? ", " : "", len[d]);
        mpu__jb_printf(pb, "], \"flat\": [%" PRIu64 ", %" PRIu64 "], \"bytes\": [%" PRIu64
                           ", %" PRIu64 "], \"crc32\": \"%s\"}",
                       a, z, blo, bhi, crc);
      } else if (line[0] == 'R') {
        char name[64], state[80];
        if (sscanf(line + 2, "%63s %79s", name, state) != 2) break;
        mpu__jb_printf(&rng, "%s\"%s\": \"%s\"", nstreams++ ? ", " : "", name, state);
      } else if (line[0] == 'D') {
        mpu__jb_printf(&rng, "}, \"default\": \"%s\"}", line + 2);
      }
    }
  }
  for (int i = 0; i < nt && !r; i++) {
    uint64_t numel = mpu__ckpt_numel(ts[i].ndim, ts[i].shape);
    if (ts[i].held != numel)
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                     "mpu_ckpt_save: tensor '%s': the ranks' pieces hold %llu of its %llu elements "
                     "(each element must be saved by exactly one rank)",
                     ts[i].name, (unsigned long long)ts[i].held, (unsigned long long)numel);
  }
  if (!r) {
    qsort(ts, (size_t)nt, sizeof *ts, cmp_gtensor);
    const mpu_ckpt_layout *l = &set->layout;
    mpu__jb_printf(ix, "{\n \"format\": \"%s\",\n \"version\": %d,\n \"step\": %" PRId64 ",\n",
                   CKPT_FORMAT, CKPT_VERSION, set->step);
    mpu__jb_printf(ix, " \"layout\": {\"world\": %d, \"tp\": %d, \"pp\": %d, \"vp\": %d, \"dp\": %d, "
                       "\"cp\": %d, \"ep\": %d, \"zero1\": %s, \"flavor\": ",
                   world, l->tp, l->pp, l->vp, l->dp, l->cp, l->ep, l->zero1 ? "true" : "false");
    mpu__jb_string(ix, l->flavor);
    mpu__jb_printf(ix, "},\n \"optimizer\": ");
    if (set->has_adamw) {
      const mpu_adamw_options *o = &set->adamw;
      mpu__jb_printf(ix, "{\"type\": \"adamw\", ");
      put_f(ix, "lr", o->lr), mpu__jb_printf(ix, ", ");
      put_f(ix, "beta1", o->beta1), mpu__jb_printf(ix, ", ");
      put_f(ix, "beta2", o->beta2), mpu__jb_printf(ix, ", ");
      put_f(ix, "eps", o->eps), mpu__jb_printf(ix, ", ");
      put_f(ix, "weight_decay", o->weight_decay), mpu__jb_printf(ix, ", ");
      put_f(ix, "clip_grad", o->clip_grad);
      mpu__jb_printf(ix, ", \"step\": %" PRId64 "},\n", set->optimizer_step);
    } else {
      mpu__jb_printf(ix, "null,\n");
    }
    mpu__jb_printf(ix, " \"metadata\": {");
    for (int i = 0; i < set->n_meta; i++) {
      mpu__jb_printf(ix, "%s", i ? ", " : "");
      mpu__jb_string(ix, set->meta[i][0]);
      mpu__jb_printf(ix, ": ");
      mpu__jb_string(ix, set->meta[i][1]);
    }
    mpu__jb_printf(ix, "},\n \"rng\": [%s\n ],\n \"files\": [%s\n ],\n \"tensors\": {",
                   rng.s ? rng.s : "", files.s ? files.s : "");
    for (int i = 0; i < nt; i++) {
      gtensor *g = &ts[i];
      mpu__jb_printf(ix, "%s\n  \"%s\": {\"kind\": \"%s\", \"dtype\": \"F32\", \"shape\": [",
                     i ? "," : "", g->name, mpu_ckpt_kind_name((mpu_ckpt_kind)g->kind));
      for (int d = 0; d < g->ndim; d++) mpu__jb_printf(ix, "%s%" PRId64, d ? ", " : "", g->shape[d]);
      mpu__jb_printf(ix, "], \"pieces\": [%s]}", g->pieces.s ? g->pieces.s : "");
    }
    mpu__jb_printf(ix, "\n }\n}\n");
    if (files.failed || rng.failed || ix->failed)
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_ckpt_save: the index");
  }
  for (int i = 0; i < nt; i++) mpu__jb_free(&ts[i].pieces);
  free(ts);
  mpu__jb_free(&files), mpu__jb_free(&rng);
  return r;
}

/* ---- the collective ---------------------------------------------------------------------- */

/* Everything the index records besides tensors, as the reader accepts it:
 * a save the loader would refuse is refused before anything is written. */
static mpu_result_t check_set(const char *fn, const mpu_ckpt_set *set) {
  if (set->step < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: step %lld is negative", fn, (long long)set->step);
  if (set->has_adamw) {
    MPU_CHECK(mpu__ckpt_adamw_numbers(fn, &set->adamw));
    if (set->optimizer_step < 0)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: optimizer step %lld is negative", fn,
                        (long long)set->optimizer_step);
  }
  const mpu_ckpt_layout *l = &set->layout;
  MPU_CHECK(mpu__ckpt_layout_check(fn, l));
  if (!memchr(l->flavor, '\0', sizeof l->flavor))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the layout's flavor is not a string of at most %zu bytes",
                      fn, sizeof l->flavor - 1);
  if (set->n_meta < 0 || set->n_meta > MPU_CKPT_META_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d metadata pairs (0..%d)", fn, set->n_meta,
                      MPU_CKPT_META_MAX);
  for (int i = 0; i < set->n_meta; i++) {
    MPU_CHECK(mpu__ckpt_meta_check(fn, set->meta[i][0], sizeof set->meta[i][0], set->meta[i][1],
                                   sizeof set->meta[i][1]));
    for (int k = 0; k < i; k++)
      if (!strcmp(set->meta[k][0], set->meta[i][0]))
        return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: metadata key '%s' twice", fn, set->meta[i][0]);
  }
  if (set->rng.n < 0 || set->rng.n > MPU_RNG_TRACKER_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d random streams (0..%d)", fn, set->rng.n,
                      MPU_RNG_TRACKER_MAX);
  for (int k = 0; k < set->rng.n; k++) {
    const char *name = set->rng.names[k];
    if (!memchr(name, '\0', sizeof set->rng.names[k]) || mpu__ckpt_name_ok(name))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: random stream %d's name is empty, too long, or has a space, a quote or "
                        "a byte outside printable ASCII", fn, k);
    for (int j = 0; j < k; j++)
      if (!strcmp(set->rng.names[j], name))
        return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: random stream '%s' twice", fn, name);
  }
  return MPU_SUCCESS;
}

/* Collective: every rank's status and step; MPU_SUCCESS only where every rank
 * succeeded with rank 0's step (the folder's name), the first other named. */
static mpu_result_t agree(const char *fn, mpu_comm *world, int size, mpu_result_t mine, int64_t step,
                          const char *what) {
  if (!world) return mine;
  int64_t me[2] = {mine != MPU_SUCCESS, step}, *all = calloc((size_t)size * 2, sizeof *all);
  if (!all) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d ranks", fn, size);
  mpu_result_t r = mpu_comm_all_gather(world, me, all, 2, MPU_INT64);
  for (int i = 0; !r && i < size; i++)
    if (all[2 * i] && !mine)
      r = mpu__error(MPU_ERR_ABORTED, "%s: rank %d %s; nothing written", fn, i, what);
    else if (all[2 * i + 1] != all[1] && !all[2 * i] && !mine)
      r = mpu__error(MPU_ERR_MISMATCH, "%s: rank %d saves step %lld, rank 0 step %lld", fn, i,
                     (long long)all[2 * i + 1], (long long)all[1]);
  free(all);
  return mine ? mine : r;
}

mpu_result_t mpu_ckpt_save(const char *dir, mpu_comm *world, const mpu_ckpt_set *set) {
  static const char fn[] = "mpu_ckpt_save";
  if (!dir || !*dir || !set) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int rank = 0, size = 1;
  if (world) {
    MPU_CHECK(mpu_comm_rank(world, &rank));
    MPU_CHECK(mpu_comm_size(world, &size));
  }
  /* the new iteration is built in dir/iter_N.tmp, which no load ever opens,
   * and renamed into place when complete: earlier iterations stay as they are */
  char name[64], stage[4096];
  mpu_ckpt_set with_layout = *set; /* the layout recorded (layout.c) */
  mpu_result_t r = mpu__ckpt_layout_for_save(&set->layout, size, &with_layout.layout);
  if (!r) r = check_set(fn, &with_layout);
  if (!r && (mpu__ckpt_iter_name(name, sizeof name, set->step, CKPT_STAGE_SUFFIX) ||
             mpu__ckpt_path(stage, sizeof stage, dir, name)))
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, dir);
  MPU_CHECK(agree(fn, world, size, r, set->step, "refused its set"));
  int lock = -1;
  if (rank == 0) r = mpu__ckpt_stage(dir, stage, &lock);
  r = agree(fn, world, size, r, set->step, "could not create the folder of the save");
  if (r) {
    mpu__ckpt_unlock(&lock);
    return r;
  }
  piece *p = NULL;
  int np = 0;
  char file[64];
  snprintf(file, sizeof file, "rank%05d.safetensors", rank);
  uint64_t bytes = 0;
  json_buf text = {0};
  if (!r) r = cut_pieces(set, rank, &p, &np);
  if (!r) r = write_rank_file(stage, file, set, p, np, rank, &bytes);
  if (!r) describe(&text, set, file, bytes, p, np);
  if (!r && text.failed) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: the description", fn);
  free_pieces(p, np);
  /* every rank's status and description length, then the descriptions */
  int64_t mine[2] = {r != MPU_SUCCESS, (int64_t)text.len + 1}, *all = calloc((size_t)size * 2, sizeof *all);
  char *blobs = NULL, **texts = calloc((size_t)size, sizeof *texts);
  mpu_result_t cr = all && texts ? MPU_SUCCESS : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (world) {
    mpu_result_t g = mpu_comm_all_gather(world, mine, all, 2, MPU_INT64);
    if (g) cr = g;
  } else if (all) {
    all[0] = mine[0], all[1] = mine[1];
  }
  int64_t longest = 0, failed = -1;
  for (int i = 0; !cr && i < size; i++) {
    if (all[2 * i] && failed < 0) failed = i;
    if (all[2 * i + 1] > longest) longest = all[2 * i + 1];
  }
  if (!cr && failed < 0) {
    blobs = calloc((size_t)size, (size_t)longest);
    char *my = calloc(1, (size_t)longest);
    if (!blobs || !my) cr = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %lld bytes", fn, (long long)longest);
    if (!cr && text.s) memcpy(my, text.s, text.len);
    if (!cr && world) cr = mpu_comm_all_gather(world, my, blobs, (size_t)longest, MPU_UINT8);
    else if (!cr) memcpy(blobs, my, (size_t)longest);
    free(my);
  }
  mpu__jb_free(&text);
  if (!r && !cr && failed >= 0)
    r = mpu__error(MPU_ERR_ABORTED, "%s: rank %lld could not write its file; nothing saved", fn,
                   (long long)failed);
  if (!r) r = cr;
  /* rank 0 writes the index, puts the folder in place and names it in the
   * tracker; its status goes to every rank */
  int32_t status = r != MPU_SUCCESS;
  if (!r && rank == 0) {
    for (int i = 0; i < size; i++) texts[i] = blobs + (size_t)i * (size_t)longest;
    json_buf ix = {0};
    r = build_index(&with_layout, texts, size, &ix);
    if (!r) {
      const void *parts[1] = {ix.s};
      size_t lens[1] = {ix.len};
      r = mpu__ckpt_write_file(stage, CKPT_INDEX, parts, lens, 1);
    }
    mpu__jb_free(&ix);
    if (!r) r = mpu__ckpt_publish(dir, stage, set->step);
    status = r != MPU_SUCCESS;
  }
  /* every rank has written or given up (the gathers): a failed save's folder goes */
  if (r && rank == 0 && !cr) mpu__ckpt_discard(stage);
  mpu__ckpt_unlock(&lock);
  free(blobs), free(texts), free(all);
  if (world && !cr) {
    mpu_result_t b = mpu_comm_broadcast(world, &status, 1, MPU_INT32, 0);
    if (b && !r) r = b;
  }
  if (!r && status)
    r = mpu__error(MPU_ERR_ABORTED,
                   "%s: rank 0 could not write the index of %s or put its folder in place", fn, dir);
  return r;
}

/*
 * fsdp.c - sharded parameter buffers: ZeRO-2, ZeRO-3 (FSDP) and hybrid
 * sharding, one code path whose strategies differ in two bits: whether a
 * bucket is resharded after its forward (FULL, HYBRID) and whether the
 * reduced gradient piece is all-reduced across replicas (HYBRID*).
 *
 * Every bucket is S equal pieces, so all_gather and reduce_scatter move it
 * with equal counts; the layout (mpu_fsdp_layout) says which elements of
 * which parameter lie where in them, and piece_of is its one rule: FSDP1's
 * flat parameter (the concatenation cut by torch.chunk, mpu_shard_chunk) or
 * FSDP2's padded dim-0 shards. Whole buckets are parameter-major (each
 * parameter's elements at its flat offset, no gaps); for the flat layout
 * that is the gathered array itself, as FlatParameter's views are.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/options.h"
#include "mpu/fsdp.h"
#include "mpu/shard.h"
#include "train/adamw.h"

typedef struct bucket {
  int first, last;       /* parameters [first, last] */
  size_t start, end;     /* elements of the buffer */
  size_t flat;           /* its parameters' elements, concatenated */
  size_t piece;          /* each rank's padded piece */
  size_t at;             /* where this rank's piece starts in the piece arrays */
  float *whole;          /* whole_len gathered parameters (allocated mode), or NULL */
  float *wgrad;          /* whole_len whole gradient, or NULL */
  int is_whole;
  mpu_request *gather;   /* a prefetch in flight into `staging` */
  float *staging;        /* S * piece: what the gather lands in */
  mpu_request *reduce;   /* a reduce-scatter in flight from `rgrad` */
  float *rgrad;          /* S * piece: the pre-divided gradient being reduced */
} bucket;

struct mpu_fsdp {
  mpu_param_buffer *b;
  mpu_comm *shard, *replicate;
  int S, s, R, r;         /* shard size and rank, replicas and this rank's replica */
  int caller_storage;    /* b finalized by the caller: whole buckets live in b->data / b->grad */
  mpu_fsdp_options o;
  float pre, post;       /* FSDP's gradient pre- and post-divide factors */
  int nb;
  bucket *bk;
  size_t *flat_at;       /* per parameter: its offset in its bucket's concatenation */
  size_t *piece_at;      /* per parameter (MPU_FSDP_PER_PARAM): its shard's offset in a piece */
  size_t held;           /* elements of the piece arrays */
  float *p, *g, *m, *v;  /* the pieces (held each) */
  int64_t step;
  size_t live, peak;     /* bytes */
  int pending;           /* the bucket whose reduce-scatter is in flight, or -1 */
};

static const char *const strategy_names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD",
                                             "_HYBRID_SHARD_ZERO2"};
static const char *const strategy_aliases[] = {"zero3", "zero2", "hsdp", "hsdp_zero2"};

const char *mpu_shard_strategy_name(mpu_shard_strategy s) {
  return (unsigned)s < 4 ? strategy_names[s] : NULL;
}

mpu_result_t mpu_shard_strategy_from_name(const char *name, mpu_shard_strategy *out) {
  for (int k = 0; name && out && k < 4; k++)
    if (!strcasecmp(name, strategy_names[k]) || !strcasecmp(name, strategy_aliases[k]) ||
        (k == MPU_SHARD_FULL && !strcasecmp(name, "fsdp")))
      return *out = (mpu_shard_strategy)k, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "mpu_shard_strategy_from_name: '%s' (want FULL_SHARD, SHARD_GRAD_OP, "
                    "HYBRID_SHARD, _HYBRID_SHARD_ZERO2 or zero3, zero2, hsdp, hsdp_zero2)",
                    name ? name : "(null)");
}

static const char *const layout_names[] = {"flat", "per_param"};
static const char *const layout_aliases[] = {"fsdp1", "fsdp2"};

const char *mpu_fsdp_layout_name(mpu_fsdp_layout layout) {
  return (unsigned)layout < 2 ? layout_names[layout] : NULL;
}

mpu_result_t mpu_fsdp_layout_from_name(const char *name, mpu_fsdp_layout *out) {
  for (int k = 0; name && out && k < 2; k++)
    if (!strcasecmp(name, layout_names[k]) || !strcasecmp(name, layout_aliases[k]))
      return *out = (mpu_fsdp_layout)k, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "mpu_fsdp_layout_from_name: '%s' (want flat or fsdp1, per_param or fsdp2)",
                    name ? name : "(null)");
}

/* The names of mpu__adamw_agree's messages. */
static const char *strategy_of(int v) { return mpu_shard_strategy_name((mpu_shard_strategy)v); }
static const char *layout_of(int v) { return mpu_fsdp_layout_name((mpu_fsdp_layout)v); }

static int reshard_after_forward(const mpu_fsdp *f) {
  return f->o.strategy == MPU_SHARD_FULL || f->o.strategy == MPU_SHARD_HYBRID;
}

/* DefaultState._get_gradient_predivide_factor */
/* FSDP here shards host buffers (parameters, gradients and AdamW's state
 * live in host memory and the step runs on the CPU): a group whose calls
 * take device memory (NCCL) cannot move them, so it is refused up front,
 * in one line, rather than at its first collective. */
static mpu_result_t host_group(const char *fn, const char *which, mpu_comm *g) {
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(g, &caps));
  if (caps.memory == MPU_MEMORY_HOST) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: the %s group is a %s communicator, which takes device memory, and FSDP "
                    "shards host buffers (parameters, gradients and AdamW's state on the CPU): "
                    "pass a host group (mpu_comm_host_twin of it, or mpu_state_host_comm)",
                    fn, which, mpu_comm_backend(g));
}

static float predivide_factor(int world) {
  int factor = 1;
  while (world % factor == 0 && world / factor > factor) factor *= 2;
  return (float)factor;
}

/* ---- memory, counted as it is taken and given back ---------------------------------------- */

static float *take(mpu_fsdp *f, size_t n, const char *fn) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) {
    mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu floats", fn, n);
    return NULL;
  }
  f->live += n * sizeof(float);
  if (f->live > f->peak) f->peak = f->live;
  return p;
}

static void give(mpu_fsdp *f, float **p, size_t n) {
  if (!*p) return;
  free(*p);
  *p = NULL;
  f->live -= n * sizeof(float);
}

static size_t padded(const mpu_fsdp *f, const bucket *k) { return k->piece * (size_t)f->S; }

/* The one layout rule: the elements of parameter i (in bucket c) that rank
 * r holds, [*lo, *hi) of the parameter's own, element *lo at index *at of
 * r's piece (*lo == *hi if none). */
static void piece_of(const mpu_fsdp *f, const bucket *c, int i, int r, size_t *lo, size_t *hi,
                     size_t *at) {
  const mpu_param *p = &f->b->params[i];
  size_t a, z;
  if (f->o.layout == MPU_FSDP_FLAT) { /* rank r's flat elements [a, z) of the bucket */
    mpu_shard_chunk(0, c->flat, (size_t)f->S, (size_t)r, &a, &z);
    size_t from = f->flat_at[i] > a ? f->flat_at[i] : a;
    size_t to = f->flat_at[i] + p->numel < z ? f->flat_at[i] + p->numel : z;
    if (from >= to) from = to = f->flat_at[i];
    *lo = from - f->flat_at[i], *hi = to - f->flat_at[i], *at = from - a;
    return;
  }
  size_t rows = p->ndim ? (size_t)p->shape[0] : p->numel, width = p->numel / rows;
  mpu_shard_chunk(0, rows, (size_t)f->S, (size_t)r, &a, &z); /* rows [a, z) */
  *lo = a * width, *hi = z * width, *at = f->piece_at[i];
}

/* Whole buckets are parameter-major and unpadded for FSDP2; FSDP1's whole
 * bucket is the gathered flat parameter itself (its padding included). */
static size_t whole_len(const mpu_fsdp *f, const bucket *c) {
  return f->o.layout == MPU_FSDP_FLAT ? padded(f, c) : c->flat;
}

/* Copy between the rank-major pieces of bucket c (S x piece, as the
 * collectives move them) and parameter-major memory: at the parameters'
 * buffer offsets in base (in_buffer) or at their flat offsets. */
static void repack(const mpu_fsdp *f, const bucket *c, float *ranked, float *base, int in_buffer,
                   int to_ranked) {
  for (int r = 0; r < f->S; r++)
    for (int i = c->first; i <= c->last; i++) {
      size_t lo, hi, at;
      piece_of(f, c, i, r, &lo, &hi, &at);
      if (lo >= hi) continue;
      float *x = ranked + (size_t)r * c->piece + at;
      float *y = base + (in_buffer ? f->b->params[i].offset : f->flat_at[i]) + lo;
      if (to_ranked) memcpy(x, y, (hi - lo) * sizeof(float));
      else memcpy(y, x, (hi - lo) * sizeof(float));
    }
}

/* ---- creation --------------------------------------------------------------------------------- */

static mpu_result_t cut_buckets(mpu_fsdp *f, const char *fn) {
  const mpu_param_buffer *b = f->b;
  f->bk = calloc((size_t)b->nparams, sizeof *f->bk);
  f->flat_at = calloc((size_t)b->nparams, sizeof *f->flat_at);
  f->piece_at = calloc((size_t)b->nparams, sizeof *f->piece_at);
  if (!f->bk || !f->flat_at || !f->piece_at)
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d buckets", fn, b->nparams);
  size_t limit = f->o.bucket_bytes / sizeof(float), S = (size_t)f->S;
  for (int i = 0; i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    bucket *cur = f->nb ? &f->bk[f->nb - 1] : NULL;
    if (!cur || cur->flat + p->numel > limit) { /* counted as FlatParameter's numel: no gaps */
      cur = &f->bk[f->nb++];
      cur->first = i, cur->start = p->offset;
    }
    cur->last = i, cur->end = p->offset + p->numel;
    f->flat_at[i] = cur->flat, cur->flat += p->numel;
    if (f->o.layout == MPU_FSDP_PER_PARAM) { /* a padded shard of ceil(rows / S) rows */
      size_t rows = p->ndim ? (size_t)p->shape[0] : p->numel;
      f->piece_at[i] = cur->piece;
      cur->piece += (rows + S - 1) / S * (p->numel / rows);
    }
  }
  for (int k = 0; k < f->nb; k++) {
    bucket *c = &f->bk[k];
    if (f->o.layout == MPU_FSDP_FLAT) c->piece = mpu_shard_chunk(0, c->flat, S, 0, NULL, NULL);
    c->at = f->held;
    if (c->piece > ((size_t)1 << 40) / S)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: bucket %d too large", fn, k);
    f->held += c->piece;
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_create(mpu_param_buffer *b, mpu_comm *shard, mpu_comm *replicate,
                             const mpu_fsdp_options *options, mpu_fsdp **out) {
  static const char fn[] = "mpu_fsdp_create";
  if (!b || !shard || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!b->nparams) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: the buffer has no parameters", fn);
  mpu_fsdp_options d = MPU_FSDP_OPTIONS_INIT;
  if (options)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_FSDP_OPTIONS_INIT", options, sizeof d,
                                sizeof d, &d));
  if (!mpu_fsdp_layout_name(d.layout))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: unknown layout %d", fn, (int)d.layout);
  if (!mpu_shard_strategy_name(d.strategy))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: unknown strategy %d", fn, (int)d.strategy);
  if (d.bucket_bytes < sizeof(float))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: bucket_bytes %zu (want at least 4)", fn,
                      d.bucket_bytes);
  MPU_CHECK(mpu__adamw_check(fn, &d.adamw));
  int is_hybrid = d.strategy == MPU_SHARD_HYBRID || d.strategy == MPU_SHARD_HYBRID_ZERO2;
  if (is_hybrid != (replicate != NULL))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %s %s a replicate group", fn, strategy_names[d.strategy],
                      is_hybrid ? "needs" : "takes no");
  MPU_CHECK(host_group(fn, "shard", shard));
  if (replicate) MPU_CHECK(host_group(fn, "replicate", replicate));
  mpu_fsdp *f = calloc(1, sizeof *f);
  if (!f) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r;
  f->b = b, f->shard = shard, f->replicate = replicate, f->o = d, f->R = 1, f->pending = -1;
  f->caller_storage = b->finalized;
  MPU_CHECK_GOTO(mpu_comm_size(shard, &f->S), r, fail);
  MPU_CHECK_GOTO(mpu_comm_rank(shard, &f->s), r, fail);
  if (replicate) MPU_CHECK_GOTO(mpu_comm_size(replicate, &f->R), r, fail);
  if (replicate) MPU_CHECK_GOTO(mpu_comm_rank(replicate, &f->r), r, fail);
  /* ranks on different layouts would cut the buckets differently: their
   * gathers and reduce-scatters would move other elements than they think */
  const mpu__agree_choice choices[2] = {{"strategy", (int)d.strategy, strategy_of},
                                        {"layout", (int)d.layout, layout_of}};
  MPU_CHECK_GOTO(mpu__adamw_agree(fn, shard, &d.adamw, d.sum, d.bucket_bytes, choices, 2, b), r,
                 fail);
  if (replicate)
    MPU_CHECK_GOTO(mpu__adamw_agree(fn, replicate, &d.adamw, d.sum, d.bucket_bytes, choices, 2,
                                    b), r, fail);
  int world = f->S * f->R;
  f->pre = d.sum ? 1.0f : predivide_factor(world);
  f->post = d.sum ? 1.0f : (float)world / f->pre;
  MPU_CHECK_GOTO(cut_buckets(f, fn), r, fail);
  r = MPU_ERR_OUT_OF_MEMORY;
  if (!(f->p = take(f, f->held, fn)) || !(f->g = take(f, f->held, fn)) ||
      !(f->m = take(f, f->held, fn)) || !(f->v = take(f, f->held, fn)))
    goto fail;
  if (f->caller_storage)
    for (int k = 0; k < f->nb; k++)
      for (int i = f->bk[k].first; i <= f->bk[k].last; i++) {
        size_t lo, hi, at;
        piece_of(f, &f->bk[k], i, f->s, &lo, &hi, &at);
        if (hi > lo)
          memcpy(f->p + f->bk[k].at + at, b->data + b->params[i].offset + lo,
                 (hi - lo) * sizeof(float));
      }
  *out = f;
  return MPU_SUCCESS;
fail:
  mpu_fsdp_free(f);
  return r;
}

mpu_result_t mpu_fsdp_create_on_mesh(mpu_param_buffer *b, mpu_device_mesh *dm, int replicate_dim,
                                     int shard_dim, const mpu_fsdp_options *options,
                                     mpu_fsdp **out) {
  static const char fn[] = "mpu_fsdp_create_on_mesh";
  if (!dm) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL mesh", fn);
  mpu_comm *shard, *rep = NULL;
  MPU_CHECK(mpu_device_mesh_comm(dm, shard_dim, &shard));
  if (replicate_dim >= 0) {
    if (replicate_dim == shard_dim)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: replicate and shard are both dim %d", fn,
                        shard_dim);
    MPU_CHECK(mpu_device_mesh_comm(dm, replicate_dim, &rep));
  }
  return mpu_fsdp_create(b, shard, rep, options, out);
}

void mpu_fsdp_free(mpu_fsdp *f) {
  if (!f) return;
  for (int k = 0; f->bk && k < f->nb; k++) {
    bucket *c = &f->bk[k];
    if (c->gather) mpu_request_wait(c->gather);
    if (c->reduce) mpu_request_wait(c->reduce);
    size_t n = padded(f, c), w = whole_len(f, c);
    give(f, &c->whole, w), give(f, &c->wgrad, w), give(f, &c->staging, n), give(f, &c->rgrad, n);
  }
  free(f->bk);
  free(f->flat_at), free(f->piece_at);
  free(f->p), free(f->g), free(f->m), free(f->v);
  free(f);
}

/* ---- queries ----------------------------------------------------------------------------------- */

int mpu_fsdp_nbuckets(const mpu_fsdp *f) { return f ? f->nb : 0; }

int mpu_fsdp_bucket_of(const mpu_fsdp *f, int param) {
  for (int k = 0; f && k < f->nb; k++)
    if (param >= f->bk[k].first && param <= f->bk[k].last) return k;
  return -1;
}

static mpu_result_t check_bucket(const char *fn, const mpu_fsdp *f, int k) {
  if (!f) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL sharded buffer", fn);
  if (k < 0 || k >= f->nb)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: bucket %d (the buffer has %d)", fn, k, f->nb);
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_bucket_range(const mpu_fsdp *f, int k, size_t *start, size_t *end,
                                   size_t *piece) {
  MPU_CHECK(check_bucket("mpu_fsdp_bucket_range", f, k));
  if (start) *start = f->bk[k].start;
  if (end) *end = f->bk[k].end;
  if (piece) *piece = f->bk[k].piece;
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_set_param(mpu_fsdp *f, int i, const float *values) {
  if (!values) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_fsdp_set_param: NULL values");
  mpu_shard s;
  MPU_CHECK(mpu_fsdp_param_shard(f, i, &s));
  MPU_CHECK(mpu_fsdp_reshard(f, mpu_fsdp_bucket_of(f, i))); /* the piece changes: regather */
  for (int k = 0; k < s.nspans; k++) /* a parameter lies in one bucket: one span at most */
    memcpy(f->p + s.spans[k].at, values + s.spans[k].lo,
           (s.spans[k].hi - s.spans[k].lo) * sizeof(float));
  return MPU_SUCCESS;
}

/* ---- unshard / reshard -------------------------------------------------------------------------- */

/* A gather in flight carries the pieces as they were when it started: wait
 * it out (every rank of the shard group started it, so it ends) and discard
 * what it brought, so that the next unshard gathers the pieces anew. */
static mpu_result_t drop_gather(mpu_fsdp *f, bucket *c) {
  if (!c->gather) return MPU_SUCCESS;
  mpu_request *req = c->gather;
  c->gather = NULL;
  mpu_result_t r = mpu_request_wait(req);
  give(f, &c->staging, padded(f, c));
  return r;
}

mpu_result_t mpu_fsdp_prefetch(mpu_fsdp *f, int k) {
  static const char fn[] = "mpu_fsdp_prefetch";
  MPU_CHECK(check_bucket(fn, f, k));
  bucket *c = &f->bk[k];
  if (c->is_whole || c->gather) return MPU_SUCCESS;
  if (!c->staging && !(c->staging = take(f, padded(f, c), fn))) return MPU_ERR_OUT_OF_MEMORY;
  float *mine = c->staging + (size_t)f->s * c->piece; /* in place: send == recv + rank * count */
  memcpy(mine, f->p + c->at, c->piece * sizeof(float));
  return mpu_comm_iall_gather(f->shard, mine, c->staging, c->piece, MPU_FLOAT32, &c->gather);
}

mpu_result_t mpu_fsdp_unshard(mpu_fsdp *f, int k, int next) {
  static const char fn[] = "mpu_fsdp_unshard";
  MPU_CHECK(check_bucket(fn, f, k));
  if (next != -1) MPU_CHECK(check_bucket(fn, f, next));
  bucket *c = &f->bk[k];
  if (!c->is_whole) {
    MPU_CHECK(mpu_fsdp_prefetch(f, k));
    mpu_request *req = c->gather;
    c->gather = NULL;
    MPU_CHECK(mpu_request_wait(req));
    if (f->caller_storage) { /* the layers read the buffer itself */
      repack(f, c, c->staging, f->b->data, 1, 0);
      give(f, &c->staging, padded(f, c));
    } else if (f->o.layout == MPU_FSDP_FLAT) { /* the flat parameter: views into it */
      c->whole = c->staging, c->staging = NULL;
    } else { /* FSDP2's copy-out of the all-gather into each parameter */
      if (!(c->whole = take(f, c->flat, fn))) return MPU_ERR_OUT_OF_MEMORY;
      repack(f, c, c->staging, c->whole, 0, 0);
      give(f, &c->staging, padded(f, c));
    }
    c->is_whole = 1;
  }
  return next >= 0 ? mpu_fsdp_prefetch(f, next) : MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_reshard(mpu_fsdp *f, int k) {
  MPU_CHECK(check_bucket("mpu_fsdp_reshard", f, k));
  bucket *c = &f->bk[k];
  give(f, &c->whole, whole_len(f, c));
  c->is_whole = 0;
  return drop_gather(f, c);
}

mpu_result_t mpu_fsdp_forward_done(mpu_fsdp *f, int k) {
  MPU_CHECK(check_bucket("mpu_fsdp_forward_done", f, k));
  return reshard_after_forward(f) ? mpu_fsdp_reshard(f, k) : MPU_SUCCESS;
}

float *mpu_fsdp_param(const mpu_fsdp *f, int i) {
  int k = mpu_fsdp_bucket_of(f, i);
  if (k < 0 || !f->bk[k].is_whole) return NULL;
  return f->caller_storage ? f->b->data + f->b->params[i].offset : f->bk[k].whole + f->flat_at[i];
}

float *mpu_fsdp_grad(mpu_fsdp *f, int i) {
  int k = mpu_fsdp_bucket_of(f, i);
  if (k < 0 || !f->bk[k].is_whole) return NULL;
  if (f->caller_storage) return f->b->grad + f->b->params[i].offset;
  bucket *c = &f->bk[k];
  if (!c->wgrad && !(c->wgrad = take(f, whole_len(f, c), "mpu_fsdp_grad"))) return NULL;
  return c->wgrad + f->flat_at[i];
}

/* ---- gradients ------------------------------------------------------------------------------------ */

/* Wait for the reduce-scatter in flight, all-reduce the piece over the
 * replicas (hybrid), post-divide, and add it to the sharded gradient. */
static mpu_result_t finish_reduce(mpu_fsdp *f) {
  if (f->pending < 0) return MPU_SUCCESS;
  bucket *c = &f->bk[f->pending];
  f->pending = -1;
  mpu_request *req = c->reduce;
  c->reduce = NULL;
  mpu_result_t r = mpu_request_wait(req);
  float *piece = c->rgrad + (size_t)f->s * c->piece;
  if (!r && f->replicate)
    r = mpu_comm_all_reduce(f->replicate, piece, piece, c->piece, MPU_FLOAT32, MPU_SUM);
  if (!r)
    for (size_t i = 0; i < c->piece; i++) f->g[c->at + i] += piece[i] / f->post;
  give(f, &c->rgrad, padded(f, c));
  return r;
}

mpu_result_t mpu_fsdp_backward_done(mpu_fsdp *f, int k) {
  static const char fn[] = "mpu_fsdp_backward_done";
  MPU_CHECK(check_bucket(fn, f, k));
  MPU_CHECK(finish_reduce(f));
  bucket *c = &f->bk[k];
  size_t n = padded(f, c);
  if (f->caller_storage) {
    if (!(c->rgrad = take(f, n, fn))) return MPU_ERR_OUT_OF_MEMORY;
    repack(f, c, c->rgrad, f->b->grad, 1, 1);
    memset(f->b->grad + c->start, 0, (c->end - c->start) * sizeof(float));
  } else if (c->wgrad && f->o.layout == MPU_FSDP_FLAT) {
    c->rgrad = c->wgrad, c->wgrad = NULL; /* the flat gradient; its padding is still zero */
  } else { /* FSDP2's copy-in, or no gradient reached this bucket: zeros */
    if (!(c->rgrad = take(f, n, fn))) return MPU_ERR_OUT_OF_MEMORY;
    if (c->wgrad) repack(f, c, c->rgrad, c->wgrad, 0, 1);
    give(f, &c->wgrad, c->flat);
  }
  if (f->pre != 1.0f) /* the padding is zero: dividing it changes nothing */
    for (size_t i = 0; i < n; i++) c->rgrad[i] /= f->pre;
  float *mine = c->rgrad + (size_t)f->s * c->piece; /* in place: recv == send + rank * count */
  MPU_CHECK(mpu_comm_ireduce_scatter(f->shard, c->rgrad, mine, c->piece, MPU_FLOAT32, MPU_SUM,
                                     &c->reduce));
  f->pending = k;
  return mpu_fsdp_reshard(f, k);
}

mpu_result_t mpu_fsdp_param_shard(const mpu_fsdp *f, int i, mpu_shard *out) {
  static const char fn[] = "mpu_fsdp_param_shard";
  if (!f || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int k = mpu_fsdp_bucket_of(f, i);
  MPU_CHECK(check_bucket(fn, f, k));
  mpu_shard s;
  MPU_CHECK(mpu__param_local_shard(fn, f->b, i, &s));
  size_t lo, hi, at;
  piece_of(f, &f->bk[k], i, f->s, &lo, &hi, &at);
  MPU_CHECK(mpu_shard_keep(&s, lo, hi, f->bk[k].at + at));
  *out = s;
  return MPU_SUCCESS;
}

/* After a consumer wrote the pieces: every whole bucket and gather is stale. */
static mpu_result_t pieces_written(void *holder) {
  mpu_fsdp *f = holder;
  for (int k = 0; k < f->nb; k++) MPU_CHECK(mpu_fsdp_reshard(f, k));
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_describe(mpu_fsdp *f, const mpu_shard_global *globals, int tp_size,
                               mpu_shard_list *out) {
  static const char fn[] = "mpu_fsdp_describe";
  if (!f || !globals || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  const mpu_param_buffer *b = f->b;
  mpu_shard *s = malloc(sizeof *s);
  if (!s) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; !r && i < b->nparams; i++) {
    const bucket *c = &f->bk[mpu_fsdp_bucket_of(f, i)];
    int writer = (b->params[i].attrs.tensor_parallel || b->tp_rank == 0) && f->r == 0;
    size_t lo, hi, at;
    piece_of(f, c, i, f->s, &lo, &hi, &at);
    r = mpu__param_shard(fn, b, i, &globals[i], tp_size, s);
    if (!r) r = mpu_shard_keep(s, lo, hi, c->at + at);
    const mpu_shard *save = writer ? s : NULL;
    const char *name = globals[i].name;
    if (!r) r = mpu__describe(fn, out, name, "", MPU_SHARD_PARAM, s, f->p, save);
    if (!r) r = mpu__describe(fn, out, name, ".exp_avg", MPU_SHARD_EXP_AVG, s, f->m, save);
    if (!r) r = mpu__describe(fn, out, name, ".exp_avg_sq", MPU_SHARD_EXP_AVG_SQ, s, f->v, save);
  }
  free(s);
  return r ? r : mpu_shard_list_on_write(out, pieces_written, f);
}

int64_t mpu_fsdp_optimizer_step(const mpu_fsdp *f) { return f ? f->step : 0; }

mpu_result_t mpu_fsdp_set_optimizer_step(mpu_fsdp *f, int64_t step) {
  if (!f || step < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_fsdp_set_optimizer_step: %s",
                      f ? "a negative step" : "NULL sharded buffer");
  f->step = step;
  return MPU_SUCCESS;
}

const mpu_fsdp_options *mpu_fsdp_get_options(const mpu_fsdp *f) { return f ? &f->o : NULL; }

int mpu_fsdp_replica(const mpu_fsdp *f) { return f ? f->r : 0; }

mpu_param_buffer *mpu_fsdp_buffer(const mpu_fsdp *f) { return f ? f->b : NULL; }

float *mpu_fsdp_shard_params(const mpu_fsdp *f, size_t *numel) {
  if (numel) *numel = f ? f->held : 0;
  return f ? f->p : NULL;
}

float *mpu_fsdp_shard_grads(const mpu_fsdp *f, size_t *numel) {
  if (numel) *numel = f ? f->held : 0;
  return f ? f->g : NULL;
}

float *mpu_fsdp_shard_exp_avg(const mpu_fsdp *f, size_t *numel) {
  if (numel) *numel = f ? f->held : 0;
  return f ? f->m : NULL;
}

float *mpu_fsdp_shard_exp_avg_sq(const mpu_fsdp *f, size_t *numel) {
  if (numel) *numel = f ? f->held : 0;
  return f ? f->v : NULL;
}

mpu_result_t mpu_fsdp_sync_grads(mpu_fsdp *f) {
  if (!f) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_fsdp_sync_grads: NULL sharded buffer");
  MPU_CHECK(finish_reduce(f));
  for (int k = 0; k < f->nb; k++) MPU_CHECK(mpu_fsdp_reshard(f, k)); /* pieces may change now */
  return MPU_SUCCESS;
}

void mpu_fsdp_zero_grad(mpu_fsdp *f) {
  if (f) memset(f->g, 0, f->held * sizeof(float));
}

/* ---- the step ------------------------------------------------------------------------------------ */

/* f(element of the pieces, decay) over every element this rank holds of a parameter */
typedef void (*held_fn)(mpu_fsdp *f, size_t j, int param, void *arg);

static void for_held(mpu_fsdp *f, held_fn fn, void *arg) {
  for (int k = 0; k < f->nb; k++) {
    bucket *c = &f->bk[k];
    for (int i = c->first; i <= c->last; i++) {
      size_t lo, hi, at;
      piece_of(f, c, i, f->s, &lo, &hi, &at);
      for (size_t e = 0; e < hi - lo; e++) fn(f, c->at + at + e, i, arg);
    }
  }
}

static void add_square(mpu_fsdp *f, size_t j, int i, void *arg) {
  if (mpu_param_counts_in_norm(f->b, i)) *(double *)arg += (double)f->g[j] * f->g[j];
}

typedef struct step_args {
  float clip, bc1, bc2;
} step_args;

static void update(mpu_fsdp *f, size_t j, int i, void *arg) {
  const step_args *a = arg;
  mpu__adamw_element(&f->p[j], f->g[j] * a->clip, &f->m[j], &f->v[j],
                     (float)f->b->params[i].decay, &f->o.adamw, a->bc1, a->bc2);
}

mpu_result_t mpu_fsdp_step_all(mpu_fsdp *const *fs, int n, mpu_comm *norm_group,
                               float *grad_norm) {
  static const char fn[] = "mpu_fsdp_step_all";
  if (!fs || n < 1) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no sharded buffers", fn);
  for (int i = 0; i < n; i++) {
    if (!fs[i]) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: buffer %d is NULL", fn, i);
    if (fs[i]->shard != fs[0]->shard)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: buffer %d has another shard group", fn, i);
  }
  mpu__stepped *e = malloc((size_t)n * sizeof *e);
  if (!e) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d sharded buffers", fn, n);
  for (int i = 0; i < n; i++) e[i].b = fs[i]->b, e[i].step = fs[i]->step;
  mpu_result_t checked = mpu__step_all_check(fn, "buffer", e, n);
  free(e);
  MPU_CHECK(checked);
  double sq = 0;
  for (int i = 0; i < n; i++) {
    MPU_CHECK(mpu_fsdp_sync_grads(fs[i]));
    for_held(fs[i], add_square, &sq);
  }
  MPU_CHECK(mpu_comm_all_reduce(fs[0]->shard, &sq, &sq, 1, MPU_FLOAT64, MPU_SUM));
  float norm;
  MPU_CHECK(mpu__grad_norm(fn, sq, norm_group, grad_norm, &norm));
  for (int i = 0; i < n; i++) {
    mpu_fsdp *f = fs[i];
    f->step++;
    step_args a = {mpu__clip_coeff(f->o.adamw.clip_grad, norm),
                   1.0f - powf(f->o.adamw.beta1, (float)f->step),
                   1.0f - powf(f->o.adamw.beta2, (float)f->step)};
    for_held(f, update, &a);
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_step(mpu_fsdp *f, mpu_comm *norm_group, float *grad_norm) {
  return mpu_fsdp_step_all(&f, 1, norm_group, grad_norm);
}

mpu_result_t mpu_fsdp_gather_params(mpu_fsdp *f, float *out) {
  static const char fn[] = "mpu_fsdp_gather_params";
  if (!f || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(finish_reduce(f));
  memset(out, 0, f->b->numel * sizeof(float));
  for (int k = 0; k < f->nb; k++) {
    bucket *c = &f->bk[k];
    float *w = take(f, padded(f, c), fn);
    if (!w) return MPU_ERR_OUT_OF_MEMORY;
    float *mine = w + (size_t)f->s * c->piece;
    memcpy(mine, f->p + c->at, c->piece * sizeof(float));
    mpu_result_t r = mpu_comm_all_gather(f->shard, mine, w, c->piece, MPU_FLOAT32);
    if (!r) repack(f, c, w, out, 1, 0);
    give(f, &w, padded(f, c));
    MPU_CHECK(r);
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_memory_usage(const mpu_fsdp *f, mpu_fsdp_memory *m) {
  if (!f || !m) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_fsdp_memory_usage: NULL argument");
  memset(m, 0, sizeof *m);
  m->params = m->grads = f->held * sizeof(float);
  m->optimizer = 2 * f->held * sizeof(float);
  m->unsharded = f->live - 4 * f->held * sizeof(float);
  m->peak = f->peak;
  for (int k = 0; k < f->nb; k++) {
    size_t n = whole_len(f, &f->bk[k]) * sizeof(float);
    if (n > m->largest_bucket) m->largest_bucket = n;
  }
  return MPU_SUCCESS;
}

void mpu_fsdp_reset_peak(mpu_fsdp *f) {
  if (f) f->peak = f->live;
}

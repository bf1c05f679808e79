/*
 * fsdp.c - sharded parameter buffers: ZeRO-2, ZeRO-3 (FSDP) and hybrid
 * sharding, one code path whose strategies differ in two bits: whether a
 * bucket is resharded after its forward (FULL, HYBRID) and whether the
 * reduced gradient piece is all-reduced across replicas (HYBRID*).
 *
 * Every bucket is padded to S equal pieces by mpu__chunk (torch.chunk's
 * rule), so all_gather and reduce_scatter move it with equal counts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/chunk.h"
#include "core/error.h"
#include "core/options.h"
#include "mpu/fsdp.h"
#include "train/adamw.h"

typedef struct bucket {
  int first, last;       /* parameters [first, last] */
  size_t start, end;     /* elements of the buffer */
  size_t piece;          /* padded piece length: ceil((end - start) / S) */
  size_t at;             /* where this rank's piece starts in the piece arrays */
  float *whole;          /* S * piece gathered parameters (allocated mode), or NULL */
  float *wgrad;          /* S * piece whole gradient, or NULL */
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

/* this rank's held elements of bucket k: [*lo, *hi) of the buffer */
static void held(const mpu_fsdp *f, const bucket *k, size_t *lo, size_t *hi) {
  mpu__chunk(k->end - k->start, (size_t)f->S, (size_t)f->s, lo, hi);
  *lo += k->start, *hi += k->start;
}

/* ---- creation --------------------------------------------------------------------------------- */

static mpu_result_t cut_buckets(mpu_fsdp *f, const char *fn) {
  const mpu_param_buffer *b = f->b;
  f->bk = calloc((size_t)b->nparams, sizeof *f->bk);
  if (!f->bk) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d buckets", fn, b->nparams);
  size_t limit = f->o.bucket_bytes / sizeof(float);
  for (int i = 0; i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    bucket *cur = f->nb ? &f->bk[f->nb - 1] : NULL;
    if (cur && p->offset + p->numel - cur->start <= limit) {
      cur->last = i, cur->end = p->offset + p->numel;
      continue;
    }
    cur = &f->bk[f->nb++];
    cur->first = cur->last = i, cur->start = p->offset, cur->end = p->offset + p->numel;
  }
  for (int k = 0; k < f->nb; k++) {
    bucket *c = &f->bk[k];
    c->piece = mpu__chunk(c->end - c->start, (size_t)f->S, 0, NULL, NULL);
    c->at = f->held;
    if (c->piece > ((size_t)1 << 40) / (size_t)f->S)
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
  MPU_CHECK_GOTO(mpu__adamw_agree(fn, shard, &d.adamw, d.sum, d.bucket_bytes, "strategy",
                                  (int)d.strategy, b), r, fail);
  if (replicate)
    MPU_CHECK_GOTO(mpu__adamw_agree(fn, replicate, &d.adamw, d.sum, d.bucket_bytes, "strategy",
                                    (int)d.strategy, b), r, fail);
  int world = f->S * f->R;
  f->pre = d.sum ? 1.0f : predivide_factor(world);
  f->post = d.sum ? 1.0f : (float)world / f->pre;
  MPU_CHECK_GOTO(cut_buckets(f, fn), r, fail);
  r = MPU_ERR_OUT_OF_MEMORY;
  if (!(f->p = take(f, f->held, fn)) || !(f->g = take(f, f->held, fn)) ||
      !(f->m = take(f, f->held, fn)) || !(f->v = take(f, f->held, fn)))
    goto fail;
  if (f->caller_storage)
    for (int k = 0; k < f->nb; k++) {
      size_t lo, hi;
      held(f, &f->bk[k], &lo, &hi);
      if (hi > lo) memcpy(f->p + f->bk[k].at, b->data + lo, (hi - lo) * sizeof(float));
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
    size_t n = padded(f, c);
    give(f, &c->whole, n), give(f, &c->wgrad, n), give(f, &c->staging, n), give(f, &c->rgrad, n);
  }
  free(f->bk);
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
  mpu_fsdp_span sp;
  MPU_CHECK(mpu_fsdp_param_span(f, i, &sp));
  MPU_CHECK(mpu_fsdp_reshard(f, mpu_fsdp_bucket_of(f, i))); /* the piece changes: regather */
  if (sp.hi > sp.lo) memcpy(sp.param, values + sp.lo, (sp.hi - sp.lo) * sizeof(float));
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
      memcpy(f->b->data + c->start, c->staging, (c->end - c->start) * sizeof(float));
      give(f, &c->staging, padded(f, c));
    } else {
      c->whole = c->staging, c->staging = NULL;
    }
    c->is_whole = 1;
  }
  return next >= 0 ? mpu_fsdp_prefetch(f, next) : MPU_SUCCESS;
}

mpu_result_t mpu_fsdp_reshard(mpu_fsdp *f, int k) {
  MPU_CHECK(check_bucket("mpu_fsdp_reshard", f, k));
  bucket *c = &f->bk[k];
  give(f, &c->whole, padded(f, c));
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
  size_t off = f->b->params[i].offset;
  return f->caller_storage ? f->b->data + off : f->bk[k].whole + (off - f->bk[k].start);
}

float *mpu_fsdp_grad(mpu_fsdp *f, int i) {
  int k = mpu_fsdp_bucket_of(f, i);
  if (k < 0 || !f->bk[k].is_whole) return NULL;
  size_t off = f->b->params[i].offset;
  if (f->caller_storage) return f->b->grad + off;
  bucket *c = &f->bk[k];
  if (!c->wgrad && !(c->wgrad = take(f, padded(f, c), "mpu_fsdp_grad"))) return NULL;
  return c->wgrad + (off - c->start);
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
  size_t len = c->end - c->start, n = padded(f, c);
  if (f->caller_storage) {
    if (!(c->rgrad = take(f, n, fn))) return MPU_ERR_OUT_OF_MEMORY;
    memcpy(c->rgrad, f->b->grad + c->start, len * sizeof(float));
    memset(f->b->grad + c->start, 0, len * sizeof(float));
  } else if (c->wgrad) {
    c->rgrad = c->wgrad, c->wgrad = NULL; /* the padding is still zero */
  } else if (!(c->rgrad = take(f, n, fn))) { /* no gradient reached this bucket: zeros */
    return MPU_ERR_OUT_OF_MEMORY;
  }
  if (f->pre != 1.0f)
    for (size_t i = 0; i < len; i++) c->rgrad[i] /= f->pre;
  float *mine = c->rgrad + (size_t)f->s * c->piece; /* in place: recv == send + rank * count */
  MPU_CHECK(mpu_comm_ireduce_scatter(f->shard, c->rgrad, mine, c->piece, MPU_FLOAT32, MPU_SUM,
                                     &c->reduce));
  f->pending = k;
  return mpu_fsdp_reshard(f, k);
}

mpu_result_t mpu_fsdp_param_span(const mpu_fsdp *f, int i, mpu_fsdp_span *out) {
  static const char fn[] = "mpu_fsdp_param_span";
  if (!f || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int k = mpu_fsdp_bucket_of(f, i);
  MPU_CHECK(check_bucket(fn, f, k));
  const mpu_param *p = &f->b->params[i];
  size_t lo, hi;
  held(f, &f->bk[k], &lo, &hi);
  size_t a = p->offset > lo ? p->offset : lo;
  size_t z = p->offset + p->numel < hi ? p->offset + p->numel : hi;
  memset(out, 0, sizeof *out);
  if (a >= z) return MPU_SUCCESS;
  size_t j = f->bk[k].at + (a - lo);
  out->lo = a - p->offset, out->hi = z - p->offset;
  out->param = f->p + j, out->exp_avg = f->m + j, out->exp_avg_sq = f->v + j;
  return MPU_SUCCESS;
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
    size_t lo, hi;
    held(f, c, &lo, &hi);
    for (int i = c->first; i <= c->last; i++) {
      const mpu_param *p = &f->b->params[i];
      size_t a = p->offset > lo ? p->offset : lo;
      size_t z = p->offset + p->numel < hi ? p->offset + p->numel : hi;
      for (size_t e = a; e < z; e++) fn(f, c->at + (e - lo), i, arg);
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
    if (!r) memcpy(out + c->start, w, (c->end - c->start) * sizeof(float));
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
    size_t n = padded(f, &f->bk[k]) * sizeof(float);
    if (n > m->largest_bucket) m->largest_bucket = n;
  }
  return MPU_SUCCESS;
}

void mpu_fsdp_reset_peak(mpu_fsdp *f) {
  if (f) f->peak = f->live;
}

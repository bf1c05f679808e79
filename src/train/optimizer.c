/*
 * optimizer.c - parameter buffers, data-parallel gradient reduction, AdamW
 * plain and distributed (ZeRO-1), gradient-norm clipping.
 *
 * One rule per thing: every element is updated by adamw_element, every
 * norm is summed by sum_squares over the parameters that count, every
 * bucket is cut by bucket_range; the plain and the distributed optimizer
 * differ only in which elements a rank updates and how the gradients and
 * parameters travel.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/simd.h"
#include "core/options.h"
#include "mpu/shard.h"
#include "mpu/train.h"
#include "train/adamw.h"

#define ALIGN 16 /* elements: each parameter starts on a 64-byte boundary */

/* ---- parameter buffers ---------------------------------------------------------------- */

void mpu_param_buffer_init(mpu_param_buffer *b, int tp_rank) {
  if (!b) return;
  memset(b, 0, sizeof *b);
  b->tp_rank = tp_rank;
}

mpu_result_t mpu_param_buffer_add(mpu_param_buffer *b, const char *name, size_t numel,
                                   mpu_param_attrs attrs, int *index) {
  static const char fn[] = "mpu_param_buffer_add";
  if (!b || !name) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  size_t len = strlen(name);
  if (!len || len >= sizeof b->params[0].name) /* a cut name could name another parameter */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: a parameter name of %zu characters (want 1..%zu): '%.60s%s'", fn, len,
                      sizeof b->params[0].name - 1, name, len > 60 ? "..." : "");
  if (b->finalized)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: '%s' after the buffer was finalized", fn, name);
  for (int i = 0; i < b->nparams; i++) /* names are keys: of checkpoints, of messages */
    if (!strcmp(b->params[i].name, name))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' is parameter %d already", fn, name, i);
  if (!numel || numel > ((size_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' has %zu elements", fn, name, numel);
  if (attrs.stride < 1 || (attrs.tensor_parallel && attrs.partition_dim < 0))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: '%s': a partitioned parameter needs a partition dim and a stride >= 1",
                      fn, name);
  size_t offset = (b->numel + ALIGN - 1) / ALIGN * ALIGN;
  if (offset + numel < offset || offset + numel > ((size_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the buffer would exceed 2^40 elements", fn);
  if (b->nparams == b->cap) {
    int cap = b->cap ? 2 * b->cap : 16;
    mpu_param *p = realloc(b->params, (size_t)cap * sizeof *p);
    if (!p) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d parameters", fn, cap);
    b->params = p, b->cap = cap;
  }
  mpu_param *p = &b->params[b->nparams];
  memset(p, 0, sizeof *p);
  memcpy(p->name, name, len + 1);
  p->offset = offset, p->numel = numel, p->attrs = attrs, p->decay = 1;
  b->numel = offset + numel;
  if (index) *index = b->nparams;
  b->nparams++;
  return MPU_SUCCESS;
}

mpu_result_t mpu_param_buffer_finalize(mpu_param_buffer *b, float *data, float *grad) {
  static const char fn[] = "mpu_param_buffer_finalize";
  if (!b) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL buffer", fn);
  if (b->finalized) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: finalized already", fn);
  if (!b->nparams) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: no parameters", fn);
  b->data = data ? data : mpu__zalloc_large(b->numel, sizeof(float));
  b->grad = grad ? grad : mpu__zalloc_large(b->numel, sizeof(float));
  b->owns_data = !data, b->owns_grad = !grad;
  if (!b->data || !b->grad) {
    if (b->owns_data) free(b->data);
    if (b->owns_grad) free(b->grad);
    b->data = b->grad = NULL;
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu elements", fn, b->numel);
  }
  b->finalized = 1;
  return MPU_SUCCESS;
}

size_t mpu_param_buffer_bytes(const mpu_param_buffer *b) { return b ? b->numel * sizeof(float) : 0; }

float *mpu_param_data(const mpu_param_buffer *b, int i) {
  return b && b->finalized && i >= 0 && i < b->nparams ? b->data + b->params[i].offset : NULL;
}

float *mpu_param_grad(const mpu_param_buffer *b, int i) {
  return b && b->finalized && i >= 0 && i < b->nparams ? b->grad + b->params[i].offset : NULL;
}

void mpu_param_buffer_zero_grad(mpu_param_buffer *b) {
  if (b && b->finalized) memset(b->grad, 0, b->numel * sizeof(float));
}

mpu_result_t mpu_param_buffer_set_shape(mpu_param_buffer *b, int i, int ndim,
                                        const int64_t *shape) {
  static const char fn[] = "mpu_param_buffer_set_shape";
  if (!b || !shape || i < 0 || i >= b->nparams)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no parameter %d or NULL shape", fn, i);
  if (ndim < 1 || ndim > MPU_SHARD_MAX_DIMS ||
      mpu_shard_numel(ndim, shape) != b->params[i].numel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: '%s': a shape of %d dims (1..%d) whose product is not its %zu elements",
                      fn, b->params[i].name, ndim, MPU_SHARD_MAX_DIMS, b->params[i].numel);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s': size %lld in dim %d", fn,
                        b->params[i].name, (long long)shape[d], d);
  b->params[i].ndim = ndim;
  memcpy(b->params[i].shape, shape, (size_t)ndim * sizeof *shape);
  return MPU_SUCCESS;
}

mpu_result_t mpu_param_buffer_no_decay(mpu_param_buffer *b, int i) {
  if (!b || i < 0 || i >= b->nparams)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_param_buffer_no_decay: no parameter %d", i);
  b->params[i].decay = 0;
  return MPU_SUCCESS;
}

void mpu_param_buffer_free(mpu_param_buffer *b) {
  if (!b) return;
  if (b->owns_data) free(b->data);
  if (b->owns_grad) free(b->grad);
  free(b->params);
  memset(b, 0, sizeof *b);
}

int mpu_param_counts_in_norm(const mpu_param_buffer *b, int i) {
  if (!b || i < 0 || i >= b->nparams) return 0;
  return b->params[i].attrs.tensor_parallel || b->tp_rank == 0;
}

/* ---- buckets ----------------------------------------------------------------------------- */

static mpu_result_t take_sync(const char *fn, const mpu_grad_sync_options *given,
                              mpu_grad_sync_options *o) {
  mpu_grad_sync_options d = MPU_GRAD_SYNC_OPTIONS_INIT;
  *o = d;
  if (given)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_GRAD_SYNC_OPTIONS_INIT", given, sizeof d,
                                sizeof d, o));
  if (o->bucket_bytes < sizeof(float))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: bucket_bytes %zu (want at least 4)", fn,
                      o->bucket_bytes);
  return MPU_SUCCESS;
}

/* Bucket k of a buffer cut in buckets of `bucket` elements: [*start, *end). */
static void bucket_range(size_t numel, size_t bucket, size_t k, size_t *start, size_t *end) {
  *start = k * bucket;
  *end = *start + bucket < numel ? *start + bucket : numel;
}

/* The buffer is ready and *dp is the group for its host memory (the host
 * twin of an NCCL group). */
static mpu_result_t ready(const char *fn, const mpu_param_buffer *b, mpu_comm **dp, int *size,
                          int *rank) {
  if (!b || !*dp) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL buffer or group", fn);
  if (!b->finalized) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: buffer not finalized", fn);
  MPU_CHECK(mpu__comm_for_host(*dp, fn, dp));
  MPU_CHECK(mpu_comm_size(*dp, size));
  return mpu_comm_rank(*dp, rank);
}

/* Megatron's rule: scale each gradient by 1/dp (unless summing), then sum. */
static void scale_grads(mpu_param_buffer *b, const mpu_grad_sync_options *o, int n, size_t start,
                        size_t end) {
  float scale = o->sum ? 1.0f : 1.0f / (float)n;
  if (scale != 1.0f)
    for (size_t i = start; i < end; i++) b->grad[i] *= scale;
}

mpu_result_t mpu_grad_all_reduce(mpu_param_buffer *b, mpu_comm *dp,
                                 const mpu_grad_sync_options *options) {
  static const char fn[] = "mpu_grad_all_reduce";
  mpu_grad_sync_options o;
  int n, rank;
  MPU_CHECK(take_sync(fn, options, &o));
  MPU_CHECK(ready(fn, b, &dp, &n, &rank));
  size_t bucket = o.bucket_bytes / sizeof(float), start, end;
  for (size_t k = 0; k * bucket < b->numel; k++) {
    bucket_range(b->numel, bucket, k, &start, &end);
    scale_grads(b, &o, n, start, end);
    MPU_CHECK(mpu_comm_all_reduce(dp, b->grad + start, b->grad + start, end - start, MPU_FLOAT32,
                                  MPU_SUM));
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_grad_all_reduce_start(mpu_param_buffer *b, mpu_comm *dp,
                                       const mpu_grad_sync_options *options, size_t start,
                                       size_t end, mpu_request **req) {
  static const char fn[] = "mpu_grad_all_reduce_start";
  mpu_grad_sync_options o;
  int n, rank;
  if (!req) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL request", fn);
  *req = NULL;
  MPU_CHECK(take_sync(fn, options, &o));
  MPU_CHECK(ready(fn, b, &dp, &n, &rank));
  if (start >= end || end > b->numel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: range [%zu, %zu) of a buffer of %zu elements",
                      fn, start, end, b->numel);
  scale_grads(b, &o, n, start, end);
  return mpu_comm_iall_reduce(dp, b->grad + start, b->grad + start, end - start, MPU_FLOAT32,
                              MPU_SUM, req);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

/* g[0]^2 + ... + g[n-1]^2 in double, as 16 running sums (sum k takes the
 * elements k, k + 16, ...) added in order at the end: a fixed order, so
 * every clone and machine gives the same bits, and 16 independent chains the
 * compiler vectorises, where one running sum waits for each add (about 4
 * cycles an element, 4% of the GPT demo's step at tp 1). */
MPU_SIMD_CLONES static double squares(const float *restrict g, size_t n) {
  enum { SUMS = 16 };
  double acc[SUMS] = {0};
  size_t i = 0;
  for (; n - i >= SUMS; i += SUMS)
    for (int k = 0; k < SUMS; k++) acc[k] += (double)g[i + k] * g[i + k];
  for (int k = 0; i + (size_t)k < n; k++) acc[k] += (double)g[i + k] * g[i + k];
  double s = 0;
  for (int k = 0; k < SUMS; k++) s += acc[k];
  return s;
}

/* Sum of squares of grad[start, end) over the parameters that count in the
 * norm (not tensor-parallel duplicates). */
static double sum_squares(const mpu_param_buffer *b, size_t start, size_t end) {
  double s = 0;
  for (int i = 0; i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    size_t lo = p->offset > start ? p->offset : start;
    size_t hi = p->offset + p->numel < end ? p->offset + p->numel : end;
    if (lo >= hi || !mpu_param_counts_in_norm(b, i)) continue;
    s += squares(b->grad + lo, hi - lo);
  }
  return s;
}

/* Bucket [start, end): the length of each rank's shard of it (ceil: the
 * last shards may be short or empty), and the elements this rank holds after
 * the reduction, [*lo, *hi): its shard for ZeRO-1, the whole bucket for the
 * plain optimizer. */
static size_t held_range(const mpu_optimizer *opt, size_t start, size_t end, size_t *lo,
                         size_t *hi) {
  size_t shard = mpu_shard_chunk(start, end, (size_t)opt->dp_size, (size_t)opt->dp_rank, lo, hi);
  if (!opt->distributed) *lo = start, *hi = end;
  return shard;
}

/* Run f(opt, first element, index of it into the rank's moments, count) over
 * every run of elements this rank updates, with its parameter's decay: one
 * call per run, so the element loop inside f is vectorised. */
typedef void (*element_fn)(mpu_optimizer *opt, size_t e, size_t j, size_t count, float decay,
                           void *arg);

static void for_owned(mpu_optimizer *opt, element_fn f, void *arg) {
  const mpu_param_buffer *b = opt->b;
  size_t j = 0, start, end;
  for (size_t k = 0; k * opt->bucket < b->numel; k++) {
    bucket_range(b->numel, opt->bucket, k, &start, &end);
    size_t lo, hi;
    held_range(opt, start, end, &lo, &hi);
    /* walk the parameters overlapping [lo, hi); gaps between them decay as 1 and carry 0 */
    for (int i = 0; i < b->nparams; i++) {
      const mpu_param *p = &b->params[i];
      size_t a = p->offset > lo ? p->offset : lo;
      size_t z = p->offset + p->numel < hi ? p->offset + p->numel : hi;
      if (a < z) f(opt, a, j + (a - lo), z - a, (float)p->decay, arg);
    }
    j += hi - lo;
  }
}

/* Every float option finite and in its range: an infinite lr, decay or eps
 * would turn the parameters into infinities or NaN at the first step. */
mpu_result_t mpu__adamw_check(const char *fn, const mpu_adamw_options *o) {
  static const char *const names[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad"};
  const float v[] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->clip_grad};
  static const char *const want[] = {"finite, >= 0", "in [0, 1)", "in [0, 1)", "finite, > 0",
                                     "finite, >= 0", "finite, >= 0 (0: no clipping)"};
  for (int i = 0; i < 6; i++) {
    int ok = isfinite(v[i]) && v[i] >= 0;
    if (i == 1 || i == 2) ok = ok && v[i] < 1;
    if (i == 3) ok = ok && v[i] > 0;
    if (!ok)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s %g out of range (want %s)", fn,
                        names[i], (double)v[i], want[i]);
  }
  return MPU_SUCCESS;
}

/* The options and the buffer's shape as one record every rank of a group
 * must share: ranks that step with different lr, averaging rules, buckets or
 * layouts diverge without a word, so the optimizers' inits compare them as
 * mpu_state_init compares the layout config. */
enum { FLOATS = 6, CHOICE0 = 10, AGREE_FIELDS = CHOICE0 + MPU__AGREE_CHOICES };

static void agree_value(char *out, size_t cap, int field, uint64_t x,
                        const mpu__agree_choice *choices) {
  const mpu__agree_choice *c = field >= CHOICE0 ? &choices[field - CHOICE0] : NULL;
  const char *name = c && c->name ? c->name((int)(int64_t)x) : NULL;
  if (field < FLOATS) {
    uint32_t bits = (uint32_t)x;
    float v;
    memcpy(&v, &bits, sizeof v);
    snprintf(out, cap, "%.9g", (double)v);
  } else if (name) {
    snprintf(out, cap, "%s", name);
  } else {
    snprintf(out, cap, "%lld", (long long)(int64_t)x);
  }
}

mpu_result_t mpu__adamw_agree(const char *fn, mpu_comm *group, const mpu_adamw_options *o,
                              int sum, size_t bucket_bytes, const mpu__agree_choice *choices,
                              int nchoices, const mpu_param_buffer *b) {
  const char *names[AGREE_FIELDS] = {"lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad",
                                     "bucket_bytes", "sum", "parameters", "elements"};
  if (nchoices < 0 || nchoices > MPU__AGREE_CHOICES)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d choices to compare", fn, nchoices);
  for (int c = 0; c < nchoices; c++) names[CHOICE0 + c] = choices[c].what;
  int n, rank;
  MPU_CHECK(mpu_comm_size(group, &n));
  MPU_CHECK(mpu_comm_rank(group, &rank));
  /* a rank whose collectives move no data (the fake backend) cannot see the
   * others' records, and is trusted as mpu_state_init trusts it */
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(group, &caps));
  if (n == 1 || !caps.moves_data) return MPU_SUCCESS;
  uint64_t *all = calloc((size_t)n * AGREE_FIELDS, sizeof *all);
  if (!all) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d option records", fn, n);
  uint64_t *mine = all + (size_t)rank * AGREE_FIELDS;
  const float v[FLOATS] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->clip_grad};
  for (int i = 0; i < FLOATS; i++) {
    uint32_t bits;
    memcpy(&bits, &v[i], sizeof bits); /* the bits: two ranks agree only on the same float */
    mine[i] = bits;
  }
  mine[6] = bucket_bytes, mine[7] = sum != 0;
  mine[8] = (uint64_t)b->nparams, mine[9] = b->numel;
  for (int c = 0; c < nchoices; c++) mine[CHOICE0 + c] = (uint64_t)(int64_t)choices[c].value;
  mpu_result_t r =
      mpu_comm_all_gather(group, mine, all, AGREE_FIELDS * sizeof *all, MPU_UINT8);
  for (size_t k = 1; !r && k < (size_t)n; k++)
    for (int f = 0; f < CHOICE0 + nchoices; f++)
      if (all[k * AGREE_FIELDS + f] != all[f]) {
        char a[32], z[32];
        agree_value(a, sizeof a, f, all[k * AGREE_FIELDS + f], choices);
        agree_value(z, sizeof z, f, all[f], choices);
        r = mpu__error(MPU_ERR_MISMATCH,
                       "%s: the ranks were given different optimizers: rank %zu's %s is %s, "
                       "rank 0's %s",
                       fn, k, names[f], a, z);
        break;
      }
  free(all);
  return r;
}

mpu_result_t mpu_optimizer_init(mpu_optimizer *opt, mpu_param_buffer *b, mpu_comm *dp,
                                int distributed, const mpu_adamw_options *options) {
  static const char fn[] = "mpu_optimizer_init";
  if (!opt) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL optimizer", fn);
  memset(opt, 0, sizeof *opt);
  mpu_adamw_options d = MPU_ADAMW_OPTIONS_INIT;
  opt->o = d;
  if (options)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_ADAMW_OPTIONS_INIT", options, sizeof d,
                                sizeof d, &opt->o));
  mpu_grad_sync_options sync;
  MPU_CHECK(take_sync(fn, &opt->o.sync, &sync));
  opt->o.sync = sync;
  MPU_CHECK(mpu__adamw_check(fn, &opt->o));
  MPU_CHECK(ready(fn, b, &dp, &opt->dp_size, &opt->dp_rank));
  opt->b = b, opt->dp = dp, opt->distributed = distributed != 0;
  mpu__agree_choice zero1 = {"distributed", opt->distributed, NULL};
  MPU_CHECK(mpu__adamw_agree(fn, dp, &opt->o, opt->o.sync.sum, opt->o.sync.bucket_bytes, &zero1,
                             1, b));
  size_t n = (size_t)opt->dp_size, bucket = sync.bucket_bytes / sizeof(float);
  opt->bucket = (bucket + n - 1) / n * n; /* every bucket's shards equal */
  if (opt->bucket > b->numel) opt->bucket = (b->numel + n - 1) / n * n;
  size_t start, end, lo, hi;
  for (size_t k = 0; k * opt->bucket < b->numel; k++) {
    bucket_range(b->numel, opt->bucket, k, &start, &end);
    held_range(opt, start, end, &lo, &hi);
    opt->owned += hi - lo;
  }
  size_t cells = opt->owned ? opt->owned : 1;
  opt->m = mpu__zalloc_large(cells, sizeof(float));
  opt->v = mpu__zalloc_large(cells, sizeof(float));
  opt->scratch = opt->distributed ? calloc(opt->bucket, sizeof(float)) : NULL;
  if (!opt->m || !opt->v || (opt->distributed && !opt->scratch)) {
    mpu_optimizer_free(opt);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu elements of state", fn, opt->owned);
  }
  return MPU_SUCCESS;
}

void mpu_optimizer_free(mpu_optimizer *opt) {
  if (!opt) return;
  free(opt->m), free(opt->v), free(opt->scratch);
  memset(opt, 0, sizeof *opt);
}

typedef struct step_args {
  float clip, bc1, bc2;
} step_args;

/* one run of elements, fused: clip and AdamW on the float32 parameters in
 * place (the main weights are the parameters: a value the caller wrote since
 * the last step, a loaded checkpoint or an edit, is what this step updates,
 * as torch's AdamW updates p.data in place; no copy of them is kept, which
 * would be one more array written each step that nothing reads) */
MPU_SIMD_CLONES static void update_run(float *restrict m, float *restrict v, float *restrict data,
                                       const float *restrict grad, size_t count, float decay,
                                       const mpu_adamw_options *o, const step_args *a) {
  mpu_adamw_options oc = *o; /* locals: no aliasing with the arrays */
  float clip = a->clip, bc1 = a->bc1, bc2 = a->bc2;
  for (size_t i = 0; i < count; i++)
    mpu__adamw_element(&data[i], grad[i] * clip, &m[i], &v[i], decay, &oc, bc1, bc2);
}

static void update(mpu_optimizer *opt, size_t e, size_t j, size_t count, float decay, void *arg) {
  update_run(opt->m + j, opt->v + j, opt->b->data + e, opt->b->grad + e, count, decay, &opt->o,
             arg);
}

/* counts[k]: how many elements of bucket [start, end) rank k holds (shards
 * of any size: the last ones short or empty, nothing padded). */
static mpu_result_t shard_counts(const mpu_optimizer *opt, size_t start, size_t end,
                                 size_t **counts) {
  size_t n = (size_t)opt->dp_size, lo, hi;
  *counts = malloc(n * sizeof **counts);
  if (!*counts) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "ZeRO-1: %zu shard counts", n);
  for (size_t k = 0; k < n; k++) {
    mpu_shard_chunk(start, end, n, k, &lo, &hi);
    (*counts)[k] = hi - lo;
  }
  return MPU_SUCCESS;
}

/* ZeRO-1's gradient half: reduce-scatter each bucket (uneven shards, as they
 * fall); this rank's shard of the reduced gradient lands in the buffer. */
static mpu_result_t reduce_scatter_grads(mpu_optimizer *opt) {
  mpu_param_buffer *b = opt->b;
  size_t n = (size_t)opt->dp_size, start, end, lo, hi, *counts = NULL;
  float scale = opt->o.sync.sum ? 1.0f : 1.0f / (float)n;
  mpu_result_t r = MPU_SUCCESS;
  for (size_t k = 0; !r && k * opt->bucket < b->numel; k++) {
    bucket_range(b->numel, opt->bucket, k, &start, &end);
    held_range(opt, start, end, &lo, &hi);
    for (size_t i = start; i < end; i++) opt->scratch[i - start] = b->grad[i] * scale;
    r = shard_counts(opt, start, end, &counts);
    if (!r) r = mpu_comm_reduce_scatter_v(opt->dp, opt->scratch, b->grad + lo, counts,
                                          MPU_FLOAT32, MPU_SUM);
    free(counts);
  }
  return r;
}

/* ZeRO-1's parameter half: all-gather each bucket's updated shards, in place. */
static mpu_result_t gather_params(mpu_optimizer *opt) {
  mpu_param_buffer *b = opt->b;
  size_t start, end, lo, hi, *counts = NULL;
  mpu_result_t r = MPU_SUCCESS;
  for (size_t k = 0; !r && k * opt->bucket < b->numel; k++) {
    bucket_range(b->numel, opt->bucket, k, &start, &end);
    held_range(opt, start, end, &lo, &hi);
    r = shard_counts(opt, start, end, &counts);
    if (!r) r = mpu_comm_all_gather_v(opt->dp, b->data + lo, b->data + start, counts, NULL,
                                      MPU_FLOAT32);
    free(counts);
  }
  return r;
}

/* Sum of squares of the gradients this optimizer's rank holds (after the reduction). */
static double held_squares(const mpu_optimizer *opt) {
  double sq = 0;
  size_t start, end, lo, hi;
  for (size_t k = 0; k * opt->bucket < opt->b->numel; k++) {
    bucket_range(opt->b->numel, opt->bucket, k, &start, &end);
    held_range(opt, start, end, &lo, &hi);
    sq += sum_squares(opt->b, lo, hi);
  }
  return sq;
}

mpu_result_t mpu__grad_norm(const char *fn, double sq, mpu_comm *norm_group, float *grad_norm,
                           float *norm) {
  if (norm_group) MPU_CHECK(mpu__comm_for_host(norm_group, fn, &norm_group));
  if (norm_group) MPU_CHECK(mpu_comm_all_reduce(norm_group, &sq, &sq, 1, MPU_FLOAT64, MPU_SUM));
  *norm = (float)sqrt(sq);
  if (grad_norm) *grad_norm = *norm;
  if (!isfinite(*norm))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the gradient norm is %g (no update made)", fn,
                      *norm);
  return MPU_SUCCESS;
}

static int by_buffer(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const mpu__stepped *)a)->b;
  uintptr_t y = (uintptr_t)((const mpu__stepped *)b)->b;
  return x < y ? -1 : x > y;
}

mpu_result_t mpu__step_all_check(const char *fn, const char *what, mpu__stepped *e, int n) {
  for (int i = 0; i < n; i++) {
    if (e[i].step < 0 || e[i].step == INT64_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s %d has done %lld steps (want 0 to %lld: the next step's count "
                        "must fit in int64); nothing was changed",
                        fn, what, i, (long long)e[i].step, (long long)INT64_MAX - 1);
    e[i].index = i;
  }
  qsort(e, (size_t)n, sizeof *e, by_buffer); /* n log n: any number of entries */
  for (int i = 1; i < n; i++)
    if (e[i].b == e[i - 1].b) {
      int a = e[i - 1].index < e[i].index ? e[i - 1].index : e[i].index;
      int z = e[i - 1].index < e[i].index ? e[i].index : e[i - 1].index;
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %ss %d and %d step the same parameter buffer (it would be updated "
                        "twice and counted twice in the norm); nothing was changed",
                        fn, what, a, z);
    }
  return MPU_SUCCESS;
}

mpu_result_t mpu_optimizer_step_all(mpu_optimizer *const *opts, int n, mpu_comm *norm_group,
                                    float *grad_norm) {
  static const char fn[] = "mpu_optimizer_step_all";
  if (!opts || n < 1) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no optimizers", fn);
  for (int i = 0; i < n; i++) {
    if (!opts[i] || !opts[i]->b)
      return mpu__error(MPU_ERR_INVALID_USAGE, "%s: optimizer %d not initialized", fn, i);
    if (opts[i]->distributed && opts[i]->grads_reduced) {
      opts[i]->grads_reduced = 0;
      return mpu__error(MPU_ERR_INVALID_USAGE,
                        "%s: optimizer %d is distributed (ZeRO-1): it reduce-scatters the "
                        "gradients itself and cannot take all-reduced ones (grads_reduced)", fn, i);
    }
  }
  mpu__stepped *e = malloc((size_t)n * sizeof *e);
  if (!e) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d optimizers", fn, n);
  for (int i = 0; i < n; i++) e[i].b = opts[i]->b, e[i].step = opts[i]->step;
  mpu_result_t checked = mpu__step_all_check(fn, "optimizer", e, n);
  free(e);
  MPU_CHECK(checked);
  double sq = 0;
  for (int i = 0; i < n; i++) {
    mpu_optimizer *opt = opts[i];
    int reduced = opt->grads_reduced;
    opt->grads_reduced = 0; /* for this step only */
    if (opt->distributed) MPU_CHECK(reduce_scatter_grads(opt));
    else if (!reduced) MPU_CHECK(mpu_grad_all_reduce(opt->b, opt->dp, &opt->o.sync));
    sq += held_squares(opt); /* the norm over what this rank holds, summed over the group */
  }
  float norm;
  MPU_CHECK(mpu__grad_norm(fn, sq, norm_group, grad_norm, &norm));
  for (int i = 0; i < n; i++) {
    mpu_optimizer *opt = opts[i];
    step_args a = {mpu__clip_coeff(opt->o.clip_grad, norm), 0, 0};
    opt->step++;
    a.bc1 = 1.0f - powf(opt->o.beta1, (float)opt->step);
    a.bc2 = 1.0f - powf(opt->o.beta2, (float)opt->step);
    for_owned(opt, update, &a);
    if (opt->distributed) MPU_CHECK(gather_params(opt));
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_optimizer_set_grads_reduced(mpu_optimizer *opt, int reduced) {
  static const char fn[] = "mpu_optimizer_set_grads_reduced";
  if (!opt || !opt->b) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: optimizer not initialized", fn);
  if (reduced && opt->distributed)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: the optimizer is distributed (ZeRO-1): it reduce-scatters the "
                      "gradients itself and cannot take all-reduced ones (grads_reduced)", fn);
  opt->grads_reduced = reduced != 0;
  return MPU_SUCCESS;
}

mpu_result_t mpu_optimizer_step(mpu_optimizer *opt, mpu_comm *norm_group, float *grad_norm) {
  if (!opt || !opt->b)
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_optimizer_step: optimizer not initialized");
  return mpu_optimizer_step_all(&opt, 1, norm_group, grad_norm);
}

mpu_result_t mpu_optimizer_param_shard(const mpu_optimizer *opt, int index, mpu_shard *out) {
  static const char fn[] = "mpu_optimizer_param_shard";
  if (!opt || !opt->b || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL or uninitialized argument", fn);
  mpu_shard s;
  MPU_CHECK(mpu__param_local_shard(fn, opt->b, index, &s));
  const mpu_param *p = &opt->b->params[index];
  size_t j = 0, start, end, lo, hi;
  for (size_t k = 0; k * opt->bucket < opt->b->numel; k++) {
    bucket_range(opt->b->numel, opt->bucket, k, &start, &end);
    held_range(opt, start, end, &lo, &hi);
    size_t a = p->offset > lo ? p->offset : lo;
    size_t z = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    if (a < z) MPU_CHECK(mpu_shard_keep(&s, a - p->offset, z - p->offset, j + (a - lo)));
    j += hi - lo;
  }
  *out = s;
  return MPU_SUCCESS;
}

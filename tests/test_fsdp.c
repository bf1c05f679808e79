/*
 * test_fsdp.c - sharded parameter buffers: ZeRO-2, FSDP (ZeRO-3) and HSDP
 * against one rank.
 *
 * A small MLP (L layers of tanh(W h + b), squared error) trained K steps
 * with AdamW and clipping: on one rank with the whole batch and the plain
 * mpu_optimizer (the reference), and on 8 thread ranks with every strategy
 * over meshes (8), (2, 4) and (4, 2), each rank taking its slice of the
 * batch, buckets whose sizes do not divide by the shard size (71, 151 and
 * single parameters of 49 and 7 elements), with the buffer in the caller's
 * memory and in the sharded buffer's own. The parameters after K steps and
 * the last step's reduced gradient pieces must equal the reference's. A
 * second test measures the peak bytes per rank as S grows. A bucket
 * prefetched before a step, a checkpoint load or set_param is gathered
 * anew by the next unshard; a step of several buffers refuses one twice and
 * a step count that cannot grow. Under MPI
 * (MPU_TEST_MPI=1, mpirun -n 8) the same cases run on the processes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

#define MPU_CHECK_OR(call)    \
  do {                        \
    mpu_result_t r_ = (call); \
    if (r_) return r_;        \
  } while (0)

enum { MAXL = 8, MAXN = 64, K = 3, BATCH = 16 };

typedef struct model {
  int L, n;
} model;

/* the parameters of the buffer: W_l (index 2l, n x n), b_l (2l + 1, n) */
static void add_params(mpu_param_buffer *b, const model *m) {
  mpu_param_buffer_init(b, 0);
  for (int l = 0; l < m->L; l++) {
    char name[32];
    int i;
    snprintf(name, sizeof name, "w%d", l);
    mpu_param_buffer_add(b, name, (size_t)(m->n * m->n), MPU_PARAM_DUPLICATE, &i);
    snprintf(name, sizeof name, "b%d", l);
    mpu_param_buffer_add(b, name, (size_t)m->n, MPU_PARAM_DUPLICATE, &i);
    mpu_param_buffer_no_decay(b, i);
  }
}

static float init_value(int p, size_t j, int n) {
  return (p % 2 ? 0.05f : 0.6f / sqrtf((float)n)) * sinf(1.3f * (float)j + 0.7f * (float)p);
}

static void sample(int s, int n, float *x, float *t) {
  for (int j = 0; j < n; j++) {
    x[j] = cosf(0.37f * (float)(s * n + j));
    t[j] = 0.5f * sinf(0.11f * (float)(s + 3 * j));
  }
}

/* where a layer's parameters and gradients are now */
typedef float *(*param_fn)(void *owner, int i);

/* Forward and backward of samples [s0, s0 + ns) of a global batch of
 * `batch`, adding d(mean loss)/d(param) into the gradients. hooks (may be
 * NULL) run before and after each layer. */
typedef struct hooks {
  mpu_result_t (*before)(void *owner, int layer, int backward);
  mpu_result_t (*after)(void *owner, int layer, int backward);
} hooks;

static mpu_result_t train_batch(const model *m, void *owner, param_fn data, param_fn grad,
                                const hooks *h, int s0, int ns, int local_batch) {
  int n = m->n, L = m->L;
  float *act = calloc((size_t)(ns * (L + 1) * n), sizeof(float));
  float *t = calloc((size_t)(ns * n), sizeof(float)), *dh = calloc((size_t)(ns * n), sizeof(float));
  float *dz = calloc((size_t)n, sizeof(float));
  mpu_result_t r = act && t && dh && dz ? MPU_SUCCESS : MPU_ERR_OUT_OF_MEMORY;
  for (int s = 0; s < ns && !r; s++) sample(s0 + s, n, act + (size_t)s * (L + 1) * n, t + s * n);
  for (int l = 0; l < L && !r; l++) {
    if (h && (r = h->before(owner, l, 0))) break;
    const float *W = data(owner, 2 * l), *b = data(owner, 2 * l + 1);
    if (!W || !b) r = mpu_fail(MPU_ERR_INTERNAL, "layer %d's parameters are not whole", l);
    for (int s = 0; s < ns && !r; s++) {
      float *in = act + ((size_t)s * (L + 1) + l) * n, *out = in + n;
      for (int i = 0; i < n; i++) {
        float z = b[i];
        for (int j = 0; j < n; j++) z += W[i * n + j] * in[j];
        out[i] = tanhf(z);
      }
    }
    if (!r && h) r = h->after(owner, l, 0);
  }
  for (int s = 0; s < ns && !r; s++) /* d(0.5 * mean squared error) */
    for (int i = 0; i < n; i++)
      dh[s * n + i] = (act[((size_t)s * (L + 1) + L) * n + i] - t[s * n + i]) / (float)local_batch;
  for (int l = L - 1; l >= 0 && !r; l--) {
    if (h && (r = h->before(owner, l, 1))) break;
    const float *W = data(owner, 2 * l);
    float *dW = grad(owner, 2 * l), *db = grad(owner, 2 * l + 1);
    if (!W || !dW || !db) r = mpu_fail(MPU_ERR_INTERNAL, "layer %d is not whole in backward", l);
    for (int s = 0; s < ns && !r; s++) {
      const float *in = act + ((size_t)s * (L + 1) + l) * n, *out = in + n;
      float *d = dh + s * n;
      for (int i = 0; i < n; i++) dz[i] = d[i] * (1 - out[i] * out[i]);
      for (int i = 0; i < n; i++) {
        db[i] += dz[i];
        for (int j = 0; j < n; j++) dW[i * n + j] += dz[i] * in[j];
      }
      for (int j = 0; j < n; j++) {
        float v = 0;
        for (int i = 0; i < n; i++) v += W[i * n + j] * dz[i];
        d[j] = v;
      }
    }
    if (!r && h) r = h->after(owner, l, 1);
  }
  free(act), free(t), free(dh), free(dz);
  return r;
}

/* ---- the reference: one rank, the whole batch, the plain optimizer ------------------------------- */

static mpu_adamw_options adamw(void) {
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.lr = 0.02f, o.weight_decay = 0.1f, o.clip_grad = 0.5f;
  return o;
}

static float *buf_data(void *b, int i) { return mpu_param_data(b, i); }
static float *buf_grad(void *b, int i) { return mpu_param_grad(b, i); }

typedef struct reference {
  model m;
  mpu_param_buffer b;  /* its parameters and its last step's averaged gradient */
} reference;

static mpu_result_t reference_rank(mpu_comm *world, void *arg) {
  reference *ref = arg;
  add_params(&ref->b, &ref->m);
  mpu_result_t r = mpu_param_buffer_finalize(&ref->b, NULL, NULL);
  for (int p = 0; !r && p < ref->b.nparams; p++)
    for (size_t j = 0; j < ref->b.params[p].numel; j++)
      mpu_param_data(&ref->b, p)[j] = init_value(p, j, ref->m.n);
  mpu_adamw_options o = adamw();
  mpu_optimizer opt;
  if (!r) r = mpu_optimizer_init(&opt, &ref->b, world, 0, &o);
  for (int k = 0; k < K && !r; k++) {
    mpu_param_buffer_zero_grad(&ref->b);
    r = train_batch(&ref->m, &ref->b, buf_data, buf_grad, NULL, 0, BATCH, BATCH);
    if (!r) r = mpu_optimizer_step(&opt, NULL, NULL);
  }
  mpu_optimizer_free(&opt);
  return r;
}

/* ---- the sharded runs ------------------------------------------------------------------------------ */

typedef struct sharded {
  model m;
  int mdim;
  int64_t mshape[2];
  mpu_shard_strategy strategy;
  int flat;              /* FULL/GRAD_OP on a 2-d mesh: shard over both dims */
  size_t bucket_bytes;
  int caller_memory;
  const reference *ref;
  int bad[8];            /* per rank: parameters or gradients that differ */
  mpu_fsdp_memory mem[8];
  int lean;              /* no prefetch, each reduction finished before the next bucket */
  mpu_fsdp_layout layout;
} sharded;

typedef struct owner {
  mpu_fsdp *f;
  int nb;
  int L, lean;
} owner;

static float *fsdp_data(void *o, int i) { return mpu_fsdp_param(((owner *)o)->f, i); }
static float *fsdp_grad(void *o, int i) { return mpu_fsdp_grad(((owner *)o)->f, i); }

/* Layer l's buckets: [first, last] */
static void layer_buckets(const owner *o, int l, int *first, int *last) {
  *first = mpu_fsdp_bucket_of(o->f, 2 * l), *last = mpu_fsdp_bucket_of(o->f, 2 * l + 1);
}

static mpu_result_t before(void *arg, int l, int backward) {
  owner *o = arg;
  int a, z;
  layer_buckets(o, l, &a, &z);
  if (!backward) {
    for (int k = a; k <= z; k++)
      MPU_CHECK_OR(mpu_fsdp_unshard(o->f, k, k + 1 < o->nb && !o->lean ? k + 1 : -1));
  } else {
    for (int k = z; k >= a; k--) MPU_CHECK_OR(mpu_fsdp_unshard(o->f, k, o->lean ? -1 : k - 1));
  }
  return MPU_SUCCESS;
}

static mpu_result_t after(void *arg, int l, int backward) {
  owner *o = arg;
  int a, z;
  layer_buckets(o, l, &a, &z);
  if (!backward) { /* a bucket is done once no later layer needs it */
    int next = l + 1 < o->L ? mpu_fsdp_bucket_of(o->f, 2 * l + 2) : o->nb;
    for (int k = a; k <= z; k++)
      if (k < next) MPU_CHECK_OR(mpu_fsdp_forward_done(o->f, k));
  } else {
    int prev = l > 0 ? mpu_fsdp_bucket_of(o->f, 2 * l - 1) : -1;
    for (int k = z; k >= a; k--)
      if (k > prev) {
        MPU_CHECK_OR(mpu_fsdp_backward_done(o->f, k));
        if (o->lean) MPU_CHECK_OR(mpu_fsdp_sync_grads(o->f));
      }
  }
  return MPU_SUCCESS;
}

static mpu_result_t make_groups(mpu_comm *world, const sharded *c, mpu_device_mesh **dm,
                                mpu_comm **shard, mpu_comm **rep) {
  const char *names[2] = {"replicate", "shard"};
  const char *one[1] = {"shard"};
  MPU_CHECK_OR(mpu_device_mesh_init(world, c->mdim, c->mshape, c->mdim == 1 ? one : names,
                                    MPU_MESH_EAGER, dm));
  *rep = NULL;
  if (c->mdim == 1) return mpu_device_mesh_comm(*dm, 0, shard);
  if (c->flat) {
    int dims[2] = {0, 1};
    return mpu_device_mesh_group_comm(*dm, NULL, dims, 2, shard);
  }
  MPU_CHECK_OR(mpu_device_mesh_comm(*dm, 0, rep));
  return mpu_device_mesh_comm(*dm, 1, shard);
}

static int close_to(float a, float b, float scale) {
  return fabsf(a - b) <= 1e-5f * scale + 1e-4f * fabsf(b);
}

/* This rank's pieces against torch's layouts, derived here from their
 * sources: FSDP1 (torch/distributed/fsdp/_flat_param.py, use_orig_params=
 * False) concatenates a unit's parameters with no gap and gives rank s
 * torch.chunk's piece s of the concatenation (FlatParamHandle.
 * _get_unpadded_shard), padded at its end to ceil(n / S); FSDP2
 * (_fully_shard/_fsdp_param.py, _init_sharded_param) gives rank s piece s
 * of torch.chunk along dim 0 of each parameter, padded to ceil(rows / S)
 * rows, one parameter after another (foreach_all_gather's input). Each
 * parameter's span must be that, its gradient the reference's, the padding
 * zero; returns the number of differences. */
static int check_pieces(mpu_fsdp *f, const mpu_param_buffer *b, const mpu_param_buffer *rb,
                        mpu_comm *shard, mpu_fsdp_layout layout) {
  int s, S, bad = 0;
  mpu_comm_rank(shard, &s), mpu_comm_size(shard, &S);
  size_t held, total = 0;
  const float *g = mpu_fsdp_shard_grads(f, &held);
  float gmax = 0;
  for (size_t e = 0; e < rb->numel; e++) gmax = fmaxf(gmax, fabsf(rb->grad[e]));
  unsigned char *covered = calloc(held + 1, 1);
  for (int k = 0; covered && k < mpu_fsdp_nbuckets(f); k++) {
    size_t flat = 0, want = 0, piece;
    mpu_fsdp_bucket_range(f, k, NULL, NULL, &piece);
    for (int i = 0; i < b->nparams; i++) {
      if (mpu_fsdp_bucket_of(f, i) != k) continue;
      size_t n = b->params[i].numel, rows = b->params[i].ndim ? (size_t)b->params[i].shape[0] : n;
      size_t lo, hi;
      if (layout == MPU_FSDP_FLAT) { /* rank s's flat elements [c s, c (s + 1)) of the unit */
        size_t c = 0;
        for (int j = 0; j < b->nparams; j++)
          c += mpu_fsdp_bucket_of(f, j) == k ? b->params[j].numel : 0;
        c = (c + (size_t)S - 1) / (size_t)S;
        size_t a = c * (size_t)s, z = a + c;
        lo = a > flat ? a - flat : 0, hi = z > flat ? z - flat : 0;
        if (lo > n) lo = n;
        if (hi > n) hi = n;
      } else { /* rows [r s, r (s + 1)) of the parameter, r = ceil(rows / S) */
        size_t r = (rows + (size_t)S - 1) / (size_t)S, w = n / rows;
        lo = r * (size_t)s * w, hi = r * ((size_t)s + 1) * w;
        if (lo > n) lo = n;
        if (hi > n) hi = n;
        want += r * w;
      }
      flat += n;
      mpu_shard ps;
      if (mpu_fsdp_param_shard(f, i, &ps) || ps.nspans > 1) return bad + 1;
      mpu_shard_span sp = ps.nspans ? ps.spans[0] : (mpu_shard_span){0, 0, 0};
      if (lo >= hi) lo = hi = 0;
      if (sp.lo != lo || sp.hi != hi) bad++;
      for (size_t j = 0; j < sp.hi - sp.lo; j++) {
        size_t at = sp.at + j;
        covered[at] = 1;
        if (!close_to(g[at], rb->grad[rb->params[i].offset + sp.lo + j], gmax)) bad++;
      }
    }
    if (layout == MPU_FSDP_FLAT) want = (flat + (size_t)S - 1) / (size_t)S;
    if (piece != want) bad++;
    total += piece;
  }
  for (size_t j = 0; covered && j < held; j++)
    if (!covered[j] && g[j] != 0.0f) bad++; /* the padding stays zero */
  if (!covered || total != held) bad++;
  free(covered);
  return bad;
}

static mpu_result_t sharded_rank(mpu_comm *world, void *arg) {
  sharded *c = arg;
  int rank, world_size;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &world_size);
  mpu_device_mesh *dm = NULL;
  mpu_comm *shard, *rep;
  mpu_param_buffer b;
  mpu_fsdp *f = NULL;
  float *full = NULL;
  add_params(&b, &c->m);
  mpu_result_t r = make_groups(world, c, &dm, &shard, &rep);
  if (!r && c->caller_memory) {
    r = mpu_param_buffer_finalize(&b, NULL, NULL);
    for (int p = 0; !r && p < b.nparams; p++)
      for (size_t j = 0; j < b.params[p].numel; j++)
        mpu_param_data(&b, p)[j] = init_value(p, j, c->m.n);
  }
  mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
  o.strategy = c->strategy, o.bucket_bytes = c->bucket_bytes, o.adamw = adamw();
  o.layout = c->layout;
  for (int p = 0; !r && p < b.nparams; p++) { /* w (n, n), b (n): FSDP2 cuts dim 0 */
    int64_t shape[2] = {c->m.n, c->m.n};
    r = mpu_param_buffer_set_shape(&b, p, p % 2 ? 1 : 2, shape);
  }
  if (!r) r = mpu_fsdp_create(&b, shard, rep, &o, &f);
  float values[MAXN * MAXN];
  for (int p = 0; !r && !c->caller_memory && p < b.nparams; p++) {
    for (size_t j = 0; j < b.params[p].numel; j++) values[j] = init_value(p, j, c->m.n);
    r = mpu_fsdp_set_param(f, p, values);
  }
  owner ow = {f, mpu_fsdp_nbuckets(f), c->m.L, c->lean};
  hooks h = {before, after};
  int local = BATCH / world_size;
  for (int k = 0; k < K && !r; k++) {
    mpu_fsdp_zero_grad(f);
    r = train_batch(&c->m, &ow, fsdp_data, fsdp_grad, &h, rank * local, local, local);
    if (!r) r = mpu_fsdp_step(f, NULL, NULL);
  }
  if (!r) r = mpu_fsdp_memory_usage(f, &c->mem[rank]);
  /* the parameters, gathered, and this rank's pieces of the last gradient */
  const mpu_param_buffer *rb = &c->ref->b;
  full = r ? NULL : malloc(b.numel * sizeof(float));
  if (!r && !full) r = MPU_ERR_OUT_OF_MEMORY;
  if (!r) r = mpu_fsdp_gather_params(f, full);
  float gmax = 0;
  for (size_t e = 0; e < rb->numel; e++) gmax = fmaxf(gmax, fabsf(rb->grad[e]));
  for (int p = 0; !r && p < b.nparams; p++)
    for (size_t j = 0; j < b.params[p].numel; j++) {
      size_t e = b.params[p].offset + j;
      if (!close_to(full[e], rb->data[e], 1.0f)) c->bad[rank]++;
    }
  if (!r) c->bad[rank] += check_pieces(f, &b, rb, shard, c->layout);
  free(full);
  mpu_fsdp_free(f);
  mpu_param_buffer_free(&b);
  mpu_device_mesh_free(dm);
  return r;
}

#ifndef MPU_TEST_FSDP_MPI
static reference the_reference(const model *m) {
  reference ref = {*m, {0}};
  mpu_result_t r = mpu_launch(1, reference_rank, &ref, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  return ref;
}

static void run_case(sharded *c) {
  int n = (int)(c->mshape[0] * (c->mdim == 2 ? c->mshape[1] : 1));
  mpu_result_t r = mpu_launch(n, sharded_rank, c, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  for (int k = 0; k < n; k++) {
    if (c->bad[k])
      fprintf(stderr, "%s %s on (%lld%s%lld) bucket %zu bytes, %s memory: rank %d has %d "
              "differences\n", mpu_fsdp_layout_name(c->layout),
              mpu_shard_strategy_name(c->strategy), (long long)c->mshape[0],
              c->mdim == 2 ? ", " : "", c->mdim == 2 ? (long long)c->mshape[1] : 0LL,
              c->bucket_bytes, c->caller_memory ? "caller" : "own", k, c->bad[k]);
    assert_int_equal(c->bad[k], 0);
  }
}

#endif

/* Every strategy on meshes (8), (2, 4), (4, 2), buckets of 71 and 151
 * elements and of one parameter (49, 7), both storages, in FSDP1's flat
 * layout; and FSDP2's per-parameter layout with the buckets of 71 and of one
 * parameter: run(c) each. */
static int every_case(const reference *ref, void (*run)(sharded *c, void *arg), void *arg) {
  static const int64_t meshes[3][3] = {{1, 8, 0}, {2, 2, 4}, {2, 4, 2}};
  static const size_t buckets[3] = {71 * 4, 151 * 4, 4};
  int cases = 0;
  for (int lay = 0; lay < 2; lay++)
  for (int mi = 0; mi < 3; mi++)
    for (int st = 0; st < 4; st++)
      for (int flat = 0; flat < (meshes[mi][0] == 2 ? 2 : 1); flat++)
        for (int bi = 0; bi < 3; bi++)
          for (int cm = 0; cm < 2; cm++) {
            int hybrid = st == MPU_SHARD_HYBRID || st == MPU_SHARD_HYBRID_ZERO2;
            if (meshes[mi][0] == 1 && hybrid) continue; /* hybrid needs two dims */
            if (meshes[mi][0] == 2 && hybrid == flat) continue;
            if (lay == MPU_FSDP_PER_PARAM && bi == 1) continue;
            sharded c = {ref->m, (int)meshes[mi][0], {meshes[mi][1], meshes[mi][2]},
                         (mpu_shard_strategy)st, flat, buckets[bi], cm, ref, {0}, {{0}}, 0,
                         (mpu_fsdp_layout)lay};
            run(&c, arg);
            cases++;
          }
  return cases;
}

static const model small = {4, 7}; /* a layer: w 49 elements at 0, b 7 at 64: 71; the next at 80 */

#ifndef MPU_TEST_FSDP_MPI
static void run_threads(sharded *c, void *arg) {
  (void)arg;
  run_case(c);
}

static void test_strategies_equal_one_rank(void **state) {
  (void)state;
  reference ref = the_reference(&small);
  int flat_cases = 2 * 3 * 2 + 2 * (4 * 3 * 2); /* FSDP1; FSDP2 with two of the three buckets */
  assert_int_equal(every_case(&ref, run_threads, NULL), flat_cases + flat_cases * 2 / 3);
  mpu_param_buffer_free(&ref.b);
}

/* Peak bytes per rank for parameters + gradients + AdamW state (with the
 * whole buckets in flight) fall as 1/S: within 10% of the one-rank state
 * over S, plus the working set of whole buckets. */
static void test_memory_falls_as_one_over_s(void **state) {
  (void)state;
  model m = {8, 64}; /* a layer: 4096 + 64 = 4160 elements */
  reference ref = the_reference(&m);
  for (int lean = 0; lean < 2; lean++) {
    size_t one_rank = 0;
    for (int S = 1; S <= 8; S *= 2) {
      sharded c = {m, 1, {S, 0}, MPU_SHARD_FULL, 0, 4160 * 4, 0, &ref, {0}, {{0}}, lean,
                   MPU_FSDP_FLAT};
      run_case(&c);
      const mpu_fsdp_memory *mm = &c.mem[S - 1];
      size_t state_bytes = mm->params + mm->grads + mm->optimizer;
      if (S == 1) one_rank = state_bytes;
      /* whole buckets at once: the one computed and its gradient; overlapped, also the next
       * one's gather and the previous one's reduction in flight */
      size_t working = (lean ? 2 : 4) * mm->largest_bucket;
      printf("%s S=%d: params+grads+AdamW %zu bytes, peak %zu bytes (one-rank state / S = %zu, "
             "one bucket %zu)\n", lean ? "lean      " : "overlapped", S, state_bytes, mm->peak,
             one_rank / (size_t)S, mm->largest_bucket);
      assert_true((double)state_bytes <= 1.1 * (double)one_rank / S);
      assert_true((double)mm->peak <= 1.1 * (double)one_rank / S + (double)working);
      assert_true(mm->peak >= state_bytes + working - mm->largest_bucket);
      assert_int_equal(mm->unsharded, 0);
      for (int k = 1; k < S; k++) assert_int_equal(c.mem[k].peak, c.mem[0].peak);
    }
  }
  mpu_param_buffer_free(&ref.b);
}

/* Bad input: clear errors, no crash. */
static void test_bad_input(void **state) {
  (void)state;
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 2, &fake), 0);
  mpu_param_buffer b;
  model m = {1, 3};
  add_params(&b, &m);
  mpu_fsdp *f = NULL;
  mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
  o.strategy = MPU_SHARD_HYBRID;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "needs a replicate group"));
  o.strategy = MPU_SHARD_FULL;
  assert_int_equal(mpu_fsdp_create(&b, fake, fake, &o, &f), MPU_ERR_INVALID_ARGUMENT);
  o.strategy = (mpu_shard_strategy)9;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), MPU_ERR_INVALID_ARGUMENT);
  o.strategy = MPU_SHARD_GRAD_OP, o.adamw.beta1 = 2;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), MPU_ERR_INVALID_ARGUMENT);
  o.adamw.beta1 = 0.9f;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), MPU_SUCCESS);
  assert_int_equal(mpu_fsdp_nbuckets(f), 1);
  assert_int_equal(mpu_fsdp_unshard(f, 1, -1), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_fsdp_unshard(f, 0, 5), MPU_ERR_INVALID_ARGUMENT);
  assert_null(mpu_fsdp_param(f, 0)); /* not whole */
  assert_int_equal(mpu_fsdp_set_param(f, 7, (float[1]){0}), MPU_ERR_INVALID_ARGUMENT);
  mpu_shard_strategy s;
  assert_int_equal(mpu_shard_strategy_from_name("hybrid_shard", &s), 0);
  assert_int_equal(s, MPU_SHARD_HYBRID);
  assert_int_equal(mpu_shard_strategy_from_name("zero2", &s), 0);
  assert_int_equal(s, MPU_SHARD_GRAD_OP);
  assert_int_equal(mpu_shard_strategy_from_name("zero9", &s), MPU_ERR_INVALID_ARGUMENT);
  assert_string_equal(mpu_shard_strategy_name(MPU_SHARD_HYBRID_ZERO2), "_HYBRID_SHARD_ZERO2");
  mpu_fsdp_free(f);
  mpu_param_buffer_free(&b);
  mpu_comm_destroy(fake);
}

/* ---- what a prefetch carries when the pieces change under it --------------------------------- */

enum { FRESH_RANKS = 2 };
static char fresh_dir[64];

/* Bucket 0 whole: every parameter equals the pieces gathered now, and they
 * differ from `before` (want_change) or not; 1 and a message if not. */
static int stale(const char *what, int caller, mpu_fsdp *f, const mpu_param_buffer *b,
                 const float *before, int want_change) {
  float *now = malloc(b->numel * sizeof *now);
  int bad = !now || mpu_fsdp_gather_params(f, now) != 0, changed = 0;
  for (int i = 0; !bad && i < b->nparams; i++) {
    const float *w = mpu_fsdp_param(f, i);
    if (!w) bad = 1;
    for (size_t j = 0; !bad && j < b->params[i].numel; j++) {
      bad = w[j] != now[b->params[i].offset + j];
      changed += now[b->params[i].offset + j] != before[b->params[i].offset + j];
    }
  }
  free(now);
  if (bad || !changed != !want_change)
    fprintf(stderr, "%s, %s storage: %s\n", what, caller ? "the caller's" : "its own",
            bad ? "the whole parameters are not the pieces" : "the pieces did not change as asked");
  return bad || !changed != !want_change;
}

/* Set every parameter to init_value(p + shift) (each rank keeps its piece). */
static mpu_result_t set_all(mpu_fsdp *f, const mpu_param_buffer *b, int n, int shift) {
  float v[MAXN * MAXN];
  for (int p = 0; p < b->nparams; p++) {
    for (size_t j = 0; j < b->params[p].numel; j++) v[j] = init_value(p + shift, j, n);
    MPU_CHECK_OR(mpu_fsdp_set_param(f, p, v));
  }
  return MPU_SUCCESS;
}

/* On 2 ranks, both storages: prefetch bucket 0, change the pieces (a step, a
 * load with its set made before or after the prefetch, set_param), unshard:
 * the whole parameters are the new pieces, never what the prefetch gathered. */
static mpu_result_t fresh_rank(mpu_comm *world, void *arg) {
  int *bad = arg, rank;
  mpu_comm_rank(world, &rank);
  const model m = {2, 5};
  mpu_result_t r = MPU_SUCCESS;
  for (int caller = 0; caller < 2 && !r; caller++) {
    mpu_param_buffer b;
    add_params(&b, &m);
    mpu_fsdp *f = NULL;
    mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
    o.adamw = adamw();
    float *before = malloc(b.numel * sizeof *before);
    if (!before) r = MPU_ERR_OUT_OF_MEMORY;
    if (!r && caller) r = mpu_param_buffer_finalize(&b, NULL, NULL);
    if (!r) r = mpu_fsdp_create(&b, world, NULL, &o, &f);
    if (!r) r = set_all(f, &b, m.n, 0);
    /* a gradient, so that the step moves every weight */
    if (!r) r = mpu_fsdp_unshard(f, 0, -1);
    for (int p = 0; !r && p < b.nparams; p++)
      for (size_t j = 0; j < b.params[p].numel; j++) mpu_fsdp_grad(f, p)[j] = (float)(rank + 1);
    if (!r) r = mpu_fsdp_backward_done(f, 0);
    if (!r) r = mpu_fsdp_gather_params(f, before);
    /* a step */
    if (!r) r = mpu_fsdp_prefetch(f, 0);
    if (!r) r = mpu_fsdp_step(f, NULL, NULL);
    if (!r) r = mpu_fsdp_unshard(f, 0, -1);
    if (!r) bad[rank] += stale("prefetch, step", caller, f, &b, before, 1);
    if (!r) r = mpu_fsdp_reshard(f, 0);
    /* save these, overwrite them, load them: the set made after, then before, the prefetch */
    mpu_ckpt_global g[2 * MAXL];
    for (int p = 0; p < b.nparams; p++)
      g[p] = (mpu_ckpt_global){b.params[p].name, 1, {(int64_t)b.params[p].numel}};
    mpu_ckpt_set save;
    mpu_ckpt_set_init(&save);
    if (!r) r = mpu_comm_size(world, &save.layout.dp); /* no state here to take the layout from */
    if (!r) r = mpu_fsdp_gather_params(f, before);
    if (!r) r = mpu_ckpt_add_fsdp(&save, f, g, 1);
    if (!r) r = mpu_ckpt_save(fresh_dir, world, &save);
    mpu_ckpt_set_free(&save);
    for (int set_first = 0; set_first < 2 && !r; set_first++) {
      mpu_ckpt_set set;
      mpu_ckpt_set_init(&set);
      mpu_ckpt *ck = NULL;
      r = set_all(f, &b, m.n, 1 + set_first);
      if (!r && set_first) r = mpu_ckpt_add_fsdp(&set, f, g, 1);
      if (!r) r = mpu_fsdp_prefetch(f, 0);
      if (!r && !set_first) r = mpu_ckpt_add_fsdp(&set, f, g, 1);
      if (!r) r = mpu_ckpt_open(fresh_dir, &ck);
      if (!r) r = mpu_ckpt_load(ck, world, &set);
      if (!r) r = mpu_fsdp_unshard(f, 0, -1);
      if (!r)
        bad[rank] += stale(set_first ? "set, prefetch, load" : "prefetch, set, load", caller, f,
                           &b, before, 0);
      if (!r) r = mpu_fsdp_reshard(f, 0);
      mpu_ckpt_free(ck);
      mpu_ckpt_set_free(&set);
    }
    /* set_param under a prefetch */
    if (!r) r = mpu_fsdp_prefetch(f, 0);
    if (!r) r = set_all(f, &b, m.n, 5);
    if (!r) r = mpu_fsdp_unshard(f, 0, -1);
    if (!r) bad[rank] += stale("prefetch, set_param", caller, f, &b, before, 1);
    free(before);
    mpu_fsdp_free(f);
    mpu_param_buffer_free(&b);
  }
  return r;
}

static void test_prefetch_never_gives_stale_weights(void **state) {
  (void)state;
  snprintf(fresh_dir, sizeof fresh_dir, "test_fsdp_ckpt_%d", (int)getpid());
  int bad[FRESH_RANKS] = {0};
  mpu_result_t r = mpu_launch(FRESH_RANKS, fresh_rank, bad, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fresh_dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(r, MPU_SUCCESS);
  for (int k = 0; k < FRESH_RANKS; k++) assert_int_equal(bad[k], 0);
}

/* A step of several buffers refuses one given twice and a step count that
 * cannot grow, before anything changes. */
static void test_step_all_refusals(void **state) {
  (void)state;
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 1, &fake), 0);
  const model m = {1, 3};
  mpu_param_buffer b, c;
  add_params(&b, &m);
  add_params(&c, &m);
  mpu_fsdp *f, *g, *h;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, NULL, &f), 0);
  assert_int_equal(mpu_fsdp_create(&c, fake, NULL, NULL, &g), 0);
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, NULL, &h), 0); /* b again */
  size_t n;
  float *p = mpu_fsdp_shard_params(f, &n), *gr = mpu_fsdp_shard_grads(f, NULL);
  for (size_t j = 0; j < n; j++) p[j] = 1.0f, gr[j] = 0.5f;
  mpu_fsdp *twice[3] = {f, g, f}, *same_buffer[2] = {f, h}, *two[2] = {f, g};
  assert_int_equal(mpu_fsdp_step_all(twice, 3, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "buffers 0 and 2"));
  assert_int_equal(mpu_fsdp_step_all(same_buffer, 2, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_fsdp_set_optimizer_step(g, INT64_MAX), 0);
  assert_int_equal(mpu_fsdp_step_all(two, 2, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "buffer 1"));
  assert_int_equal(mpu_fsdp_step(g, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  for (size_t j = 0; j < n; j++) assert_true(p[j] == 1.0f && gr[j] == 0.5f); /* nothing changed */
  assert_int_equal(mpu_fsdp_optimizer_step(f), 0);
  assert_true(mpu_fsdp_optimizer_step(g) == INT64_MAX);
  assert_int_equal(mpu_fsdp_set_optimizer_step(g, INT64_MAX - 1), 0);
  assert_int_equal(mpu_fsdp_step_all(two, 2, NULL, NULL), 0); /* the last step that counts */
  assert_true(mpu_fsdp_optimizer_step(g) == INT64_MAX && mpu_fsdp_optimizer_step(f) == 1);
  assert_true(p[0] != 1.0f);
  mpu_fsdp_free(f), mpu_fsdp_free(g), mpu_fsdp_free(h);
  mpu_param_buffer_free(&b), mpu_param_buffer_free(&c);
  mpu_comm_destroy(fake);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_strategies_equal_one_rank),
      cmocka_unit_test(test_memory_falls_as_one_over_s),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_prefetch_never_gives_stale_weights),
      cmocka_unit_test(test_step_all_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else /* the same cases on the processes of an MPI job of 8 */

#include <mpi.h>

typedef struct mpi_run {
  mpu_comm *world;
  int rank, failed;
} mpi_run;

static void run_mpi(sharded *c, void *arg) {
  mpi_run *m = arg;
  mpu_result_t r = sharded_rank(m->world, c);
  if (r || c->bad[m->rank]) {
    fprintf(stderr, "rank %d: %s on a %d-d mesh, bucket %zu bytes, %s memory: %s, %d differences\n",
            m->rank, mpu_shard_strategy_name(c->strategy), c->mdim, c->bucket_bytes,
            c->caller_memory ? "caller" : "own", r ? mpu_last_error() : "ran", c->bad[m->rank]);
    m->failed++;
  }
}

int main(int argc, char **argv) {
  mpi_run m = {NULL, 0, 0};
  int size;
  if (mpu_comm_mpi_world(&argc, &argv, &m.world)) return 1;
  mpu_comm_rank(m.world, &m.rank);
  mpu_comm_size(m.world, &size);
  if (size != 8) {
    if (m.rank == 0) fprintf(stderr, "run with 8 processes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  reference ref = {small, {0}};
  if (mpu_launch(1, reference_rank, &ref, NULL, NULL)) MPI_Abort(MPI_COMM_WORLD, 1);
  int cases = every_case(&ref, run_mpi, &m), failed = m.failed;
  mpu_comm_all_reduce(m.world, &failed, &failed, 1, MPU_INT32, MPU_SUM);
  if (m.rank == 0) printf("%d cases on 8 MPI processes: %d failures\n", cases, failed);
  mpu_param_buffer_free(&ref.b);
  mpu_comm_destroy(m.world);
  mpu_mpi_finalize();
  return failed ? 1 : 0;
}
#endif

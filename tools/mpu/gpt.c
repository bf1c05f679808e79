/*
 * gpt.c - the small GPT of `mpu demo gpt`: a model chunk's parameters,
 * forward and backward (gpt.h says what the pieces are).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

struct gpt_block {
  int layer;
  int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  mpu_layer_norm ln1, ln2;
  mpu_column_linear qkv, fc1;
  mpu_row_linear proj, fc2;
  mpu_attention attn;
  float *x, *y1, *qkv_out, *att_mask, *proj_out, *m1, *mid, *y2, *h, *fc2_out, *m2;
  float *d1, *d2, *dqkv, *datt, *dh, *dg;
  float *gt;     /* the GeLU's tanh, kept for its backward */
  int mb;        /* the micro-batch of the last forward (its dropout keys) */
  int recompute; /* GPT_RECOMPUTE_*: what this block's backward runs again */
};

/* ---- dropout: a counter-based mask keyed by the step and the element's place ------------ */

static float keep_scale(const gpt_ctx *ctx, int layer, int site, int mb, uint64_t index) {
  float p = ctx->cfg.dropout;
  if (p <= 0) return 1.0f;
  uint64_t x = ctx->key ^ ((uint64_t)(layer + 2) * UINT64_C(0x9E3779B97F4A7C15)) ^
               ((uint64_t)site * UINT64_C(0xBF58476D1CE4E5B9)) ^
               ((uint64_t)mb * UINT64_C(0x94D049BB133111EB));
  x += index * UINT64_C(0xD6E8FEB86659FD93);
  x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
  x ^= x >> 31;
  float u = (float)(x >> 40) * (1.0f / 16777216.0f);
  return u < p ? 0.0f : 1.0f / (1.0f - p);
}

/* rows of (T_local, hidden) hidden states: the global token of row i */
static int first_row(const gpt_ctx *ctx) { return ctx->sp ? ctx->tp_rank * ctx->T_local : 0; }

/* The dropout mask of hidden states (T_local, hidden) in m, or NULL without
 * dropout: every element is kept unscaled then, and the loops below skip the
 * multiplication by 1 (the same bits, one pass over the activations less). */
static const float *hidden_mask(const gpt_ctx *ctx, int layer, int site, int mb, float *m) {
  size_t H = (size_t)ctx->cfg.hidden, off = (size_t)first_row(ctx);
  if (ctx->cfg.dropout <= 0) return NULL;
  for (size_t i = 0; i < (size_t)ctx->T_local; i++)
    for (size_t j = 0; j < H; j++) m[i * H + j] = keep_scale(ctx, layer, site, mb, (off + i) * H + j);
  return m;
}

/* the mask a forward made (hidden_mask), for its backward */
static const float *kept_mask(const gpt_ctx *ctx, const float *m) {
  return ctx->cfg.dropout > 0 ? m : NULL;
}

/* out = a + b * m (the residual around a dropped branch); m NULL: a + b */
static void add_dropped(float *out, const float *a, const float *b, const float *m, size_t n) {
  if (m)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i] * m[i];
  else
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* The gradient through dropout: g * m into scratch, or g itself (m NULL). */
static const float *through_dropout(const float *g, const float *m, float *scratch, size_t n) {
  if (!m) return g;
  for (size_t i = 0; i < n; i++) scratch[i] = g[i] * m[i];
  return scratch;
}

/* ---- set-up ------------------------------------------------------------------------------- */

mpu_result_t gpt_ctx_init(gpt_ctx *ctx, const gpt_config *cfg, mpu_comm *tp, int sp) {
  memset(ctx, 0, sizeof *ctx);
  ctx->cfg = *cfg, ctx->tp = tp;
  mpu_result_t r = mpu_comm_size(tp, &ctx->tp_size);
  if (!r) r = mpu_comm_rank(tp, &ctx->tp_rank);
  if (r) return r;
  int t = ctx->tp_size;
  ctx->sp = sp && t > 1;
  if (cfg->heads % t || cfg->hidden % cfg->heads || cfg->vocab % t || (ctx->sp && cfg->seq % t))
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT,
                    "gpt: tp %d must divide the heads (%d) and the vocabulary (%d), the heads the "
                    "hidden size (%d), and with sequence parallelism tp the sequence (%d)",
                    t, cfg->heads, cfg->vocab, cfg->hidden, cfg->seq);
  ctx->T_local = ctx->sp ? cfg->seq / t : cfg->seq;
  return MPU_SUCCESS;
}

static mpu_result_t add(gpt_chunk *c, const char *name, int rows, int cols, int dim, int stride,
                        int tp, int decay, int *index) {
  size_t local = (size_t)rows * cols / (dim < 0 ? 1 : (size_t)tp);
  mpu_param_attrs a = dim < 0 ? MPU_PARAM_DUPLICATE : MPU_PARAM_PARTITIONED(dim, stride);
  mpu_result_t r = mpu_param_buffer_add(&c->params, name, local, a, index);
  if (!r && !decay) r = mpu_param_buffer_no_decay(&c->params, *index);
  int64_t shape[2] = {dim == 0 ? rows / tp : rows, dim == 1 ? cols / tp : cols}; /* local */
  if (!r) r = mpu_param_buffer_set_shape(&c->params, *index, cols == 1 ? 1 : 2, shape);
  if (r) return r;
  gpt_shape *s = realloc(c->shapes, (size_t)(*index + 1) * sizeof *s);
  if (!s) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: shapes");
  c->shapes = s;
  snprintf(s[*index].name, sizeof s[*index].name, "%s", name);
  s[*index].rows = rows, s[*index].cols = cols, s[*index].dim = dim, s[*index].stride = stride;
  return MPU_SUCCESS;
}

static float *data(gpt_chunk *c, int i) { return mpu_param_data(&c->params, i); }
static float *grad(gpt_chunk *c, int i) { return mpu_param_grad(&c->params, i); }

/* skip_bias_add: the caller adds the bias (the GeLU's fused bias_gelu) */
static mpu_result_t column(gpt_chunk *c, const gpt_ctx *ctx, mpu_column_linear *l, int in,
                           int out, int w, int b, int stride, int skip_bias_add, uint64_t seed,
                           float std) {
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.gather_output = 0, o.sequence_parallel = ctx->sp, o.stride = stride, o.seed = seed;
  o.skip_bias_add = skip_bias_add;
  o.init_method = mpu_init_normal, o.init_arg = &std, o.bias = b >= 0;
  o.weight = data(c, w), o.weight_grad = grad(c, w);
  if (b >= 0) o.bias_data = data(c, b), o.bias_grad = grad(c, b);
  return mpu_column_linear_create(l, ctx->tp, in, out, &o);
}

static mpu_result_t row(gpt_chunk *c, const gpt_ctx *ctx, mpu_row_linear *l, int in, int out,
                        int w, int b, uint64_t seed, float std) {
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.input_is_parallel = 1, o.sequence_parallel = ctx->sp, o.seed = seed;
  o.init_method = mpu_init_normal, o.init_arg = &std;
  o.weight = data(c, w), o.weight_grad = grad(c, w), o.bias_data = data(c, b), o.bias_grad = grad(c, b);
  return mpu_row_linear_create(l, ctx->tp, in, out, &o);
}

static float *alloc(size_t n, int *failed) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) *failed = 1;
  return p;
}

mpu_result_t gpt_chunk_create(const gpt_ctx *ctx, gpt_chunk *c, int vs, int nvs) {
  const gpt_config *g = &ctx->cfg;
  memset(c, 0, sizeof *c);
  if (g->layers % nvs)
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "gpt: %d layers do not split over %d model chunks",
                    g->layers, nvs);
  int tp = ctx->tp_size, H = g->hidden, F = 4 * H, V = g->vocab, T = g->seq;
  c->vs = vs, c->first = vs == 0, c->last = vs == nvs - 1;
  c->nlayers = g->layers / nvs, c->layer0 = vs * c->nlayers;
  mpu_param_buffer_init(&c->params, ctx->tp_rank);
  c->blocks = calloc((size_t)c->nlayers, sizeof *c->blocks);
  if (!c->blocks) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: blocks");
  mpu_result_t r = MPU_SUCCESS;
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, head = -1;
  char n[48];
#define ADD(name, rows, cols, dim, stride, decay, idx) \
  if (!r) r = add(c, name, rows, cols, dim, stride, tp, decay, idx)
  if (c->first) {
    ADD("wte", V, H, 0, 1, 1, &wte);
    ADD("wpe", T, H, -1, 1, 1, &wpe);
  }
  for (int i = 0; i < c->nlayers; i++) {
    gpt_block *b = &c->blocks[i];
    int L = b->layer = c->layer0 + i;
#define P(suffix, rows, cols, dim, stride, decay, idx)         \
  snprintf(n, sizeof n, "layer%d.%s", L, suffix);               \
  ADD(n, rows, cols, dim, stride, decay, idx)
    P("ln1.weight", H, 1, -1, 1, 0, &b->ln1_w);
    P("ln1.bias", H, 1, -1, 1, 0, &b->ln1_b);
    P("qkv.weight", 3 * H, H, 0, 3, 1, &b->qkv_w);
    P("qkv.bias", 3 * H, 1, 0, 3, 0, &b->qkv_b);
    P("proj.weight", H, H, 1, 1, 1, &b->proj_w);
    P("proj.bias", H, 1, -1, 1, 0, &b->proj_b);
    P("ln2.weight", H, 1, -1, 1, 0, &b->ln2_w);
    P("ln2.bias", H, 1, -1, 1, 0, &b->ln2_b);
    P("fc1.weight", F, H, 0, 1, 1, &b->fc1_w);
    P("fc1.bias", F, 1, 0, 1, 0, &b->fc1_b);
    P("fc2.weight", H, F, 1, 1, 1, &b->fc2_w);
    P("fc2.bias", H, 1, -1, 1, 0, &b->fc2_b);
#undef P
  }
  if (c->last) {
    ADD("lnf.weight", H, 1, -1, 1, 0, &lnf_w);
    ADD("lnf.bias", H, 1, -1, 1, 0, &lnf_b);
    ADD("head.weight", V, H, 0, 1, 1, &head);
  }
#undef ADD
  if (!r) r = mpu_param_buffer_finalize(&c->params, NULL, NULL);
  if (r) return r;
  /* every master weight from its own seed: any layout holds slices of one model */
  uint64_t s = g->seed;
  float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)g->layers); /* GPT-2's scaled init */
  int T_l = ctx->T_local, Hl = H / tp, Fl = F / tp, hl = g->heads / tp, failed = 0;
  if (c->first) {
    mpu_embedding_options eo = MPU_EMBEDDING_OPTIONS_INIT;
    eo.seed = s + 1, eo.init_method = mpu_init_normal, eo.init_arg = &std;
    eo.weight = data(c, wte), eo.weight_grad = grad(c, wte);
    if (!r) r = mpu_vocab_embedding_create(&c->wte, ctx->tp, V, H, &eo);
    c->wpe = data(c, wpe), c->dwpe = grad(c, wpe);
    mpu_rng rng;
    mpu_rng_seed(&rng, s + 2);
    mpu_init_normal(c->wpe, T, H, &rng, &std);
    c->emb = alloc((size_t)T * H, &failed), c->emb_mask = alloc((size_t)T * H, &failed);
  }
  for (int i = 0; i < c->nlayers && !r; i++) {
    gpt_block *b = &c->blocks[i];
    uint64_t ls = s + 1000 * (uint64_t)(b->layer + 1);
    r = mpu_layer_norm_init(&b->ln1, H, 1e-5f, data(c, b->ln1_w), data(c, b->ln1_b),
                            grad(c, b->ln1_w), grad(c, b->ln1_b));
    if (!r) r = mpu_layer_norm_init(&b->ln2, H, 1e-5f, data(c, b->ln2_w), data(c, b->ln2_b),
                                    grad(c, b->ln2_w), grad(c, b->ln2_b));
    if (!r) r = column(c, ctx, &b->qkv, H, 3 * H, b->qkv_w, b->qkv_b, 3, 0, ls + 1, std);
    if (!r) r = row(c, ctx, &b->proj, H, H, b->proj_w, b->proj_b, ls + 2, out_std);
    if (!r) r = column(c, ctx, &b->fc1, H, F, b->fc1_w, b->fc1_b, 1, 1, ls + 3, std);
    if (!r) r = row(c, ctx, &b->fc2, F, H, b->fc2_w, b->fc2_b, ls + 4, out_std);
    size_t th = (size_t)T_l * H;
    b->x = alloc(th, &failed), b->y1 = alloc(th, &failed), b->proj_out = alloc(th, &failed);
    b->m1 = alloc(th, &failed), b->mid = alloc(th, &failed), b->y2 = alloc(th, &failed);
    b->fc2_out = alloc(th, &failed), b->m2 = alloc(th, &failed);
    b->d1 = alloc(th, &failed), b->d2 = alloc(th, &failed);
    b->recompute = gpt_block_recompute(g, i, c->nlayers);
    /* q, k, v go where the attention keeps them, but for the selective recompute's own copy */
    if (b->recompute == GPT_RECOMPUTE_SELECTIVE) b->qkv_out = alloc((size_t)T * 3 * Hl, &failed);
    b->dqkv = alloc((size_t)T * 3 * Hl, &failed);
    b->datt = alloc((size_t)T * Hl, &failed);
    b->att_mask = alloc((size_t)hl * T * T, &failed);
    b->h = alloc((size_t)T * Fl, &failed);
    b->dh = alloc((size_t)T * Fl, &failed), b->dg = alloc((size_t)T * Fl, &failed);
    b->gt = alloc((size_t)T * Fl, &failed);
  }
  if (c->last && !r) {
    r = mpu_layer_norm_init(&c->lnf, H, 1e-5f, data(c, lnf_w), data(c, lnf_b), grad(c, lnf_w),
                            grad(c, lnf_b));
    if (!r) r = column(c, ctx, &c->head, H, V, head, -1, 1, 0, s + 3, std);
    c->logits = alloc((size_t)T * (V / tp), &failed), c->dlogits = alloc((size_t)T * (V / tp), &failed);
    c->loss = alloc((size_t)T, &failed), c->dloss = alloc((size_t)T, &failed);
  }
  c->act = alloc((size_t)T_l * H, &failed), c->dact = alloc((size_t)T_l * H, &failed);
  c->tmp = alloc((size_t)T * H, &failed);
  if (!r && failed) r = mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: activations");
  return r;
}

void gpt_chunk_free(gpt_chunk *c) {
  if (!c) return;
  gpt_frames_free(c);
  for (int i = 0; c->blocks && i < c->nlayers; i++) {
    gpt_block *b = &c->blocks[i];
    mpu_layer_norm_free(&b->ln1), mpu_layer_norm_free(&b->ln2);
    mpu_column_linear_free(&b->qkv), mpu_column_linear_free(&b->fc1);
    mpu_row_linear_free(&b->proj), mpu_row_linear_free(&b->fc2);
    mpu_attention_free(&b->attn);
    float *bufs[] = {b->x, b->y1, b->qkv_out, b->att_mask, b->proj_out, b->m1, b->mid,
                     b->y2, b->h, b->fc2_out, b->m2, b->d1, b->d2, b->dqkv,
                     b->datt, b->dh, b->dg, b->gt};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
  }
  free(c->blocks);
  mpu_vocab_embedding_free(&c->wte);
  mpu_layer_norm_free(&c->lnf);
  mpu_column_linear_free(&c->head);
  mpu_vocab_cross_entropy_free(&c->ce);
  float *bufs[] = {c->emb, c->emb_mask, c->act, c->dact, c->logits, c->dlogits, c->loss, c->dloss, c->tmp};
  for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
  mpu_param_buffer_free(&c->params);
  free(c->shapes);
  memset(c, 0, sizeof *c);
}

/* ---- activation recompute: what each micro-batch keeps between its passes -------------------- */

/*
 * Megatron's choices (--recompute-granularity, --recompute-num-layers):
 *   full, every block   the chunk keeps only its input; the caller runs the
 *                       whole chunk forward again before its backward
 *                       (mpu_recompute), so one working set serves every
 *                       micro-batch in flight;
 *   full, first N       those blocks keep their input and run their forward
 *                       again in the backward; the others keep everything;
 *   selective           every block keeps everything but the attention core
 *                       (the (heads, T, T) probabilities, dropout mask and
 *                       dropped probabilities), which the backward recomputes
 *                       from the kept q, k, v;
 *   none                everything is kept.
 * Unless the whole chunk is recomputed, each micro-batch in flight needs its
 * own activations: a frame. The chunk's layers work on one set at a time;
 * gpt_chunk_use_frame swaps a frame's saved buffers in (the layers' saved
 * inputs, the masks, the GeLU's input and tanh), leaving the scratch shared.
 */

int gpt_block_recompute(const gpt_config *g, int i, int nlayers) {
  if (g->recompute == GPT_RECOMPUTE_NONE || g->recompute == GPT_RECOMPUTE_SELECTIVE)
    return g->recompute;
  return g->recompute_layers > 0 && g->recompute_layers < nlayers && i < g->recompute_layers
             ? GPT_RECOMPUTE_FULL
             : GPT_RECOMPUTE_NONE;
}

int gpt_chunk_whole_recompute(const gpt_ctx *ctx, const gpt_chunk *c) {
  const gpt_config *g = &ctx->cfg;
  return g->recompute == GPT_RECOMPUTE_FULL &&
         (g->recompute_layers <= 0 || g->recompute_layers >= c->nlayers);
}

/* a block's saved state, as swapped in and out of the live block */
struct gpt_block_frame {
  float *ln1_xhat, *ln1_rstd, *ln2_xhat, *ln2_rstd, *qkv_x, *fc1_x, *proj_x, *fc2_x;
  int ln1_n, ln2_n, qkv_n, fc1_n, proj_n, fc2_n, mb;
  mpu_attention attn;
  float *x, *qkv_out, *att_mask, *m1, *m2, *h, *gt;
};

struct gpt_frame {
  struct gpt_block_frame *blocks;
  const int64_t *wte_ids;
  int wte_n, lnf_n, head_n, ce_n;
  float *emb_mask, *lnf_xhat, *lnf_rstd, *head_x, *ce_softmax;
  int64_t *ce_targets;
};

#define SWAP(type, a, b) \
  do {                   \
    type t_ = (a);       \
    (a) = (b);           \
    (b) = t_;            \
  } while (0)

static void swap_block(gpt_block *b, struct gpt_block_frame *f) {
  SWAP(float *, b->x, f->x);
  SWAP(int, b->mb, f->mb);
  if (b->recompute == GPT_RECOMPUTE_FULL) return; /* all the rest is computed again */
  SWAP(float *, b->ln1.xhat, f->ln1_xhat); SWAP(float *, b->ln1.rstd, f->ln1_rstd);
  SWAP(float *, b->ln2.xhat, f->ln2_xhat); SWAP(float *, b->ln2.rstd, f->ln2_rstd);
  SWAP(int, b->ln1.n, f->ln1_n); SWAP(int, b->ln2.n, f->ln2_n);
  SWAP(float *, b->qkv.x_total, f->qkv_x); SWAP(int, b->qkv.n, f->qkv_n);
  SWAP(float *, b->fc1.x_total, f->fc1_x); SWAP(int, b->fc1.n, f->fc1_n);
  SWAP(float *, b->proj.x_local, f->proj_x); SWAP(int, b->proj.n, f->proj_n);
  SWAP(float *, b->fc2.x_local, f->fc2_x); SWAP(int, b->fc2.n, f->fc2_n);
  SWAP(float *, b->m1, f->m1); SWAP(float *, b->m2, f->m2);
  SWAP(float *, b->h, f->h); SWAP(float *, b->gt, f->gt);
  if (b->recompute == GPT_RECOMPUTE_SELECTIVE) { /* the core is recomputed from q, k, v */
    SWAP(float *, b->qkv_out, f->qkv_out);
  } else {
    SWAP(mpu_attention, b->attn, f->attn);
    SWAP(float *, b->att_mask, f->att_mask);
  }
}

static void swap_frame(gpt_chunk *c, struct gpt_frame *f) {
  for (int i = 0; i < c->nlayers; i++) swap_block(&c->blocks[i], &f->blocks[i]);
  SWAP(const int64_t *, c->wte.ids, f->wte_ids); SWAP(int, c->wte.n, f->wte_n);
  SWAP(float *, c->emb_mask, f->emb_mask);
  SWAP(float *, c->lnf.xhat, f->lnf_xhat); SWAP(float *, c->lnf.rstd, f->lnf_rstd);
  SWAP(int, c->lnf.n, f->lnf_n);
  SWAP(float *, c->head.x_total, f->head_x); SWAP(int, c->head.n, f->head_n);
  SWAP(float *, c->ce.softmax, f->ce_softmax); SWAP(int64_t *, c->ce.targets, f->ce_targets);
  SWAP(int, c->ce.n, f->ce_n);
}

static void free_frame(struct gpt_frame *f, int nlayers) {
  for (int i = 0; f->blocks && i < nlayers; i++) {
    struct gpt_block_frame *b = &f->blocks[i];
    float *bufs[] = {b->ln1_xhat, b->ln1_rstd, b->ln2_xhat, b->ln2_rstd, b->qkv_x, b->fc1_x,
                     b->proj_x, b->fc2_x, b->x, b->qkv_out, b->att_mask, b->m1, b->m2, b->h, b->gt};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
    mpu_attention_free(&b->attn);
  }
  free(f->blocks);
  free(f->emb_mask), free(f->lnf_xhat), free(f->lnf_rstd), free(f->head_x), free(f->ce_softmax);
  free(f->ce_targets);
}

void gpt_frames_free(gpt_chunk *c) {
  gpt_chunk_use_frame(c, 0); /* the live set's own buffers back in place */
  for (int k = 1; k < c->nframes; k++) free_frame(&c->frames[k], c->nlayers);
  if (c->frames) free(c->frames[0].blocks);
  free(c->frames);
  c->frames = NULL, c->nframes = c->frame = 0;
}

mpu_result_t gpt_chunk_frames(const gpt_ctx *ctx, gpt_chunk *c, int n) {
  gpt_frames_free(c);
  if (n < 1 || gpt_chunk_whole_recompute(ctx, c)) return MPU_SUCCESS;
  const gpt_config *g = &ctx->cfg;
  int tp = ctx->tp_size, T = g->seq, H = g->hidden, failed = 0;
  size_t th = (size_t)ctx->T_local * H, tf = (size_t)T * (4 * H / tp);
  c->frames = calloc((size_t)n, sizeof *c->frames);
  if (!c->frames) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: frames");
  c->nframes = n, c->frame = 0;
  /* frame 0 is the live set itself: its slot holds what the live set gives up */
  for (int k = 0; k < n; k++) {
    struct gpt_frame *f = &c->frames[k];
    f->blocks = calloc((size_t)c->nlayers, sizeof *f->blocks);
    if (!f->blocks) failed = 1;
    if (k == 0 || failed) continue;
    if (c->first) f->emb_mask = alloc((size_t)T * H, &failed);
    for (int i = 0; i < c->nlayers; i++) { /* the layers' own buffers come with their forward */
      struct gpt_block_frame *b = &f->blocks[i];
      int rc = c->blocks[i].recompute;
      b->x = alloc(th, &failed);
      if (rc == GPT_RECOMPUTE_FULL) continue;
      b->m1 = alloc(th, &failed), b->m2 = alloc(th, &failed);
      b->h = alloc(tf, &failed), b->gt = alloc(tf, &failed);
      if (rc == GPT_RECOMPUTE_SELECTIVE) b->qkv_out = alloc((size_t)T * 3 * (H / tp), &failed);
      else b->att_mask = alloc((size_t)(g->heads / tp) * T * T, &failed);
    }
  }
  if (failed) {
    gpt_frames_free(c);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: %d frames of activations", n);
  }
  return MPU_SUCCESS;
}

void gpt_chunk_use_frame(gpt_chunk *c, int k) {
  if (!c->frames || k == c->frame || k < 0 || k >= c->nframes) return;
  swap_frame(c, &c->frames[c->frame]); /* the live set back to its frame */
  swap_frame(c, &c->frames[k]);
  c->frame = k;
}

size_t gpt_saved_floats(const gpt_ctx *ctx, int nlayers, int first, int last, int recompute,
                        int recompute_layers) {
  const gpt_config *g = &ctx->cfg;
  size_t tp = (size_t)ctx->tp_size, T = (size_t)g->seq, H = (size_t)g->hidden;
  size_t Tl = (size_t)ctx->T_local, hl = (size_t)g->heads / tp, Hl = H / tp, Fl = 4 * H / tp;
  size_t th = Tl * H, core = hl * T * T * (g->dropout > 0 ? 3 : 1);
  if (recompute == GPT_RECOMPUTE_FULL && (recompute_layers <= 0 || recompute_layers >= nlayers))
    return th; /* the chunk's input */
  size_t rest = 2 * (th + Tl) + 2 * T * H + T * Hl + T * Fl /* LayerNorms, the linears' inputs */
                + 2 * th + 2 * T * Fl                     /* dropout masks, GeLU input and tanh */
                + th;                                     /* the block's input */
  size_t n = 0;
  for (int i = 0; i < nlayers; i++) {
    gpt_config one = *g;
    one.recompute = recompute, one.recompute_layers = recompute_layers;
    int rc = gpt_block_recompute(&one, i, nlayers);
    n += rc == GPT_RECOMPUTE_FULL ? th : rc == GPT_RECOMPUTE_SELECTIVE ? rest + T * 3 * Hl : rest + T * 3 * Hl + core;
  }
  size_t V = (size_t)g->vocab / tp;
  if (first) n += T * H;                      /* the embedding's dropout mask */
  if (last) n += th + Tl + T * H + T * V + T; /* final LayerNorm, head input, softmax, targets */
  return n;
}

/* ---- forward and backward ------------------------------------------------------------------ */

#define TRY(call)                        \
  do {                                   \
    mpu_result_t r_ = (call);            \
    if (r_) return r_;                   \
  } while (0)

/* the attention core: dropout mask (keyed by the global head), softmax(q k^T) v */
static mpu_result_t attention_core(const gpt_ctx *ctx, gpt_block *b, const float *qkv, float *out) {
  const gpt_config *g = &ctx->cfg;
  int T = g->seq, hl = g->heads / ctx->tp_size, d = g->hidden / g->heads;
  if (g->dropout > 0)
    for (int h = 0; h < hl; h++)
      for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++)
          b->att_mask[((size_t)h * T + i) * T + j] = keep_scale(
              ctx, b->layer, 1, b->mb, (((uint64_t)(ctx->tp_rank * hl + h)) * T + i) * T + j);
  return mpu_attention_forward(&b->attn, qkv, T, hl, d, g->dropout > 0 ? b->att_mask : NULL, out);
}

static mpu_result_t block_forward(const gpt_ctx *ctx, gpt_block *b, int mb, const float *in,
                                  float *out) {
  const gpt_config *g = &ctx->cfg;
  int T = g->seq, T_l = ctx->T_local, H = g->hidden, tp = ctx->tp_size;
  int Fl = 4 * H / tp;
  size_t th = (size_t)T_l * H;
  if (in != b->x) memcpy(b->x, in, th * sizeof(float)); /* (a block recomputed runs from b->x) */
  b->mb = mb;
  /* what feeds a linear is written where the linear saves its input, not copied there; with
   * sequence parallelism the column layers' saved inputs are gathered from every rank */
  float *y1 = b->y1, *y2 = b->y2, *att, *gl;
  if (!ctx->sp) {
    TRY(mpu_column_linear_input(&b->qkv, T_l, &y1));
    TRY(mpu_column_linear_input(&b->fc1, T_l, &y2));
  }
  TRY(mpu_row_linear_input(&b->proj, T, &att));
  TRY(mpu_row_linear_input(&b->fc2, T, &gl));
  /* q, k, v written where the attention saves them, unless a selective recompute runs the
   * attention again from its own copy */
  float *qkv_out = b->qkv_out;
  if (b->recompute != GPT_RECOMPUTE_SELECTIVE)
    TRY(mpu_attention_input(&b->attn, T, g->heads / tp, H / g->heads, &qkv_out));
  TRY(mpu_layer_norm_forward(&b->ln1, b->x, T_l, y1));
  TRY(mpu_column_linear_forward(&b->qkv, y1, T_l, qkv_out));
  TRY(attention_core(ctx, b, qkv_out, att));
  TRY(mpu_row_linear_forward(&b->proj, att, T, b->proj_out));
  add_dropped(b->mid, b->x, b->proj_out, hidden_mask(ctx, b->layer, 2, mb, b->m1), th);
  TRY(mpu_layer_norm_forward(&b->ln2, b->mid, T_l, y2));
  TRY(mpu_column_linear_forward(&b->fc1, y2, T_l, b->h));
  mpu_bias_gelu_forward_keep(b->h, b->fc1.bias, (size_t)T, (size_t)Fl, gl, b->gt);
  TRY(mpu_row_linear_forward(&b->fc2, gl, T, b->fc2_out));
  add_dropped(out, b->mid, b->fc2_out, hidden_mask(ctx, b->layer, 3, mb, b->m2), th);
  return MPU_SUCCESS;
}

/* dout (T_local, hidden) -> dx; they may be the same buffer */
static mpu_result_t block_backward(const gpt_ctx *ctx, gpt_block *b, const float *dout, float *dx) {
  const gpt_config *g = &ctx->cfg;
  int T = g->seq, H = g->hidden, Fl = 4 * H / ctx->tp_size;
  size_t th = (size_t)ctx->T_local * H;
  if (b->recompute == GPT_RECOMPUTE_FULL) /* the block again, from its saved input */
    TRY(block_forward(ctx, b, b->mb, b->x, b->d2));
  TRY(mpu_row_linear_backward(&b->fc2, through_dropout(dout, kept_mask(ctx, b->m2), b->d1, th),
                              b->dg));
  mpu_bias_gelu_backward_kept(b->h, b->fc1.bias, b->gt, b->dg, b->dh, (size_t)T, (size_t)Fl,
                              b->fc1.dbias);
  TRY(mpu_column_linear_backward(&b->fc1, b->dh, b->d2));
  /* the residual's gradient and ln2's summed in ln2's backward: dx then is the gradient of
   * mid, and ln1's is added to it the same way */
  if (dx != dout) memcpy(dx, dout, th * sizeof(float));
  TRY(mpu_layer_norm_backward_add(&b->ln2, b->d2, dx));
  if (b->recompute == GPT_RECOMPUTE_SELECTIVE) /* the attention core again, from q, k, v */
    TRY(attention_core(ctx, b, b->qkv_out, b->datt));
  TRY(mpu_row_linear_backward(&b->proj, through_dropout(dx, kept_mask(ctx, b->m1), b->d1, th),
                              b->datt));
  TRY(mpu_attention_backward(&b->attn, b->datt, b->dqkv));
  TRY(mpu_column_linear_backward(&b->qkv, b->dqkv, b->d2));
  TRY(mpu_layer_norm_backward_add(&b->ln1, b->d2, dx));
  return MPU_SUCCESS;
}

mpu_result_t gpt_chunk_forward(const gpt_ctx *ctx, gpt_chunk *c, int mb, const int64_t *ids,
                               const int64_t *targets, const float *in, float *out,
                               double *loss_sum) {
  const gpt_config *g = &ctx->cfg;
  int T = g->seq, T_l = ctx->T_local, H = g->hidden;
  size_t th = (size_t)T_l * H;
  if (c->first) { /* word + position embedding, dropout, then this rank's rows */
    TRY(mpu_vocab_embedding_forward(&c->wte, ids, T, c->emb));
    if (ctx->cfg.dropout > 0)
      for (size_t i = 0; i < (size_t)T * H; i++) {
        c->emb_mask[i] = keep_scale(ctx, -1, 0, mb, i);
        c->emb[i] = (c->emb[i] + c->wpe[i]) * c->emb_mask[i];
      }
    else /* every element kept unscaled: the same bits without the mask */
      for (size_t i = 0; i < (size_t)T * H; i++) c->emb[i] += c->wpe[i];
    memcpy(c->act, c->emb + (size_t)first_row(ctx) * H, th * sizeof(float));
  } else {
    memcpy(c->act, in, th * sizeof(float));
  }
  for (int i = 0; i < c->nlayers; i++) TRY(block_forward(ctx, &c->blocks[i], mb, c->act, c->act));
  if (!c->last) {
    memcpy(out, c->act, th * sizeof(float));
    return MPU_SUCCESS;
  }
  int Vl = g->vocab / ctx->tp_size;
  float *hx = c->tmp; /* the head's input, where it saves it (as the blocks') */
  if (!ctx->sp) TRY(mpu_column_linear_input(&c->head, T_l, &hx));
  TRY(mpu_layer_norm_forward(&c->lnf, c->act, T_l, hx));
  TRY(mpu_column_linear_forward(&c->head, hx, T_l, c->logits));
  TRY(mpu_vocab_cross_entropy_forward(&c->ce, ctx->tp, c->logits, targets, T, Vl, 0.0f, c->loss));
  if (loss_sum)
    for (int t = 0; t < T; t++) *loss_sum += c->loss[t];
  return MPU_SUCCESS;
}

/* The gradients from element `from` of the chunk's buffer on are final. The
 * buffer holds the embedding's, the blocks' in order, then the head's. */
static mpu_result_t grads_final(const gpt_ctx *ctx, gpt_chunk *c, size_t from) {
  return ctx->grads_final ? ctx->grads_final(ctx->grads_user, c, from) : MPU_SUCCESS;
}

static size_t param_offset(const gpt_chunk *c, int param) { return c->params.params[param].offset; }

mpu_result_t gpt_chunk_backward(const gpt_ctx *ctx, gpt_chunk *c, const float *gout, float *gin,
                                float loss_scale) {
  const gpt_config *g = &ctx->cfg;
  int T = g->seq, T_l = ctx->T_local, H = g->hidden;
  size_t th = (size_t)T_l * H;
  if (c->last) {
    for (int t = 0; t < T; t++) c->dloss[t] = loss_scale;
    TRY(mpu_vocab_cross_entropy_backward(&c->ce, c->dloss, c->dlogits));
    TRY(mpu_column_linear_backward(&c->head, c->dlogits, c->tmp));
    TRY(mpu_layer_norm_backward(&c->lnf, c->tmp, c->dact));
    const gpt_block *lastb = &c->blocks[c->nlayers - 1]; /* the head's follow the last block's */
    TRY(grads_final(ctx, c, param_offset(c, lastb->fc2_b) + c->params.params[lastb->fc2_b].numel));
  } else {
    memcpy(c->dact, gout, th * sizeof(float));
  }
  for (int i = c->nlayers - 1; i >= 0; i--) {
    TRY(block_backward(ctx, &c->blocks[i], c->dact, c->dact));
    TRY(grads_final(ctx, c, param_offset(c, c->blocks[i].ln1_w)));
  }
  if (!c->first) {
    memcpy(gin, c->dact, th * sizeof(float));
    return grads_final(ctx, c, 0);
  }
  /* the embedding's gradient over the whole sequence: gathered back with
   * sequence parallelism (scatter_to_sequence_parallel_region's backward) */
  if (ctx->sp) TRY(mpu_comm_all_gather(ctx->tp, c->dact, c->tmp, th, MPU_FLOAT32));
  else memcpy(c->tmp, c->dact, th * sizeof(float));
  const float *m = kept_mask(ctx, c->emb_mask);
  if (m)
    for (size_t i = 0; i < (size_t)T * H; i++) c->tmp[i] *= m[i];
  for (size_t i = 0; i < (size_t)T * H; i++) c->dwpe[i] += c->tmp[i];
  TRY(mpu_vocab_embedding_backward(&c->wte, c->tmp));
  return grads_final(ctx, c, 0);
}

mpu_result_t gpt_chunk_sync_sequence_grads(const gpt_ctx *ctx, gpt_chunk *c) {
  if (!ctx->sp) return MPU_SUCCESS;
  size_t H = (size_t)ctx->cfg.hidden;
  for (int i = 0; i < c->nlayers; i++) {
    mpu_layer_norm *ln[2] = {&c->blocks[i].ln1, &c->blocks[i].ln2};
    for (int k = 0; k < 2; k++) {
      TRY(mpu_comm_all_reduce(ctx->tp, ln[k]->dweight, ln[k]->dweight, H, MPU_FLOAT32, MPU_SUM));
      TRY(mpu_comm_all_reduce(ctx->tp, ln[k]->dbias, ln[k]->dbias, H, MPU_FLOAT32, MPU_SUM));
    }
  }
  if (c->last) {
    TRY(mpu_comm_all_reduce(ctx->tp, c->lnf.dweight, c->lnf.dweight, H, MPU_FLOAT32, MPU_SUM));
    TRY(mpu_comm_all_reduce(ctx->tp, c->lnf.dbias, c->lnf.dbias, H, MPU_FLOAT32, MPU_SUM));
  }
  return MPU_SUCCESS;
}

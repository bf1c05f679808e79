/*
 * vocab.c - VocabParallelEmbedding and Megatron core's vocab-parallel cross
 * entropy: the vocabulary is split across the tensor-parallel group, and
 * only maxima, sums and the target logits cross it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"
#include "layers/layers_internal.h"

/* ---- embedding ------------------------------------------------------------------------- */

mpu_result_t mpu_vocab_embedding_create(mpu_vocab_embedding *e, mpu_comm *tp, int vocab,
                                        int hidden, const mpu_embedding_options *options) {
  static const char fn[] = "mpu_vocab_embedding_create";
  if (!e) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL", fn);
  memset(e, 0, sizeof *e);
  mpu_embedding_options o = MPU_EMBEDDING_OPTIONS_INIT;
  if (options)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_EMBEDDING_OPTIONS_INIT", options, sizeof o,
                                sizeof o, &o));
  if ((o.weight == NULL) != (o.weight_grad == NULL))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: give the weight and its gradient as views "
                      "together (or neither)", fn);
  MPU_CHECK(mpu__layer_comm(fn, &tp, &e->tp_size, &e->tp_rank));
  if (vocab < 1 || hidden < 1 || vocab % e->tp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: vocab %d, hidden %d (vocab must divide by the %d tensor-parallel ranks)",
                      fn, vocab, hidden, e->tp_size);
  int per = vocab / e->tp_size;
  e->tp = tp, e->vocab = vocab, e->hidden = hidden;
  e->vocab_start = e->tp_rank * per, e->vocab_end = e->vocab_start + per;
  e->owns_params = o.weight == NULL;
  e->weight = o.weight ? o.weight : malloc((size_t)per * hidden * sizeof(float));
  e->dweight = o.weight_grad ? o.weight_grad : calloc((size_t)per * hidden, sizeof(float));
  if (!e->weight || !e->dweight) {
    mpu_vocab_embedding_free(e);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  mpu_result_t r = mpu__init_partition(o.init_method, o.init_arg, o.seed, vocab, hidden, 0, 1,
                                       e->tp_size, e->tp_rank, e->weight, NULL);
  if (r) mpu_vocab_embedding_free(e);
  return r;
}

mpu_result_t mpu_vocab_embedding_init(mpu_vocab_embedding *e, mpu_comm *tp, int vocab, int hidden,
                                      uint64_t seed, float init_std) {
  mpu_embedding_options o = MPU_EMBEDDING_OPTIONS_INIT;
  o.seed = seed, o.init_method = mpu_init_normal, o.init_arg = &init_std;
  return mpu_vocab_embedding_create(e, tp, vocab, hidden, &o);
}

void mpu_vocab_embedding_free(mpu_vocab_embedding *e) {
  if (!e) return;
  if (e->owns_params) free(e->weight), free(e->dweight);
  memset(e, 0, sizeof *e);
}

void mpu_vocab_embedding_zero_grad(mpu_vocab_embedding *e) {
  memset(e->dweight, 0, (size_t)(e->vocab_end - e->vocab_start) * e->hidden * sizeof(float));
}

mpu_result_t mpu_vocab_embedding_forward(mpu_vocab_embedding *e, const int64_t *ids, int n,
                                         float *out) {
  static const char fn[] = "mpu_vocab_embedding_forward";
  if (!e || !e->weight || !ids || !out || n < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d ids", fn, n);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= e->vocab)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: id %lld at %d is outside the vocabulary 0..%d",
                        fn, (long long)ids[i], i, e->vocab - 1);
  size_t h = (size_t)e->hidden;
  for (int i = 0; i < n; i++) { /* ids of other ranks' rows are masked to zero */
    int64_t id = ids[i];
    if (id >= e->vocab_start && id < e->vocab_end)
      memcpy(out + i * h, e->weight + (size_t)(id - e->vocab_start) * h, h * sizeof(float));
    else
      memset(out + i * h, 0, h * sizeof(float));
  }
  e->ids = ids;
  e->n = n;
  return mpu__run(MPU_PRIM_ALL_REDUCE, e->tp, out, n, e->hidden, out, n, e->hidden); /* reduce_from */
}

mpu_result_t mpu_vocab_embedding_backward(mpu_vocab_embedding *e, const float *dout) {
  if (!e || !e->ids || !dout)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_vocab_embedding_backward: no forward yet");
  size_t h = (size_t)e->hidden;
  for (int i = 0; i < e->n; i++) {
    int64_t id = e->ids[i];
    if (id < e->vocab_start || id >= e->vocab_end) continue;
    float *row = e->dweight + (size_t)(id - e->vocab_start) * h;
    for (size_t j = 0; j < h; j++) row[j] += dout[i * h + j];
  }
  return MPU_SUCCESS;
}

/* ---- cross entropy ------------------------------------------------------------------------ */

mpu_result_t mpu_vocab_cross_entropy_forward(mpu_vocab_cross_entropy *ce, mpu_comm *tp,
                                             const float *logits, const int64_t *targets, int n,
                                             int vocab_local, float label_smoothing, float *loss) {
  static const char fn[] = "mpu_vocab_cross_entropy_forward";
  int T, r;
  MPU_CHECK(mpu__layer_comm(fn, &tp, &T, &r));
  if (!ce || !logits || !targets || !loss || n < 1 || vocab_local < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument, %d rows, %d logits", fn, n,
                      vocab_local);
  if (!(label_smoothing >= 0 && label_smoothing < 1) || (label_smoothing > 0 && vocab_local < 2))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: label smoothing %g (want 0 <= s < 1, and 2+ logits per rank)", fn,
                      (double)label_smoothing);
  for (int i = 0; i < n; i++)
    if (targets[i] < 0 || targets[i] >= (int64_t)vocab_local * T)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: target %lld at %d is outside 0..%d", fn,
                        (long long)targets[i], i, vocab_local * T - 1);
  mpu_vocab_cross_entropy_free(ce);
  ce->tp = tp, ce->n = n, ce->vocab_local = vocab_local, ce->vocab_start = r * vocab_local;
  ce->label_smoothing = label_smoothing;
  ce->softmax = malloc((size_t)n * vocab_local * sizeof(float));
  ce->targets = malloc((size_t)n * sizeof(int64_t));
  float *max = malloc((size_t)n * sizeof(float)), *pred = calloc((size_t)n, sizeof(float));
  float *sum = calloc((size_t)n, sizeof(float));
  mpu_result_t res = MPU_SUCCESS;
  if (!ce->softmax || !ce->targets || !max || !pred || !sum) {
    res = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    goto out;
  }
  memcpy(ce->targets, targets, (size_t)n * sizeof(int64_t));
  size_t V = (size_t)vocab_local;
  for (int i = 0; i < n; i++) {
    max[i] = logits[i * V];
    for (size_t j = 1; j < V; j++) max[i] = fmaxf(max[i], logits[i * V + j]);
  }
  if ((res = mpu_comm_all_reduce(tp, max, max, (size_t)n, MPU_FLOAT32, MPU_MAX))) goto out;
  for (int i = 0; i < n; i++) {
    float *s = ce->softmax + i * V;
    for (size_t j = 0; j < V; j++) s[j] = logits[i * V + j] - max[i];
    int64_t t = targets[i] - ce->vocab_start;
    if (t >= 0 && t < (int64_t)V) pred[i] = s[t];
    for (size_t j = 0; j < V; j++) sum[i] += (s[j] = expf(s[j]));
  }
  if ((res = mpu_comm_all_reduce(tp, pred, pred, (size_t)n, MPU_FLOAT32, MPU_SUM))) goto out;
  if ((res = mpu_comm_all_reduce(tp, sum, sum, (size_t)n, MPU_FLOAT32, MPU_SUM))) goto out;
  for (int i = 0; i < n; i++) {
    float *s = ce->softmax + i * V;
    loss[i] = logf(sum[i]) - pred[i];
    for (size_t j = 0; j < V; j++) s[j] /= sum[i];
    if (label_smoothing > 0) { /* over this rank's partition, as Megatron core */
      float sm = label_smoothing * (float)V / (float)(V - 1), mean = 0;
      for (size_t j = 0; j < V; j++) mean += logf(s[j]);
      mean /= (float)V;
      loss[i] = (1.0f - sm) * loss[i] - sm * mean;
    }
  }
out:
  free(max);
  free(pred);
  free(sum);
  if (res) mpu_vocab_cross_entropy_free(ce);
  return res;
}

mpu_result_t mpu_vocab_cross_entropy_backward(mpu_vocab_cross_entropy *ce, const float *dloss,
                                              float *dlogits) {
  if (!ce || !ce->softmax || !dloss || !dlogits)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_vocab_cross_entropy_backward: no forward yet");
  size_t V = (size_t)ce->vocab_local;
  float ls = ce->label_smoothing, sm = ls > 0 ? ls * (float)V / (float)(V - 1) : 0;
  for (int i = 0; i < ce->n; i++) {
    float *g = dlogits + i * V;
    memcpy(g, ce->softmax + i * V, V * sizeof(float));
    int64_t t = ce->targets[i] - ce->vocab_start;
    if (t >= 0 && t < (int64_t)V) g[t] -= ls > 0 ? 1.0f - sm : 1.0f;
    if (ls > 0)
      for (size_t j = 0; j < V; j++) g[j] -= sm / (float)V;
    for (size_t j = 0; j < V; j++) g[j] *= dloss[i];
  }
  return MPU_SUCCESS;
}

void mpu_vocab_cross_entropy_free(mpu_vocab_cross_entropy *ce) {
  if (!ce) return;
  free(ce->softmax);
  free(ce->targets);
  ce->softmax = NULL;
  ce->targets = NULL;
}

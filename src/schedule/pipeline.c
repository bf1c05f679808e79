/*
 * pipeline.c - running a schedule's order over the pipeline group.
 *
 * Each step receives what it needs, runs the model's callback and sends what
 * the next virtual stage needs: a forward's input from the previous virtual
 * stage, a backward's output gradient from the next. Activations and
 * gradients travel on two communicators of the same members, so that each
 * direction between two ranks carries one stream, and every stream's
 * receiver takes its messages in the order the sender sent them: both walk
 * the same schedule table (chunk c of rank pp - 1 feeds chunk c + 1 of rank
 * 0, which comes in the same order), and sends return once copied (host
 * backends), so no rank waits on a peer that waits on it.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mpu/schedule.h"

struct mpu_pipeline {
  mpu_comm *acts, *grads;  /* the group twice */
  int size, rank;
  size_t count;
  float *in, *out, *gin, *gout;
};

void mpu_pipeline_free(mpu_pipeline *p) {
  if (!p) return;
  mpu_comm_destroy(p->acts);
  mpu_comm_destroy(p->grads);
  free(p->in), free(p->out), free(p->gin), free(p->gout);
  free(p);
}

/* The group's members in order: its own copy is a group of all of them. */
static mpu_result_t dup(mpu_comm *g, int size, mpu_comm **out) {
  int *members = malloc((size_t)size * sizeof *members);
  if (!members) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_pipeline_create");
  for (int i = 0; i < size; i++) members[i] = i;
  mpu_result_t r = mpu_comm_create_group(g, members, size, out);
  free(members);
  return r;
}

mpu_result_t mpu_pipeline_create(mpu_comm *pp_group, size_t count, mpu_pipeline **out) {
  static const char fn[] = "mpu_pipeline_create";
  if (!pp_group || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!count || count > ((size_t)1 << 34))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %zu elements per activation", fn, count);
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(pp_group, &caps));
  if (caps.memory != MPU_MEMORY_HOST)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "%s: the pipeline runner moves host buffers with sends that do not wait "
                      "for the receiver (threads, MPI); a %s group needs batched p2p", fn,
                      mpu_comm_backend(pp_group));
  mpu_pipeline *p = calloc(1, sizeof *p);
  if (!p) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = mpu_comm_size(pp_group, &p->size);
  if (!r) r = mpu_comm_rank(pp_group, &p->rank);
  p->count = count;
  if (!r) r = dup(pp_group, p->size, &p->acts);
  if (!r) r = dup(pp_group, p->size, &p->grads);
  if (!r) {
    p->in = malloc(count * sizeof(float)), p->out = malloc(count * sizeof(float));
    p->gin = malloc(count * sizeof(float)), p->gout = malloc(count * sizeof(float));
    if (!p->in || !p->out || !p->gin || !p->gout)
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: 4 x %zu floats", fn, count);
  }
  if (r) {
    mpu_pipeline_free(p);
    return r;
  }
  *out = p;
  return MPU_SUCCESS;
}

mpu_result_t mpu_pipeline_run(mpu_pipeline *p, const mpu_schedule_config *cfg,
                              const mpu_pipeline_callbacks *cb, FILE *trace) {
  static const char fn[] = "mpu_pipeline_run";
  if (!p || !cfg || !cb || !cb->forward || (!cb->backward && !cfg->forward_only))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL pipeline, config or callback", fn);
  if (cfg->pp != p->size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the schedule has %d stages, the group %d",
                      fn, cfg->pp, p->size);
  int n, warmup;
  MPU_CHECK(mpu_schedule_count(cfg, p->rank, &n, &warmup));
  mpu_schedule_step *order = malloc((size_t)n * sizeof *order);
  if (!order) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d steps", fn, n);
  mpu_result_t r = mpu_schedule_order(cfg, p->rank, order, (size_t)n, &n);
  int P = p->size, V = P * cfg->vp;
  for (int i = 0; i < n && !r; i++) {
    const mpu_schedule_step *s = &order[i];
    int vs = s->chunk * P + p->rank, prev = (p->rank - 1 + P) % P, next = (p->rank + 1) % P;
    int from = -1, to = -1;
    if (s->phase == 'F') {
      if (vs > 0) from = prev, r = mpu_comm_recv(p->acts, p->in, p->count, MPU_FLOAT32, prev);
      if (!r) r = cb->forward(cb->user, s->microbatch, s->chunk, vs > 0 ? p->in : NULL, p->out);
      if (!r && vs < V - 1)
        to = next, r = mpu_comm_send(p->acts, p->out, p->count, MPU_FLOAT32, next);
    } else {
      if (vs < V - 1) from = next, r = mpu_comm_recv(p->grads, p->gout, p->count, MPU_FLOAT32, next);
      if (!r)
        r = cb->backward(cb->user, s->microbatch, s->chunk, vs < V - 1 ? p->gout : NULL,
                         vs > 0 ? p->gin : NULL);
      if (!r && vs > 0) to = prev, r = mpu_comm_send(p->grads, p->gin, p->count, MPU_FLOAT32, prev);
    }
    if (r) mpu__error_prefix("%s: stage %d, %s of micro-batch %d on chunk %d", fn, p->rank,
                             s->phase == 'F' ? "forward" : "backward", s->microbatch, s->chunk);
    if (trace && !r) {
      fprintf(trace, "stage %d: %c %d.%d", p->rank, s->phase, s->microbatch, s->chunk);
      if (from >= 0) fprintf(trace, " recv %d", from);
      if (to >= 0) fprintf(trace, " send %d", to);
      fprintf(trace, "\n");
    }
  }
  free(order);
  return r;
}

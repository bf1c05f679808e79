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
 * 0, which comes in the same order).
 *
 * A step's send and the next step's receive are one group (mpu_group_start/
 * end), as Megatron's send_forward_recv_backward and its batched p2p: on
 * NCCL, whose send completes only when the peer receives, two neighbours
 * that send to each other at once then do not wait on each other; host
 * backends run the group's send first. Buffers are the communicator's
 * memory (device memory on NCCL, from mpu_comm_mem_alloc), and so are the
 * callbacks' inputs and outputs.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mpu/schedule.h"

struct mpu_pipeline {
  mpu_comm *acts, *grads;  /* the group twice */
  int size, rank;
  int rendezvous; /* sends wait for their receiver (NCCL) */
  size_t count;
  float *in, *out, *gin, *gout;
};

void mpu_pipeline_free(mpu_pipeline *p) {
  if (!p) return;
  float *bufs[] = {p->in, p->out, p->gin, p->gout};
  for (int i = 0; i < 4; i++)
    if (bufs[i]) mpu_comm_mem_free(p->acts, bufs[i]);
  mpu_comm_destroy(p->acts);
  mpu_comm_destroy(p->grads);
  free(p);
}

/* The group's members in order: its own copy is a group of all of them (a
 * split where groups come only from splits: NCCL from the environment). */
static mpu_result_t dup(mpu_comm *g, int size, int by_split, mpu_comm **out) {
  if (by_split) {
    int rank;
    MPU_CHECK(mpu_comm_rank(g, &rank));
    return mpu_comm_split(g, 0, rank, out);
  }
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
  mpu_pipeline *p = calloc(1, sizeof *p);
  if (!p) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = mpu_comm_size(pp_group, &p->size);
  if (!r) r = mpu_comm_rank(pp_group, &p->rank);
  p->rendezvous = caps.memory == MPU_MEMORY_DEVICE; /* NCCL's point to point */
  p->count = count;
  if (!r) r = dup(pp_group, p->size, caps.groups_by_split, &p->acts);
  if (!r) r = dup(pp_group, p->size, caps.groups_by_split, &p->grads);
  float **bufs[] = {&p->in, &p->out, &p->gin, &p->gout};
  for (int i = 0; i < 4 && !r; i++) /* the communicator's memory: device memory on NCCL */
    r = mpu_comm_mem_alloc(p->acts, count * sizeof(float), (void **)bufs[i]);
  if (r) {
    mpu_pipeline_free(p);
    return r;
  }
  *out = p;
  return MPU_SUCCESS;
}

/* What step s moves: a receive before it (from >= 0) and a send after it (to >= 0). */
typedef struct step_io {
  mpu_comm *rc, *sc;
  float *rbuf, *sbuf;
  int from, to;
} step_io;

static const step_io no_io = {NULL, NULL, NULL, NULL, -1, -1};

static step_io io_of(const mpu_pipeline *p, const mpu_schedule_step *s, int V) {
  int P = p->size, vs = s->chunk * P + p->rank;
  int prev = (p->rank - 1 + P) % P, next = (p->rank + 1) % P;
  step_io io = no_io;
  if (s->phase == 'F') {
    if (vs > 0) io.rc = p->acts, io.rbuf = p->in, io.from = prev;
    if (vs < V - 1) io.sc = p->acts, io.sbuf = p->out, io.to = next;
  } else {
    if (vs < V - 1) io.rc = p->grads, io.rbuf = p->gout, io.from = next;
    if (vs > 0) io.sc = p->grads, io.sbuf = p->gin, io.to = prev;
  }
  return io;
}

/* One group: the sends of the block that just ran and the receives of the
 * next block (blocks of one or two steps, see block_end). */
static mpu_result_t exchange(const mpu_pipeline *p, const step_io *sends, int nsends,
                             const step_io *recvs, int nrecvs) {
  int any = 0;
  for (int i = 0; i < nsends; i++) any |= sends[i].to >= 0;
  for (int i = 0; i < nrecvs; i++) any |= recvs[i].from >= 0;
  if (!any) return MPU_SUCCESS;
  MPU_CHECK(mpu_group_start());
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; i < nsends && !r; i++)
    if (sends[i].to >= 0) r = mpu_comm_send(sends[i].sc, sends[i].sbuf, p->count, MPU_FLOAT32, sends[i].to);
  for (int i = 0; i < nrecvs && !r; i++)
    if (recvs[i].from >= 0)
      r = mpu_comm_recv(recvs[i].rc, recvs[i].rbuf, p->count, MPU_FLOAT32, recvs[i].from);
  mpu_result_t e = mpu_group_end(); /* always closes the group it opened */
  return r ? r : e;
}

/* Where the steps' communication goes: 1 if a group follows step i. Every
 * step is a block of its own, except in the steady state of the interleaved
 * schedule, where a forward and the backward after it are one block, as in
 * Megatron's forward_backward_pipelining_with_interleaving: one
 * send_forward_backward_recv_forward_backward after both, which receives
 * the next forward's input and the next backward's gradient together. (One
 * group per step would make two neighbours send gradients to each other at
 * once there, which NCCL's sends cannot.) */
static int block_end(const mpu_schedule_config *cfg, const mpu_schedule_step *order, int n,
                     int warmup, int i) {
  if (i + 1 >= n) return 1;
  if (cfg->kind != MPU_SCHEDULE_INTERLEAVED || i < warmup) return 1;
  /* pairs from the first step after the warmup: (F, B), (F, B), ... */
  int k = warmup;
  while (k + 1 < n && order[k].phase == 'F' && order[k + 1].phase == 'B') {
    if (i == k) return 0;
    if (i == k + 1) return 1;
    k += 2;
  }
  return 1;
}

mpu_result_t mpu_pipeline_run(mpu_pipeline *p, const mpu_schedule_config *cfg,
                              const mpu_pipeline_callbacks *cb, FILE *trace) {
  static const char fn[] = "mpu_pipeline_run";
  if (!p || !cfg || !cb || !cb->forward || (!cb->backward && !cfg->forward_only))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL pipeline, config or callback", fn);
  if (cfg->pp != p->size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the schedule has %d stages, the group %d",
                      fn, cfg->pp, p->size);
  /* Micro-batch groups larger than the pipeline make the last stage send a
   * wrapped activation to the first while the first still sends its warm-up
   * forwards: with sends that wait for their receiver, both wait. */
  if (p->rendezvous && cfg->kind == MPU_SCHEDULE_INTERLEAVED && cfg->group_size > cfg->pp)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "%s: on a %s group, whose sends wait for their receiver, the interleaved "
                      "schedule takes micro-batch groups of at most pp (%d; Megatron's default), "
                      "not %d",
                      fn, mpu_comm_backend(p->acts), cfg->pp, cfg->group_size);
  int n, warmup;
  MPU_CHECK(mpu_schedule_count(cfg, p->rank, &n, &warmup));
  mpu_schedule_step *order = malloc((size_t)n * sizeof *order);
  if (!order) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d steps", fn, n);
  mpu_result_t r = mpu_schedule_order(cfg, p->rank, order, (size_t)n, &n);
  int V = p->size * cfg->vp;
  step_io *io = r ? NULL : malloc((size_t)(n > 0 ? n : 1) * sizeof *io);
  if (!r && !io) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d steps", fn, n);
  for (int i = 0; i < n && !r; i++) io[i] = io_of(p, &order[i], V);
  /* blocks [start, end]: receive the block's inputs, run it, send its outputs */
  int start = 0, end = 0;
  while (!r && end < n && !block_end(cfg, order, n, warmup, end)) end++;
  if (!r && n > 0) r = exchange(p, NULL, 0, io, end + 1); /* the first block's inputs */
  for (int i = 0; i < n && !r; i++) {
    const mpu_schedule_step *s = &order[i];
    int vs = s->chunk * p->size + p->rank;
    if (s->phase == 'F')
      r = cb->forward(cb->user, s->microbatch, s->chunk, io[i].from >= 0 ? p->in : NULL, p->out);
    else
      r = cb->backward(cb->user, s->microbatch, s->chunk, vs < V - 1 ? p->gout : NULL,
                       vs > 0 ? p->gin : NULL);
    if (!r && i == end) { /* this block's outputs, the next block's inputs */
      int next_start = end + 1, next_end = next_start;
      while (next_end < n && !block_end(cfg, order, n, warmup, next_end)) next_end++;
      int nrecv = next_start < n ? next_end - next_start + 1 : 0;
      r = exchange(p, io + start, end - start + 1, io + next_start, nrecv);
      start = next_start, end = next_end;
    }
    if (r) mpu__error_prefix("%s: stage %d, %s of micro-batch %d on chunk %d", fn, p->rank,
                             s->phase == 'F' ? "forward" : "backward", s->microbatch, s->chunk);
    if (trace && !r) {
      fprintf(trace, "stage %d: %c %d.%d", p->rank, s->phase, s->microbatch, s->chunk);
      if (io[i].from >= 0) fprintf(trace, " recv %d", io[i].from);
      if (io[i].to >= 0) fprintf(trace, " send %d", io[i].to);
      fprintf(trace, "\n");
    }
  }
  free(io);
  free(order);
  return r;
}

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
 * callbacks' inputs and outputs; each boundary between virtual stages moves
 * its own dtype and count (mpu_pipeline_config), in buffers as large as the
 * largest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"
#include "mpu/schedule.h"

/* What crosses one boundary: its dtype and shape, count elements of es bytes. */
typedef struct boundary {
  mpu_tensor view; /* data NULL: the shape only */
  size_t count, es;
} boundary;

struct mpu_pipeline {
  mpu_comm *acts, *grads;  /* the group twice */
  int size, rank;
  int rendezvous; /* sends wait for their receiver (NCCL) */
  int nb;         /* boundaries described: 1 (every boundary alike) or pp x vp - 1 */
  boundary *b;    /* [nb] */
  int all_float;  /* every boundary float32: the float callbacks may run it */
  size_t bytes;   /* each buffer: the largest boundary */
  void *in, *out, *gin, *gout;
};

void mpu_pipeline_free(mpu_pipeline *p) {
  if (!p) return;
  void *bufs[] = {p->in, p->out, p->gin, p->gout};
  for (int i = 0; i < 4; i++)
    if (bufs[i]) mpu_comm_mem_free(p->acts, bufs[i]);
  mpu_comm_destroy(p->acts);
  mpu_comm_destroy(p->grads);
  free(p->b);
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

/* Boundary `which`'s description, checked: a dtype, 1..8 dims of at least
 * one element each, 1..2^34 elements. */
static mpu_result_t take_boundary(const char *fn, int which, mpu_dtype dt, int ndim,
                                  const int64_t *shape, boundary *out) {
  char where[32] = "every boundary";
  if (which >= 0) snprintf(where, sizeof where, "boundary %d", which);
  if (!mpu_dtype_size(dt))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s's dtype is %d", fn, where, (int)dt);
  if (ndim < 1 || ndim > MPU_TENSOR_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s has %d dims (want 1..%d)", fn, where,
                      ndim, MPU_TENSOR_MAX_DIMS);
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1 || (uint64_t)shape[d] > ((uint64_t)1 << 34) || n > ((size_t)1 << 34) / (size_t)shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s's dim %d is %lld (want 1 to 2^34 elements in all)", fn, where, d,
                        (long long)shape[d]);
    n *= (size_t)shape[d];
  }
  memset(out, 0, sizeof *out);
  out->view.dtype = dt, out->view.ndim = ndim;
  memcpy(out->view.shape, shape, (size_t)ndim * sizeof *shape);
  out->count = n, out->es = mpu_dtype_size(dt);
  return MPU_SUCCESS;
}

mpu_result_t mpu_pipeline_create_ex(mpu_comm *pp_group, const mpu_pipeline_config *cfg,
                                    mpu_pipeline **out) {
  static const char fn[] = "mpu_pipeline_create";
  if (!pp_group || !cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(mpu__check_size(fn, "config", "MPU_PIPELINE_CONFIG_INIT", cfg->size,
                            sizeof(mpu_pipeline_config), sizeof(mpu_pipeline_config)));
  if (cfg->nboundaries < 0 || cfg->nboundaries > 4096 || (cfg->nboundaries && !cfg->boundaries))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d boundaries at %p (want 0..4096)", fn,
                      cfg->nboundaries, (const void *)cfg->boundaries);
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(pp_group, &caps));
  mpu_pipeline *p = calloc(1, sizeof *p);
  int nb = cfg->nboundaries ? cfg->nboundaries : 1;
  if (p) p->b = calloc((size_t)nb, sizeof *p->b);
  if (!p || !p->b) {
    mpu_pipeline_free(p);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  p->nb = nb;
  p->all_float = 1;
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; i < nb && !r; i++) {
    const mpu_tensor *t = cfg->nboundaries ? &cfg->boundaries[i] : NULL;
    r = take_boundary(fn, t ? i : -1, t ? t->dtype : cfg->dtype, t ? t->ndim : cfg->ndim,
                      t ? t->shape : cfg->shape, &p->b[i]);
    if (!r && p->b[i].count * p->b[i].es > p->bytes) p->bytes = p->b[i].count * p->b[i].es;
    if (!r) p->all_float &= p->b[i].view.dtype == MPU_FLOAT32;
  }
  if (!r) r = mpu_comm_size(pp_group, &p->size);
  if (!r) r = mpu_comm_rank(pp_group, &p->rank);
  p->rendezvous = caps.memory == MPU_MEMORY_DEVICE; /* NCCL's point to point */
  if (!r) r = dup(pp_group, p->size, caps.groups_by_split, &p->acts);
  if (!r) r = dup(pp_group, p->size, caps.groups_by_split, &p->grads);
  void **bufs[] = {&p->in, &p->out, &p->gin, &p->gout};
  for (int i = 0; i < 4 && !r; i++) /* the communicator's memory: device memory on NCCL */
    r = mpu_comm_mem_alloc(p->acts, p->bytes, bufs[i]);
  if (r) {
    mpu_pipeline_free(p);
    return r;
  }
  *out = p;
  return MPU_SUCCESS;
}

mpu_result_t mpu_pipeline_create(mpu_comm *pp_group, size_t count, mpu_pipeline **out) {
  if (!count || count > ((size_t)1 << 34))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_pipeline_create: %zu elements per activation",
                      count);
  mpu_pipeline_config cfg = MPU_PIPELINE_CONFIG_INIT;
  cfg.ndim = 1, cfg.shape[0] = (int64_t)count;
  return mpu_pipeline_create_ex(pp_group, &cfg, out);
}

/* Boundary k's description (k = 0..V-2): its own, or the one of all. */
static const boundary *boundary_of(const mpu_pipeline *p, int k) { return &p->b[p->nb > 1 ? k : 0]; }

/* What step s moves: a receive before it (from >= 0) and a send after it
 * (to >= 0), each of its boundary's dtype and count. */
typedef struct step_io {
  mpu_comm *rc, *sc;
  void *rbuf, *sbuf;
  const boundary *rb, *sb;
  int from, to;
} step_io;

static const step_io no_io = {NULL, NULL, NULL, NULL, NULL, NULL, -1, -1};

static step_io io_of(const mpu_pipeline *p, const mpu_schedule_step *s, int V) {
  int P = p->size, vs = s->chunk * P + p->rank;
  int prev = (p->rank - 1 + P) % P, next = (p->rank + 1) % P;
  step_io io = no_io;
  if (s->phase == 'F') {
    if (vs > 0) io.rc = p->acts, io.rbuf = p->in, io.rb = boundary_of(p, vs - 1), io.from = prev;
    if (vs < V - 1) io.sc = p->acts, io.sbuf = p->out, io.sb = boundary_of(p, vs), io.to = next;
  } else {
    if (vs < V - 1) io.rc = p->grads, io.rbuf = p->gout, io.rb = boundary_of(p, vs), io.from = next;
    if (vs > 0) io.sc = p->grads, io.sbuf = p->gin, io.sb = boundary_of(p, vs - 1), io.to = prev;
  }
  return io;
}

/* One group: the sends of the block that just ran and the receives of the
 * next block (blocks of one or two steps, see block_end). */
static mpu_result_t exchange(const step_io *sends, int nsends, const step_io *recvs, int nrecvs) {
  int any = 0;
  for (int i = 0; i < nsends; i++) any |= sends[i].to >= 0;
  for (int i = 0; i < nrecvs; i++) any |= recvs[i].from >= 0;
  if (!any) return MPU_SUCCESS;
  MPU_CHECK(mpu_group_start());
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; i < nsends && !r; i++)
    if (sends[i].to >= 0)
      r = mpu_comm_send(sends[i].sc, sends[i].sbuf, sends[i].sb->count, sends[i].sb->view.dtype,
                        sends[i].to);
  for (int i = 0; i < nrecvs && !r; i++)
    if (recvs[i].from >= 0)
      r = mpu_comm_recv(recvs[i].rc, recvs[i].rbuf, recvs[i].rb->count, recvs[i].rb->view.dtype,
                        recvs[i].from);
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

/* The callbacks of either form: float ones get the buffers as mpu_pipeline_run
 * always gave them (output even on the last virtual stage), tensor ones views. */
typedef struct stage_fns {
  const mpu_pipeline_callbacks *f;
  const mpu_pipeline_tensor_callbacks *t;
} stage_fns;

static mpu_result_t call_step(const mpu_pipeline *p, const stage_fns *fns,
                              const mpu_schedule_step *s, int V) {
  int vs = s->chunk * p->size + p->rank, first = vs == 0, last = vs == V - 1;
  int fwd = s->phase == 'F';
  void *a = fwd ? p->in : p->gout, *b = fwd ? p->out : p->gin;
  if (fns->f) {
    if (fwd) return fns->f->forward(fns->f->user, s->microbatch, s->chunk, first ? NULL : a, b);
    return fns->f->backward(fns->f->user, s->microbatch, s->chunk, last ? NULL : a, first ? NULL : b);
  }
  mpu_tensor before, after; /* boundary vs - 1 and boundary vs */
  if (!first) before = boundary_of(p, vs - 1)->view, before.data = fwd ? a : b;
  if (!last) after = boundary_of(p, vs)->view, after.data = fwd ? b : a;
  if (fwd)
    return fns->t->forward(fns->t->user, s->microbatch, s->chunk, first ? NULL : &before,
                           last ? NULL : &after);
  return fns->t->backward(fns->t->user, s->microbatch, s->chunk, last ? NULL : &after,
                          first ? NULL : &before);
}

static mpu_result_t run(mpu_pipeline *p, const mpu_schedule_config *cfg, const stage_fns *fns,
                        FILE *trace) {
  static const char fn[] = "mpu_pipeline_run";
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
  int V = p->size * cfg->vp;
  if (p->nb > 1 && p->nb != V - 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the pipeline describes %d boundaries, the schedule has %d (pp %d x vp "
                      "%d virtual stages)",
                      fn, p->nb, V - 1, cfg->pp, cfg->vp);
  mpu_schedule_step *order = malloc((size_t)n * sizeof *order);
  if (!order) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d steps", fn, n);
  mpu_result_t r = mpu_schedule_order(cfg, p->rank, order, (size_t)n, &n);
  step_io *io = r ? NULL : malloc((size_t)(n > 0 ? n : 1) * sizeof *io);
  if (!r && !io) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d steps", fn, n);
  for (int i = 0; i < n && !r; i++) io[i] = io_of(p, &order[i], V);
  /* blocks [start, end]: receive the block's inputs, run it, send its outputs */
  int start = 0, end = 0;
  while (!r && end < n && !block_end(cfg, order, n, warmup, end)) end++;
  if (!r && n > 0) r = exchange(NULL, 0, io, end + 1); /* the first block's inputs */
  for (int i = 0; i < n && !r; i++) {
    const mpu_schedule_step *s = &order[i];
    r = call_step(p, fns, s, V);
    if (!r && i == end) { /* this block's outputs, the next block's inputs */
      int next_start = end + 1, next_end = next_start;
      while (next_end < n && !block_end(cfg, order, n, warmup, next_end)) next_end++;
      int nrecv = next_start < n ? next_end - next_start + 1 : 0;
      r = exchange(io + start, end - start + 1, io + next_start, nrecv);
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

mpu_result_t mpu_pipeline_run(mpu_pipeline *p, const mpu_schedule_config *cfg,
                              const mpu_pipeline_callbacks *cb, FILE *trace) {
  static const char fn[] = "mpu_pipeline_run";
  if (!p || !cfg || !cb || !cb->forward || (!cb->backward && !cfg->forward_only))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL pipeline, config or callback", fn);
  for (int k = 0; k < p->nb && !p->all_float; k++)
    if (p->b[k].view.dtype != MPU_FLOAT32)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: boundary %d carries %s; the float callbacks take float32 "
                        "(mpu_pipeline_run_tensors takes any dtype)",
                        fn, k, mpu_dtype_name(p->b[k].view.dtype));
  stage_fns fns = {cb, NULL};
  return run(p, cfg, &fns, trace);
}

mpu_result_t mpu_pipeline_run_tensors(mpu_pipeline *p, const mpu_schedule_config *cfg,
                                      const mpu_pipeline_tensor_callbacks *cb, FILE *trace) {
  if (!p || !cfg || !cb || !cb->forward || (!cb->backward && !cfg->forward_only))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_pipeline_run_tensors: NULL pipeline, config or callback");
  stage_fns fns = {NULL, cb};
  return run(p, cfg, &fns, trace);
}

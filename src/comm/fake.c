/*
 * fake.c - the fake backend: this process is rank R of a world of W, and no
 * data moves.
 *
 * Like PyTorch's "fake" process group, collectives over more than one rank
 * succeed at once and leave outputs as they are; this is what lets a test ask
 * every parallel-state question as rank 3000 of 4096 on one machine. A
 * communicator of one rank has nobody to pretend about, so it behaves exactly
 * (outputs are the inputs), and so do messages a rank sends to itself.
 * Arguments are still checked by comm.c, so a bad call fails here as it would
 * on a real backend.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/error.h"

static const mpu__comm_ops fake_ops;

/* Over more than one rank nothing moves: outputs keep what they held
 * (comm.c answers a group of one exactly). */
static mpu_result_t fake_start(mpu_comm *c, const mpu__call *call, void **handle) {
  (void)c, (void)call;
  *handle = NULL;
  return MPU_SUCCESS;
}

/* Messages a rank sent to itself, oldest first: the impl of a fake comm. */
typedef struct fake_msg {
  struct fake_msg *next;
  size_t count;
  mpu_dtype dtype;
  char data[];
} fake_msg;

typedef struct fake_state {
  fake_msg *head, *tail;
  /* a described group (group_described): how to list its members */
  mpu_result_t (*list)(const void *ctx, int *out, int size);
  void *ctx;
  void (*free_ctx)(void *ctx);
} fake_state;

static mpu_result_t fake_send(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  const void *buf = send;
  if (peer != c->rank) return MPU_SUCCESS; /* nobody there to receive it */
  fake_state *st = c->impl;
  size_t bytes = count * mpu_dtype_size(dt);
  fake_msg *m = malloc(sizeof *m + bytes);
  if (!m) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_send: %zu bytes", bytes);
  *m = (fake_msg){NULL, count, dt};
  if (bytes) memcpy(m->data, buf, bytes);
  if (st->tail) st->tail->next = m;
  else st->head = m;
  st->tail = m;
  return MPU_SUCCESS;
}

static mpu_result_t fake_recv(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  void *buf = recv;
  if (peer != c->rank) return MPU_SUCCESS; /* pretend: the buffer keeps what it held */
  fake_state *st = c->impl;
  fake_msg *m = st->head;
  if (!m)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_comm_recv: rank %d receives from itself but sent nothing: it would "
                      "wait forever",
                      c->rank);
  st->head = m->next;
  if (!st->head) st->tail = NULL;
  mpu_result_t r = mpu__deliver(buf, count, dt, m->data, m->count, m->dtype, peer);
  free(m);
  return r;
}

static mpu_result_t fake_new(int rank, int size, const int *world_ranks, mpu_comm **out) {
  fake_state *st = calloc(1, sizeof *st);
  mpu_comm *c = st ? mpu__comm_new(&fake_ops, rank, size, world_ranks, st) : NULL;
  if (!c) {
    free(st);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "fake: communicator of %d ranks", size);
  }
  *out = c;
  return MPU_SUCCESS;
}

/* The caller alone decides: the members are known, so no peer is needed. */
static mpu_result_t fake_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  MPU_CHECK(mpu__comm_members(c));
  int *wr = malloc((size_t)n * sizeof(int));
  if (!wr) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "fake: group of %d", n);
  int me = 0;
  for (int i = 0; i < n; i++) {
    wr[i] = mpu__comm_world_rank(c, members[i]);
    if (members[i] == c->rank) me = i;
  }
  mpu_result_t r = fake_new(me, n, wr, out);
  free(wr);
  return r;
}

/* A split needs every rank's color, which a fake rank cannot know. */
static mpu_result_t fake_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  (void)key;
  if (color == MPU_COMM_SPLIT_NOCOLOR) {
    *out = NULL;
    return MPU_SUCCESS;
  }
  if (c->size == 1) {
    MPU_CHECK(mpu__comm_members(c));
    return fake_new(0, 1, c->world_ranks, out);
  }
  return mpu__error(MPU_ERR_UNSUPPORTED,
                    "mpu_comm_split: the fake backend cannot learn the other ranks' colors; "
                    "compute the members and use mpu_comm_create_group");
}

static mpu_result_t fake_abort(mpu_comm *c) {
  (void)c;
  return MPU_SUCCESS;
}

static mpu_result_t fake_list_members(const mpu_comm *c, int *world_ranks) {
  const fake_state *st = c->impl;
  return st->list(st->ctx, world_ranks, c->size); /* only lazy_members comms get here */
}

static void fake_destroy(mpu_comm *c) {
  fake_state *st = c->impl;
  if (st->free_ctx) st->free_ctx(st->ctx);
  while (st->head) {
    fake_msg *m = st->head;
    st->head = m->next;
    free(m);
  }
  free(st);
}

static mpu_result_t fake_group_described(mpu_comm *world, int pos, int size,
                                         mpu_result_t (*list)(const void *ctx, int *out, int size),
                                         void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out);

static void fake_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->moves_data = c->size == 1; /* a rank of many cannot see its peers' inputs */
  caps->described_groups = 1;
}

static const mpu__comm_ops fake_ops = {
    .name = "fake",
    .start = fake_start,
    .start_nb = fake_start, /* nothing moves: a non-blocking call is done at once */
    .send = fake_send,
    .recv = fake_recv,
    .create_group = fake_create_group,
    .split = fake_split,
    .abort = fake_abort,
    .destroy = fake_destroy,
    .list_members = fake_list_members,
    .group_described = fake_group_described,
    .caps = fake_caps,
};

static mpu_result_t fake_group_described(mpu_comm *world, int pos, int size,
                                         mpu_result_t (*list)(const void *ctx, int *out, int size),
                                         void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out) {
  (void)world;
  MPU_CHECK(fake_new(pos, size, NULL, out));
  fake_state *st = (*out)->impl;
  st->list = list, st->ctx = ctx, st->free_ctx = free_ctx;
  (*out)->lazy_members = 1;
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_fake_create(int rank, int size, mpu_comm **out) {
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_fake_create: out is NULL");
  if (size < 1 || rank < 0 || rank >= size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_comm_fake_create: rank %d of %d (want size >= 1, 0 <= rank < size)",
                      rank, size);
  return fake_new(rank, size, NULL, out);
}

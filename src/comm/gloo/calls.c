/*
 * calls.c - the gloo backend's collectives and send/recv, on gloo's unbound
 * buffers. A collective is at most three rounds (round.c: every rank's
 * messages to and from every peer at once, the small ones eagerly):
 *
 *   check   (call checking on) the call's signature to every peer, compared
 *           by every rank alike (base/signature.c): a mismatch fails on all of
 *           them before any data moves, and a rank that never came is named.
 *           An all_reduce of at most 64 bytes travels in it, reduced by every
 *           rank on arrival: one round in all. all_to_all_v adds a round of
 *           count rows, so every rank sees every pair's counts agree.
 *   data    one or two rounds by the table in data (the one switch on the
 *           collective), e.g. all_reduce = chunk k of every input to rank k,
 *           reduced there, then every reduced chunk to every rank; inputs of
 *           at most 32 KiB together go whole to every rank in one round.
 *
 * Reductions are base/reduce.c's, sources in rank order, so results equal
 * the threads and MPI backends' bit for bit. Sends are eager: send copies
 * the message, posts it and returns; the copy is freed once gloo says it
 * went out (mpu__gloo_reap).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/reduce.h"
#include "comm/gloo/gloo.h"
#include "core/clock.h"

#define INLINE_BYTES 64
/* an all_reduce or reduce whose inputs together are at most this: one round,
 * every input to every rank (or the root), where two rounds of chunks would
 * only add a round trip (the MPI backend's rule too) */
#define SMALL_BYTES (32u << 10)

typedef struct rec {
  mpu__sig sig;
  unsigned char data[INLINE_BYTES]; /* a small all_reduce's input */
} rec;

/* ---- call checking ---- */

static mpu_result_t check_call(mpu_comm *c, const char *fn, const mpu__call *call, rec *recs,
                               int *inline_done) {
  int n = c->size, me = c->rank;
  MPU__CALL_ARGS(call);
  memset(&recs[me], 0, sizeof *recs);
  recs[me].sig = call->sig;
  size_t bytes = count * mpu_dtype_size(dt);
  int small = call->sig.kind == MPU_COLL_ALL_REDUCE && bytes <= INLINE_BYTES;
  if (small && bytes) memcpy(recs[me].data, send, bytes);
  mpu__round rd;
  mpu_result_t r = mpu__round_new(n, &rd);
  if (!r) {
    mpu__round_all(&rd, n, &recs[me], sizeof *recs, (char *)recs, sizeof *recs, sizeof *recs);
    r = mpu__gloo_round(c, fn, "the call's signature", MPU__GLOO_SLOT_SIG, &rd);
  }
  mpu__round_free(&rd);
  MPU_CHECK(r);
  MPU_CHECK(mpu__sig_compare(fn, recs, sizeof *recs, n, c->world_ranks, MPU__CHECK_ALL));
  *inline_done = 0;
  if (small) { /* every rank has every input: reduce here, in rank order */
    const void **srcs = malloc((size_t)n * sizeof *srcs);
    if (!srcs) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    for (int j = 0; j < n; j++) srcs[j] = recs[j].data;
    if (bytes) mpu__reduce(recv, srcs, n, count, dt, op, n);
    free(srcs);
    *inline_done = 1;
  }
  return MPU_SUCCESS;
}

/* all_to_all_v: every rank's (send, receive) count rows to every rank, and
 * every pair checked by all alike: what a sends b is what b takes from a. */
static mpu_result_t check_rows(mpu_comm *c, const char *fn, const mpu__call *call) {
  int n = c->size, me = c->rank;
  size_t row = 2 * (size_t)n;
  uint64_t *rows = calloc((size_t)n * row, sizeof *rows);
  if (!rows) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: count rows of %d ranks", fn, n);
  for (int j = 0; j < n; j++)
    rows[me * row + (size_t)j] = call->counts[j], rows[me * row + (size_t)n + j] = call->rcounts[j];
  mpu__round rd;
  mpu_result_t r = mpu__round_new(n, &rd);
  if (!r) {
    mpu__round_all(&rd, n, rows + me * row, row * sizeof *rows, (char *)rows, row * sizeof *rows,
              row * sizeof *rows);
    r = mpu__gloo_round(c, fn, "the count rows", MPU__GLOO_SLOT_ROWS, &rd);
  }
  mpu__round_free(&rd);
  for (int a = 0; a < n && !r; a++)
    for (int b = 0; b < n && !r; b++)
      if (rows[a * row + (size_t)b] != rows[b * row + (size_t)n + a])
        r = mpu__error(MPU_ERR_MISMATCH,
                       "%s: rank %d sends %llu elements to rank %d, which takes %llu from it",
                       fn, mpu__comm_world_rank(c, a), (unsigned long long)rows[a * row + (size_t)b],
                       mpu__comm_world_rank(c, b), (unsigned long long)rows[b * row + (size_t)n + a]);
  free(rows);
  return r;
}

/* ---- the data rounds ---- */

/* Chunk k of every rank's input (at in + off(k), len(k) bytes each) to rank k,
 * reduced there in rank order into out (len(me) bytes). tmp holds n pieces of
 * stride bytes. */
static mpu_result_t spread_reduce(mpu_comm *c, const char *fn, const mpu__call *call, mpu__round *rd,
                                  const size_t *off, const size_t *len, char *tmp, size_t stride,
                                  void *out, size_t count_me) {
  int n = c->size, me = c->rank;
  MPU__CALL_ARGS(call);
  for (int j = 0; j < n; j++) {
    rd->sp[j] = (const char *)send + off[j], rd->sn[j] = len[j];
    rd->rp[j] = tmp + (size_t)j * stride, rd->rn[j] = len[me];
  }
  MPU_CHECK(mpu__gloo_round(c, fn, "the pieces to reduce", MPU__GLOO_SLOT_SPREAD, rd));
  const void **srcs = malloc((size_t)n * sizeof *srcs);
  if (!srcs) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  for (int j = 0; j < n; j++) srcs[j] = j == me ? (const char *)send + off[me] : tmp + (size_t)j * stride;
  if (count_me) mpu__reduce(out, srcs, n, count_me, dt, op, n);
  free(srcs);
  return MPU_SUCCESS;
}

static int mul_ok(size_t a, size_t b, size_t *out) {
  if (b && a > SIZE_MAX / b) return 0;
  *out = a * b;
  return 1;
}

/* The communicator's staging buffer of at least n pieces of stride bytes,
 * kept for its next calls (a fresh one per call would fault in every page of
 * a large all_reduce's staging again); NULL when out of memory. */
static char *staging(mpu_comm *c, const char *fn, size_t stride, mpu_result_t *r) {
  gloo_impl *m = gloo_of(c);
  size_t bytes = 0;
  if (!mul_ok(stride, (size_t)c->size, &bytes)) bytes = SIZE_MAX;
  if (!bytes) bytes = 1; /* an empty call still gets a buffer (NULL means out of memory) */
  if (bytes > m->staging_bytes) {
    void *p = bytes == SIZE_MAX ? NULL : malloc(bytes);
    if (!p) {
      *r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes of staging", fn, bytes);
      return NULL;
    }
    free(m->staging);
    m->staging = p, m->staging_bytes = bytes;
  }
  return m->staging;
}

/* The data rounds of one call (after its check): the one switch on the
 * collective. */
static mpu_result_t data(mpu_comm *c, const char *fn, const mpu__call *call, mpu__round *rd) {
  int n = c->size, me = c->rank;
  MPU__CALL_ARGS(call);
  size_t es = mpu_dtype_size(dt), each = count * es; /* comm.c checked these products */
  size_t *off = calloc((size_t)n, sizeof *off), *len = calloc((size_t)n, sizeof *len);
  char *tmp = NULL;
  mpu_result_t r = off && len ? MPU_SUCCESS : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  size_t stride = 0;
  switch (r ? MPU_COLL_KINDS : (mpu_collective)call->sig.kind) {
  case MPU_COLL_ALL_REDUCE:
  case MPU_COLL_REDUCE: /* chunk k reduced on rank k, then to everyone (or the root) */
    if ((size_t)n * each <= SMALL_BYTES) { /* small: every input to every rank (or the root) */
      int to_all = call->sig.kind == MPU_COLL_ALL_REDUCE;
      for (int j = 0; j < n; j++) off[j] = 0, len[j] = to_all || j == root ? each : 0;
      if ((tmp = staging(c, fn, each, &r)))
        r = spread_reduce(c, fn, call, rd, off, len, tmp, each, recv, len[me] / es);
      break;
    }
    for (int j = 0; j < n; j++)
      off[j] = mpu__chunk_lo(count, n, j) * es,
      len[j] = (mpu__chunk_lo(count, n, j + 1) - mpu__chunk_lo(count, n, j)) * es;
    stride = len[0];
    if (!(tmp = staging(c, fn, stride, &r))) break;
    int to_all = call->sig.kind == MPU_COLL_ALL_REDUCE;
    char *mine = to_all || me == root ? (char *)recv + off[me] : tmp + (size_t)me * stride;
    /* The reduced chunks' receives are posted before the pieces move, so a
     * peer that has reduced its chunk finds them there and writes at once.
     * In place, chunk j of recv still goes to rank j when they are posted:
     * rank j's reduced chunk comes only after it took that (so after it
     * left this rank's buffer). */
    mpu__round gr = {0};
    mpu__gloo_posted gp;
    r = mpu__round_new(n, &gr);
    for (int j = 0; j < n && !r; j++) {
      gr.sp[j] = mine, gr.sn[j] = to_all || j == root ? len[me] : 0;
      gr.rn[j] = to_all || me == root ? len[j] : 0; /* a reduce's other ranks take nothing */
      gr.rp[j] = gr.rn[j] ? (char *)recv + off[j] : NULL;
    }
    if (!r) r = mpu__gloo_post_recvs(c, fn, MPU__GLOO_SLOT_GATHER, &gr, &gp);
    if (!r) {
      r = spread_reduce(c, fn, call, rd, off, len, tmp, stride, mine, len[me] / es);
      if (r)
        mpu__gloo_posted_abandon(c, &gp, r);
      else
        r = mpu__gloo_run_posted(c, fn, "the reduced chunks", MPU__GLOO_SLOT_GATHER, &gr, &gp);
    }
    mpu__round_free(&gr);
    break;
  case MPU_COLL_REDUCE_SCATTER: /* block k of every input reduced on rank k */
  case MPU_COLL_REDUCE_SCATTER_V: {
    size_t at = 0;
    for (int j = 0; j < n; j++) {
      size_t k = call->sig.kind == MPU_COLL_REDUCE_SCATTER ? count : call->counts[j];
      off[j] = at * es, len[j] = k * es, at += k;
    }
    stride = len[me];
    if (!(tmp = staging(c, fn, stride, &r))) break;
    r = spread_reduce(c, fn, call, rd, off, len, tmp, stride, recv, len[me] / es);
    break;
  }
  case MPU_COLL_ALL_GATHER: /* every input to every rank */
    mpu__round_all(rd, n, send, each, recv, each, each);
    if ((const char *)send != (char *)recv + (size_t)me * each && each)
      memcpy((char *)recv + (size_t)me * each, send, each);
    r = mpu__gloo_round(c, fn, "the inputs to gather", MPU__GLOO_SLOT_SPREAD, rd);
    break;
  case MPU_COLL_ALL_GATHER_V:
    for (int j = 0; j < n; j++)
      rd->sp[j] = send, rd->sn[j] = call->counts[me] * es,
      rd->rp[j] = (char *)recv + call->displs[j] * es, rd->rn[j] = call->counts[j] * es;
    if ((const char *)send != rd->rp[me] && rd->sn[me]) memcpy(rd->rp[me], send, rd->sn[me]);
    r = mpu__gloo_round(c, fn, "the inputs to gather", MPU__GLOO_SLOT_SPREAD, rd);
    break;
  case MPU_COLL_BROADCAST: /* the root's buffer to every rank */
    for (int j = 0; j < n; j++)
      rd->sp[j] = recv, rd->sn[j] = me == root ? each : 0,
      rd->rp[j] = recv, rd->rn[j] = j == root ? each : 0;
    r = mpu__gloo_round(c, fn, "the root's buffer", MPU__GLOO_SLOT_SPREAD, rd);
    break;
  case MPU_COLL_ALL_TO_ALL: /* block k of every input to rank k */
    for (int j = 0; j < n; j++)
      rd->sp[j] = (const char *)send + (size_t)j * each, rd->sn[j] = each,
      rd->rp[j] = (char *)recv + (size_t)j * each, rd->rn[j] = each;
    if (each) memcpy(rd->rp[me], rd->sp[me], each);
    r = mpu__gloo_round(c, fn, "the blocks to exchange", MPU__GLOO_SLOT_SPREAD, rd);
    break;
  case MPU_COLL_ALL_TO_ALL_V:
    for (int j = 0; j < n; j++)
      rd->sp[j] = (const char *)send + call->displs[j] * es, rd->sn[j] = call->counts[j] * es,
      rd->rp[j] = (char *)recv + call->rdispls[j] * es, rd->rn[j] = call->rcounts[j] * es;
    if (rd->sn[me] && rd->rn[me])
      memmove(rd->rp[me], rd->sp[me], rd->sn[me] < rd->rn[me] ? rd->sn[me] : rd->rn[me]);
    r = mpu__gloo_round(c, fn, "the blocks to exchange", MPU__GLOO_SLOT_SPREAD, rd);
    break;
  case MPU_COLL_BARRIER: { /* checked, the signatures were the barrier */
    static const char token = 1;
    char got[1];
    if (gloo_of(c)->check_calls) break;
    for (int j = 0; j < n; j++)
      rd->sp[j] = &token, rd->sn[j] = 1, rd->rp[j] = got, rd->rn[j] = 1;
    r = mpu__gloo_round(c, fn, "the barrier", MPU__GLOO_SLOT_TOKEN, rd); /* got: the same byte n times */
    break;
  }
  default:
    if (!r) r = mpu__error(MPU_ERR_INTERNAL, "%s: collective %d", fn, call->sig.kind);
  }
  free(off), free(len); /* tmp is the communicator's */
  return r;
}

mpu_result_t mpu__gloo_start(mpu_comm *c, const mpu__call *call, void **handle) {
  char fn[64];
  snprintf(fn, sizeof fn, "mpu_comm_%s", mpu_collective_name((mpu_collective)call->sig.kind));
  *handle = NULL;
  MPU_CHECK(mpu__gloo_usable(c, fn));
  mpu__gloo_reap(c, 0);
  gloo_of(c)->calls++;
  int n = c->size, done = 0;
  mpu__round rd = {0};
  rec *recs = NULL;
  mpu_result_t r = mpu__round_new(n, &rd);
  if (!r && gloo_of(c)->check_calls) {
    recs = calloc((size_t)n, sizeof *recs);
    r = recs ? check_call(c, fn, call, recs, &done) : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    if (!r && call->sig.kind == MPU_COLL_ALL_TO_ALL_V) r = check_rows(c, fn, call);
  }
  if (!r && !done) r = data(c, fn, call, &rd);
  free(recs);
  mpu__round_free(&rd);
  return r;
}

/* ---- send and recv ---- */

typedef struct head {
  uint64_t count;
  int32_t dtype;
  int32_t pad;
} head;

void mpu__gloo_reap(mpu_comm *c, double wait_s) {
  gloo_impl *m = gloo_of(c);
  double deadline = mpu__now() + wait_s;
  int free_all = wait_s < 0;
  gloo_pending **at = &m->sends;
  while (*at) {
    gloo_pending *p = *at;
    int done = mpu__gl_sends_done(p->buf);
    while (done < p->sends && !free_all && wait_s > 0) {
      char err[256];
      int peer;
      if (mpu__gl_wait_send(p->buf, deadline - mpu__now(), &peer, err, sizeof err)) {
        mpu__gl_close(m->g); /* the others' buffers may be in use until then */
        free_all = 1;
      } else
        done++;
    }
    if (done < p->sends && !free_all) {
      at = &p->next;
      continue;
    }
    *at = p->next;
    mpu__gl_buf_free(p->buf);
    free(p->bytes);
    free(p);
  }
  m->sends_tail = at;
}

mpu_result_t mpu__gloo_send(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_send";
  gloo_impl *m = gloo_of(c);
  MPU_CHECK(mpu__gloo_usable(c, fn));
  mpu__gloo_reap(c, 0);
  size_t bytes = count * mpu_dtype_size(dt); /* comm.c checked the product */
  if (bytes > SIZE_MAX - sizeof(head))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %zu bytes", fn, bytes);
  gloo_pending *p = calloc(1, sizeof *p);
  head *h = malloc(sizeof(head) + bytes);
  char err[512] = "";
  if (!p || !h) {
    free(p), free(h);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a copy of %zu bytes", fn, bytes);
  }
  *h = (head){count, (int32_t)dt, 0};
  if (bytes) memcpy(h + 1, buf, bytes);
  p->bytes = h;
  if (peer == c->rank) { /* no connection to oneself: kept for this rank's recv */
    *m->to_self_tail = p;
    m->to_self_tail = &p->next;
    return MPU_SUCCESS;
  }
  p->sends = bytes ? 2 : 1;
  p->buf = mpu__gl_buf_new(m->g, h, sizeof(head) + bytes, err, sizeof err);
  int rc = !p->buf || mpu__gl_send(p->buf, peer, MPU__GLOO_SLOT(MPU__GLOO_SLOT_HEAD), 0, sizeof(head), err, sizeof err);
  if (!rc && bytes)
    rc = mpu__gl_send(p->buf, peer, MPU__GLOO_SLOT(MPU__GLOO_SLOT_BODY), sizeof(head), bytes, err, sizeof err);
  /* queued even when it failed: gloo may hold the buffer until its connections close */
  *m->sends_tail = p;
  m->sends_tail = &p->next;
  if (!rc) return MPU_SUCCESS;
  unsigned char *who = calloc((size_t)c->size, 1);
  if (who) who[peer] = 1;
  mpu_result_t r = mpu__gloo_fail(c, fn, -1, "a send", who, err);
  free(who);
  return r;
}

/* one message of n bytes from peer into p */
static mpu_result_t take(mpu_comm *c, const char *fn, int peer, int slot_kind, void *p, size_t n,
                         const char *what) {
  gloo_impl *m = gloo_of(c);
  char err[512] = "";
  int got = -1, rc = -1;
  mpu__gl_buf *b = mpu__gl_buf_new(m->g, p, n, err, sizeof err);
  if (b && !mpu__gl_recv(b, peer, MPU__GLOO_SLOT(slot_kind), 0, n, err, sizeof err)) {
    mpu_result_t w = mpu__gloo_watch(c, fn, &b, 1);
    if (w) {
      mpu__gl_close(m->g); /* aborted: nothing may land in p after this returns */
      mpu__gl_buf_free(b);
      return w;
    }
    rc = mpu__gl_wait_recv(b, m->timeout_s, &got, err, sizeof err);
    mpu__gloo_unwatch(c);
  }
  mpu__gl_buf_free(b);
  if (!rc) return MPU_SUCCESS;
  unsigned char *who = calloc((size_t)c->size, 1);
  if (who) who[peer] = 1;
  mpu_result_t r = mpu__gloo_fail(c, fn, rc, what, who, err);
  free(who);
  return r;
}

mpu_result_t mpu__gloo_recv(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_recv";
  MPU_CHECK(mpu__gloo_usable(c, fn));
  mpu__gloo_reap(c, 0);
  gloo_impl *m = gloo_of(c);
  if (peer == c->rank) {
    gloo_pending *p = m->to_self;
    if (!p)
      return mpu__error(MPU_ERR_INVALID_USAGE, "%s: rank %d receives from itself, but sent "
                        "itself nothing before (the recv would wait forever)", fn,
                        mpu__comm_world_rank(c, peer));
    if (!(m->to_self = p->next)) m->to_self_tail = &m->to_self;
    const head *h = p->bytes;
    mpu_result_t r = mpu__deliver(buf, count, dt, h + 1, (size_t)h->count, (mpu_dtype)h->dtype,
                                  mpu__comm_world_rank(c, peer));
    free(p->bytes);
    free(p);
    return r;
  }
  head h;
  MPU_CHECK(take(c, fn, peer, MPU__GLOO_SLOT_HEAD, &h, sizeof h, "a message"));
  size_t got_bytes = 0;
  int known = h.dtype >= 0 && h.dtype < MPU_DTYPE_COUNT;
  if (!known || !mul_ok((size_t)h.count, mpu_dtype_size((mpu_dtype)h.dtype), &got_bytes))
    return mpu__gloo_fail(c, fn, -1, "a message", NULL, "a message header mpu did not write");
  mpu_result_t mismatch =
      mpu__recv_mismatch(count, dt, (size_t)h.count, (mpu_dtype)h.dtype, mpu__comm_world_rank(c, peer));
  if (!got_bytes) return mismatch;
  void *to = mismatch ? malloc(got_bytes) : buf; /* a refused message is taken and dropped */
  if (!to) return mpu__gloo_fail(c, fn, -1, "a message", NULL, "out of memory for a refused message");
  mpu_result_t r = take(c, fn, peer, MPU__GLOO_SLOT_BODY, to, got_bytes, "a message's payload");
  if (to != buf) free(to);
  return r ? r : mismatch;
}

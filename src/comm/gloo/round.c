/*
 * round.c - one round of the gloo backend's collectives: every rank posts
 * its receives from and its sends to every peer at once, then waits for them
 * (one buffer per peer, so a wait names the peer it waited for).
 *
 * Small messages go eagerly. Gloo's TCP transport moves a message only once
 * the receiver's "ready" notice reached the sender (gloo/transport/tcp/
 * pair.cc: a send finds the peer's pending recv, else it waits for it), so a
 * receive posted when the round starts costs a round trip through both
 * ranks' event-loop threads before any byte moves; on a machine whose cores
 * are all busy each of those hops may wait for a time slice. Each pair
 * therefore keeps EAGER_DEPTH receives posted at all times on its own slot,
 * in buffers of the communicator: a message of at most eager_cap bytes is
 * copied behind a header into the sender's slot for that peer and written at
 * once (the receive is already there), and the receiver copies it out and
 * posts that buffer again. Gloo matches messages per pair and slot in the
 * order they were posted, and the ranks' rounds come in the same order, so
 * the k-th eager message from a peer lands in its k-th posted buffer. The
 * header's length, kind and call number catch ranks whose calls differ
 * (a message left over from an earlier call included).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gloo/gloo.h"
#include "core/clock.h"

#define EAGER_DEPTH 2
/* the eager buffers of one communicator, one way: at most this much over
 * all its peers, each peer's cap between the two bounds */
#define EAGER_TOTAL ((size_t)256 << 10)
#define EAGER_MIN ((size_t)256)
#define EAGER_MAX ((size_t)64 << 10)

typedef struct eager_head {
  uint64_t len;  /* payload bytes */
  uint32_t kind; /* the round's slot kind */
  uint32_t call; /* the sender's collective call number on the communicator */
} eager_head;

#define EAGER_SLOT_BYTES(cap) (sizeof(eager_head) + (cap))

size_t mpu__gloo_eager_cap(int n) {
  if (n < 2) return 0;
  size_t cap = EAGER_TOTAL / (size_t)(n - 1);
  cap = cap < EAGER_MIN ? EAGER_MIN : cap > EAGER_MAX ? EAGER_MAX : cap;
  return cap & ~(size_t)63;
}

mpu_result_t mpu__round_new(int n, mpu__round *rd) {
  rd->sp = calloc((size_t)n, sizeof *rd->sp);
  rd->sn = calloc((size_t)n, sizeof *rd->sn);
  rd->rp = calloc((size_t)n, sizeof *rd->rp);
  rd->rn = calloc((size_t)n, sizeof *rd->rn);
  if (rd->sp && rd->sn && rd->rp && rd->rn) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_OUT_OF_MEMORY, "gloo: a round of %d ranks", n);
}

void mpu__round_free(mpu__round *rd) {
  free(rd->sp), free(rd->sn), free(rd->rp), free(rd->rn);
}

void mpu__round_all(mpu__round *rd, int n, const void *sp, size_t sn, char *rbase, size_t stride,
                    size_t rn) {
  for (int j = 0; j < n; j++)
    rd->sp[j] = sp, rd->sn[j] = sn, rd->rp[j] = rbase + (size_t)j * stride, rd->rn[j] = rn;
}

/* ---- the eager buffers ---- */

static char *eager_rx(gloo_impl *m, int j, int k) {
  return m->eager_rx + ((size_t)j * EAGER_DEPTH + (size_t)k) * EAGER_SLOT_BYTES(m->eager_cap);
}

mpu_result_t mpu__gloo_eager_init(mpu_comm *c) {
  gloo_impl *m = gloo_of(c);
  int n = c->size;
  size_t cap = mpu__gloo_eager_cap(n), slot = EAGER_SLOT_BYTES(cap);
  char err[512] = "";
  m->eager_cap = cap;
  /* EAGER_DEPTH * n/(n-1) * EAGER_TOTAL at most, up to 1025 ranks; past that
   * EAGER_MIN each (n * EAGER_DEPTH * slot stays far from SIZE_MAX: n is an int) */
  m->eager_rx = malloc((size_t)n * EAGER_DEPTH * slot);
  m->eager_tx = malloc((size_t)n * slot);
  m->eager_rb = calloc((size_t)n * EAGER_DEPTH, sizeof *m->eager_rb);
  m->eager_sb = calloc((size_t)n, sizeof *m->eager_sb);
  m->eager_next = calloc((size_t)n, sizeof *m->eager_next);
  m->eager_lost = calloc((size_t)n * EAGER_DEPTH, 1);
  if (!m->eager_rx || !m->eager_tx || !m->eager_rb || !m->eager_sb || !m->eager_next ||
      !m->eager_lost)
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_gloo: eager buffers for %d ranks", n);
  for (int j = 0; j < n; j++) {
    if (j == c->rank) continue;
    if (!(m->eager_sb[j] = mpu__gl_buf_new(m->g, m->eager_tx + (size_t)j * slot, slot, err,
                                           sizeof err)))
      return mpu__error(MPU_ERR_BACKEND, "mpu_comm_gloo: an eager buffer: gloo: %s", err);
    for (int k = 0; k < EAGER_DEPTH; k++) {
      mpu__gl_buf **b = &m->eager_rb[j * EAGER_DEPTH + k];
      if (!(*b = mpu__gl_buf_new(m->g, eager_rx(m, j, k), slot, err, sizeof err)) ||
          mpu__gl_recv(*b, j, MPU__GLOO_SLOT(MPU__GLOO_SLOT_EAGER), 0, slot, err, sizeof err))
        return mpu__error(MPU_ERR_BACKEND, "mpu_comm_gloo: posting a receive for rank %d: "
                          "gloo: %s", mpu__comm_world_rank(c, j), err);
    }
  }
  return MPU_SUCCESS;
}

void mpu__gloo_eager_free(mpu_comm *c) {
  gloo_impl *m = gloo_of(c);
  /* The receives stay posted to the end and go with the connections still
   * open: closing them here would reset them (gloo's close sets SO_LINGER 0)
   * and lose what this rank's last sends left in the kernel for its peers;
   * freeing the context closes them gently. A message that still came for a
   * freed buffer is dropped by gloo (its pointer to it is a weak one). */
  for (int j = 0; m->eager_sb && j < c->size; j++) mpu__gl_buf_free(m->eager_sb[j]);
  for (int j = 0; m->eager_rb && j < c->size * EAGER_DEPTH; j++) mpu__gl_buf_free(m->eager_rb[j]);
  free(m->eager_sb), free(m->eager_rb), free(m->eager_next), free(m->eager_lost);
  free(m->eager_rx), free(m->eager_tx);
  m->eager_sb = m->eager_rb = NULL;
  m->eager_next = NULL;
  m->eager_lost = NULL;
  m->eager_rx = m->eager_tx = NULL;
}

static int eager(const gloo_impl *m, size_t len) { return m->eager_rb && len <= m->eager_cap; }

/* An eager message from peer j taken: checked, copied out, its buffer posted
 * again. MPU_SUCCESS, or the error (the communicator is then broken). A
 * peer may leave once its last messages are out: posting that buffer again
 * then fails, which fails only a later round that needs a message from it
 * in that buffer (the other may hold one already). */
static mpu_result_t eager_take(mpu_comm *c, const char *fn, const char *what, int slot_kind,
                               int j, void *to, size_t len) {
  gloo_impl *m = gloo_of(c);
  int k = m->eager_next[j];
  const char *at = eager_rx(m, j, k);
  eager_head h;
  memcpy(&h, at, sizeof h);
  if (h.len != len || h.kind != (uint32_t)slot_kind || h.call != m->calls) {
    char why[512];
    snprintf(why, sizeof why, "%s: rank %d sent %llu bytes for a step of its call %u (kind %u) "
             "where this rank, in its call %u, waited for %zu bytes of %s: the ranks' calls "
             "differ (call checking, MPU_CHECK_CALLS=1, names how)", fn,
             mpu__comm_world_rank(c, j), (unsigned long long)h.len, h.call, h.kind, m->calls,
             len, what);
    return mpu__gloo_break(c, MPU_ERR_MISMATCH, why);
  }
  memcpy(to, at + sizeof h, len);
  char err[512] = "";
  if (mpu__gl_recv(m->eager_rb[j * EAGER_DEPTH + k], j, MPU__GLOO_SLOT(MPU__GLOO_SLOT_EAGER), 0,
                   EAGER_SLOT_BYTES(m->eager_cap), err, sizeof err))
    m->eager_lost[j * EAGER_DEPTH + k] = 1;
  m->eager_next[j] = (k + 1) % EAGER_DEPTH;
  return MPU_SUCCESS;
}

/* ---- a round ---- */

void mpu__gloo_posted_drop(mpu_comm *c, mpu__gloo_posted *p) {
  for (int j = 0; p->rb && p->sb && p->eg && j < c->size; j++) {
    if (!(p->eg[j] & 1)) mpu__gl_buf_free(p->rb[j]);
    if (!(p->eg[j] & 2)) mpu__gl_buf_free(p->sb[j]);
  }
  free(p->rb), free(p->sb), free(p->eg), free(p->pending), free(p->all);
  memset(p, 0, sizeof *p);
}

void mpu__gloo_posted_abandon(mpu_comm *c, mpu__gloo_posted *p, mpu_result_t why) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  int broken = m->broken != MPU_SUCCESS;
  pthread_mutex_unlock(&m->lock);
  if (why && !broken) { /* the call's own error (out of memory) is kept as the reason */
    char said[640];
    snprintf(said, sizeof said, "%s", mpu_last_error());
    mpu__gloo_break(c, why, said);
  }
  mpu__gl_close(m->g); /* a message for a freed buffer would wedge its connection */
  mpu__gloo_posted_drop(c, p);
}

/* Post one side of rd (pass 0 the receives, 1 the sends) into p. A peer
 * whose connection failed does not stop the posts to the others: they would
 * wait for this rank's message until it left, then name it instead of the
 * lost peer. Its buffer is dropped (its wait would fail). An eager receive
 * is only marked: its buffer is the peer's next one when the round runs. */
static void post(mpu_comm *c, mpu__gloo_posted *p, int pass, int slot_kind, const mpu__round *rd) {
  gloo_impl *m = gloo_of(c);
  int n = c->size, me = c->rank;
  mpu__gl_buf **b = pass ? p->sb : p->rb;
  /* from the next rank on, as the waits: each rank's first large message
   * goes to a different peer, not every rank's to rank 0 */
  for (int i = 1; i < n && !p->oom; i++) {
    int j = (me + i) % n;
    size_t len = pass ? rd->sn[j] : rd->rn[j];
    if (!len) continue;
    char e[512] = "";
    int rc = 0;
    if (eager(m, len)) {
      p->eg[j] |= pass ? 2 : 1;
      if (!pass) continue;
      char *to = m->eager_tx + (size_t)j * EAGER_SLOT_BYTES(m->eager_cap);
      eager_head h = {len, (uint32_t)slot_kind, m->calls};
      memcpy(to, &h, sizeof h);
      memcpy(to + sizeof h, rd->sp[j], len);
      b[j] = m->eager_sb[j];
      rc = mpu__gl_send(b[j], j, MPU__GLOO_SLOT(MPU__GLOO_SLOT_EAGER), 0, sizeof h + len, e,
                        sizeof e);
    } else {
      b[j] = mpu__gl_buf_new(m->g, pass ? (void *)rd->sp[j] : rd->rp[j], len, e, sizeof e);
      if (!b[j]) { /* not a peer's fault */
        snprintf(p->err, sizeof p->err, "%s", e);
        p->oom = 1;
        continue;
      }
      uint64_t slot = MPU__GLOO_SLOT(slot_kind);
      rc = pass ? mpu__gl_send(b[j], j, slot, 0, len, e, sizeof e)
                : mpu__gl_recv(b[j], j, slot, 0, len, e, sizeof e);
    }
    if (rc) {
      if (!p->posted_bad++) snprintf(p->err, sizeof p->err, "%s", e), p->failed_at = j;
      if (!(p->eg[j] & (pass ? 2 : 1))) mpu__gl_buf_free(b[j]);
      b[j] = NULL;
    }
  }
}

mpu_result_t mpu__gloo_post_recvs(mpu_comm *c, const char *fn, int slot_kind, const mpu__round *rd,
                                  mpu__gloo_posted *p) {
  int n = c->size;
  memset(p, 0, sizeof *p);
  p->failed_at = -1;
  p->rb = calloc((size_t)n, sizeof *p->rb);
  p->sb = calloc((size_t)n, sizeof *p->sb);
  p->eg = calloc((size_t)n, 1);
  p->pending = calloc((size_t)n, 1);
  p->all = malloc(2 * (size_t)n * sizeof *p->all);
  if (!p->rb || !p->sb || !p->eg || !p->pending || !p->all) {
    mpu__gloo_posted_drop(c, p);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a round of %d ranks", fn, n);
  }
  post(c, p, 0, slot_kind, rd);
  return MPU_SUCCESS;
}

mpu_result_t mpu__gloo_run_posted(mpu_comm *c, const char *fn, const char *what, int slot_kind,
                                  const mpu__round *rd, mpu__gloo_posted *p) {
  gloo_impl *m = gloo_of(c);
  int n = c->size, me = c->rank, rc = 0;
  if (!p->oom) post(c, p, 1, slot_kind, rd);
  /* the eager receives: each peer's next buffer, unless posting it again failed */
  for (int j = 0; j < n; j++) {
    if (!(p->eg[j] & 1)) continue;
    if (m->eager_lost[j * EAGER_DEPTH + m->eager_next[j]]) {
      if (!p->posted_bad++)
        snprintf(p->err, sizeof p->err, "its connection closed after its last message"),
            p->failed_at = j;
    } else {
      p->rb[j] = m->eager_rb[j * EAGER_DEPTH + m->eager_next[j]];
    }
  }
  mpu__gl_buf **rb = p->rb, **sb = p->sb;
  int failed_at = p->failed_at;
  char err[512];
  snprintf(err, sizeof err, "%s", p->err);
  if (p->oom) rc = -1, failed_at = -1;
  unsigned char *pending = p->pending;
  double waits_from = mpu__now(), deadline = waits_from + m->timeout_s;
  /* rb and sb side by side: one list for an abort to interrupt */
  mpu__gl_buf **all = p->all;
  memcpy(all, rb, (size_t)n * sizeof *all);
  memcpy(all + n, sb, (size_t)n * sizeof *all);
  mpu_result_t w = mpu__gloo_watch(c, fn, all, 2 * n);
  if (w) { /* aborted meanwhile: closing ends gloo's use of the buffers */
    mpu__gl_close(m->g);
    mpu__gloo_posted_drop(c, p);
    return w;
  }
  /* Receives first, from the next rank on; then the sends (a send completes
   * once its peer took it). Every posted buffer is waited for, even after
   * one failed: gloo's loop thread may use a buffer until its operation
   * completed or failed, or an abort closed the connections (before it
   * interrupts the waits), so none is freed earlier. The first failure is
   * the one named. */
  for (int pass = 0; pass < 2; pass++) {
    mpu__gl_buf **b = pass ? sb : rb;
    for (int i = 1; i < n; i++) {
      int j = (me + i) % n, peer = -1;
      if (!b[j]) continue;
      /* after a timeout gloo closed the connections: a completed wait
       * returns at once, the others fail at once */
      double left = rc == 1 ? 0.001 : deadline - mpu__now();
      char e[512] = "";
      int got = pass ? mpu__gl_wait_send(b[j], left, &peer, e, sizeof e)
                     : mpu__gl_wait_recv(b[j], left, &peer, e, sizeof e);
      if (!got) continue;
      if (!pass || !rc) pending[j] = 1; /* a timeout names the ranks that never came */
      if (!rc) rc = got, failed_at = j, snprintf(err, sizeof err, "%s", e);
    }
  }
  mpu__gloo_unwatch(c);
  if (!rc && p->posted_bad) rc = -1; /* the others' messages moved; failed_at is the lost one */
  mpu_result_t r = MPU_SUCCESS;
  if (!rc) r = mpu__gloo_after_wait(c, fn, what, mpu__now() - waits_from);
  if (rc) {
    if (rc < 0 && failed_at >= 0) { /* a connection failed: that peer is named */
      memset(pending, 0, (size_t)n);
      pending[failed_at] = 1;
    }
    r = mpu__gloo_fail(c, fn, rc, what, pending, err);
  }
  /* the eager messages taken (after a failure the communicator is broken:
   * its buffers are left as they are) */
  for (int j = 0; j < n && !r; j++)
    if (p->eg[j] & 1) r = eager_take(c, fn, what, slot_kind, j, rd->rp[j], rd->rn[j]);
  mpu__gloo_posted_drop(c, p);
  return r;
}

mpu_result_t mpu__gloo_round(mpu_comm *c, const char *fn, const char *what, int slot_kind,
                             const mpu__round *rd) {
  mpu__gloo_posted p;
  MPU_CHECK(mpu__gloo_post_recvs(c, fn, slot_kind, rd, &p));
  return mpu__gloo_run_posted(c, fn, what, slot_kind, rd, &p);
}

/*
 * check.c - the MPI backend's call checking: the signature exchange every
 * collective starts with, blocking or not.
 *
 * Each collective first exchanges its signature with every member in a small
 * fixed-size block, so mismatched calls fail on every rank with
 * MPU_ERR_MISMATCH. The exchange is point to point on communicators of up to
 * MPU_MPI_P2P_CHECK_RANKS ranks (an Isend and an Irecv per peer on the
 * private duplicate nb: half the cost of Open MPI's MPI_Iallgather on 2
 * processes), one MPI_Iallgather above; either way the same MPI calls on
 * every member whatever else it has pending (MPI never matches a blocking
 * collective with a non-blocking one), polled (while it waits, the rank
 * drives the pending non-blocking calls, pending.c). Without a timeout (the
 * default: MPI has none) an 8-byte call's input rides in the same block, so
 * such a call costs one exchange. With a timeout the polling is bounded
 * (timeout.c), and the data never rides with the signature: the data phase
 * then also runs non-blocking under the timeout.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/base/reduce.h"
#include "comm/mpi/backend.h"
#include "core/error.h"

/* The bytes of this rank's input a call carries in its signature block, or
 * SIZE_MAX where the call is too large (or uneven) to ride along. */
size_t mpu__mpi_carried_bytes(const mpu_comm *c, const mpu__call *k) {
  const mpu__coll *row = mpu__coll_of(k->sig.kind);
  size_t bytes, es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  if (row->listed) return SIZE_MAX;
  /* what this rank sends: its send buffer's blocks (a barrier: nothing) */
  if (__builtin_mul_overflow((size_t)k->sig.count, es, &bytes) ||
      __builtin_mul_overflow(bytes, mpu__coll_blocks(row->send_blocks, c->size), &bytes))
    return SIZE_MAX;
  return bytes <= CARRIED_BYTES ? bytes : SIZE_MAX;
}

/* Start the exchange of this rank's block blk[0] into blk[1 + p] of every
 * member p; *nreqs requests (at most SIG_REQS) to complete. Point to point, the
 * k-th call's blocks pair up on every rank whether the call is blocking or
 * not: MPI keeps the messages of one source, communicator and tag in order,
 * and every call of the communicator starts its exchange here, in issue order.
 * If posting fails part way, the posted requests are in reqs[*nreqs]. */
mpu_result_t mpu__mpi_sig_start(mpu_comm *c, carrier *blk, MPI_Request *reqs, int *nreqs,
                              const char *fn) {
  mpi_impl *m = impl_of(c);
  int n = c->size, me = c->rank, k = 0, err = MPI_SUCCESS;
  *nreqs = 0;
  if (!m->p2p) {
    MPU_CHECK(mpu__mpi_check(MPI_Iallgather(&blk[0], (int)sizeof *blk, MPI_BYTE, &blk[1], (int)sizeof *blk,
                                   MPI_BYTE, m->comm, reqs),
                    fn));
    *nreqs = 1;
    return MPU_SUCCESS;
  }
  blk[1 + me] = blk[0];
  for (int i = 1; i < n && err == MPI_SUCCESS; i++) { /* receives first: no unexpected copies */
    int p = (me + i) % n;
    err = MPI_Irecv(&blk[1 + p], (int)sizeof *blk, MPI_BYTE, p, SIG_TAG, m->nb, &reqs[k]);
    k += err == MPI_SUCCESS;
  }
  for (int i = 1; i < n && err == MPI_SUCCESS; i++) {
    int p = (me + n - i) % n;
    err = MPI_Isend(&blk[0], (int)sizeof *blk, MPI_BYTE, p, SIG_TAG, m->nb, &reqs[k]);
    k += err == MPI_SUCCESS;
  }
  *nreqs = k;
  return mpu__mpi_check(err, fn);
}

/* A failed sig_start (MPI refused to post a message): the communicator is
 * broken, what was posted stays with MPI, with the block buffer. */
mpu_result_t mpu__mpi_sig_abandon(mpu_comm *c, MPI_Request *reqs, int nreqs, carrier *blk,
                                mpu_result_t r) {
  mpi_impl *m = impl_of(c);
  mpu__mpi_orphan_add_all(reqs, nreqs, blk, NULL, NULL, NULL);
  m->sig_left = 1;
  m->broken = r;
  snprintf(m->why, sizeof m->why, "%s", mpu_last_error());
  return r;
}

size_t mpu__mpi_sig_fill(const mpu_comm *c, const mpu__call *k, carrier *mine) {
  size_t carried = impl_of(c)->timed ? SIZE_MAX : mpu__mpi_carried_bytes(c, k);
  mine->sig = k->sig;
  /* a broadcast's one buffer is read at the root only */
  int reads = mpu__coll_of(k->sig.kind)->in_place != MPU__IN_PLACE_ONE_BUFFER ||
              c->rank == k->sig.root;
  if (carried != SIZE_MAX && carried && reads) memcpy(mine->data, k->send, carried);
  return carried;
}

/* Start of every collective: refuse on a broken communicator, and with
 * checking on exchange the call's signature with every member, in fixed-size
 * blocks (sig_start), polled. A small call's input travels in the same block: *done is set when
 * the exchange brought every input this rank needs (finish_carried then
 * completes the call locally). */
mpu_result_t mpu__mpi_enter(mpu_comm *c, const mpu__call *k, const char *fn, int *done) {
  mpi_impl *m = impl_of(c);
  *done = 0;
  if (m->broken) return mpu__mpi_broken(m, fn);
  mpu__mpi_orphans_progress(0);
  MPU_CHECK(mpu__mpi_settle(c, fn));
  if (!m->checked || c->size == 1) return MPU_SUCCESS;
  if (m->roll) mpu__mpi_roll_enter(m->roll);
  carrier *mine = &m->blk[0];
  size_t carried = mpu__mpi_sig_fill(c, k, mine);
  /* polled, never a blocking MPI call: while it waits, this rank starts the
   * data phases of its non-blocking calls that peers may be waiting for */
  int nreqs;
  mpu_result_t r = mpu__mpi_sig_start(c, m->blk, m->x, &nreqs, fn);
  if (r) {
    carrier *blk = m->blk;
    m->blk = NULL;
    return mpu__mpi_sig_abandon(c, m->x, nreqs, blk, r);
  }
  MPU_CHECK(mpu__mpi_wait_all(c, m->x, nreqs, fn, "waiting for every rank to enter the call"));
  for (int p = 0; p < c->size; p++) /* the common case: every block says the same */
    if (memcmp(&m->blk[1 + p].sig, &mine->sig, sizeof mine->sig)) {
      MPU_CHECK(mpu__sig_compare(fn, &m->blk[1], sizeof *mine, c->size, c->world_ranks,
                                 MPU__CHECK_ALL));
      break;
    }
  *done = carried != SIZE_MAX;
  return MPU_SUCCESS;
}

/* Complete a call whose inputs all arrived in the signature blocks. */
mpu_result_t mpu__mpi_finish_carried(mpu_comm *c, const mpu__call *k, const carrier *blk) {
  MPU__CALL_ARGS(k);
  mpi_impl *m = impl_of(c);
  int n = c->size, me = c->rank;
  size_t bytes = count * mpu_dtype_size(dt);
  const void **ptrs = m->ptrs;
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE:
  case MPU_COLL_REDUCE:
    if (k->sig.kind == MPU_COLL_REDUCE && me != root) return MPU_SUCCESS;
    for (int p = 0; p < n; p++) ptrs[p] = blk[1 + p].data;
    mpu__reduce(recv, ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  case MPU_COLL_REDUCE_SCATTER:
    for (int p = 0; p < n; p++) ptrs[p] = blk[1 + p].data + (size_t)me * bytes;
    mpu__reduce(recv, ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  case MPU_COLL_ALL_GATHER:
    for (int p = 0; p < n && bytes; p++)
      memcpy((char *)recv + (size_t)p * bytes, blk[1 + p].data, bytes);
    return MPU_SUCCESS;
  case MPU_COLL_ALL_TO_ALL:
    for (int p = 0; p < n && bytes; p++)
      memcpy((char *)recv + (size_t)p * bytes, blk[1 + p].data + (size_t)me * bytes, bytes);
    return MPU_SUCCESS;
  case MPU_COLL_BROADCAST:
    if (me != root && bytes) memcpy(recv, blk[1 + root].data, bytes);
    return MPU_SUCCESS;
  default: return MPU_SUCCESS; /* barrier: the exchange was the barrier */
  }
}

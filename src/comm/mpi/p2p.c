/*
 * p2p.c - the MPI backend's send and recv.
 *
 * send is eager (MPI_Isend of a private copy, tag = a base + the dtype);
 * recv matches a message with MPI_Improbe, polled against the timeout
 * (driving the pending non-blocking calls meanwhile: the sender may wait for
 * one of ours first), checks its dtype (the tag) and size before receiving
 * it straight into the caller's buffer, and drops a mismatched one as the
 * threads backend does. A communicator's destroy never waits: sends still in
 * flight are cancelled or orphaned.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi/backend.h"
#include "core/error.h"

#define P2P_TAG 7000 /* + dtype: the tag tells recv what was sent */

/* Free the sends that have completed. */
static void progress_sends(mpi_impl *m) {
  int kept = 0;
  for (int i = 0; i < m->nsends; i++) {
    int done = 0;
    MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done) free(m->sends[i].copy);
    else m->sends[kept++] = m->sends[i];
  }
  m->nsends = kept;
}

mpu_result_t mpu__mpi_send(mpu_comm *c, const mpu__call *k) {
  static const char fn[] = "mpu_comm_send";
  MPU__CALL_ARGS(k);
  const void *buf = send;
  mpi_impl *m = impl_of(c);
  if (m->broken) return mpu__mpi_broken(m, fn);
  MPU_CHECK(mpu__mpi_fits(fn, count, 1));
  progress_sends(m);
  if (m->nsends == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    pending_send *grown = realloc(m->sends, (size_t)cap * sizeof *grown);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    m->sends = grown, m->cap = cap;
  }
  size_t bytes = count * mpu_dtype_size(dt);
  void *copy = malloc(bytes ? bytes : 1);
  if (!copy) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  if (bytes) memcpy(copy, buf, bytes);
  pending_send *p = &m->sends[m->nsends];
  mpu_result_t r =
      mpu__mpi_check(MPI_Isend(copy, (int)count, bits_of(dt), peer, P2P_TAG + (int)dt, m->comm, &p->req), fn);
  if (r) {
    free(copy);
    return r;
  }
  p->copy = copy;
  m->nsends++;
  return MPU_SUCCESS;
}

mpu_result_t mpu__mpi_recv(mpu_comm *c, const mpu__call *k) {
  static const char fn[] = "mpu_comm_recv";
  MPU__CALL_ARGS(k);
  void *buf = recv;
  mpi_impl *m = impl_of(c);
  if (m->broken) return mpu__mpi_broken(m, fn);
  MPU_CHECK(mpu__mpi_fits(fn, count, 1));
  progress_sends(m);
  MPI_Message msg;
  MPI_Status st;
  double start = MPI_Wtime();
  for (long spins = 0;; spins++) {
    int found = 0;
    MPU_CHECK(mpu__mpi_check(MPI_Improbe(peer, MPI_ANY_TAG, m->comm, &found, &msg, &st), fn));
    if (found) break;
    mpu__mpi_drive(); /* the sender may wait for a non-blocking call of ours first */
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > m->timeout_s) {
        /* nothing of ours is pending: the communicator stays usable */
        return mpu__error(MPU_ERR_TIMEOUT, "%s: no message from rank %d within %.3g s", fn, peer,
                          m->timeout_s);
      }
      sched_yield();
    }
  }
  int bytes = 0;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  int tag_dt = st.MPI_TAG - P2P_TAG;
  mpu_dtype got = tag_dt >= 0 && tag_dt < MPU_DTYPE_COUNT ? (mpu_dtype)tag_dt : dt;
  size_t got_count = (size_t)bytes / mpu_dtype_size(got);
  mpu_result_t r = mpu__recv_mismatch(count, dt, got_count, got, peer);
  if (r) { /* drop it, as every backend does */
    char *sink = malloc(bytes > 0 ? (size_t)bytes : 1);
    MPI_Mrecv(sink ? (void *)sink : NULL, sink ? bytes : 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    free(sink);
    return r;
  }
  return mpu__mpi_check(MPI_Mrecv(buf, (int)count, bits_of(dt), &msg, MPI_STATUS_IGNORE), fn);
}

void mpu__mpi_sends_end(mpi_impl *m) {
  progress_sends(m);
  for (int i = 0; i < m->nsends; i++) {
    int done = 0;
    MPI_Cancel(&m->sends[i].req);
    MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done) free(m->sends[i].copy);
    else mpu__mpi_orphan_add(m->sends[i].req, m->sends[i].copy, NULL, NULL, NULL);
  }
  free(m->sends);
  m->sends = NULL, m->nsends = m->cap = 0;
}

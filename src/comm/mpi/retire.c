/*
 * retire.c - what MPI may still touch after mpu stopped waiting for it.
 *
 * Orphans: buffers of requests MPI still runs (a timed-out collective, a
 * released non-blocking call, a send nobody received), freed once their
 * requests complete, or at mpu_mpi_finalize. Retired duplicates: the notes'
 * and abort channels' duplicates of destroyed communicators, kept until
 * finalize so a late message lands there, never in a successor. Nothing
 * here blocks.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/mpi/backend.h"

/* ---- orphans: buffers MPI may still touch after we stopped waiting ------- */

#define ORPHAN_BUFS 4

typedef struct orphan {
  struct orphan *next;
  void *bufs[ORPHAN_BUFS];
  int nreqs;
  MPI_Request reqs[]; /* every one must complete before the buffers go */
} orphan;

static orphan *orphans;

/* Keep bufs until every one of reqs[n] completes (or MPI is finalised).
 * Without memory for the record, the buffers leak: freeing them under MPI
 * would be worse. */
void mpu__mpi_orphan_add_all(const MPI_Request *reqs, int n, void *a, void *b, void *c, void *d) {
  orphan *o = malloc(sizeof *o + (size_t)n * sizeof *reqs);
  if (!o) return;
  *o = (orphan){orphans, {a, b, c, d}, n};
  memcpy(o->reqs, reqs, (size_t)n * sizeof *reqs);
  orphans = o;
}

void mpu__mpi_orphan_add(MPI_Request req, void *a, void *b, void *c, void *d) {
  mpu__mpi_orphan_add_all(&req, 1, a, b, c, d);
}

static void orphan_free(orphan *o) {
  for (int i = 0; i < ORPHAN_BUFS; i++) free(o->bufs[i]);
  free(o);
}

/* Free the orphans whose requests have completed (all of them at finalize). */
void mpu__mpi_orphans_progress(int all) {
  if (!orphans) return;
  for (orphan **p = &orphans; *p;) {
    int done = all;
    if (!done) MPI_Testall((*p)->nreqs, (*p)->reqs, &done, MPI_STATUSES_IGNORE);
    if (done) {
      orphan *o = *p;
      *p = o->next;
      orphan_free(o);
    } else {
      p = &(*p)->next;
    }
  }
}

/* The duplicates of destroyed communicators, freed at mpu_mpi_finalize: Open
 * MPI gives a freed communicator's id to the next one made, and a note still
 * on its way to a freed one would land in that successor, out of its message
 * order, and stall it. Kept, a late note lands here and is drained. */
static MPI_Comm *retired;
static int nretired, retired_cap;

static void drain(MPI_Comm comm) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    int64_t late[MPU__MPI_LATE_WORDS]; /* a note, or an abort channel's message */
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    MPI_Recv(late, MPU__MPI_LATE_WORDS, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, comm,
             MPI_STATUS_IGNORE);
  }
}

void mpu__mpi_retire(MPI_Comm comm) {
  if (nretired == retired_cap) {
    int cap = retired_cap ? 2 * retired_cap : 16;
    MPI_Comm *grown = realloc(retired, (size_t)cap * sizeof *grown);
    if (!grown) { /* freed now, then: a late note is unlikely, a leak is not better */
      MPI_Comm_free(&comm);
      return;
    }
    retired = grown, retired_cap = cap;
  }
  retired[nretired++] = comm;
}


/* A send (or MPI_REQUEST_NULL) that may never be received, ended without
 * blocking: done, or cancelled, its buffer freed; else left with the orphans. */
void mpu__mpi_end_send(MPI_Request *req, void *buf) {
  int done = 1;
  if (*req != MPI_REQUEST_NULL) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(req);
      MPI_Test(req, &done, MPI_STATUS_IGNORE);
    }
  }
  if (done) free(buf);
  else mpu__mpi_orphan_add(*req, buf, NULL, NULL, NULL);
}

/* At finalize: every late note read, every duplicate freed. */
void mpu__mpi_retired_free(void) {
  for (int i = 0; i < nretired; i++) {
    drain(retired[i]);
    MPI_Comm_free(&retired[i]);
  }
  free(retired);
  retired = NULL, nretired = retired_cap = 0;
}

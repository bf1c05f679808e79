/*
 * timeout.c - the MPI backend's polled waits under the communicator's
 * timeout, and the notes that let a timeout name the ranks that never came.
 *
 * MPI has no timeouts: a checked communicator with one (options.timeout_s
 * or MPU_TIMEOUT) polls each MPI request it waits for (mpu__mpi_wait_all),
 * driving the pending non-blocking calls meanwhile (pending.c), and after
 * the timeout breaks the communicator: every later call fails at once. MPI
 * cannot cancel a collective, so the buffers of the timed-out request stay
 * with MPI: the library's are handed to the orphans (retire.c), the
 * caller's must not be reused (docs/mpi.md).
 */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/mpi/backend.h"
#include "core/error.h"

/* ---- who is missing: the notes behind a timeout's message ---------------------
 *
 * MPI cannot say which ranks a timed-out collective still waits for, so
 * the ranks tell each other, on a duplicate of the communicator made with it
 * (timed communicators of 2+ ranks): a rank whose wait at step s of call k
 * lasts longer than note_after sends each member one note "waiting at (k, s)";
 * a rank that times out sends "gave up at (k, s)". The one that timed out
 * reads the notes that came (MPI_Iprobe, never blocking; up to a grace for
 * late ones) and names the members that neither waited at its step nor gave
 * up: they did not arrive. Fast calls send nothing (a counter moves); notes
 * are read every 64 calls and at destroy, where a note still in flight is
 * cancelled or left with the orphans. */

enum { NOTE_WAITING = 1, NOTE_GAVE_UP = 2 };
#define NOTE_AFTER_MAX_S 0.05 /* a wait this long (or a quarter of the timeout) sends notes */
#define NOTE_GRACE_S 0.2      /* after the timeout, how long notes in flight may take */

typedef struct note {
  int64_t call, step;
} note;

typedef struct roll {
  MPI_Comm comm;
  int size, me;
  double note_after;
  note at;           /* where this rank is: call k (entered), step s (waits in it) */
  int noted;         /* this step's "waiting" note is sent */
  note *reached;     /* [size]: the latest step each member said it waited at */
  note *gave_up;     /* [size]: where each member gave up (call 0: it has not) */
  MPI_Request *out;  /* [size]: this rank's last note to each member */
  note **out_buf;    /* [size]: its payload, freed when the send completes */
} roll;

static int note_before(note a, note b) {
  return a.call < b.call || (a.call == b.call && a.step < b.step);
}

/* Over comm (a duplicate, taken; every member makes it, whatever happens
 * after, so none waits for another's MPI_Comm_dup); NULL where a part cannot
 * be made: timeouts then say MPI cannot name anyone. */
roll *mpu__mpi_roll_make(MPI_Comm comm, int size, int me, double timeout_s) {
  roll *r = comm == MPI_COMM_NULL ? NULL : calloc(1, sizeof *r);
  if (r) {
    r->reached = calloc((size_t)size, sizeof *r->reached);
    r->gave_up = calloc((size_t)size, sizeof *r->gave_up);
    r->out = malloc((size_t)size * sizeof *r->out);
    r->out_buf = calloc((size_t)size, sizeof *r->out_buf);
  }
  if (!r || !r->reached || !r->gave_up || !r->out || !r->out_buf) {
    if (r) free(r->reached), free(r->gave_up), free(r->out), free(r->out_buf), free(r);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    return NULL;
  }
  r->comm = comm;
  for (int p = 0; p < size; p++) r->out[p] = MPI_REQUEST_NULL;
  r->size = size, r->me = me;
  r->note_after = timeout_s / 4 < NOTE_AFTER_MAX_S ? timeout_s / 4 : NOTE_AFTER_MAX_S;
  return r;
}

/* Read every note that has come. */
static void roll_read(roll *r) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    note n;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, r->comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    if (MPI_Recv(&n, 2, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, r->comm, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS ||
        st.MPI_SOURCE < 0 || st.MPI_SOURCE >= r->size)
      continue;
    note *slot = st.MPI_TAG == NOTE_GAVE_UP ? &r->gave_up[st.MPI_SOURCE] : &r->reached[st.MPI_SOURCE];
    if (note_before(*slot, n)) *slot = n;
  }
}

/* Send every member a note of where this rank is. Skipped: a member whose
 * last note is still in flight (notes never pile up), and one that gave up
 * (it is leaving the communicator). */
static void roll_tell(roll *r, int tag) {
  roll_read(r);
  for (int p = 0; p < r->size; p++) {
    if (p == r->me || r->gave_up[p].call) continue;
    int done = 1;
    if (r->out[p] != MPI_REQUEST_NULL) MPI_Test(&r->out[p], &done, MPI_STATUS_IGNORE);
    if (!done) continue;
    free(r->out_buf[p]);
    r->out_buf[p] = malloc(sizeof(note));
    if (!r->out_buf[p]) continue;
    *r->out_buf[p] = r->at;
    if (MPI_Isend(r->out_buf[p], 2, MPI_INT64_T, p, tag, r->comm, &r->out[p]) != MPI_SUCCESS) {
      free(r->out_buf[p]);
      r->out_buf[p] = NULL, r->out[p] = MPI_REQUEST_NULL;
    }
  }
}

/* A checked call begins: its number, and now and then the notes read. */
void mpu__mpi_roll_enter(roll *r) {
  r->at.call++, r->at.step = 0;
  if ((r->at.call & 63) == 0) roll_read(r);
}

/* Member p at this rank's step: 0 here (waiting at it or later, or gave up
 * there: a peer of this timeout), 1 missing, 2 gave up at an earlier step. */
static int roll_where(const roll *r, int p) {
  if (p == r->me || !note_before(r->reached[p], r->at) || !note_before(r->gave_up[p], r->at))
    return 0;
  return r->gave_up[p].call ? 2 : 1;
}

/* After the timeout: say so, give late notes the grace, and write who did
 * not arrive (and who had given up) into text, "rank 3 did not arrive". */
static void roll_names(const mpu_comm *c, roll *r, char *text, size_t cap) {
  roll_tell(r, NOTE_GAVE_UP);
  double start = MPI_Wtime(), grace = r->note_after + NOTE_GRACE_S;
  int missing = 0, gone = 0;
  for (;;) {
    roll_read(r);
    missing = gone = 0;
    for (int p = 0; p < r->size; p++) {
      int where = roll_where(r, p);
      missing += where == 1, gone += where == 2;
    }
    if (!missing || MPI_Wtime() - start > grace) break;
    sched_yield();
  }
  size_t used = 0;
  text[0] = 0;
  for (int pass = 0; pass < 2; pass++) { /* the missing, then those that gave up */
    int want = pass ? gone : missing, listed = 0;
    if (!want) continue;
    used += (size_t)snprintf(text + used, cap - used, "%s%s ", used ? "; " : "",
                             want == 1 ? "rank" : "ranks");
    for (int p = 0; p < r->size && used < cap; p++) {
      if (roll_where(r, p) != 1 + pass) continue;
      if (listed == 8) {
        used += (size_t)snprintf(text + used, cap - used, " and %d more", want - listed);
        break;
      }
      used += (size_t)snprintf(text + used, cap - used, "%s%d", listed ? ", " : "", p);
      if (c->world_ranks && c->world_ranks[p] != p && used < cap)
        used += (size_t)snprintf(text + used, cap - used, " (world %d)", c->world_ranks[p]);
      listed++;
    }
    if (used < cap)
      used += (size_t)snprintf(text + used, cap - used, "%s",
                               pass ? " had given up (timed out) before" : " did not arrive");
    if (used >= cap) used = cap - 1;
  }
}

/* Never blocks: notes that came are read, notes still going out cancelled
 * or left with the orphans (MPI may still read them), the duplicate retired. */
void mpu__mpi_roll_free(roll *r) {
  if (!r) return;
  roll_read(r);
  for (int p = 0; p < r->size; p++) mpu__mpi_end_send(&r->out[p], r->out_buf[p]);
  mpu__mpi_retire(r->comm);
  free(r->reached), free(r->gave_up), free(r->out), free(r->out_buf), free(r);
}

/* Wait for req, polling, no longer than the timeout. On timeout the
 * communicator breaks and the request, with the library's buffers it may
 * still use, goes to the orphans. */
mpu_result_t mpu__mpi_wait_all(mpu_comm *c, MPI_Request *reqs, int nreqs, const char *fn,
                             const char *phase) {
  mpi_impl *m = impl_of(c);
  roll *r = m->roll;
  /* without a timeout no clock is read: a read costs about a twentieth of
   * an 8-byte exchange on shared memory */
  int clocked = isfinite(m->timeout_s);
  double start = clocked ? MPI_Wtime() : 0;
  if (r) r->at.step++, r->noted = 0;
  for (long spins = 0;; spins++) {
    int done = 0;
    MPU_CHECK(mpu__mpi_check(MPI_Testall(nreqs, reqs, &done, MPI_STATUSES_IGNORE), fn));
    if (done) return MPU_SUCCESS;
    mpu__mpi_drive(); /* a peer may wait for a non-blocking call only this rank can start */
    if ((spins & 63) == 63) {
      double waited = clocked ? MPI_Wtime() - start : 0;
      if (waited > m->timeout_s) break;
      if (r && !r->noted && waited > r->note_after) roll_tell(r, NOTE_WAITING), r->noted = 1;
      sched_yield(); /* ranks may outnumber cores: let the late one run */
    }
  }
  char names[160] = "";
  if (r) roll_names(c, r, names, sizeof names);
  snprintf(m->why, sizeof m->why, "%s timed out after %.3g s %s (communicator of %d ranks: %s)",
           fn, m->timeout_s, phase, c->size,
           !r ? "MPI cannot name the missing ones"
           : names[0] ? names
                      : "every rank was waiting at this step, MPI did not complete it");
  m->broken = MPU_ERR_TIMEOUT;
  mpu__mpi_orphan_add_all(reqs, nreqs, m->blk, m->scratch, m->v, NULL); /* MPI may still write them */
  m->blk = NULL, m->scratch = NULL, m->v = NULL, m->scratch_cap = 0;
  m->sig_left = 1;
  return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
}

mpu_result_t mpu__mpi_wait_for(mpu_comm *c, MPI_Request *req, const char *fn, const char *phase) {
  return mpu__mpi_wait_all(c, req, 1, fn, phase);
}

/* A blocking call begins after the non-blocking calls issued before it on
 * its communicator completed (it may read their outputs), driving every
 * pending call meanwhile, under the communicator's timeout. */
mpu_result_t mpu__mpi_settle(mpu_comm *c, const char *fn) {
  mpi_impl *m = impl_of(c);
  if (m->nb_next == m->nb_issued) return MPU_SUCCESS; /* the common case: no clock read */
  double start = MPI_Wtime();
  for (long spins = 0; m->nb_next != m->nb_issued; spins++) {
    mpu__mpi_drive();
    if (m->broken) return mpu__mpi_broken(m, fn);
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > m->timeout_s) {
        snprintf(m->why, sizeof m->why,
                 "%s timed out after %.3g s waiting for the non-blocking calls issued before it "
                 "(communicator of %d ranks)",
                 fn, m->timeout_s, c->size);
        m->broken = MPU_ERR_TIMEOUT;
        return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
      }
      sched_yield();
    }
  }
  return MPU_SUCCESS;
}

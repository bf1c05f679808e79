/*
 * abort.c - the MPI backend's aborts: mpu_comm_abort (MPI_Abort, which ends
 * the job), and the out-of-band abort channel.
 *
 * A device communicator (NCCL) made over an MPI communicator tells its peers
 * that it aborted through here: NCCL raises ncclRemoteError only on its
 * socket and IB transports, so over NVLink, P2P or shared memory a peer would
 * spin in its collective until its own deadline. Each channel owns a
 * duplicate of the MPI communicator (made at open, collectively): post sends
 * one fixed-size message to every peer with MPI_Isend and returns; poll
 * reads with MPI_Iprobe, at most every POLL_EVERY_S, and returns at once.
 *
 * MPI is initialised MPI_THREAD_FUNNELED by mpu (or by the caller), so only
 * the main thread calls MPI here unless MPI gives MPI_THREAD_MULTIPLE: a post
 * from a helper thread (mpu_comm_abort) is kept and sent by the next poll,
 * which the waiting thread makes every few hundred spins.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi/backend.h"
#include "core/error.h"

#define POLL_EVERY_S 0.01 /* MPI_Iprobe is a progress call: not on every spin */
#define WHY_WORDS (MPU__MPI_LATE_WORDS - 1)
#define TAG 7

typedef struct oob_msg {
  int64_t rank;
  int64_t why[WHY_WORDS]; /* the reason, NUL-terminated text */
} oob_msg;
_Static_assert(sizeof(oob_msg) == MPU__MPI_LATE_WORDS * sizeof(int64_t), "one late message");

typedef struct oob_channel {
  pthread_mutex_t lock;
  MPI_Comm comm;
  int me, size;
  int any_thread;      /* MPI_THREAD_MULTIPLE: post sends from any thread */
  int posted, sent;    /* this rank posted; its messages are out */
  oob_msg out;         /* what it posted */
  MPI_Request *reqs;   /* [size]: the sends (MPI_REQUEST_NULL to itself) */
  oob_msg **bufs;      /* [size]: each send's copy, freed when it completes */
  int heard;           /* a peer's message came */
  oob_msg in;          /* the first one */
  double next_probe;
} oob_channel;

/* MPI may be called on this thread now. */
static int may_call(const oob_channel *ch) {
  int main_thread = 0;
  if (ch->any_thread) return 1;
  MPI_Is_thread_main(&main_thread);
  return main_thread;
}

/* With the lock held: the posted message out to every peer, never blocking. */
static void send_posted(oob_channel *ch) {
  if (!ch->posted || ch->sent || !may_call(ch)) return;
  for (int p = 0; p < ch->size; p++) {
    if (p == ch->me || !(ch->bufs[p] = malloc(sizeof ch->out))) continue;
    *ch->bufs[p] = ch->out;
    if (MPI_Isend(ch->bufs[p], MPU__MPI_LATE_WORDS, MPI_INT64_T, p, TAG, ch->comm,
                  &ch->reqs[p]) != MPI_SUCCESS) {
      free(ch->bufs[p]);
      ch->bufs[p] = NULL, ch->reqs[p] = MPI_REQUEST_NULL;
    }
  }
  ch->sent = 1;
}

/* With the lock held: every message that came read; the first one kept. */
static void read_arrived(oob_channel *ch) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    oob_msg m;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG, ch->comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    if (MPI_Recv(&m, MPU__MPI_LATE_WORDS, MPI_INT64_T, st.MPI_SOURCE, TAG, ch->comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    if (!ch->heard) {
      m.rank = st.MPI_SOURCE; /* MPI's word for who sent it, not the message's */
      ((char *)m.why)[sizeof m.why - 1] = '\0';
      ch->in = m;
      ch->heard = 1;
    }
  }
}

mpu_result_t mpu__mpi_oob_open(mpu_comm *c, void **ctx) {
  static const char fn[] = "mpu_comm_nccl_create: abort channel";
  oob_channel *ch = calloc(1, sizeof *ch);
  MPI_Request *reqs = calloc((size_t)c->size, sizeof *reqs);
  oob_msg **bufs = calloc((size_t)c->size, sizeof *bufs);
  MPI_Comm dup = MPI_COMM_NULL;
  /* every member duplicates, whatever failed here, so none waits for another */
  int bad = MPI_Comm_dup(mpu__mpi_comm_of(c), &dup) != MPI_SUCCESS;
  if (bad || !ch || !reqs || !bufs) {
    if (dup != MPI_COMM_NULL) mpu__mpi_retire(dup);
    free(ch), free(reqs), free(bufs);
    return bad ? mpu__error(MPU_ERR_BACKEND, "%s: MPI_Comm_dup failed", fn)
               : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  pthread_mutex_init(&ch->lock, NULL);
  ch->comm = dup;
  ch->me = c->rank;
  ch->size = c->size;
  ch->any_thread = level == MPI_THREAD_MULTIPLE;
  for (int p = 0; p < c->size; p++) reqs[p] = MPI_REQUEST_NULL;
  ch->reqs = reqs;
  ch->bufs = bufs;
  ch->next_probe = 0;
  *ctx = ch;
  return MPU_SUCCESS;
}

void mpu__mpi_oob_post(void *ctx, int rank, const char *why) {
  oob_channel *ch = ctx;
  pthread_mutex_lock(&ch->lock);
  if (!ch->posted) {
    ch->posted = 1;
    ch->out.rank = rank;
    strncpy((char *)ch->out.why, why ? why : "", sizeof ch->out.why - 1);
  }
  send_posted(ch);
  pthread_mutex_unlock(&ch->lock);
}

int mpu__mpi_oob_poll(void *ctx, int *who, char *why, size_t len) {
  oob_channel *ch = ctx;
  if (pthread_mutex_trylock(&ch->lock)) return 0; /* a post is under way: next time */
  if (may_call(ch)) {
    send_posted(ch);
    double now = MPI_Wtime();
    if (!ch->heard && now >= ch->next_probe) {
      read_arrived(ch);
      ch->next_probe = now + POLL_EVERY_S;
    }
  }
  int heard = ch->heard;
  if (heard) {
    *who = (int)ch->in.rank;
    if (len) {
      strncpy(why, (const char *)ch->in.why, len - 1);
      why[len - 1] = '\0';
    }
  }
  pthread_mutex_unlock(&ch->lock);
  return heard;
}

/* Never blocks: what came is read, sends still going out cancelled or left
 * with the backend's orphans, the duplicate kept until mpu_mpi_finalize
 * (where a late message is drained). */
void mpu__mpi_oob_close(void *ctx) {
  oob_channel *ch = ctx;
  if (!ch) return;
  if (!may_call(ch)) {
    /* ended off MPI's thread: what MPI may still read stays (a leak, not a
     * use after free); so does the duplicate */
    pthread_mutex_destroy(&ch->lock);
    free(ch);
    return;
  }
  read_arrived(ch);
  for (int p = 0; p < ch->size; p++) mpu__mpi_end_send(&ch->reqs[p], ch->bufs[p]);
  mpu__mpi_retire(ch->comm);
  pthread_mutex_destroy(&ch->lock);
  free(ch->reqs), free(ch->bufs), free(ch);
}

/* MPI ends every process of the job: there is no one left to tell. */
mpu_result_t mpu__mpi_abort(mpu_comm *c) {
  MPI_Abort(comm_of(c), 1); /* MPI ends every process of the job */
  return MPU_SUCCESS;
}

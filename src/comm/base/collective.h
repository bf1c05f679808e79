/*
 * collective.h - what each call of the communicator is, in one table.
 *
 * One row per kind of call: the collectives of mpu/comm.h (mpu_collective)
 * and, after them, point-to-point send and recv. A row says the call's
 * names, which arguments it takes (op, root, peer), how its count is read
 * (elements per block, how many blocks each buffer holds, or counts per
 * rank in lists), its one in-place form, and what mpu bench reports of it
 * (nccl-tests' bus factor, the least memory traffic). Everything that asks
 * "what is this call" reads this row: the argument checks and the call
 * description (comm.c), the signatures (signature.c), the backends, the
 * bench and the tools. A backend keeps one switch, from a kind to the
 * library call that moves its bytes (the Open MPI coll / NCCL model).
 *
 * Adding a collective: a row here, its entry point in comm.c, and the case
 * in each backend's switch.
 */
#ifndef MPU_COMM_BASE_COLLECTIVE_H
#define MPU_COMM_BASE_COLLECTIVE_H

#include <stddef.h>

#include "core/error.h"
#include "mpu/comm.h"

/* The kinds past the public collectives: point to point, described and
 * checked as every other call (they have no request form and no signature
 * compared across ranks). */
enum {
  MPU__CALL_SEND = MPU_COLL_KINDS,
  MPU__CALL_RECV,
  MPU__CALL_KINDS /* every kind of call */
};

/* How many blocks of `count` elements a buffer holds. */
enum {
  MPU__BLOCKS_NONE = 0,    /* no such buffer */
  MPU__BLOCKS_ONE = 1,     /* one block */
  MPU__BLOCKS_PER_RANK = 2 /* one block per rank of the communicator */
};

/* The one overlap of send and recv a call allows. */
typedef enum mpu__in_place {
  MPU__IN_PLACE_NONE,         /* none: send and recv must not overlap */
  MPU__IN_PLACE_SAME,         /* recv == send (all_reduce; reduce at its root) */
  MPU__IN_PLACE_SEND_IN_RECV, /* send == recv + rank's block (all_gather, all_gather_v) */
  MPU__IN_PLACE_RECV_IN_SEND, /* recv == send + rank's block (reduce_scatter) */
  MPU__IN_PLACE_ONE_BUFFER    /* one buffer, read at the root and written elsewhere (broadcast) */
} mpu__in_place;

typedef struct mpu__coll {
  const char *name;   /* "all_reduce": mpu_collective_name, mpu bench, messages */
  const char *fn;     /* "mpu_comm_all_reduce": the blocking call, in messages */
  const char *ifn;    /* "mpu_comm_iall_reduce": its request form; the blocking one where
                         there is none (the uneven calls, send, recv) */
  unsigned has_op : 1;   /* takes a reduction op */
  unsigned has_root : 1; /* takes a root rank */
  unsigned has_peer : 1; /* takes a peer rank (send: the destination, recv: the source) */
  unsigned listed : 1;   /* counts per rank in the call's lists (the uneven calls); else
                            sig.count elements per block */
  unsigned recv_at_root : 1; /* recv is read only at the root (reduce) */
  unsigned send_blocks : 2;  /* MPU__BLOCKS_*: blocks of count elements in send */
  unsigned recv_blocks : 2;  /* and in recv */
  mpu__in_place in_place;
  int p2p;               /* MPU__CALL_SEND or MPU__CALL_RECV for point to point; 0 */
  const char *peer_name; /* the peer in messages: "dst" (send), "src" (recv) */
  /* mpu bench, nccl-tests' definitions (its doc/PERFORMANCE.md): busbw =
   * algbw x bus_scale x ((n - 1) / n where bus_ring, else 1) */
  double bus_scale;
  unsigned bus_ring : 1;
  /* the least memory traffic over all ranks, bytes read + written, for a
   * call of nccl-tests' size S: (traffic_n x n + traffic_1) x S */
  double traffic_n, traffic_1;
} mpu__coll;

/* The row of `kind` (0 .. MPU__CALL_KINDS - 1); NULL for any other value. */
MPU_SIBLING_API const mpu__coll *mpu__coll_of(int kind);

/* Whether send and recv of rank `rank`'s call are the row's in-place form
 * (block: one block's bytes): recv == send, send at the rank's block of recv,
 * or recv at the rank's block of send. 0 for a row without one. */
static inline int mpu__coll_in_place(const mpu__coll *row, const void *send, const void *recv,
                                     int rank, size_t block) {
  const char *s = send, *r = recv;
  size_t mine = (size_t)rank * block;
  switch (row->in_place) {
  case MPU__IN_PLACE_SAME: return s == r;
  case MPU__IN_PLACE_SEND_IN_RECV: return r && s == r + mine;
  case MPU__IN_PLACE_RECV_IN_SEND: return s && r == s + mine;
  default: return 0;
  }
}

/* A buffer's blocks (MPU__BLOCKS_*) on a communicator of n ranks: 0, 1 or n. */
static inline size_t mpu__coll_blocks(unsigned blocks, int n) {
  return blocks == MPU__BLOCKS_PER_RANK ? (size_t)n : (size_t)blocks;
}

/* The call's name for messages, "mpu_comm_all_reduce"; "mpu call" for a
 * kind outside the table. */
MPU_SIBLING_API const char *mpu__coll_fn(int kind);

#endif

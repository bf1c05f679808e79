/*
 * collective.c - the table of what each call is (collective.h), and the
 * public names read from it.
 */
#include "comm/base/collective.h"

#include <stdio.h>
#include <strings.h>

#include "core/error.h"

#define ONE MPU__BLOCKS_ONE
#define PER_RANK MPU__BLOCKS_PER_RANK

static const mpu__coll table[MPU__CALL_KINDS] = {
    [MPU_COLL_ALL_REDUCE] = {.name = "all_reduce", .fn = "mpu_comm_all_reduce",
                             .ifn = "mpu_comm_iall_reduce", .has_op = 1, .send_blocks = ONE,
                             .recv_blocks = ONE, .in_place = MPU__IN_PLACE_SAME,
                             .bus_scale = 2, .bus_ring = 1, .traffic_n = 2},
    [MPU_COLL_ALL_GATHER] = {.name = "all_gather", .fn = "mpu_comm_all_gather",
                             .ifn = "mpu_comm_iall_gather", .send_blocks = ONE,
                             .recv_blocks = PER_RANK, .in_place = MPU__IN_PLACE_SEND_IN_RECV,
                             .bus_scale = 1, .bus_ring = 1, .traffic_n = 1, .traffic_1 = 1},
    [MPU_COLL_REDUCE_SCATTER] = {.name = "reduce_scatter", .fn = "mpu_comm_reduce_scatter",
                                 .ifn = "mpu_comm_ireduce_scatter", .has_op = 1,
                                 .send_blocks = PER_RANK, .recv_blocks = ONE,
                                 .in_place = MPU__IN_PLACE_RECV_IN_SEND, .bus_scale = 1,
                                 .bus_ring = 1, .traffic_n = 1, .traffic_1 = 1},
    [MPU_COLL_BROADCAST] = {.name = "broadcast", .fn = "mpu_comm_broadcast",
                            .ifn = "mpu_comm_ibroadcast", .has_root = 1, .send_blocks = ONE,
                            .recv_blocks = ONE, .in_place = MPU__IN_PLACE_ONE_BUFFER,
                            .bus_scale = 1, .traffic_n = 1},
    [MPU_COLL_REDUCE] = {.name = "reduce", .fn = "mpu_comm_reduce", .ifn = "mpu_comm_ireduce",
                         .has_op = 1, .has_root = 1, .recv_at_root = 1, .send_blocks = ONE,
                         .recv_blocks = ONE, .in_place = MPU__IN_PLACE_SAME, .bus_scale = 1,
                         .traffic_n = 1, .traffic_1 = 1},
    [MPU_COLL_ALL_TO_ALL] = {.name = "all_to_all", .fn = "mpu_comm_all_to_all",
                             .ifn = "mpu_comm_iall_to_all", .send_blocks = PER_RANK,
                             .recv_blocks = PER_RANK, .in_place = MPU__IN_PLACE_NONE,
                             .bus_scale = 1, .bus_ring = 1, .traffic_n = 2},
    [MPU_COLL_BARRIER] = {.name = "barrier", .fn = "mpu_comm_barrier", .ifn = "mpu_comm_ibarrier"},
    [MPU_COLL_ALL_GATHER_V] = {.name = "all_gather_v", .fn = "mpu_comm_all_gather_v",
                               .ifn = "mpu_comm_all_gather_v", .listed = 1,
                               .in_place = MPU__IN_PLACE_SEND_IN_RECV},
    [MPU_COLL_REDUCE_SCATTER_V] = {.name = "reduce_scatter_v", .fn = "mpu_comm_reduce_scatter_v",
                                   .ifn = "mpu_comm_reduce_scatter_v", .has_op = 1, .listed = 1},
    [MPU_COLL_ALL_TO_ALL_V] = {.name = "all_to_all_v", .fn = "mpu_comm_all_to_all_v",
                               .ifn = "mpu_comm_all_to_all_v", .listed = 1},
    [MPU__CALL_SEND] = {.name = "send", .fn = "mpu_comm_send", .ifn = "mpu_comm_send",
                        .has_peer = 1, .send_blocks = ONE, .p2p = MPU__CALL_SEND,
                        .peer_name = "dst"},
    [MPU__CALL_RECV] = {.name = "recv", .fn = "mpu_comm_recv", .ifn = "mpu_comm_recv",
                        .has_peer = 1, .recv_blocks = ONE, .p2p = MPU__CALL_RECV,
                        .peer_name = "src"},
};

const mpu__coll *mpu__coll_of(int kind) {
  return kind >= 0 && kind < MPU__CALL_KINDS ? &table[kind] : NULL;
}

const char *mpu__coll_fn(int kind) {
  const mpu__coll *k = mpu__coll_of(kind);
  return k ? k->fn : "mpu call";
}

/* ---- the public names: the collectives only ------------------------------------ */

const char *mpu_collective_name(mpu_collective c) {
  return (unsigned)c < MPU_COLL_KINDS ? table[c].name : "invalid";
}

mpu_result_t mpu_collective_from_name(const char *name, mpu_collective *out) {
  if (!name || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_collective_from_name: NULL");
  for (int i = 0; i < MPU_COLL_KINDS; i++)
    if (!strcasecmp(name, table[i].name)) return *out = (mpu_collective)i, MPU_SUCCESS;
  char list[256];
  size_t used = 0;
  for (int i = 0; i < MPU_COLL_KINDS && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", table[i].name);
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "unknown collective '%s' (want one of %s)", name,
                    list);
}

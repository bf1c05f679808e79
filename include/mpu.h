/*
 * mpu.h - the whole public surface of mpu, one header per layer.
 *
 *   mpu/result.h   result codes and the last-error message
 *   mpu/tensor.h   dtypes and the tensor view
 *   mpu/comm.h     communicators, collectives, the threads and fake backends
 *   mpu/mesh.h     N-d meshes of ranks with named dims, and their communicators
 *   mpu/shard.h    which part of a tensor a rank holds: boxes, kept spans, the box copy
 *   mpu/layout.h   Megatron's rank groups by arithmetic (deepspeed, core, core-0.19)
 *   mpu/state.h    the parallel state: communicators, getters, seeded streams, test helpers
 *   mpu/regions.h  tensor-parallel regions as (forward, backward) pairs
 *   mpu/layers.h   tensor-parallel layers: linear, embedding, cross entropy, broadcast_data
 *   mpu/schedule.h Megatron's pipeline schedules: each rank's order of work, its timeline
 *   mpu/train.h    parameter buffers, bucketed gradient reduction, AdamW, ZeRO-1, clipping
 *   mpu/fsdp.h     sharded parameter buffers: ZeRO-2, ZeRO-3 (FSDP), hybrid sharding (HSDP)
 *   mpu/dtensor.h  placements on a mesh (Shard, Replicate, Partial) and redistribute
 *   mpu/bench.h    timing collectives as nccl-tests does
 *   mpu/checkpoint.h  distributed checkpoints (safetensors + index) that load into any layout
 */
#ifndef MPU_H
#define MPU_H

#include "mpu/result.h"
#include "mpu/tensor.h"
#include "mpu/comm.h"
#include "mpu/mesh.h"
#include "mpu/shard.h"
#include "mpu/layout.h"
#include "mpu/state.h"
#include "mpu/regions.h"
#include "mpu/layers.h"
#include "mpu/schedule.h"
#include "mpu/train.h"
#include "mpu/fsdp.h"
#include "mpu/dtensor.h"
#include "mpu/bench.h"
#include "mpu/checkpoint.h"

#endif

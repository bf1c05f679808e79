/*
 * gpt_device.h - mpu demo gpt --backend nccl: the pipeline's transfers and
 * the loss's all-reduce on NCCL communicators with device buffers, while the
 * layers and the optimizer stay on the host (their groups' host twins).
 */
#ifndef MPU_TOOLS_GPT_DEVICE_H
#define MPU_TOOLS_GPT_DEVICE_H

#include "mpu.h"

typedef struct gpt_device {
  mpu_comm *pp, *dp;         /* this rank's NCCL pipeline and data-parallel groups */
  float *in, *out, *gin, *gout; /* host staging of one activation */
  double *loss;              /* one double of device memory (dp) */
  size_t count;
  mpu_pipeline_callbacks host; /* the model's callbacks, on host buffers */
} gpt_device;

/* Collective over the state's ranks: NCCL communicators for every group
 * (mpu_state_enable_nccl) and *dev_cb, callbacks that stage the pipeline's
 * device buffers (count floats) through the host for host_cb. */
mpu_result_t gpt_device_init(gpt_device *d, mpu_state *s, size_t count,
                             const mpu_pipeline_callbacks *host_cb, mpu_pipeline_callbacks *dev_cb);

/* *loss = its mean over the data-parallel group, through device memory. */
mpu_result_t gpt_device_loss_avg(gpt_device *d, double *loss);

void gpt_device_free(gpt_device *d);

#endif

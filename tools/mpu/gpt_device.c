/*
 * gpt_device.c - mpu demo gpt --backend nccl (see gpt_device.h). The layers
 * run on the CPU, so each pipeline callback copies its device input to the
 * host and its host output back (mpu_comm_copy2d, cudaMemcpy on NCCL): what
 * a CUDA trainer's kernels would read and write in place.
 */
#include <stdlib.h>
#include <string.h>

#include "gpt_device.h"

#define CHECK(call)                   \
  do {                                \
    mpu_result_t r_ = (call);         \
    if (r_ != MPU_SUCCESS) return r_; \
  } while (0)

static mpu_result_t to_host(gpt_device *d, float *host, const float *dev) {
  size_t b = d->count * sizeof(float);
  return mpu_comm_copy2d(d->pp, host, b, dev, b, b, 1);
}

static mpu_result_t to_device(gpt_device *d, float *dev, const float *host) {
  size_t b = d->count * sizeof(float);
  return mpu_comm_copy2d(d->pp, dev, b, host, b, b, 1);
}

static mpu_result_t dev_forward(void *user, int mb, int chunk, const float *input, float *output) {
  gpt_device *d = user;
  if (input) CHECK(to_host(d, d->in, input));
  CHECK(d->host.forward(d->host.user, mb, chunk, input ? d->in : NULL, d->out));
  return to_device(d, output, d->out);
}

static mpu_result_t dev_backward(void *user, int mb, int chunk, const float *grad_output,
                                 float *grad_input) {
  gpt_device *d = user;
  if (grad_output) CHECK(to_host(d, d->gout, grad_output));
  CHECK(d->host.backward(d->host.user, mb, chunk, grad_output ? d->gout : NULL,
                             grad_input ? d->gin : NULL));
  return grad_input ? to_device(d, grad_input, d->gin) : MPU_SUCCESS;
}

mpu_result_t gpt_device_init(gpt_device *d, mpu_state *s, size_t count,
                             const mpu_pipeline_callbacks *host_cb, mpu_pipeline_callbacks *dev_cb) {
  memset(d, 0, sizeof *d);
  d->count = count, d->host = *host_cb;
  CHECK(mpu_state_enable_nccl(s, NULL));
  CHECK(mpu_state_comm(s, MPU_GROUP_PP, &d->pp));
  CHECK(mpu_state_comm(s, MPU_GROUP_DP, &d->dp));
  CHECK(mpu_comm_mem_alloc(d->dp, sizeof(double), (void **)&d->loss));
  float **bufs[] = {&d->in, &d->out, &d->gin, &d->gout};
  for (int i = 0; i < 4; i++)
    if (!(*bufs[i] = calloc(count ? count : 1, sizeof(float))))
      return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: %zu floats of staging", count);
  *dev_cb = (mpu_pipeline_callbacks){dev_forward, dev_backward, d};
  return MPU_SUCCESS;
}

mpu_result_t gpt_device_loss_avg(gpt_device *d, double *loss) {
  CHECK(mpu_comm_copy2d(d->dp, d->loss, sizeof *loss, loss, sizeof *loss, sizeof *loss, 1));
  CHECK(mpu_comm_all_reduce(d->dp, d->loss, d->loss, 1, MPU_FLOAT64, MPU_AVG));
  return mpu_comm_copy2d(d->dp, loss, sizeof *loss, d->loss, sizeof *loss, sizeof *loss, 1);
}

void gpt_device_free(gpt_device *d) {
  if (d->loss) mpu_comm_mem_free(d->dp, d->loss);
  free(d->in), free(d->out), free(d->gin), free(d->gout);
  memset(d, 0, sizeof *d);
}

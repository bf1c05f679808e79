/*
 * toy_model.h - the HSDP tutorial's ToyModel (Linear 10->10, ReLU,
 * Linear 10->5) with a mean-squared-error loss, forward and backward written
 * out as in llm.c. Parameters live in one flat vector so that a data-parallel
 * trainer can shard, gather and reduce them as a whole.
 */
#ifndef MPU_TOOLS_TOY_MODEL_H
#define MPU_TOOLS_TOY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define TOY_IN 10
#define TOY_HIDDEN 10
#define TOY_OUT 5

/* Offsets into the flat parameter (and gradient) vector. */
#define TOY_W1 0                                  /* (HIDDEN, IN), torch's (out, in) layout */
#define TOY_B1 (TOY_W1 + TOY_HIDDEN * TOY_IN)     /* (HIDDEN) */
#define TOY_W2 (TOY_B1 + TOY_HIDDEN)              /* (OUT, HIDDEN) */
#define TOY_B2 (TOY_W2 + TOY_OUT * TOY_HIDDEN)    /* (OUT) */
#define TOY_NPARAMS (TOY_B2 + TOY_OUT)            /* 165 */

/* A deterministic generator (splitmix64): the same seed gives the same
 * numbers everywhere. */
typedef struct toy_rng {
  uint64_t state;
} toy_rng;

float toy_uniform(toy_rng *g, float lo, float hi);

/* torch.nn.Linear's default init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias. */
void toy_init_params(float *params, uint64_t seed);

/* A synthetic regression set: x (n, IN) in U(-1, 1), targets (n, OUT) from a
 * fixed random teacher, y = tanh(T x). */
void toy_make_data(float *x, float *y, int n, uint64_t seed);

/* Activations of one forward pass over a batch of n. */
typedef struct toy_acts {
  int n;
  float *h;   /* (n, HIDDEN) before ReLU */
  float *a;   /* (n, HIDDEN) after ReLU */
  float *out; /* (n, OUT) */
} toy_acts;

int toy_acts_alloc(toy_acts *acts, int n); /* 0 on success */
void toy_acts_free(toy_acts *acts);

/* Forward; returns the mean squared error over the n x OUT outputs. */
float toy_forward(const float *params, const float *x, const float *y, toy_acts *acts);

/* Backward of the mean loss: writes (not adds) grads (NPARAMS). Returns 0, or
 * -1 when out of memory (grads then unspecified). */
int toy_backward(const float *params, const float *x, const float *y, const toy_acts *acts,
                  float *grads);

#endif

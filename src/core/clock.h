/*
 * clock.h - the library's one monotonic clock, in seconds.
 */
#ifndef MPU_CORE_CLOCK_H
#define MPU_CORE_CLOCK_H

#include "core/error.h"

/* CLOCK_MONOTONIC in seconds: deadlines, timeouts, the communication clock
 * and the benchmarks (the tool has its own, cli_now). */
MPU_SIBLING_API double mpu__now(void);

#endif

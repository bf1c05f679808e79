/*
 * cpus.h - which CPU of a CPU set is the n-th: how the threads backend binds
 * its ranks and the bench's roof places its threads, one CPU each in order.
 */
#ifndef MPU_CORE_CPUS_H
#define MPU_CORE_CPUS_H

#include <sched.h>

/* The CPU number of the (n modulo their count)-th CPU in `set`, counting
 * from its lowest; -1 for an empty set. */
int mpu__cpu_nth(const cpu_set_t *set, unsigned n);

#endif

/*
 * cpus.c - the n-th CPU of a CPU set.
 */
#include "core/cpus.h"

int mpu__cpu_nth(const cpu_set_t *set, unsigned n) {
  int count = CPU_COUNT(set);
  if (count < 1) return -1;
  unsigned want = n % (unsigned)count, seen = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, set) && seen++ == want) return c;
  return -1;
}

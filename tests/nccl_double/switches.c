/*
 * switches.c - the test double's forgiving shortcuts (switches.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_double/switches.h"

static const char *const names[DOUBLE_SWITCHES] = {
    "pointers", "abort", "order", "reductions", "p2p_size", "split_early", "share", "group_order",
    "pageable", "host_access", "free_nowait"};
static atomic_int state[DOUBLE_SWITCHES];
static pthread_once_t from_env = PTHREAD_ONCE_INIT;

static int apply(const char *list, int on) {
  int bad = 0;
  for (const char *p = list; p && *p;) {
    size_t n = strcspn(p, ",");
    int found = 0;
    for (int s = 0; s < DOUBLE_SWITCHES; s++)
      if (strlen(names[s]) == n && !strncmp(p, names[s], n)) atomic_store(&state[s], on), found = 1;
    bad |= !found && n;
    p += n + (p[n] == ',');
  }
  return bad ? -1 : 0;
}

static void read_env(void) { apply(getenv("MPU_DOUBLE_FORGIVE"), 1); }

int double_forgive(const char *names_list, int on) {
  pthread_once(&from_env, read_env);
  return apply(names_list, on);
}

int double_forgives(double_switch s) {
  pthread_once(&from_env, read_env);
  return s >= 0 && s < DOUBLE_SWITCHES && atomic_load(&state[s]);
}

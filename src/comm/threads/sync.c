/*
 * sync.c - how threads ranks wait for each other: a generation barrier that
 * spins, yields or sleeps on a futex as the peers' placement warrants, and
 * that can be broken.
 *
 * Waiting adapts to where the peers run and to how crowded the machine is: a
 * waiter spins (briefly, and less after spins that did not pay, or when more
 * threads are runnable than there are CPUs) while its peers run on other
 * CPUs, yields at once when a peer last arrived from its own CPU (it cannot
 * arrive while we spin), and sleeps on a futex, which the last arrival wakes,
 * when neither ends the wait. A yield hands the CPU to the peer only while
 * nothing else waits for that CPU: on a crowded machine it runs a stranger's
 * whole time slice first (a millisecond or more), while a sleeper is woken by
 * the peer's arrival and, having used no CPU meanwhile, runs before the
 * strangers. So a crowded machine (sampled from the runnable threads every
 * CROWD_EVERY_S, or seen in a yield that came back late) turns yields into
 * sleeps.
 *
 * The barrier is one 64-bit word: BROKEN | generation << 32 | arrivals. The
 * last member to arrive starts the next generation; a waiter that gives up
 * (timeout, a peer gone, the world poisoned) sets BROKEN with a
 * compare-and-swap that succeeds only if the generation is still incomplete.
 * So each call either completes for every member or fails for every member.
 * A sleeping waiter wakes every SLICE (doubling up to 16 SLICEs as the wait
 * grows) to look for failures, so an abort is noticed within that time
 * without anyone having to know who sleeps where; each look is O(1).
 */

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/threads/threads.h"
#include "core/clock.h"
#include "core/error.h"

#define BROKEN (UINT64_C(1) << 63)
#define GEN_MASK UINT64_C(0x7fffffff)
#define COUNT_MASK UINT64_C(0xffffffff)
#define SLICE_S 0.01
#define SPIN_MIN 32          /* the adaptive spin budget's floor (pause()s) */
#define SHARED_SCAN_MAX 64   /* groups up to this size look for a peer on their CPU */
#define SHARED_YIELDS 2000   /* yields to a peer on our CPU before sleeping */
#define SHARED_MOVE_EVERY 256 /* shared waits between two tries to move off the CPU */
#define SHORT_WAIT_S 50e-6   /* a wait past the spin this short grows the budget back */
#define CROWD_EVERY_S 0.02   /* how often a waiter counts the machine's runnable threads */
#define YIELD_SLOW_S 50e-6   /* a yield that took this long ran someone else's time slice */

static inline uint64_t gen_of(uint64_t s) { return (s >> 32) & GEN_MASK; }

/* The threads runnable on the machine now, the reader included: the number
 * before the '/' in /proc/loadavg's fourth field ("0.52 0.58 0.59 3/467
 * 12345"). 0 where it cannot be read or parsed (then nothing counts as
 * crowded). */
static long runnable_parse(const char *text) {
  const char *p = text;
  for (int field = 0; field < 3; field++) {
    p = strchr(p, ' ');
    if (!p) return 0;
    p++;
  }
  char *end;
  long n = strtol(p, &end, 10);
  return end != p && *end == '/' && n > 0 ? n : 0;
}

static long runnable_threads(void) {
  char text[128];
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t got = read(fd, text, sizeof text - 1);
  close(fd);
  if (got <= 0) return 0;
  text[got] = 0;
  return runnable_parse(text);
}

/* The spin budget's ceiling with `runnable` threads on `online` CPUs: spin
 * while they fit, less as they outnumber the CPUs (never under the floor). */
static long spin_cap(long spin, long online, long runnable) {
  if (runnable <= online || spin <= SPIN_MIN) return spin;
  long cap = (long)((double)spin * (double)online / (double)runnable);
  return cap < SPIN_MIN ? SPIN_MIN : cap;
}

/* Whether more threads are runnable than the machine has CPUs: then a late
 * peer is likely descheduled, spinning for it takes time the machine needs
 * elsewhere, and a yield runs a stranger first. Counted at most every
 * CROWD_EVERY_S (by one waiter: the others read the last count), in the slow
 * path only; the count also sets the spin budget's ceiling. */
static int crowded(tworld *w) {
  int64_t now = (int64_t)(mpu__now() * 1e6);
  int64_t at = atomic_load_explicit(&w->crowd_at_us, memory_order_relaxed);
  if (now - at >= (int64_t)(CROWD_EVERY_S * 1e6) &&
      atomic_compare_exchange_strong(&w->crowd_at_us, &at, now)) {
    long runnable = runnable_threads();
    atomic_store_explicit(&w->spin_cap, spin_cap(w->spin, w->online, runnable),
                          memory_order_relaxed);
    atomic_store_explicit(&w->crowded, runnable > w->online, memory_order_relaxed);
  }
  return atomic_load_explicit(&w->crowded, memory_order_relaxed);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected, double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

void mpu__treason_text(uint64_t reason, char *buf, size_t len) {
  tcause cause = (tcause)(reason >> 48);
  mpu_result_t code = (mpu_result_t)((reason >> 32) & 0xffff);
  int rank = (int)(uint32_t)reason - 1;
  switch (cause) {
  case TC_ABORTED:
    snprintf(buf, len, "world rank %d called mpu_comm_abort", rank);
    break;
  case TC_FAILED:
    snprintf(buf, len, "world rank %d failed (its function returned %s)", rank,
             mpu_result_name(code));
    break;
  case TC_EXITED:
    snprintf(buf, len, "world rank %d returned while its peers still waited for it", rank);
    break;
  case TC_DESTROYED:
    snprintf(buf, len, "world rank %d destroyed its communicator while its peers waited for it",
             rank);
    break;
  case TC_TIMEOUT:
    snprintf(buf, len, "timed out waiting for world rank %d", rank);
    break;
  case TC_START:
    snprintf(buf, len, "world rank %d could not be started", rank);
    break;
  default:
    snprintf(buf, len, "unknown failure");
  }
}

static mpu_result_t code_of(uint64_t reason) {
  return (tcause)(reason >> 48) == TC_TIMEOUT ? MPU_ERR_TIMEOUT : MPU_ERR_ABORTED;
}

void mpu__tworld_poison(tworld *w, tcause cause, mpu_result_t code, int world_rank) {
  uint64_t none = 0;
  atomic_compare_exchange_strong(&w->poison, &none, tc_pack(cause, code, world_rank));
}

mpu_result_t mpu__tgroup_broken(const tgroup *g, const char *what) {
  uint64_t reason;
  char text[200];
  /* the breaker stores the reason right after winning the break */
  while (!(reason = atomic_load(&((tgroup *)g)->reason))) cpu_relax();
  mpu__treason_text(reason, text, sizeof text);
  return mpu__error(code_of(reason), "%s: communicator of %d ranks is broken: %s", what, g->n,
                    text);
}

/* Break generation `gen` of g's barrier for `reason`. Returns 1 if the barrier
 * is broken (by us or someone else), 0 if the generation completed first. */
static int try_break(tgroup *g, uint64_t gen, uint64_t reason) {
  tbarrier *b = &g->bar;
  uint64_t s = atomic_load(&b->state);
  for (;;) {
    if (s & BROKEN) return 1;
    if (gen_of(s) != gen || (s & COUNT_MASK) >= (uint64_t)g->n) return 0;
    if (atomic_compare_exchange_weak(&b->state, &s, s | BROKEN)) break;
  }
  atomic_store(&g->reason, reason);
  atomic_fetch_xor(&b->futex, UINT32_C(0x80000000)); /* sleepers must not sleep on */
  futex_wake_all(&b->futex);
  return 1;
}

/* What a waiter saw the last time it looked at the members. */
typedef struct watch {
  uint32_t exits, departures;
  int scanned;
} watch;

/* Why this wait should give up now, as a reason word (0: keep waiting).
 * O(1) per call: the members are scanned only when a rank has returned or a
 * handle of the group was destroyed since the last look, so thousands of
 * sleepers waking to check cost the same as one. */
static uint64_t failure(tcomm *tc, double deadline, watch *seen, char *detail, size_t len) {
  tgroup *g = tc->g;
  tworld *w = g->world;
  uint64_t poison = atomic_load(&w->poison);
  if (poison) return poison;
  uint32_t exits = atomic_load(&w->exits), departures = atomic_load(&g->departures);
  if (!seen->scanned || exits != seen->exits || departures != seen->departures) {
    *seen = (watch){exits, departures, 1};
    for (int m = 0; m < g->n; m++) {
      if (atomic_load(&g->mem[m].entered) >= tc->seq) continue; /* already here */
      if (atomic_load(&g->mem[m].departed)) return tc_pack(TC_DESTROYED, MPU_ERR_ABORTED, g->members[m]);
      if (atomic_load(&w->gone[g->members[m]]))
        return tc_pack(TC_EXITED, MPU_ERR_ABORTED, g->members[m]);
    }
  }
  if (mpu__now() < deadline) return 0;
  size_t used = (size_t)snprintf(detail, len, "; missing ranks of this communicator:");
  int first = -1;
  for (int m = 0; m < g->n && used < len; m++)
    if (atomic_load(&g->mem[m].entered) < tc->seq) {
      used += (size_t)snprintf(detail + used, len - used, " %d (world %d)", m, g->members[m]);
      if (first < 0) first = g->members[m];
    }
  return tc_pack(TC_TIMEOUT, MPU_ERR_TIMEOUT, first < 0 ? g->members[tc->me] : first);
}

/* 1: generation gen is complete; -1: the barrier broke; 0: still waiting.
 * Acquire: a completed generation makes the peers' writes before it visible. */
static inline int look(tbarrier *b, uint64_t gen) {
  uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
  if (gen_of(s) != gen) return 1;
  return s & BROKEN ? -1 : 0;
}

/* Whether a peer last arrived from this CPU: then it cannot run while we
 * spin (both threads pinned to one core, or placed there by the scheduler),
 * and the CPU is better handed to it at once. A hint: a stale entry costs one
 * call a spin or a yield, never correctness. Big groups skip the scan. */
static int peer_on_my_cpu(const tgroup *g, int me, int cpu) {
  /* with more ranks in the world than CPUs sharing is the rule, not an
   * accident: those waiters sleep (after the world's few yields) and leave
   * the CPUs to the ranks that work */
  if (cpu < 0 || g->n > SHARED_SCAN_MAX || g->world->n > g->world->online) return 0;
  for (int m = 0; m < g->n; m++)
    if (m != me && atomic_load_explicit(&g->mem[m].cpu, memory_order_relaxed) == cpu) return 1;
  return 0;
}

static mpu_result_t wait_slow(tcomm *tc, int breakable, const char *what, uint64_t gen,
                              int shared);

/* A wait ended within the spin, or soon after: spin longer next time (up to
 * the ceiling the machine's crowding allows). */
static inline void grow_spin(tcomm *tc) {
  long most = atomic_load_explicit(&tc->g->world->spin_cap, memory_order_relaxed);
  if (tc->spin < most) tc->spin = tc->spin * 2 > most ? most : tc->spin * 2;
}

/* Move this thread to an allowed CPU that no member of the group was last
 * seen on, when the world has CPUs enough for one each: set the affinity to
 * that CPU alone, which migrates the thread at once, then give the original
 * mask back (the thread stays where it now is). Threads pinned to one CPU, or
 * more ranks than CPUs, are left where they are. */
static void move_off(tcomm *tc) {
  tgroup *g = tc->g;
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) || CPU_COUNT(&allowed) < g->world->n) return;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed)) continue;
    int used = 0;
    for (int m = 0; m < g->n && !used; m++)
      used = atomic_load_explicit(&g->mem[m].cpu, memory_order_relaxed) == c;
    if (used) continue;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    if (!sched_setaffinity(0, sizeof one, &one)) {
      sched_setaffinity(0, sizeof allowed, &allowed);
      atomic_store_explicit(&g->mem[tc->me].cpu, sched_getcpu(), memory_order_relaxed);
    }
    return;
  }
}

mpu_result_t mpu__tbarrier(tcomm *tc, int breakable, const char *what) {
  tgroup *g = tc->g;
  tbarrier *b = &g->bar;
  int cpu = sched_getcpu(); /* vDSO: tens of nanoseconds */
  /* stored only when it moved: the others read it on every wait */
  if (atomic_load_explicit(&g->mem[tc->me].cpu, memory_order_relaxed) != cpu)
    atomic_store_explicit(&g->mem[tc->me].cpu, cpu, memory_order_relaxed);
  uint64_t s = atomic_fetch_add(&b->state, 1);
  if (s & BROKEN) return mpu__tgroup_broken(g, what);
  uint64_t gen = gen_of(s);
  if ((s & COUNT_MASK) + 1 == (uint64_t)g->n) { /* last to arrive: open the next generation */
    /* the futex word first: the state is what the spinning peers read, and a
     * store to the line after theirs would take it back from them. A waiter
     * that saw the old state then finds the futex moved and does not sleep;
     * one that counted itself a sleeper before our state store is woken (the
     * state store and the sleepers load are sequentially consistent) */
    atomic_store_explicit(&b->futex, (uint32_t)(gen + 1), memory_order_relaxed);
    atomic_store(&b->state, ((gen + 1) & GEN_MASK) << 32);
    if (atomic_load(&b->sleepers)) futex_wake_all(&b->futex);
    return MPU_SUCCESS;
  }

  /* Spin while it pays: not when a peer shares our CPU, and for as long as
   * recent waits were short (the budget halves after a wait that outlasted it
   * by far and doubles after one that ended within it or soon after, as
   * glibc's adaptive mutexes follow their recent spins). */
  int shared = peer_on_my_cpu(g, tc->me, cpu), done;
  if (!shared) {
    long budget = tc->spin, cap = atomic_load_explicit(&g->world->spin_cap, memory_order_relaxed);
    if (budget > cap) budget = tc->spin = cap;
    for (long i = 0; i < budget; i++) {
      if ((done = look(b, gen))) {
        grow_spin(tc);
        return done > 0 ? MPU_SUCCESS : mpu__tgroup_broken(g, what);
      }
      cpu_relax();
    }
  }
  double t0 = mpu__now();
  mpu_result_t r = wait_slow(tc, breakable, what, gen, shared);
  /* the budget follows what waits take: one that ended soon after the spin
   * gave up says spinning a little longer would have paid */
  if (!shared) {
    if (mpu__now() - t0 < SHORT_WAIT_S) grow_spin(tc);
    else if (tc->spin > SPIN_MIN) tc->spin /= 2;
  }
  return r;
}

/* After the spin: yield, then sleep until the generation completes, the
 * barrier breaks, or (breakable) this wait finds a reason to break it. */
static mpu_result_t wait_slow(tcomm *tc, int breakable, const char *what, uint64_t gen,
                              int shared) {
  tgroup *g = tc->g;
  tbarrier *b = &g->bar;
  uint64_t s;
  int done;
  /* yield: to the peer on our CPU, or (ranks outnumber cores) to one with
   * work, before paying for a sleep and a wake-up; but not on a crowded
   * machine, where each yield may first run a stranger's time slice, and
   * not past a yield that came back late (one did: say so to the others
   * until the next count). Two threads that hand each other one CPU look
   * busy and cache-hot to the scheduler, which then leaves them there even
   * with a CPU idle: so a shared wait now and then moves this thread to a
   * CPU no member was seen on (move_off). */
  tworld *w = g->world;
  int yields = shared ? (crowded(w) ? 0 : SHARED_YIELDS) : w->yields;
  if (shared && tc->shared_waits++ % SHARED_MOVE_EVERY == 0) move_off(tc);
  for (int i = 0; i < yields; i++) {
    if ((done = look(b, gen))) return done > 0 ? MPU_SUCCESS : mpu__tgroup_broken(g, what);
    double t0 = mpu__now();
    sched_yield();
    if (mpu__now() - t0 > YIELD_SLOW_S) {
      atomic_store_explicit(&w->crowded, 1, memory_order_relaxed);
      break;
    }
  }
  if (!shared) crowded(w); /* keep the spin's ceiling current */

  double deadline = mpu__now() + g->world->timeout_s, slice = SLICE_S;
  char detail[512] = "";
  watch seen = {0, 0, 0};
  for (;;) {
    s = atomic_load(&b->state);
    if (gen_of(s) != gen) return MPU_SUCCESS;
    if (s & BROKEN) return mpu__tgroup_broken(g, what);
    if (breakable) {
      uint64_t reason = failure(tc, deadline, &seen, detail, sizeof detail);
      if (reason && try_break(g, gen, reason)) {
        mpu_result_t r = mpu__tgroup_broken(g, what);
        if (detail[0] && atomic_load(&g->reason) == reason) {
          char msg[1024];
          snprintf(msg, sizeof msg, "%s (after %.3g s)%s", mpu_last_error(),
                   g->world->timeout_s, detail);
          mpu__error(r, "%s", msg);
        }
        return r;
      }
      /* else the generation completed meanwhile: the next check sees it */
    }
    atomic_fetch_add(&b->sleepers, 1);
    s = atomic_load(&b->state);
    if (gen_of(s) == gen && !(s & BROKEN)) futex_wait(&b->futex, (uint32_t)gen, slice);
    atomic_fetch_sub(&b->sleepers, 1);
    /* a long wait looks less often: 10 ms, doubling to 160 ms (a failure is
     * still seen within that; the last arrival and breakers wake sleepers) */
    if (slice < 16 * SLICE_S) slice *= 2;
  }
}

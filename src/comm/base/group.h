/*
 * group.h - what the base layer's entry points ask of group.c
 * (mpu_group_start / mpu_group_end, declared in mpu/comm.h).
 */
#ifndef MPU_COMM_BASE_GROUP_H
#define MPU_COMM_BASE_GROUP_H

#include <stdint.h>

#include "comm/comm_internal.h"

/* 1 while this thread is between mpu_group_start and its mpu_group_end. */
int mpu__group_open(void);

/* The open group's number on this thread (0: none): a request made inside a
 * group cannot be waited for before the group ends. */
uint64_t mpu__group_serial(void);

/* 1 if the open group holds a call on c (c must not be destroyed yet). */
int mpu__group_holds(const mpu_comm *c);

/* MPU_ERR_INVALID_USAGE for a call that cannot be part of a group (set-up
 * calls, which need their peers' answers at once). */
mpu_result_t mpu__group_refuse(const char *fn);

/* Open the backend's own group (NCCL's ncclGroupStart) before c's first call
 * inside the bracket; nothing outside one. */
mpu_result_t mpu__group_enter(mpu_comm *c);

/* A blocking collective / send / recv issued inside a group: started now
 * (device backends) or recorded (host backends); complete at group end. */
mpu_result_t mpu__group_call(const char *fn, mpu_comm *c, const mpu__call *call);

/* A host backend's request made inside a group: run in issue order at the
 * group's end (request.c's mpu__request_run). */
mpu_result_t mpu__group_request(const char *fn, mpu_comm *c, mpu_request *req);

/* The thread is leaving (its rank function returned) with a bracket open:
 * close it without running the posted calls, free what was posted, and
 * return MPU_ERR_INVALID_USAGE naming `who` (MPU_SUCCESS: none was open). */
mpu_result_t mpu__group_abandon(const char *who);

/* request.c: run a queued request now, with the ones queued before it. */
void mpu__request_run(mpu_request *req);

#endif

/* schedule_cmd.h - `mpu plan --schedule` (schedule_cmd.c). */
#ifndef MPU_TOOL_SCHEDULE_CMD_H
#define MPU_TOOL_SCHEDULE_CMD_H

#include "cli.h"
#include "mpu/schedule.h"

int plan_schedule(const mpu_schedule_config *c, cli_format format);

#endif

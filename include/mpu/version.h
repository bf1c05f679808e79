/*
 * mpu/version.h - the version of mpu, the one place it is written: CMake
 * reads it (project version, library soname, pkg-config, CMake package), the
 * tool prints it, and mpu_version() reports the library actually loaded.
 * Every public header includes it (through mpu/result.h).
 */
#ifndef MPU_VERSION_H
#define MPU_VERSION_H

#define MPU_VERSION_MAJOR 0
#define MPU_VERSION_MINOR 3
#define MPU_VERSION_PATCH 0
#define MPU_VERSION_STRING "0.3.0"

/* major * 10000 + minor * 100 + patch, for #if checks */
#define MPU_VERSION_NUMBER (MPU_VERSION_MAJOR * 10000 + MPU_VERSION_MINOR * 100 + MPU_VERSION_PATCH)

#endif

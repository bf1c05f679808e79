/*
 * module.h - backends that live in their own library (libmpu_mpi,
 * libmpu_nccl, libmpu_gloo) and plug into libmpu, the way Open MPI's MCA components and
 * NCCL's net plugins plug into theirs.
 *
 * A backend library registers its entry points when it is loaded (a
 * constructor): a program that links it has them at start; otherwise libmpu
 * loads it on first use (dlopen of libmpu_<name>.so.<major>, from the loader's
 * path, then from libmpu's own folder). libmpu itself needs nothing but libc.
 */
#ifndef MPU_COMM_MODULE_H
#define MPU_COMM_MODULE_H

#include "core/error.h"
#include "mpu/comm.h"

typedef struct mpu__module {
  const char *name;    /* "mpi", "nccl" or "gloo" */
  const char *version; /* MPU_VERSION_STRING it was built with: must be libmpu's */
  /* the MPI backend */
  mpu_result_t (*mpi_world)(int *argc, char ***argv, const mpu_mpi_options *options,
                            mpu_comm **out);
  mpu_result_t (*mpi_finalize)(void);
  /* the NCCL backend */
  mpu_result_t (*nccl_create)(mpu_comm *host, const mpu_nccl_options *options, mpu_comm **out);
  mpu_result_t (*nccl_from_env)(const mpu_nccl_options *options, mpu_comm **out);
  /* the gloo backend */
  mpu_result_t (*gloo_from_env)(const mpu_gloo_options *options, mpu_comm **out);
  mpu_result_t (*gloo_create)(mpu_comm *host, const mpu_gloo_options *options, mpu_comm **out);
  /* Optional: whether the library the module runs on will do (NCCL's
   * version), asked before each use; MPU_ERR_UNSUPPORTED with one line if not */
  mpu_result_t (*usable)(const char *fn);
} mpu__module;

/* Called by a backend library's constructor. */
MPU_SIBLING_API void mpu__module_register(const mpu__module *m);

/* The backend `name`, loading its library if no library registered it yet;
 * else MPU_ERR_UNSUPPORTED with one line saying what is missing. */
mpu_result_t mpu__module_get(const char *fn, const char *name, const mpu__module **out);

#endif

/*
 * module.c - finding the backends that live in their own libraries, and the
 * public calls that reach them (mpu/comm.h's MPI, NCCL and gloo sections).
 */
#include "comm/base/module.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mpu/version.h"

#define STR_(x) #x
#define STR(x) STR_(x)

enum { MOD_MPI, MOD_NCCL, MOD_GLOO, MOD_COUNT };
static const char *const mod_names[MOD_COUNT] = {"mpi", "nccl", "gloo"};
static const char *const mod_needs[MOD_COUNT] = {"an MPI library (libmpi)",
                                                 "the CUDA runtime and NCCL",
                                                 "gloo (libgloo, Debian's libgloo-dev)"};
static const mpu__module *registered[MOD_COUNT];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int index_of(const char *name) {
  for (int i = 0; i < MOD_COUNT; i++)
    if (!strcmp(name, mod_names[i])) return i;
  return -1;
}

void mpu__module_register(const mpu__module *m) {
  int i = m ? index_of(m->name) : -1;
  if (i < 0 || strcmp(m->version, MPU_VERSION_STRING)) return; /* refused at get */
  pthread_mutex_lock(&lock);
  if (!registered[i]) registered[i] = m;
  pthread_mutex_unlock(&lock);
}

static const mpu__module *lookup(int i) {
  pthread_mutex_lock(&lock);
  const mpu__module *m = registered[i];
  pthread_mutex_unlock(&lock);
  return m;
}

/* dlopen the module: by its name through the loader's path (LD_LIBRARY_PATH,
 * the program's run path, the system), then from the folder libmpu is in.
 * *why gets the failure of the attempt that found the file, if any did. */
static void *load(const char *soname, char *why, size_t len) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
  if (h) return h;
  snprintf(why, len, "%s", dlerror());
  int found = strncmp(why, soname, strlen(soname)) != 0; /* it failed on a dependency */
  Dl_info info;
  if (found || !dladdr((void *)&mpu__module_get, &info) || !info.dli_fname) return NULL;
  const char *slash = strrchr(info.dli_fname, '/');
  if (!slash) return NULL;
  char path[4096];
  int n = snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                   soname);
  if (n < 0 || (size_t)n >= sizeof path || access(path, F_OK)) return NULL;
  h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) snprintf(why, len, "%s", dlerror());
  return h;
}

mpu_result_t mpu__module_get(const char *fn, const char *name, const mpu__module **out) {
  int i = index_of(name);
  if (i < 0) return mpu__error(MPU_ERR_INTERNAL, "%s: no backend module '%s'", fn, name);
  const mpu__module *m = lookup(i);
  if (!m) {
    char soname[64], why[512] = "";
    snprintf(soname, sizeof soname, "libmpu_%s.so.%s", name, STR(MPU_VERSION_MAJOR));
    void *h = load(soname, why, sizeof why);
    m = lookup(i); /* its constructor registered it */
    if (!m && h)
      snprintf(why, sizeof why, "%s is not the %s module of mpu %s", soname, name,
               MPU_VERSION_STRING);
    if (!m)
      return mpu__error(MPU_ERR_UNSUPPORTED,
                        "%s: the %s backend is not available: %s (it needs %s; link -lmpu_%s or "
                        "install it next to libmpu)",
                        fn, name, why, mod_needs[i], name);
  }
  if (m->usable) MPU_CHECK(m->usable(fn));
  *out = m;
  return MPU_SUCCESS;
}

/* ---- the public calls ---------------------------------------------------------------- */

/* 0: mpu_last_error() says what is missing */
int mpu_mpi_available(void) {
  const mpu__module *m;
  return mpu__module_get("mpu_mpi_available", "mpi", &m) == MPU_SUCCESS;
}

int mpu_nccl_available(void) {
  const mpu__module *m;
  return mpu__module_get("mpu_nccl_available", "nccl", &m) == MPU_SUCCESS;
}

mpu_result_t mpu_comm_mpi_world_ex(int *argc, char ***argv, const mpu_mpi_options *options,
                                   mpu_comm **out) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_comm_mpi_world", "mpi", &m));
  return m->mpi_world(argc, argv, options, out);
}

mpu_result_t mpu_comm_mpi_world(int *argc, char ***argv, mpu_comm **out) {
  return mpu_comm_mpi_world_ex(argc, argv, NULL, out);
}

mpu_result_t mpu_mpi_finalize(void) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_mpi_finalize", "mpi", &m));
  return m->mpi_finalize();
}

mpu_result_t mpu_comm_nccl_create(mpu_comm *host, const mpu_nccl_options *options,
                                  mpu_comm **out) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_comm_nccl_create", "nccl", &m));
  return m->nccl_create(host, options, out);
}

mpu_result_t mpu_comm_nccl_from_env(const mpu_nccl_options *options, mpu_comm **out) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_comm_nccl_from_env", "nccl", &m));
  return m->nccl_from_env(options, out);
}

int mpu_gloo_available(void) {
  const mpu__module *m;
  return mpu__module_get("mpu_gloo_available", "gloo", &m) == MPU_SUCCESS;
}

mpu_result_t mpu_comm_gloo_from_env(const mpu_gloo_options *options, mpu_comm **out) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_comm_gloo_from_env", "gloo", &m));
  return m->gloo_from_env(options, out);
}

mpu_result_t mpu_comm_gloo_create(mpu_comm *host, const mpu_gloo_options *options, mpu_comm **out) {
  const mpu__module *m;
  MPU_CHECK(mpu__module_get("mpu_comm_gloo_create", "gloo", &m));
  return m->gloo_create(host, options, out);
}

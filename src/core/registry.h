/*
 * registry.h - live handles by pointer: every entry point of a handle type
 * (communicators, states) looks its handle up here, comparing pointers only,
 * before it reads anything through it, so a destroyed or foreign pointer is
 * an error, never a read of freed memory. Buckets have their own locks, so
 * ranks using different handles do not contend.
 */
#ifndef MPU_CORE_REGISTRY_H
#define MPU_CORE_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define MPU__REGISTRY_BUCKETS 1024

typedef struct mpu__registry {
  size_t next_offset; /* where a handle keeps its link: offsetof(type, next_live) */
  size_t key_offset;  /* keyed registries: where a record keeps its key pointer */
  int keyed;          /* records are looked up by their key, not their address */
  _Atomic int ready;  /* the locks are initialised */
  pthread_mutex_t lock[MPU__REGISTRY_BUCKETS];
  void *head[MPU__REGISTRY_BUCKETS];
} mpu__registry;

#define MPU__REGISTRY_INIT(type, field) {.next_offset = offsetof(type, field)}

/* A registry of records found by a pointer they hold (an allocation's
 * address, say), not by their own address. */
#define MPU__REGISTRY_KEYED_INIT(type, field, key)                                          \
  {.next_offset = offsetof(type, field), .key_offset = offsetof(type, key), .keyed = 1}

void mpu__registry_add(mpu__registry *r, void *handle);

/* 1 if handle is live. */
int mpu__registry_find(mpu__registry *r, const void *handle);

/* Take handle out: 1 if it was live, 0 if not, -1 (and it stays) if
 * refuse(handle) says so. refuse may be NULL. */
int mpu__registry_take(mpu__registry *r, const void *handle, int (*refuse)(const void *handle));

/* Keyed registries: take out the record whose key is `key` and return it,
 * NULL if there is none. */
void *mpu__registry_take_key(mpu__registry *r, const void *key);

#endif

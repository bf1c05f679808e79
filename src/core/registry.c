/*
 * registry.c - live handles by pointer (registry.h).
 */
#include "core/registry.h"

#include <stdint.h>

/* a registry's locks are made on its first use, once, under this lock */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket_of(mpu__registry *r, const void *h) {
  if (!atomic_load_explicit(&r->ready, memory_order_acquire)) {
    pthread_mutex_lock(&init_lock);
    if (!atomic_load_explicit(&r->ready, memory_order_relaxed)) {
      for (int i = 0; i < MPU__REGISTRY_BUCKETS; i++) pthread_mutex_init(&r->lock[i], NULL);
      atomic_store_explicit(&r->ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&init_lock);
  }
  return ((uintptr_t)h >> 4) % MPU__REGISTRY_BUCKETS;
}

static void **link_of(const mpu__registry *r, void *h) {
  return (void **)(void *)((char *)h + r->next_offset);
}

/* What a handle is looked up by: itself, or the key it holds. */
static const void *key_of(const mpu__registry *r, void *h) {
  return r->keyed ? *(void **)(void *)((char *)h + r->key_offset) : h;
}

void mpu__registry_add(mpu__registry *r, void *h) {
  size_t b = bucket_of(r, key_of(r, h));
  pthread_mutex_lock(&r->lock[b]);
  *link_of(r, h) = r->head[b];
  r->head[b] = h;
  pthread_mutex_unlock(&r->lock[b]);
}

int mpu__registry_find(mpu__registry *r, const void *h) {
  if (!h) return 0;
  size_t b = bucket_of(r, h);
  int found = 0;
  pthread_mutex_lock(&r->lock[b]);
  for (void *p = r->head[b]; p && !found; p = *link_of(r, p)) found = key_of(r, p) == h;
  pthread_mutex_unlock(&r->lock[b]);
  return found;
}

int mpu__registry_take(mpu__registry *r, const void *h, int (*refuse)(const void *h)) {
  if (!h) return 0;
  size_t b = bucket_of(r, h);
  int found = 0;
  pthread_mutex_lock(&r->lock[b]);
  for (void **p = &r->head[b]; *p; p = link_of(r, *p))
    if (*p == h) {
      if (refuse && refuse(h)) {
        found = -1;
      } else {
        *p = *link_of(r, *p);
        found = 1;
      }
      break;
    }
  pthread_mutex_unlock(&r->lock[b]);
  return found;
}

void *mpu__registry_take_key(mpu__registry *r, const void *key) {
  if (!key) return NULL;
  size_t b = bucket_of(r, key);
  void *found = NULL;
  pthread_mutex_lock(&r->lock[b]);
  for (void **p = &r->head[b]; *p; p = link_of(r, *p))
    if (key_of(r, *p) == key) {
      found = *p;
      *p = *link_of(r, *p);
      break;
    }
  pthread_mutex_unlock(&r->lock[b]);
  return found;
}

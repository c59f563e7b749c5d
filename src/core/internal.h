/*
 * internal.h -- helpers shared by the core's source files; not installed.
 */
#ifndef DLB_CORE_INTERNAL_H_
#define DLB_CORE_INTERNAL_H_

#include "dlbridge/dlbridge.h"

/* Allocate through the installed allocator.  Callers that hand memory to a
 * deleter which may run after the allocator changed must keep a copy of the
 * allocator (see managed.c) instead of calling dlb__free later. */
void *dlb__alloc(size_t size);
void dlb__free(void *ptr);

/* a * b into *out, false on int64 overflow.  a, b >= 0. */
static inline bool dlb__mul_nonneg(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return false;
  *out = a * b;
  return true;
}

#endif /* DLB_CORE_INTERNAL_H_ */

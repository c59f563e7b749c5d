/* alloc.c -- the one place the core gets host memory, so users can route it
 * elsewhere and tests can make any allocation fail. */
#include <stdlib.h>

#include "internal.h"

static void *default_alloc(size_t size, void *ctx) {
  (void)ctx;
  /* malloc(0) may return NULL, which callers would read as failure. */
  return malloc(size == 0 ? 1 : size);
}

static void default_release(void *ptr, void *ctx) {
  (void)ctx;
  free(ptr);
}

static const dlb_allocator default_allocator = {default_alloc, default_release,
                                                NULL};
static dlb_allocator current_allocator = {default_alloc, default_release, NULL};

void dlb_set_allocator(const dlb_allocator *allocator) {
  current_allocator =
      (allocator != NULL && allocator->alloc != NULL && allocator->release != NULL)
          ? *allocator
          : default_allocator;
}

const dlb_allocator *dlb_get_allocator(void) { return &current_allocator; }

void *dlb__alloc(size_t size) {
  return current_allocator.alloc(size, current_allocator.ctx);
}

void dlb__free(void *ptr) {
  if (ptr != NULL) current_allocator.release(ptr, current_allocator.ctx);
}

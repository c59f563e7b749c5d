/* alloc.c -- the one place the core gets host memory, so users can route it
 * elsewhere and tests can make any allocation fail. */
#if defined(__linux__)
/* posix_memalign and madvise are POSIX/BSD, hidden by -std=c11 unless a
 * feature macro asks for them. */
#define _DEFAULT_SOURCE 1
#include <sys/mman.h>
#endif
#include <stdlib.h>

#include "internal.h"

#if defined(__linux__) && defined(MADV_HUGEPAGE)
/* Large tensors are filled right after allocation, and with 4 KiB pages a
 * fresh 64 MiB block costs ~16k page faults -- more than the copy that
 * fills it.  Where transparent huge pages are in "madvise" mode (the common
 * default) only memory that asks gets 2 MiB pages, so big blocks are
 * 2 MiB-aligned and ask, as NumPy does for its arrays.  The hint is only
 * that: if it fails the memory is still good. */
#define HUGE_THRESHOLD ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

static void *alloc_large(size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, HUGE_PAGE, size) != 0) return NULL;
  (void)madvise(p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
  return p;
}
#else
#define HUGE_THRESHOLD ((size_t)-1)
static void *alloc_large(size_t size) { return malloc(size); }
#endif

static void *default_alloc(size_t size, void *ctx) {
  (void)ctx;
  if (size >= HUGE_THRESHOLD) return alloc_large(size);
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

bool dlb_allocator_is_default(void) {
  return current_allocator.alloc == default_alloc &&
         current_allocator.release == default_release &&
         current_allocator.ctx == NULL;
}

void *dlb__alloc(size_t size) {
  return current_allocator.alloc(size, current_allocator.ctx);
}

void dlb__free(void *ptr) {
  if (ptr != NULL) current_allocator.release(ptr, current_allocator.ctx);
}

/*
 * check.h -- the tiny harness every C unit test uses.
 *
 * CHECK* macros count and report failures without stopping the test, so one
 * run shows every broken assertion.  Each test program ends with
 * `return check_summary("name");`, which prints "name: N passed, N failed"
 * and exits non-zero when anything failed.
 *
 * The injectable allocator makes the k-th allocation fail and counts live
 * blocks, so a test can drive every allocation-failure path and prove that
 * nothing leaked and nothing was freed twice.
 */
#ifndef DLB_TESTS_CHECK_H_
#define DLB_TESTS_CHECK_H_

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlbridge/dlbridge.h"

static int check_passed_;
static int check_failed_;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (cond) {                                                              \
      check_passed_++;                                                       \
    } else {                                                                 \
      check_failed_++;                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,       \
              #cond);                                                        \
    }                                                                        \
  } while (0)

#define CHECK_EQ(a, b)                                                       \
  do {                                                                       \
    long long check_a_ = (long long)(a), check_b_ = (long long)(b);          \
    if (check_a_ == check_b_) {                                              \
      check_passed_++;                                                       \
    } else {                                                                 \
      check_failed_++;                                                       \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n",   \
              __FILE__, __LINE__, #a, #b, check_a_, check_b_);               \
    }                                                                        \
  } while (0)

#define CHECK_STREQ(a, b)                                                    \
  do {                                                                       \
    const char *check_a_ = (a), *check_b_ = (b);                             \
    if (check_a_ && check_b_ && strcmp(check_a_, check_b_) == 0) {           \
      check_passed_++;                                                       \
    } else {                                                                 \
      check_failed_++;                                                       \
      fprintf(stderr, "%s:%d: CHECK_STREQ failed: \"%s\" vs \"%s\"\n",       \
              __FILE__, __LINE__, check_a_ ? check_a_ : "(null)",            \
              check_b_ ? check_b_ : "(null)");                               \
    }                                                                        \
  } while (0)

/* The message must mention needle: errors are for people, so tests hold
 * them to saying what went wrong. */
#define CHECK_MSG(err, needle)                                               \
  do {                                                                       \
    if (strstr((err).message, (needle)) != NULL) {                           \
      check_passed_++;                                                       \
    } else {                                                                 \
      check_failed_++;                                                       \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__,     \
              __LINE__, (err).message, (needle));                            \
    }                                                                        \
  } while (0)

static inline int check_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, check_passed_, check_failed_);
  return check_failed_ == 0 ? 0 : 1;
}

/* ---- injectable allocator ---- */

static long failing_countdown_ = -1; /* fail when it reaches 0; -1: never */
static long failing_live_;           /* blocks handed out, not yet freed */
static long failing_total_;          /* allocations attempted */

static void *failing_alloc_(size_t size, void *ctx) {
  (void)ctx;
  failing_total_++;
  if (failing_countdown_ == 0) return NULL;
  if (failing_countdown_ > 0) failing_countdown_--;
  void *p = malloc(size);
  if (p) failing_live_++;
  return p;
}

static void failing_release_(void *ptr, void *ctx) {
  (void)ctx;
  if (ptr) failing_live_--;
  free(ptr);
}

/* Install the counting allocator; the allocation after `succeed` successful
 * ones fails (succeed < 0: none fails). */
static inline void failing_allocator_install(long succeed) {
  static const dlb_allocator a = {failing_alloc_, failing_release_, NULL};
  failing_countdown_ = succeed;
  failing_total_ = 0;
  dlb_set_allocator(&a);
}

static inline void failing_allocator_remove(void) { dlb_set_allocator(NULL); }

static inline long failing_allocator_live(void) { return failing_live_; }
static inline long failing_allocator_total(void) { return failing_total_; }

#endif /* DLB_TESTS_CHECK_H_ */

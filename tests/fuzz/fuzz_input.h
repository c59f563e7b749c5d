/*
 * fuzz_input.h -- reading a libFuzzer input as a stream of fields.  A field
 * past the end of the input reads as zero, so every input decodes to some
 * tensor and the fuzzer spends its time on the library, not on framing.
 */
#ifndef DLB_FUZZ_INPUT_H_
#define DLB_FUZZ_INPUT_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  const uint8_t *p;
  size_t n;
} fuzz_input;

static inline void fuzz_take(fuzz_input *in, void *out, size_t size) {
  size_t k = in->n < size ? in->n : size;
  memset(out, 0, size);
  memcpy(out, in->p, k);
  in->p += k;
  in->n -= k;
}

static inline uint8_t fuzz_u8(fuzz_input *in) {
  uint8_t v;
  fuzz_take(in, &v, sizeof v);
  return v;
}

static inline int64_t fuzz_i64(fuzz_input *in) {
  int64_t v;
  fuzz_take(in, &v, sizeof v);
  return v;
}

/* A small value most of the time (extents and strides that can describe a
 * buffer the fuzzer can afford), the raw 64 bits when the selector's top
 * bit is set (overflow and sign corner cases). */
static inline int64_t fuzz_dim(fuzz_input *in) {
  uint8_t sel = fuzz_u8(in);
  if (sel & 0x80) return fuzz_i64(in);
  return (int64_t)(int8_t)(sel << 1) / 2;
}

#endif /* DLB_FUZZ_INPUT_H_ */

/*
 * fuzz_formats.c -- libFuzzer target for the parsers of other protocols'
 * dtype spellings: dlb_dtype_from_typestr (array interfaces) and
 * dlb_dtype_from_buffer_format (the buffer protocol).
 *
 * Input: one selector byte, two bytes of itemsize, then the text (copied
 * into an exactly sized, NUL-terminated heap block, so AddressSanitizer
 * catches a read past its end).  Whatever a parser accepts must be a dtype
 * dlbridge understands (dlb_dtype_check) whose width is the one asked for;
 * every failure must leave a NUL-terminated message naming a status.
 */
#include <stdlib.h>
#include <string.h>

#include "dlbridge/dlbridge.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size};
  uint8_t which = fuzz_u8(&in);
  uint16_t itemsize = 0;
  fuzz_take(&in, &itemsize, sizeof itemsize);
  char *text = malloc(in.n + 1);
  if (text == NULL) return 0;
  memcpy(text, in.p, in.n);
  text[in.n] = '\0';
  DLDataType d = {0, 0, 0};
  dlb_error err;
  err.message[0] = '\0';
  int rc;
  if (which & 1) {
    rc = dlb_dtype_from_typestr(text, &d, &err);
  } else {
    rc = dlb_dtype_from_buffer_format((which & 2) ? NULL : text,
                                      (int64_t)(int16_t)itemsize, &d, &err);
    if (rc == DLB_OK && (int64_t)d.bits != (int64_t)(int16_t)itemsize * 8) abort();
  }
  if (rc == DLB_OK) {
    if (dlb_dtype_check(d, NULL) != DLB_OK || d.lanes != 1) abort();
  } else {
    if (rc != DLB_EINVAL && rc != DLB_EUNSUPPORTED) abort();
    if (memchr(err.message, '\0', sizeof err.message) == NULL) abort();
    if (err.code != rc || err.message[0] == '\0') abort();
  }
  free(text);
  return 0;
}

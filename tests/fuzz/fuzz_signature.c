/*
 * fuzz_signature.c -- libFuzzer target for dlb_signature_parse, the
 * signature language of dlb_kernel functions (dlbridge.Function).
 *
 * The input is the signature text itself, copied into an exactly sized
 * heap block with no NUL after it (the parser takes a length), so
 * AddressSanitizer catches any read past its end.  Whatever parses must be
 * self-consistent: counts within the record arrays, every parameter's dim
 * records inside dims[], every dim that checks a name pointing at an
 * earlier (parameter, axis) that exists, every name inside the text.  A
 * failure must carry a message and an error offset within the text.
 */
#include <stdlib.h>
#include <string.h>

#include "dlbridge/dlbridge.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_name(const dlb_signature *s, const char *p, size_t n) {
  if (p < s->text || n > s->length || p + n > s->text + s->length) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dlb_signature sig; /* ~130 KB: not on the stack */
  char *text = malloc(size ? size : 1);
  if (text == NULL) return 0;
  memcpy(text, data, size);
  dlb_error err;
  int rc = dlb_signature_parse(text, size, &sig, &err);
  if (rc != DLB_OK) {
    if (rc != DLB_EINVAL || sig.message == NULL || sig.error_pos > size ||
        memchr(err.message, '\0', sizeof err.message) == NULL)
      abort();
    free(text);
    return 0;
  }
  if (sig.nin < 0 || sig.nin > sig.nparams ||
      sig.nparams > DLB_SIGNATURE_MAX_PARAMS || sig.ndims < 0 ||
      sig.ndims > DLB_SIGNATURE_MAX_PARAMS * DLB_MAX_NDIM)
    abort();
  check_name(&sig, sig.name, sig.name_len);
  int32_t next = 0;
  for (int i = 0; i < sig.nparams; i++) {
    const dlb_signature_param *p = &sig.params[i];
    if (p->ndim < 0 || p->ndim > DLB_MAX_NDIM || p->dim0 != next) abort();
    if (dlb_dtype_check(p->dtype, NULL) != DLB_OK) abort();
    if (i >= sig.nin && p->mut) abort(); /* results are never 'mut' */
    if (i < sig.nin) check_name(&sig, sig.param_name[i], sig.param_name_len[i]);
    for (int a = 0; a < p->ndim; a++) {
      const dlb_signature_dim *d = &sig.dims[p->dim0 + a];
      if (d->kind == DLB_SIGNATURE_DIM_LITERAL) {
        if (d->value < 0 || d->sym != -1) abort();
      } else {
        if (d->sym < 0 || d->sym >= sig.nsyms) abort();
        check_name(&sig, sig.sym[d->sym], sig.sym_len[d->sym]);
        if (d->from_param < 0 || d->from_param > i ||
            d->from_param >= sig.nin ||
            d->from_axis < 0 || d->from_axis >= sig.params[d->from_param].ndim)
          abort();
        if (d->kind == DLB_SIGNATURE_DIM_BIND &&
            (d->from_param != i || d->from_axis != a || i >= sig.nin))
          abort();
      }
    }
    next += p->ndim;
  }
  if (next != sig.ndims) abort();
  free(text);
  return 0;
}

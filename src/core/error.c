/* error.c -- the dlb_error convention: an int code plus a message a user can
 * act on, written into storage the caller owns so no allocation can fail
 * while reporting a failure. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

const char *dlb_status_name(int code) {
  switch (code) {
    case DLB_OK: return "DLB_OK";
    case DLB_EINVAL: return "DLB_EINVAL";
    case DLB_ENOMEM: return "DLB_ENOMEM";
    case DLB_EOVERFLOW: return "DLB_EOVERFLOW";
    case DLB_EUNSUPPORTED: return "DLB_EUNSUPPORTED";
    case DLB_EVERSION: return "DLB_EVERSION";
    case DLB_EDEVICE: return "DLB_EDEVICE";
    case DLB_EREADONLY: return "DLB_EREADONLY";
    case DLB_ESYSTEM: return "DLB_ESYSTEM";
    default: return "DLB_E(unknown)";
  }
}

int dlb_error_set(dlb_error *err, int code, const char *fmt, ...) {
  if (err != NULL) {
    err->code = code;
    err->message[0] = '\0';
    if (fmt != NULL) {
      va_list ap;
      va_start(ap, fmt);
      /* Truncation is fine: the head of the message says what went wrong. */
      vsnprintf(err->message, sizeof err->message, fmt, ap);
      va_end(ap);
    }
  }
  return code;
}

void dlb_error_clear(dlb_error *err) {
  if (err != NULL) {
    err->code = DLB_OK;
    err->message[0] = '\0';
  }
}

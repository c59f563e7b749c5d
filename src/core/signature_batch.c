/* signature_batch.c -- the batch dimensions of a call: NumPy's broadcast of
 * the batch parts of the tensors of `...` parameters (include/dlbridge/
 * dlbridge.h, "Batch dimensions"; docs/function.md, "Signatures").
 *
 * Pure and allocation-free: the eager call, the compiled calls' shape
 * function and their run time all decide a batch shape with this one
 * function, so a mismatch is found by the same rule everywhere (as the
 * core dims are by function.h's inline checks).
 *
 * B is built right-aligned (rev[k] is the k-th axis from the right) with,
 * per axis, the parameter whose extent set it: a conflict names both
 * tensors, the one refused and the one that gave B its extent there.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static int refuse(dlb_signature_batch *out, int reason, int refused,
                  int other, int axis) {
  out->reason = reason;
  out->refused = refused;
  out->other = other;
  out->axis = axis;
  return DLB_EINVAL;
}

int dlb_signature_batch_shape(const dlb_signature_param *params, int nin,
                              int nparams, DLTensor *const *tensors,
                              dlb_signature_batch *out, dlb_error *err) {
  int64_t rev[DLB_MAX_NDIM];
  int32_t owner[DLB_MAX_NDIM];
  int rc = DLB_OK;
  if (out == NULL || (nparams > 0 && (params == NULL || tensors == NULL)) ||
      nin < 0 || nin > nparams) {
    return dlb_error_set(err, DLB_EINVAL,
                         "dlb_signature_batch_shape: out, params or tensors "
                         "is NULL, or nin is not within [0, nparams]");
  }
  out->ndim = 0;
  refuse(out, DLB_BATCH_OK, -1, -1, -1);
  int r = 0;
  /* pass 0: every input broadcasts into B; pass 1: a `mut` input and a
   * result must be all of B (the kernel writes every element of them) */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < nparams; i++) {
      const dlb_signature_param *p = &params[i];
      const DLTensor *t = tensors[i];
      if (!p->batch || t == NULL) continue;
      if (pass == 0 ? i >= nin : i < nin && !p->mut) continue;
      if (t->ndim < p->ndim) {
        rc = refuse(out, DLB_BATCH_RANK, i, -1, -1);
        goto cleanup;
      }
      int nb = t->ndim - p->ndim;
      if (nb > DLB_MAX_NDIM) {
        rc = refuse(out, DLB_BATCH_TOO_MANY, i, -1, -1);
        goto cleanup;
      }
      if (pass == 1) {
        /* padded on the left with 1s, both of them */
        for (int k = 0; k < (nb > r ? nb : r); k++) {
          int64_t e = k < nb ? t->shape[nb - 1 - k] : 1;
          int64_t b = k < r ? rev[k] : 1;
          if (e >= 0 && b >= 0 && e != b) {
            rc = refuse(out, DLB_BATCH_NOT_FULL, i, k < r ? owner[k] : -1,
                        k);
            goto cleanup;
          }
        }
        continue;
      }
      /* axis k from the right of t's batch part is t->shape[nb - 1 - k] */
      for (; r < nb; r++) {
        rev[r] = 1;
        owner[r] = -1;
      }
      for (int k = 0; k < nb; k++) {
        int64_t e = t->shape[nb - 1 - k], b = rev[k];
        if (e == 1) continue; /* broadcasts: B keeps what it has */
        if (e < 0) {
          /* unknown: B is unknown there unless some tensor knows it */
          if (b == 1) {
            rev[k] = -1;
            owner[k] = i;
          }
        } else if (b == 1 || b < 0) {
          rev[k] = e;
          owner[k] = i;
        } else if (b != e) {
          rc = refuse(out, DLB_BATCH_BROADCAST, i, owner[k], k);
          goto cleanup;
        }
      }
    }
  }
  out->ndim = r;
  for (int k = 0; k < r; k++) out->shape[r - 1 - k] = rev[k];
cleanup:
  if (rc != DLB_OK) {
    out->ndim = 0;
    static const char *const what[] = {
        "",
        "has fewer dimensions than its core",
        "has more than 64 batch dimensions",
        "does not broadcast with that of parameter",
        "is not the whole broadcast batch shape",
    };
    if (out->reason == DLB_BATCH_BROADCAST)
      rc = dlb_error_set(err, DLB_EINVAL,
                         "the batch part of parameter %d %s %d",
                         (int)out->refused, what[out->reason],
                         (int)out->other);
    else
      rc = dlb_error_set(err, DLB_EINVAL,
                         "the batch part of parameter %d %s",
                         (int)out->refused, what[out->reason]);
  }
  return rc;
}

int dlb_signature_batch_pad(const dlb_signature_param *p, const DLTensor *t,
                            const dlb_signature_batch *b, int64_t *shape,
                            int64_t *strides, DLTensor *out,
                            dlb_error *err) {
  int rc = DLB_OK;
  if (p == NULL || t == NULL || b == NULL || shape == NULL ||
      strides == NULL || out == NULL || !p->batch) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_signature_batch_pad: a NULL argument, or a "
                       "parameter without '...'");
    goto cleanup;
  }
  int nb = t->ndim - p->ndim;
  int ndim = b->ndim + p->ndim;
  if (nb < 0 || nb > b->ndim || ndim > DLB_MAX_NDIM) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_signature_batch_pad: a tensor of %d dims does "
                       "not fit %d batch dims before %d core ones",
                       (int)t->ndim, (int)b->ndim, (int)p->ndim);
    goto cleanup;
  }
  int pad = ndim - t->ndim;
  /* the tensor's own strides, compact row-major when it has none; then
   * the padded axes: extent 1, stride 0 (never stepped along) */
  int64_t step = 1;
  for (int a = t->ndim - 1; a >= 0; a--) {
    shape[pad + a] = t->shape[a];
    strides[pad + a] = t->strides != NULL ? t->strides[a] : step;
    step *= t->shape[a] > 0 ? t->shape[a] : 1;
  }
  for (int a = 0; a < pad; a++) {
    shape[a] = 1;
    strides[a] = 0;
  }
  *out = *t;
  out->ndim = ndim;
  out->shape = shape;
  out->strides = strides;
cleanup:
  return rc;
}

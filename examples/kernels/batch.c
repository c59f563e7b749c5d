/*
 * batch.c -- kernels with batch dimensions `...` (issue 25; docs/function.md,
 * "Batch dimensions").  Built into the dlb_example_kernels module; the batch
 * tests, benchmarks and `make demo` call them eagerly and under jax.vmap,
 * torch.vmap and tf.vectorized_map.
 *
 * What every kernel here receives (dlbridge's contract, the same for every
 * framework, eager and compiled):
 *  - every `...` argument and result has the same batch rank R (dlbridge
 *    left-pads shorter ones with size-1 dims);
 *  - at each batch axis an argument's extent is the broadcast shape B's or 1,
 *    and broadcasting a 1 is the kernel's job; strides may be anything
 *    (0 from an expand, negative from a flip, permuted views), NULL = compact;
 *  - results have the full batch shape B;
 *  - a parameter without `...` has exactly its core rank.
 * Each kernel checks all of that and returns DLB_EINVAL with a message when it
 * does not hold, so a test that breaks the contract fails loudly instead of
 * reading out of bounds.
 *
 * Element type: float32 or float64, whichever the arguments are (all alike).
 * Signatures (T = float32 or float64; dlbridge's derived vjp/jvp order):
 *   bscale(a: T[...], x: T[..., n]) -> (y: T[..., n])              y = a x
 *   bscale_vjp (a: T[...], x: T[..., n], dy: T[..., n])
 *              -> (da: T[...], dx: T[..., n])   da = sum_n x dy (at the full
 *              batch shape: dlbridge sums it down to a's shape), dx = a dy
 *   bscale_jvp (a: T[...], x: T[..., n], ta: T[...], tx: T[..., n])
 *              -> (ty: T[..., n])               ty = ta x + a tx
 *   bstats(x: T[..., n]) -> (mean: T[...], sq: T[..., n])   mean_n x, x*x
 *   baxpy(a: T[...], x: T[..., n], y: mut T[..., n])        y += a x
 *   bdot(x: T[..., n], w: T[n]) -> (s: T[...])              s = sum_n x w
 *   vscale(a: T, x: T[n]) -> (y: T[n])      no `...`: under a vmap dlbridge
 *                                           loops over it in C
 *   vscale_vjp (a: T, x: T[n], dy: T[n]) -> (da: T, dx: T[n])
 *
 * Counters (read them with ctypes): every call that passes the checks adds
 * one to dlb_example_batch_calls and stores its batch rank and extents (the
 * broadcast shape B, which is every `...` result's batch shape) in
 * dlb_example_batch_last: [R, B0, ..., B(R-1)].  A test counts kernel launches
 * with them (one per vmap for a `...` kernel, one per item for vscale).
 * They are plain int64_t, not atomics: the tests call from one thread.
 */
#include <stddef.h>
#include <stdint.h>

#include "dlbridge/dlbridge.h"

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

#define MAX_ARGS 5
#define MAX_BATCH 16

EXPORT int64_t dlb_example_batch_calls;
EXPORT int64_t dlb_example_batch_last[1 + MAX_BATCH];

/* The per-item body: p[i] points at argument i's item (its batch offset
 * applied), s[i] is its element stride along the core axis (0 for a 0-d
 * core), n the core extent shared by every 1-d core. */
typedef void (*item_fn)(char *const *p, const int64_t *s, int64_t n);

/* What one kernel declares: its arguments (inputs, then results) and for each
 * whether it has `...`, its core rank (0 or 1) and whether it must have the
 * full batch shape (results and mut arguments). */
typedef struct {
  const char *name;
  int32_t nargs;
  const char *names[MAX_ARGS];
  uint8_t batched[MAX_ARGS];
  uint8_t core[MAX_ARGS];
  uint8_t full[MAX_ARGS];
  item_fn f32, f64;
} kernel_desc;

/* Element stride of axis k, NULL strides being compact. */
static int64_t stride_at(const DLTensor *t, int32_t k) {
  if (t->strides != NULL) return t->strides[k];
  int64_t s = 1;
  for (int32_t j = t->ndim - 1; j > k; j--) s *= t->shape[j];
  return s;
}

/* Checks the arguments against d and the batch contract, computes B, then
 * walks B calling the item body once per batch index. */
static int run(const kernel_desc *d, DLTensor *const *args, int32_t nargs,
               dlb_error *err) {
  if (nargs != d->nargs)
    return dlb_error_set(err, DLB_EINVAL, "%s takes %d arguments, got %d",
                         d->name, (int)d->nargs, (int)nargs);
  for (int32_t i = 0; i < nargs; i++) {
    const DLTensor *t = args[i];
    if (t == NULL)
      return dlb_error_set(err, DLB_EINVAL, "%s: argument %s is NULL", d->name,
                           d->names[i]);
    if (!dlb_device_is_host_accessible(t->device))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "%s runs on the CPU only (%s is not)", d->name,
                           d->names[i]);
    if (t->dtype.code != kDLFloat || t->dtype.lanes != 1 ||
        (t->dtype.bits != 32 && t->dtype.bits != 64) ||
        t->dtype.bits != args[0]->dtype.bits)
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: %s must be float32 or float64 like %s "
                           "(dtype code %d, %d bits)",
                           d->name, d->names[i], d->names[0],
                           (int)t->dtype.code, (int)t->dtype.bits);
  }
  /* The batch rank: equal among `...` arguments (dlbridge pads), none on the
   * others. */
  int32_t rank = -1, first = -1;
  for (int32_t i = 0; i < nargs; i++) {
    const DLTensor *t = args[i];
    if (!d->batched[i]) {
      if (t->ndim != d->core[i])
        return dlb_error_set(err, DLB_EINVAL,
                             "%s: %s has no batch dimensions, so %d "
                             "dimension(s), got %d",
                             d->name, d->names[i], (int)d->core[i],
                             (int)t->ndim);
      continue;
    }
    if (t->ndim < d->core[i])
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: %s needs at least %d dimension(s), got %d",
                           d->name, d->names[i], (int)d->core[i], (int)t->ndim);
    int32_t r = t->ndim - d->core[i];
    if (rank < 0) {
      rank = r;
      first = i;
    } else if (r != rank) {
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: batch ranks differ: %s has %d, %s has %d "
                           "(dlbridge pads every `...` tensor to one rank)",
                           d->name, d->names[first], (int)rank, d->names[i],
                           (int)r);
    }
  }
  if (rank < 0) rank = 0;
  if (rank > MAX_BATCH)
    return dlb_error_set(err, DLB_EINVAL, "%s: batch rank %d is over %d",
                         d->name, (int)rank, MAX_BATCH);
  /* B: at each axis the one extent other than 1 (NumPy broadcasting); the
   * full arguments must have it exactly. */
  int64_t bshape[MAX_BATCH];
  for (int32_t k = 0; k < rank; k++) {
    int64_t b = 1;
    int32_t from = -1;
    for (int32_t i = 0; i < nargs; i++) {
      if (!d->batched[i]) continue;
      int64_t e = args[i]->shape[k];
      if (e == 1) continue;
      if (from < 0) {
        b = e;
        from = i;
      } else if (e != b) {
        return dlb_error_set(err, DLB_EINVAL,
                             "%s: batch axis %d: %s has %lld, %s has %lld "
                             "(each must be the broadcast extent or 1)",
                             d->name, (int)k, d->names[from], (long long)b,
                             d->names[i], (long long)e);
      }
    }
    for (int32_t i = 0; i < nargs; i++)
      if (d->batched[i] && d->full[i] && args[i]->shape[k] != b)
        return dlb_error_set(err, DLB_EINVAL,
                             "%s: batch axis %d: %s has %lld, the broadcast "
                             "extent is %lld (results and mut arguments have "
                             "the full batch shape)",
                             d->name, (int)k, d->names[i],
                             (long long)args[i]->shape[k], (long long)b);
    bshape[k] = b;
  }
  /* n: one extent for every 1-d core. */
  int64_t n = 0;
  int32_t nfrom = -1;
  for (int32_t i = 0; i < nargs; i++) {
    if (d->core[i] != 1) continue;
    int64_t e = args[i]->shape[args[i]->ndim - 1];
    if (nfrom < 0) {
      n = e;
      nfrom = i;
    } else if (e != n) {
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: core dimension n: %s has %lld, %s has %lld",
                           d->name, d->names[nfrom], (long long)n, d->names[i],
                           (long long)e);
    }
  }
  /* Batch strides (0 where the extent is 1: that is the broadcast) and the
   * core stride of each argument. */
  int64_t bstride[MAX_ARGS][MAX_BATCH], cstride[MAX_ARGS];
  char *base[MAX_ARGS];
  const size_t elsize = args[0]->dtype.bits / 8;
  for (int32_t i = 0; i < nargs; i++) {
    const DLTensor *t = args[i];
    for (int32_t k = 0; k < rank; k++)
      bstride[i][k] = (d->batched[i] && t->shape[k] != 1) ? stride_at(t, k) : 0;
    cstride[i] = d->core[i] == 1 ? stride_at(t, t->ndim - 1) : 0;
    base[i] = (char *)dlb_tensor_data(t);
  }
  dlb_example_batch_calls++;
  dlb_example_batch_last[0] = rank;
  int64_t items = 1;
  for (int32_t k = 0; k < rank; k++) {
    dlb_example_batch_last[1 + k] = bshape[k];
    items *= bshape[k];
  }
  item_fn body = elsize == 4 ? d->f32 : d->f64;
  /* An odometer over the batch index; off[i] is argument i's element offset
   * at the current index. */
  int64_t idx[MAX_BATCH] = {0}, off[MAX_ARGS] = {0};
  char *p[MAX_ARGS];
  for (int64_t item = 0; item < items; item++) {
    for (int32_t i = 0; i < nargs; i++)
      p[i] = base[i] + off[i] * (int64_t)elsize;
    body(p, cstride, n);
    for (int32_t k = rank - 1; k >= 0; k--) {
      idx[k]++;
      for (int32_t i = 0; i < nargs; i++) off[i] += bstride[i][k];
      if (idx[k] < bshape[k]) break;
      for (int32_t i = 0; i < nargs; i++) off[i] -= bstride[i][k] * bshape[k];
      idx[k] = 0;
    }
  }
  return DLB_OK;
}

/* The item bodies, written once over the element type T. */
#define DLB_BATCH_ITEMS(T, SUFFIX)                                              \
  static void bscale_item##SUFFIX(char *const *p, const int64_t *s,             \
                                  int64_t n) {                                 \
    const T a = *(const T *)p[0];                                              \
    const T *x = (const T *)p[1];                                              \
    T *y = (T *)p[2];                                                          \
    for (int64_t i = 0; i < n; i++) y[i * s[2]] = a * x[i * s[1]];             \
  }                                                                            \
  static void bscale_vjp_item##SUFFIX(char *const *p, const int64_t *s,         \
                                      int64_t n) {                             \
    const T a = *(const T *)p[0];                                              \
    const T *x = (const T *)p[1], *dy = (const T *)p[2];                       \
    T *dx = (T *)p[4], sum = 0;                                                \
    for (int64_t i = 0; i < n; i++) {                                          \
      sum += x[i * s[1]] * dy[i * s[2]];                                       \
      dx[i * s[4]] = a * dy[i * s[2]];                                         \
    }                                                                          \
    *(T *)p[3] = sum;                                                          \
  }                                                                            \
  static void bscale_jvp_item##SUFFIX(char *const *p, const int64_t *s,         \
                                      int64_t n) {                             \
    const T a = *(const T *)p[0], ta = *(const T *)p[2];                       \
    const T *x = (const T *)p[1], *tx = (const T *)p[3];                       \
    T *ty = (T *)p[4];                                                         \
    for (int64_t i = 0; i < n; i++)                                            \
      ty[i * s[4]] = ta * x[i * s[1]] + a * tx[i * s[3]];                      \
  }                                                                            \
  static void bstats_item##SUFFIX(char *const *p, const int64_t *s,             \
                                  int64_t n) {                                 \
    const T *x = (const T *)p[0];                                              \
    T *sq = (T *)p[2], sum = 0;                                                \
    for (int64_t i = 0; i < n; i++) {                                          \
      sum += x[i * s[0]];                                                      \
      sq[i * s[2]] = x[i * s[0]] * x[i * s[0]];                                \
    }                                                                          \
    /* The mean of no elements is NaN, as NumPy's. */                          \
    *(T *)p[1] = sum / (T)n;                                                   \
  }                                                                            \
  static void baxpy_item##SUFFIX(char *const *p, const int64_t *s,              \
                                 int64_t n) {                                  \
    const T a = *(const T *)p[0];                                              \
    const T *x = (const T *)p[1];                                              \
    T *y = (T *)p[2];                                                          \
    for (int64_t i = 0; i < n; i++) y[i * s[2]] += a * x[i * s[1]];            \
  }                                                                            \
  static void bdot_item##SUFFIX(char *const *p, const int64_t *s, int64_t n) {  \
    const T *x = (const T *)p[0], *w = (const T *)p[1];                        \
    T sum = 0;                                                                 \
    for (int64_t i = 0; i < n; i++) sum += x[i * s[0]] * w[i * s[1]];          \
    *(T *)p[2] = sum;                                                          \
  }

DLB_BATCH_ITEMS(float, _f32)
DLB_BATCH_ITEMS(double, _f64)

/* vscale and its vjp are bscale's bodies: only the declaration (no `...`)
 * differs, which is what makes dlbridge loop over them under a vmap. */
static const kernel_desc bscale_desc = {
    "bscale", 3, {"a", "x", "y"}, {1, 1, 1}, {0, 1, 1}, {0, 0, 1},
    bscale_item_f32, bscale_item_f64};
static const kernel_desc bscale_vjp_desc = {
    "bscale_vjp",         5,
    {"a", "x", "dy", "da", "dx"}, {1, 1, 1, 1, 1},
    {0, 1, 1, 0, 1},      {0, 0, 0, 1, 1},
    bscale_vjp_item_f32,  bscale_vjp_item_f64};
static const kernel_desc bscale_jvp_desc = {
    "bscale_jvp",         5,
    {"a", "x", "ta", "tx", "ty"}, {1, 1, 1, 1, 1},
    {0, 1, 0, 1, 1},      {0, 0, 0, 0, 1},
    bscale_jvp_item_f32,  bscale_jvp_item_f64};
static const kernel_desc bstats_desc = {
    "bstats", 3, {"x", "mean", "sq"}, {1, 1, 1}, {1, 0, 1}, {0, 1, 1},
    bstats_item_f32, bstats_item_f64};
static const kernel_desc baxpy_desc = {
    "baxpy", 3, {"a", "x", "y"}, {1, 1, 1}, {0, 1, 1}, {0, 0, 1},
    baxpy_item_f32, baxpy_item_f64};
static const kernel_desc bdot_desc = {
    "bdot", 3, {"x", "w", "s"}, {1, 0, 1}, {1, 1, 0}, {0, 0, 1},
    bdot_item_f32, bdot_item_f64};
static const kernel_desc vscale_desc = {
    "vscale", 3, {"a", "x", "y"}, {0, 0, 0}, {0, 1, 1}, {0, 0, 0},
    bscale_item_f32, bscale_item_f64};
static const kernel_desc vscale_vjp_desc = {
    "vscale_vjp",         5,
    {"a", "x", "dy", "da", "dx"}, {0, 0, 0, 0, 0},
    {0, 1, 1, 0, 1},      {0, 0, 0, 0, 0},
    bscale_vjp_item_f32,  bscale_vjp_item_f64};

#define DLB_BATCH_KERNEL(NAME)                                                  \
  EXPORT int dlb_kernel_##NAME(DLTensor *const *args, int32_t nargs,           \
                               void *stream, dlb_error *err) {                 \
    (void)stream;                                                              \
    return run(&NAME##_desc, args, nargs, err);                                \
  }

DLB_BATCH_KERNEL(bscale)
DLB_BATCH_KERNEL(bscale_vjp)
DLB_BATCH_KERNEL(bscale_jvp)
DLB_BATCH_KERNEL(bstats)
DLB_BATCH_KERNEL(baxpy)
DLB_BATCH_KERNEL(bdot)
DLB_BATCH_KERNEL(vscale)
DLB_BATCH_KERNEL(vscale_vjp)

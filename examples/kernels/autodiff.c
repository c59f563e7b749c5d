/*
 * autodiff.c -- forward kernels with their vjp and jvp kernels, for
 * dlbridge.Function(..., vjp=, jvp=) (docs/function.md, "Gradients").  Built
 * into the dlb_example_kernels module with the other examples; the tests,
 * benchmarks and `make demo` train through them in torch, JAX and TensorFlow.
 *
 * Conventions every vjp kernel here follows (and any user kernel must):
 *  - it writes every element of every result: under XLA a result is an
 *    uninitialised buffer, so an accumulating kernel zeroes it first (gather);
 *  - cotangents follow JAX's convention, ct . J with no conjugation, so for
 *    p = z * w the cotangent of z is dp * w (cmul); dlbridge converts to torch's
 *    and TensorFlow's conjugated convention itself.
 *
 * Signatures (float64 unless the name says f32; "derived" means the vjp/jvp
 * signature dlbridge derives from the forward's; "spelled" ones are bound by
 * parameter name):
 *   scale(a: float64, x: float64[n]) -> (y: float64[n])            y = a x
 *     scale_vjp derived (a, x, dy) -> (da, dx);  scale_jvp derived (a, x, ta, tx) -> (ty)
 *   softmax(x: float64[n]) -> (y: float64[n])
 *     softmax_vjp spelled (y: float64[n], dy: float64[n]) -> (dx: float64[n])
 *     softmax_jvp spelled (y: float64[n], tx: float64[n]) -> (ty: float64[n])
 *   gather(x: float64[m], idx: int64[k]) -> (y: float64[k])  (f32: int32 idx)
 *     gather_vjp derived (x, idx, dy) -> (dx); no jvp
 *   sincos(x: float64[n]) -> (s: float64[n], c: float64[n])
 *     sincos_vjp derived (x, ds, dc) -> (dx);  sincos_jvp derived (x, tx) -> (ts, tc)
 *   softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)
 *     softmax_lse_vjp spelled (y: float64[n], dy: float64[n]) -> (dx: float64[n])
 *   cmul(z: complex128[n], w: complex128[n]) -> (p: complex128[n])
 *     cmul_vjp derived (z, w, dp) -> (dz, dw);  cmul_jvp derived (z, w, tz, tw) -> (tp)
 *   mul_f32(a: float32[n], b: float32[n]) -> (y: float32[n]); mul_f32_vjp derived
 *   bad_vjp_shape (x: float64[n], dy: float64[n]) -> (dx: float64[n])  dx = dy,
 *     a well-behaved kernel the tests pair with signatures that must be refused.
 */
#include <math.h>

#include "dlbridge/dlbridge.h"

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

/* Element stride of a 1-d tensor (NULL strides mean compact). */
static int64_t stride0(const DLTensor *t) {
  return t->strides != NULL ? t->strides[0] : 1;
}

/* The count check and the host check every kernel starts with. */
static int expect(DLTensor *const *args, int32_t nargs, int32_t want,
                  const char *who, dlb_error *err) {
  if (nargs != want)
    return dlb_error_set(err, DLB_EINVAL, "%s takes %d arguments, got %d", who,
                         (int)want, (int)nargs);
  for (int32_t i = 0; i < nargs; i++)
    if (!dlb_device_is_host_accessible(args[i]->device))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "%s runs on the CPU only (argument %d is not)", who,
                           (int)i);
  return DLB_OK;
}

/* The float32 and float64 variants of a kernel differ only in the element
 * type; each body is written once as a macro over T. */

/* scale: y = a x;  vjp: da = sum(dy x), dx = a dy;  jvp: ty = ta x + a tx. */
#define DLB_SCALE_KERNELS(T, SUFFIX)                                             \
  EXPORT int dlb_kernel_scale##SUFFIX(DLTensor *const *args, int32_t nargs,     \
                                      void *stream, dlb_error *err) {           \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 3, "scale" #SUFFIX, err);                      \
    if (rc != DLB_OK) return rc;                                                \
    const T a = *(const T *)dlb_tensor_data(args[0]);                           \
    const T *x = (const T *)dlb_tensor_data(args[1]);                           \
    T *y = (T *)dlb_tensor_data(args[2]);                                       \
    const int64_t n = args[1]->shape[0], sx = stride0(args[1]),                 \
                  sy = stride0(args[2]);                                        \
    for (int64_t i = 0; i < n; i++) y[i * sy] = a * x[i * sx];                  \
    return DLB_OK;                                                              \
  }                                                                             \
  EXPORT int dlb_kernel_scale##SUFFIX##_vjp(DLTensor *const *args,              \
                                            int32_t nargs, void *stream,        \
                                            dlb_error *err) {                   \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 5, "scale" #SUFFIX "_vjp", err);               \
    if (rc != DLB_OK) return rc;                                                \
    const T a = *(const T *)dlb_tensor_data(args[0]);                           \
    const T *x = (const T *)dlb_tensor_data(args[1]);                           \
    const T *dy = (const T *)dlb_tensor_data(args[2]);                          \
    T *da = (T *)dlb_tensor_data(args[3]);                                      \
    T *dx = (T *)dlb_tensor_data(args[4]);                                      \
    const int64_t n = args[1]->shape[0], sx = stride0(args[1]),                 \
                  sdy = stride0(args[2]), sdx = stride0(args[4]);               \
    T sum = 0;                                                                  \
    for (int64_t i = 0; i < n; i++) {                                           \
      sum += dy[i * sdy] * x[i * sx];                                           \
      dx[i * sdx] = a * dy[i * sdy];                                            \
    }                                                                           \
    *da = sum;                                                                  \
    return DLB_OK;                                                              \
  }                                                                             \
  EXPORT int dlb_kernel_scale##SUFFIX##_jvp(DLTensor *const *args,              \
                                            int32_t nargs, void *stream,        \
                                            dlb_error *err) {                   \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 5, "scale" #SUFFIX "_jvp", err);               \
    if (rc != DLB_OK) return rc;                                                \
    const T a = *(const T *)dlb_tensor_data(args[0]);                           \
    const T *x = (const T *)dlb_tensor_data(args[1]);                           \
    const T ta = *(const T *)dlb_tensor_data(args[2]);                          \
    const T *tx = (const T *)dlb_tensor_data(args[3]);                          \
    T *ty = (T *)dlb_tensor_data(args[4]);                                      \
    const int64_t n = args[1]->shape[0], sx = stride0(args[1]),                 \
                  stx = stride0(args[3]), sty = stride0(args[4]);               \
    for (int64_t i = 0; i < n; i++)                                             \
      ty[i * sty] = ta * x[i * sx] + a * tx[i * stx];                           \
    return DLB_OK;                                                              \
  }

/* softmax: y = exp(x - max) / sum;  vjp from the saved y:
 * dx = y (dy - <y, dy>);  jvp: ty = y (tx - <y, tx>) (the same map). */
#define DLB_SOFTMAX_KERNELS(T, SUFFIX, EXP)                                      \
  EXPORT int dlb_kernel_softmax##SUFFIX(DLTensor *const *args, int32_t nargs,   \
                                        void *stream, dlb_error *err) {         \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 2, "softmax" #SUFFIX, err);                    \
    if (rc != DLB_OK) return rc;                                                \
    const T *x = (const T *)dlb_tensor_data(args[0]);                           \
    T *y = (T *)dlb_tensor_data(args[1]);                                       \
    const int64_t n = args[0]->shape[0], sx = stride0(args[0]),                 \
                  sy = stride0(args[1]);                                        \
    if (n == 0) return DLB_OK;                                                  \
    T top = x[0], sum = 0;                                                      \
    for (int64_t i = 1; i < n; i++)                                             \
      if (x[i * sx] > top) top = x[i * sx];                                     \
    for (int64_t i = 0; i < n; i++) {                                           \
      y[i * sy] = EXP(x[i * sx] - top);                                         \
      sum += y[i * sy];                                                         \
    }                                                                           \
    for (int64_t i = 0; i < n; i++) y[i * sy] /= sum;                           \
    return DLB_OK;                                                              \
  }                                                                             \
  static int softmax##SUFFIX##_pullback(DLTensor *const *args, int32_t nargs,   \
                                        const char *who, dlb_error *err) {      \
    int rc = expect(args, nargs, 3, who, err);                                  \
    if (rc != DLB_OK) return rc;                                                \
    const T *y = (const T *)dlb_tensor_data(args[0]);                           \
    const T *v = (const T *)dlb_tensor_data(args[1]);                           \
    T *out = (T *)dlb_tensor_data(args[2]);                                     \
    const int64_t n = args[0]->shape[0], sy = stride0(args[0]),                 \
                  sv = stride0(args[1]), so = stride0(args[2]);                 \
    T dot = 0;                                                                  \
    for (int64_t i = 0; i < n; i++) dot += y[i * sy] * v[i * sv];               \
    for (int64_t i = 0; i < n; i++)                                             \
      out[i * so] = y[i * sy] * (v[i * sv] - dot);                              \
    return DLB_OK;                                                              \
  }                                                                             \
  EXPORT int dlb_kernel_softmax##SUFFIX##_vjp(DLTensor *const *args,            \
                                              int32_t nargs, void *stream,      \
                                              dlb_error *err) {                 \
    (void)stream;                                                               \
    return softmax##SUFFIX##_pullback(args, nargs, "softmax" #SUFFIX "_vjp",    \
                                      err);                                     \
  }                                                                             \
  EXPORT int dlb_kernel_softmax##SUFFIX##_jvp(DLTensor *const *args,            \
                                              int32_t nargs, void *stream,      \
                                              dlb_error *err) {                 \
    (void)stream;                                                               \
    return softmax##SUFFIX##_pullback(args, nargs, "softmax" #SUFFIX "_jvp",    \
                                      err);                                     \
  }

/* gather: y[j] = x[idx[j]];  vjp: dx = 0, then dx[idx[j]] += dy[j]. */
#define DLB_GATHER_KERNELS(T, I, SUFFIX)                                         \
  EXPORT int dlb_kernel_gather##SUFFIX(DLTensor *const *args, int32_t nargs,    \
                                       void *stream, dlb_error *err) {          \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 3, "gather" #SUFFIX, err);                     \
    if (rc != DLB_OK) return rc;                                                \
    const T *x = (const T *)dlb_tensor_data(args[0]);                           \
    const I *idx = (const I *)dlb_tensor_data(args[1]);                         \
    T *y = (T *)dlb_tensor_data(args[2]);                                       \
    const int64_t m = args[0]->shape[0], k = args[1]->shape[0];                 \
    const int64_t sx = stride0(args[0]), si = stride0(args[1]),                 \
                  sy = stride0(args[2]);                                        \
    for (int64_t j = 0; j < k; j++) {                                           \
      const int64_t at = (int64_t)idx[j * si];                                  \
      if (at < 0 || at >= m)                                                    \
        return dlb_error_set(err, DLB_EINVAL,                                   \
                             "gather: idx[%lld] = %lld is outside x[0:%lld]",   \
                             (long long)j, (long long)at, (long long)m);        \
      y[j * sy] = x[at * sx];                                                   \
    }                                                                           \
    return DLB_OK;                                                              \
  }                                                                             \
  EXPORT int dlb_kernel_gather##SUFFIX##_vjp(DLTensor *const *args,             \
                                             int32_t nargs, void *stream,       \
                                             dlb_error *err) {                  \
    (void)stream;                                                               \
    int rc = expect(args, nargs, 4, "gather" #SUFFIX "_vjp", err);              \
    if (rc != DLB_OK) return rc;                                                \
    const I *idx = (const I *)dlb_tensor_data(args[1]);                         \
    const T *dy = (const T *)dlb_tensor_data(args[2]);                          \
    T *dx = (T *)dlb_tensor_data(args[3]);                                      \
    const int64_t m = args[0]->shape[0], k = args[1]->shape[0];                 \
    const int64_t si = stride0(args[1]), sdy = stride0(args[2]),                \
                  sdx = stride0(args[3]);                                       \
    for (int64_t i = 0; i < m; i++) dx[i * sdx] = 0;                            \
    for (int64_t j = 0; j < k; j++) {                                           \
      const int64_t at = (int64_t)idx[j * si];                                  \
      if (at < 0 || at >= m)                                                    \
        return dlb_error_set(err, DLB_EINVAL,                                   \
                             "gather_vjp: idx[%lld] = %lld is outside "         \
                             "x[0:%lld]",                                       \
                             (long long)j, (long long)at, (long long)m);        \
      dx[at * sdx] += dy[j * sdy];                                              \
    }                                                                           \
    return DLB_OK;                                                              \
  }

DLB_SCALE_KERNELS(double, )
DLB_SCALE_KERNELS(float, _f32)
DLB_SOFTMAX_KERNELS(double, , exp)
DLB_SOFTMAX_KERNELS(float, _f32, expf)
DLB_GATHER_KERNELS(double, int64_t, )
DLB_GATHER_KERNELS(float, int32_t, _f32)

/* sincos: s = sin x, c = cos x;  vjp: dx = ds cos x - dc sin x;
 * jvp: ts = cos x tx, tc = -sin x tx. */
EXPORT int dlb_kernel_sincos(DLTensor *const *args, int32_t nargs, void *stream,
                             dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 3, "sincos", err);
  if (rc != DLB_OK) return rc;
  const double *x = (const double *)dlb_tensor_data(args[0]);
  double *s = (double *)dlb_tensor_data(args[1]);
  double *c = (double *)dlb_tensor_data(args[2]);
  const int64_t n = args[0]->shape[0], sx = stride0(args[0]),
                ss = stride0(args[1]), sc = stride0(args[2]);
  for (int64_t i = 0; i < n; i++) {
    s[i * ss] = sin(x[i * sx]);
    c[i * sc] = cos(x[i * sx]);
  }
  return DLB_OK;
}

EXPORT int dlb_kernel_sincos_vjp(DLTensor *const *args, int32_t nargs,
                                 void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 4, "sincos_vjp", err);
  if (rc != DLB_OK) return rc;
  const double *x = (const double *)dlb_tensor_data(args[0]);
  const double *ds = (const double *)dlb_tensor_data(args[1]);
  const double *dc = (const double *)dlb_tensor_data(args[2]);
  double *dx = (double *)dlb_tensor_data(args[3]);
  const int64_t n = args[0]->shape[0], sx = stride0(args[0]),
                sds = stride0(args[1]), sdc = stride0(args[2]),
                sdx = stride0(args[3]);
  for (int64_t i = 0; i < n; i++)
    dx[i * sdx] = ds[i * sds] * cos(x[i * sx]) - dc[i * sdc] * sin(x[i * sx]);
  return DLB_OK;
}

EXPORT int dlb_kernel_sincos_jvp(DLTensor *const *args, int32_t nargs,
                                 void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 4, "sincos_jvp", err);
  if (rc != DLB_OK) return rc;
  const double *x = (const double *)dlb_tensor_data(args[0]);
  const double *tx = (const double *)dlb_tensor_data(args[1]);
  double *ts = (double *)dlb_tensor_data(args[2]);
  double *tc = (double *)dlb_tensor_data(args[3]);
  const int64_t n = args[0]->shape[0], sx = stride0(args[0]),
                stx = stride0(args[1]), sts = stride0(args[2]),
                stc = stride0(args[3]);
  for (int64_t i = 0; i < n; i++) {
    ts[i * sts] = cos(x[i * sx]) * tx[i * stx];
    tc[i * stc] = -sin(x[i * sx]) * tx[i * stx];
  }
  return DLB_OK;
}

/* softmax_lse: the softmax and its log-sum-exp, a statistic the backward does
 * not differentiate (declared nodiff); its vjp is softmax's. */
EXPORT int dlb_kernel_softmax_lse(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 3, "softmax_lse", err);
  if (rc != DLB_OK) return rc;
  const double *x = (const double *)dlb_tensor_data(args[0]);
  double *y = (double *)dlb_tensor_data(args[1]);
  double *lse = (double *)dlb_tensor_data(args[2]);
  const int64_t n = args[0]->shape[0], sx = stride0(args[0]),
                sy = stride0(args[1]);
  if (n == 0) {
    *lse = -INFINITY;
    return DLB_OK;
  }
  double top = x[0], sum = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i * sx] > top) top = x[i * sx];
  for (int64_t i = 0; i < n; i++) {
    y[i * sy] = exp(x[i * sx] - top);
    sum += y[i * sy];
  }
  for (int64_t i = 0; i < n; i++) y[i * sy] /= sum;
  *lse = top + log(sum);
  return DLB_OK;
}

EXPORT int dlb_kernel_softmax_lse_vjp(DLTensor *const *args, int32_t nargs,
                                      void *stream, dlb_error *err) {
  (void)stream;
  return softmax_pullback(args, nargs, "softmax_lse_vjp", err);
}

/* complex128 elements as (re, im) pairs of doubles: the layout DLPack and
 * every framework use, without depending on the optional <complex.h>. */
static void cmul_at(const double *p, const double *q, double *out) {
  const double re = p[0] * q[0] - p[1] * q[1];
  const double im = p[0] * q[1] + p[1] * q[0];
  out[0] = re;
  out[1] = im;
}

/* cmul: p = z w;  vjp (ct . J): dz = dp w, dw = dp z;  jvp: tp = tz w + z tw. */
EXPORT int dlb_kernel_cmul(DLTensor *const *args, int32_t nargs, void *stream,
                           dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 3, "cmul", err);
  if (rc != DLB_OK) return rc;
  const double *z = (const double *)dlb_tensor_data(args[0]);
  const double *w = (const double *)dlb_tensor_data(args[1]);
  double *p = (double *)dlb_tensor_data(args[2]);
  const int64_t n = args[0]->shape[0], sz = 2 * stride0(args[0]),
                sw = 2 * stride0(args[1]), sp = 2 * stride0(args[2]);
  for (int64_t i = 0; i < n; i++) cmul_at(z + i * sz, w + i * sw, p + i * sp);
  return DLB_OK;
}

EXPORT int dlb_kernel_cmul_vjp(DLTensor *const *args, int32_t nargs,
                               void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 5, "cmul_vjp", err);
  if (rc != DLB_OK) return rc;
  const double *z = (const double *)dlb_tensor_data(args[0]);
  const double *w = (const double *)dlb_tensor_data(args[1]);
  const double *dp = (const double *)dlb_tensor_data(args[2]);
  double *dz = (double *)dlb_tensor_data(args[3]);
  double *dw = (double *)dlb_tensor_data(args[4]);
  const int64_t n = args[0]->shape[0], sz = 2 * stride0(args[0]),
                sw = 2 * stride0(args[1]), sdp = 2 * stride0(args[2]),
                sdz = 2 * stride0(args[3]), sdw = 2 * stride0(args[4]);
  for (int64_t i = 0; i < n; i++) {
    cmul_at(dp + i * sdp, w + i * sw, dz + i * sdz);
    cmul_at(dp + i * sdp, z + i * sz, dw + i * sdw);
  }
  return DLB_OK;
}

EXPORT int dlb_kernel_cmul_jvp(DLTensor *const *args, int32_t nargs,
                               void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 5, "cmul_jvp", err);
  if (rc != DLB_OK) return rc;
  const double *z = (const double *)dlb_tensor_data(args[0]);
  const double *w = (const double *)dlb_tensor_data(args[1]);
  const double *tz = (const double *)dlb_tensor_data(args[2]);
  const double *tw = (const double *)dlb_tensor_data(args[3]);
  double *tp = (double *)dlb_tensor_data(args[4]);
  const int64_t n = args[0]->shape[0], sz = 2 * stride0(args[0]),
                sw = 2 * stride0(args[1]), stz = 2 * stride0(args[2]),
                stw = 2 * stride0(args[3]), stp = 2 * stride0(args[4]);
  for (int64_t i = 0; i < n; i++) {
    double a[2], b[2];
    cmul_at(tz + i * stz, w + i * sw, a);
    cmul_at(z + i * sz, tw + i * stw, b);
    tp[i * stp] = a[0] + b[0];
    tp[i * stp + 1] = a[1] + b[1];
  }
  return DLB_OK;
}

/* mul_f32: y = a b, the benchmarks' training-step kernel;  vjp: da = dy b,
 * db = dy a. */
EXPORT int dlb_kernel_mul_f32(DLTensor *const *args, int32_t nargs,
                              void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 3, "mul_f32", err);
  if (rc != DLB_OK) return rc;
  const float *a = (const float *)dlb_tensor_data(args[0]);
  const float *b = (const float *)dlb_tensor_data(args[1]);
  float *y = (float *)dlb_tensor_data(args[2]);
  const int64_t n = args[0]->shape[0], sa = stride0(args[0]),
                sb = stride0(args[1]), sy = stride0(args[2]);
  for (int64_t i = 0; i < n; i++) y[i * sy] = a[i * sa] * b[i * sb];
  return DLB_OK;
}

EXPORT int dlb_kernel_mul_f32_vjp(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 5, "mul_f32_vjp", err);
  if (rc != DLB_OK) return rc;
  const float *a = (const float *)dlb_tensor_data(args[0]);
  const float *b = (const float *)dlb_tensor_data(args[1]);
  const float *dy = (const float *)dlb_tensor_data(args[2]);
  float *da = (float *)dlb_tensor_data(args[3]);
  float *db = (float *)dlb_tensor_data(args[4]);
  const int64_t n = args[0]->shape[0], sa = stride0(args[0]),
                sb = stride0(args[1]), sdy = stride0(args[2]),
                sda = stride0(args[3]), sdb = stride0(args[4]);
  for (int64_t i = 0; i < n; i++) {
    da[i * sda] = dy[i * sdy] * b[i * sb];
    db[i * sdb] = dy[i * sdy] * a[i * sa];
  }
  return DLB_OK;
}

EXPORT int dlb_kernel_bad_vjp_shape(DLTensor *const *args, int32_t nargs,
                                    void *stream, dlb_error *err) {
  (void)stream;
  int rc = expect(args, nargs, 3, "bad_vjp_shape", err);
  if (rc != DLB_OK) return rc;
  const double *dy = (const double *)dlb_tensor_data(args[1]);
  double *dx = (double *)dlb_tensor_data(args[2]);
  const int64_t n = args[1]->shape[0], sdy = stride0(args[1]),
                sdx = stride0(args[2]);
  for (int64_t i = 0; i < n; i++) dx[i * sdx] = dy[i * sdy];
  return DLB_OK;
}

/*
 * ops/tf.c -- a dlbridge.Function as a TensorFlow op: one generic op,
 * DlbridgeCall, registered through TensorFlow's C API, whose kernel runs
 * the Function that its `function` attribute names.
 *
 *   DlbridgeCall(args: Tin) -> outs: Tout
 *     Tin, Tout       list(type)
 *     function        string     the Function's identity (ops/registry.c)
 *     result_shapes   list(int)  the declared results' extents, flattened;
 *                                -1 for one not known when traced; a
 *                                `...` result's batch extents first (every
 *                                `...` result has the same number of them)
 *
 * python/dlbridge/_ops_tf.py builds the node while tf.function traces;
 * everything it writes into the node comes from Function._result_specs,
 * the shape function the eager call checks with.  Outputs are the declared
 * results, then one per `mut` input: TensorFlow's tensors are immutable, so
 * a `mut` input is copied into its output (or the input's buffer is taken
 * over when TensorFlow says nobody else holds it) and the kernel writes
 * there; the caller's tensor is never written.
 *
 * No TensorFlow header and no link: the few opaque types, codes and
 * functions needed are declared below from tensorflow/c/{ops,kernels,
 * tf_tensor,tf_status}.h of TF 2.21 and found with dlsym in the
 * libtensorflow_framework.so.2 that `import tensorflow` loaded (RTLD_NOLOAD:
 * never a second copy).  They are all in that library since TF 2.5 and
 * their arguments have not changed.
 *
 * Decisions:
 *  - Registration runs here, in _core, on the first compiled call, not in a
 *    library of our own handed to tf.load_op_library: the kernel must reach
 *    the Function registry and dlb__function_run, which live in _core and
 *    are not exported; tf.load_op_library(_core's path) would find the
 *    library already loaded and no op registered during the load.  The
 *    Python side builds nodes with the helper TF's generated wrappers call.
 *  - TensorFlow aborts the process on a second registration of an op name,
 *    so registration happens once per process (a static flag under a
 *    mutex), and _ops_tf.py refuses when someone else holds the name.
 *  - The op is stateful: a kernel may have effects TensorFlow cannot see
 *    (a Function with no results exists only for them), so every traced
 *    call runs once, in program order, and none is pruned, merged or
 *    constant-folded.
 *  - The C shape function says "unknown": TF's shape-inference context can
 *    read no attribute but a type, so it cannot know the Function.  The
 *    static shapes come from the signature on the Python side
 *    (Tensor.set_shape, which TensorFlow's own shape refiner keeps).
 *  - Output extents come from the node (result_shapes), fixed at trace
 *    time where they are known; an extent traced as unknown (-1: a
 *    tf.function traced with None extents, input_signature or
 *    reduce_retracing) is the signature's answer for the inputs of each
 *    run (dlb__function_result_shape).  dlb__function_run still checks
 *    every tensor against the signature before the kernel runs, so a node
 *    that disagrees with its inputs is an error, never a write out of
 *    bounds.
 *  - CPU only.  On TF's GPU device the kernel refuses at construction: TF's
 *    C API gives a CUDA stream only to PluggableDevices (TF_GetStream), not
 *    to its built-in GPU device, and a kernel that cannot be ordered on
 *    TF's stream must not run there.  tf.device("/CPU:0") is the way out.
 *  - The kernel needs no GIL: the Function comes from the lock-free
 *    registry (alive until exit) and dlb__function_run needs no Python.
 */
#include "../python/dlbridge_py.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TF_OP_NAME "DlbridgeCall"
#define TF_LIBRARY "libtensorflow_framework.so.2"

/* ---- TensorFlow's C API: what we use, declared here ------------------------- */

typedef struct tf_status tf_status;
typedef struct tf_tensor tf_tensor;
typedef struct tf_op_builder tf_op_builder;
typedef struct tf_shape_context tf_shape_context;
typedef struct tf_kernel_builder tf_kernel_builder;
typedef struct tf_kernel_construction tf_kernel_construction;
typedef struct tf_kernel_context tf_kernel_context;

/* TF_DataType and TF_Code are C enums of small non-negative values: passed
 * and stored as int. */
enum {
  TF_CODE_OK = 0,
  TF_CODE_UNKNOWN = 2,
  TF_CODE_INVALID_ARGUMENT = 3,
  TF_CODE_RESOURCE_EXHAUSTED = 8,
  TF_CODE_FAILED_PRECONDITION = 9,
  TF_CODE_UNIMPLEMENTED = 12,
  TF_CODE_INTERNAL = 13
};

typedef struct {
  tf_status *(*NewStatus)(void);
  void (*DeleteStatus)(tf_status *);
  void (*SetStatus)(tf_status *, int code, const char *message);
  int (*GetCode)(const tf_status *);
  const char *(*Message)(const tf_status *);
  tf_op_builder *(*NewOpDefinitionBuilder)(const char *op_name);
  void (*OpDefinitionBuilderAddInput)(tf_op_builder *, const char *spec);
  void (*OpDefinitionBuilderAddOutput)(tf_op_builder *, const char *spec);
  void (*OpDefinitionBuilderAddAttr)(tf_op_builder *, const char *spec);
  void (*OpDefinitionBuilderSetIsStateful)(tf_op_builder *, bool);
  void (*OpDefinitionBuilderSetShapeInferenceFunction)(
      tf_op_builder *, void (*)(tf_shape_context *, tf_status *));
  void (*RegisterOpDefinition)(tf_op_builder *, tf_status *);
  void (*ShapeInferenceContextSetUnknownShape)(tf_shape_context *,
                                               tf_status *);
  tf_kernel_builder *(*NewKernelBuilder)(
      const char *op_name, const char *device_name,
      void *(*create)(tf_kernel_construction *),
      void (*compute)(void *, tf_kernel_context *), void (*destroy)(void *));
  void (*RegisterKernelBuilder)(const char *kernel_name, tf_kernel_builder *,
                                tf_status *);
  void (*OpKernelConstruction_GetAttrSize)(tf_kernel_construction *,
                                           const char *attr,
                                           int32_t *list_size,
                                           int32_t *total_size, tf_status *);
  void (*OpKernelConstruction_GetAttrString)(tf_kernel_construction *,
                                             const char *attr, char *value,
                                             size_t max_length, tf_status *);
  void (*OpKernelConstruction_GetAttrTypeList)(tf_kernel_construction *,
                                               const char *attr, int *values,
                                               int max_values, tf_status *);
  void (*OpKernelConstruction_GetAttrInt64List)(tf_kernel_construction *,
                                                const char *attr,
                                                int64_t *values,
                                                int max_values, tf_status *);
  void (*OpKernelConstruction_Failure)(tf_kernel_construction *, tf_status *);
  void (*OpKernelContext_Failure)(tf_kernel_context *, tf_status *);
  void (*GetInput)(tf_kernel_context *, int index, tf_tensor **,
                   tf_status *);
  tf_tensor *(*AllocateOutput)(tf_kernel_context *, int index, int dtype,
                               const int64_t *dims, int ndims, size_t bytes,
                               tf_status *);
  tf_tensor *(*ForwardInputOrAllocateOutput)(
      tf_kernel_context *, const int *candidates, int ncandidates,
      int output_index, const int64_t *dims, int ndims, int *forwarded,
      tf_status *);
  void (*DeleteTensor)(tf_tensor *);
  void *(*TensorData)(const tf_tensor *);
  size_t (*TensorByteSize)(const tf_tensor *);
  int (*NumDims)(const tf_tensor *);
  int64_t (*Dim)(const tf_tensor *, int index);
} tf_api;

#define TF_SYMBOL(name) {"TF_" #name, offsetof(tf_api, name)}
static const struct {
  const char *name;
  size_t offset;
} tf_symbols[] = {
    TF_SYMBOL(NewStatus),
    TF_SYMBOL(DeleteStatus),
    TF_SYMBOL(SetStatus),
    TF_SYMBOL(GetCode),
    TF_SYMBOL(Message),
    TF_SYMBOL(NewOpDefinitionBuilder),
    TF_SYMBOL(OpDefinitionBuilderAddInput),
    TF_SYMBOL(OpDefinitionBuilderAddOutput),
    TF_SYMBOL(OpDefinitionBuilderAddAttr),
    TF_SYMBOL(OpDefinitionBuilderSetIsStateful),
    TF_SYMBOL(OpDefinitionBuilderSetShapeInferenceFunction),
    TF_SYMBOL(RegisterOpDefinition),
    TF_SYMBOL(ShapeInferenceContextSetUnknownShape),
    TF_SYMBOL(NewKernelBuilder),
    TF_SYMBOL(RegisterKernelBuilder),
    TF_SYMBOL(OpKernelConstruction_GetAttrSize),
    TF_SYMBOL(OpKernelConstruction_GetAttrString),
    TF_SYMBOL(OpKernelConstruction_GetAttrTypeList),
    TF_SYMBOL(OpKernelConstruction_GetAttrInt64List),
    TF_SYMBOL(OpKernelConstruction_Failure),
    TF_SYMBOL(OpKernelContext_Failure),
    TF_SYMBOL(GetInput),
    TF_SYMBOL(AllocateOutput),
    TF_SYMBOL(ForwardInputOrAllocateOutput),
    TF_SYMBOL(DeleteTensor),
    TF_SYMBOL(TensorData),
    TF_SYMBOL(TensorByteSize),
    TF_SYMBOL(NumDims),
    TF_SYMBOL(Dim),
};
#undef TF_SYMBOL

/* Filled once, under register_lock, before TensorFlow knows our op; read
 * by the kernels, which TensorFlow runs only after the registration that
 * published them. */
static tf_api tf;
/* 0: not tried; 1: registered; -1: a registration with TensorFlow failed
 * (never tried again: TensorFlow aborts on a second registration of a
 * name that the first may have taken). */
static int registration;
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- dtypes: TF_DataType <-> DLDataType -------------------------------------- */

/* The TensorFlow dtypes whose elements are laid out as DLPack's (whole
 * bytes, no padding).  TF's 4- and 2-bit integers and float4 keep one
 * element per byte, which DLPack's packed sub-byte types are not. */
static const struct {
  int tf;
  uint8_t code, bits;
} tf_dtypes[] = {
    {1, kDLFloat, 32},  {2, kDLFloat, 64},  {3, kDLInt, 32},
    {4, kDLUInt, 8},    {5, kDLInt, 16},    {6, kDLInt, 8},
    {8, kDLComplex, 64}, {9, kDLInt, 64},   {10, kDLBool, 8},
    {14, kDLBfloat, 16}, {17, kDLUInt, 16}, {18, kDLComplex, 128},
    {19, kDLFloat, 16}, {22, kDLUInt, 32},  {23, kDLUInt, 64},
    {24, kDLFloat8_e5m2, 8},        {25, kDLFloat8_e4m3fn, 8},
    {26, kDLFloat8_e4m3fnuz, 8},    {27, kDLFloat8_e4m3b11fnuz, 8},
    {28, kDLFloat8_e5m2fnuz, 8},
};

/* TensorFlow's code for dtype, or -1 when TensorFlow has none. */
static int tf_dtype_of(DLDataType dtype) {
  if (dtype.lanes != 1) return -1;
  for (size_t i = 0; i < sizeof tf_dtypes / sizeof tf_dtypes[0]; i++)
    if (tf_dtypes[i].code == dtype.code && tf_dtypes[i].bits == dtype.bits)
      return tf_dtypes[i].tf;
  return -1;
}

/* ---- errors handed to TensorFlow ------------------------------------------ */

/* What a dlb_status becomes in TensorFlow (and so which tf.errors class
 * Python sees): the same split as errors.c's dlb__raise. */
static int tf_code_of(int status) {
  switch (status) {
    case DLB_EINVAL:
    case DLB_EOVERFLOW:
      return TF_CODE_INVALID_ARGUMENT;
    case DLB_ENOMEM:
      return TF_CODE_RESOURCE_EXHAUSTED;
    case DLB_EUNSUPPORTED:
    case DLB_EVERSION:
      return TF_CODE_UNIMPLEMENTED;
    case DLB_EREADONLY:
      return TF_CODE_FAILED_PRECONDITION;
    case DLB_EDEVICE:
      return TF_CODE_INTERNAL;
    default:
      return TF_CODE_UNKNOWN;
  }
}

/* Length of the well-formed UTF-8 sequence at s (n bytes left), 0 if none:
 * TensorFlow decodes error messages strictly, and a kernel's message may
 * hold any bytes. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) len = 3;
  else if (c >= 0xF0 && c <= 0xF4) len = 4;
  else return 0;
  if (c == 0xE0) lo = 0xA0;      /* overlong */
  else if (c == 0xED) hi = 0x9F; /* surrogates */
  else if (c == 0xF0) lo = 0x90; /* overlong */
  else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < len; k++)
    if (s[k] < 0x80 || s[k] > 0xBF) return 0;
  return len;
}

/* Set status to code with message (NUL-terminated), every byte that is not
 * part of well-formed UTF-8 shown as '?'. */
static void tf_fail_with(tf_status *status, int code, char *message) {
  size_t n = strlen(message);
  for (size_t i = 0; i < n;) {
    size_t len = utf8_sequence((const unsigned char *)message + i, n - i);
    if (len == 0) {
      message[i++] = '?';
    } else {
      i += len;
    }
  }
  tf.SetStatus(status, code, message);
}

/* ---- the shape function ------------------------------------------------------ */

static void tf_shape_unknown(tf_shape_context *ctx, tf_status *status) {
  tf.ShapeInferenceContextSetUnknownShape(ctx, status);
}

/* ---- the kernel -------------------------------------------------------------- */

/* One DlbridgeCall node, made once when TensorFlow builds its kernel. */
typedef struct {
  PyObject *fn; /* the registry's Function: alive until exit */
  const dlb_signature_param *params;
  int32_t nin, nout, nmut;
  int32_t ndims;         /* the inputs' and results' ranks, summed (a
                            `...` input counted at DLB_MAX_NDIM) */
  int32_t nbatch;        /* the batch rank of every `...` result, as
                            traced (result_shapes says) */
  size_t scratch;        /* bytes a call needs for its arrays */
  const int32_t *muts;   /* [nmut] the `mut` inputs, in order */
  const int *out_types;  /* [nout] TensorFlow's dtype of each result */
  const int64_t *shapes; /* the results' extents, flattened */
  int64_t storage[];     /* muts, out_types and shapes live here */
} tf_node;

/* A call's arrays, laid out in one block (the kernel may run on several
 * threads at once, so nothing per call lives in the node). */
typedef struct {
  DLTensor *ts;      /* [nin + nout] */
  DLTensor **argv;   /* [nin + nout] */
  tf_tensor **held;  /* [nin + nout + nmut]: inputs, then outputs */
  int64_t *dims;     /* [2 * ndims]: shapes, then strides */
} tf_frame;

static size_t frame_size(int32_t nargs, int32_t nheld, int32_t ndims) {
  return (size_t)nargs * (sizeof(DLTensor) + sizeof(DLTensor *)) +
         (size_t)nheld * sizeof(tf_tensor *) +
         (size_t)ndims * 2 * sizeof(int64_t);
}

static void frame_layout(const tf_node *node, void *block, tf_frame *f) {
  int32_t nargs = node->nin + node->nout;
  char *p = block;
  f->ts = (DLTensor *)(void *)p;
  p += (size_t)nargs * sizeof(DLTensor);
  f->dims = (int64_t *)(void *)p;
  p += (size_t)node->ndims * 2 * sizeof(int64_t);
  f->argv = (DLTensor **)(void *)p;
  p += (size_t)nargs * sizeof(DLTensor *);
  f->held = (tf_tensor **)(void *)p;
}

/* Compact row-major strides for t (shape already set). */
static void compact_strides(DLTensor *t) {
  int64_t step = 1;
  for (int32_t a = t->ndim - 1; a >= 0; a--) {
    t->strides[a] = step;
    step *= t->shape[a] > 0 ? t->shape[a] : 1;
  }
}

/* Whether a result's extents (-1: given by the inputs at run time) could
 * make more bytes than int64 counts, at 16 bytes an element (complex128,
 * the widest dtype TF holds): TensorFlow checks a shape by aborting. */
static int extents_out_of_range(const int64_t *shape, int32_t ndim) {
  int64_t count = 1;
  for (int32_t a = 0; a < ndim; a++) {
    int64_t d = shape[a];
    if (d < -1) return 1;
    if (d > 0 && count > INT64_MAX / 16 / d) return 1;
    if (d > 0) count *= d;
  }
  return 0;
}

static void node_fail(tf_kernel_construction *ctx, tf_status *status,
                      int code, const char *identity, const char *fmt, ...) {
  char message[DLB_ERROR_MESSAGE_SIZE + 128];
  int n = snprintf(message, sizeof message, TF_OP_NAME " %s: ",
                   identity ? identity : "(no function)");
  if (n < 0 || (size_t)n >= sizeof message) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message + n, sizeof message - (size_t)n, fmt, ap);
  va_end(ap);
  tf_fail_with(status, code, message);
  tf.OpKernelConstruction_Failure(ctx, status);
}

/* The `function` attribute: a malloc'd, NUL-terminated copy in *out. */
static int read_identity(tf_kernel_construction *ctx, tf_status *status,
                         char **out, size_t *len) {
  int32_t list_size = 0, total = 0;
  tf.OpKernelConstruction_GetAttrSize(ctx, "function", &list_size, &total,
                                      status);
  if (tf.GetCode(status) != TF_CODE_OK) return -1;
  if (total < 0) total = 0;
  char *text = malloc((size_t)total + 1);
  if (text == NULL) {
    tf.SetStatus(status, TF_CODE_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  tf.OpKernelConstruction_GetAttrString(ctx, "function", text, (size_t)total,
                                        status);
  if (tf.GetCode(status) != TF_CODE_OK) {
    free(text);
    return -1;
  }
  text[total] = '\0';
  *out = text;
  *len = (size_t)total;
  return 0;
}

/* A list attribute's length, -1 with status set when it has none. */
static int32_t attr_length(tf_kernel_construction *ctx, const char *attr,
                           tf_status *status) {
  int32_t list_size = -1, total = 0;
  tf.OpKernelConstruction_GetAttrSize(ctx, attr, &list_size, &total, status);
  if (tf.GetCode(status) != TF_CODE_OK) return -1;
  return list_size;
}

/* Whether the node's type list attr (n entries) is want[0..n). */
static int types_match(tf_kernel_construction *ctx, const char *attr,
                       const int *want, int32_t n, tf_status *status) {
  if (attr_length(ctx, attr, status) != n) return 0;
  if (n == 0) return 1;
  int *got = malloc((size_t)n * sizeof *got);
  if (got == NULL) return 0;
  tf.OpKernelConstruction_GetAttrTypeList(ctx, attr, got, n, status);
  int same = tf.GetCode(status) == TF_CODE_OK &&
             memcmp(got, want, (size_t)n * sizeof *got) == 0;
  free(got);
  return same;
}

static void *kernel_create(tf_kernel_construction *ctx) {
  tf_status *status = tf.NewStatus();
  tf_node *node = NULL;
  char *identity = NULL;
  int *types = NULL;
  size_t len;
  if (read_identity(ctx, status, &identity, &len) < 0) {
    tf.OpKernelConstruction_Failure(ctx, status);
    goto cleanup;
  }
  PyObject *fn = dlb__ops_find(identity, len);
  if (fn == NULL) {
    node_fail(ctx, status, TF_CODE_FAILED_PRECONDITION, identity,
              "no dlbridge Function with this identity is registered in "
              "this process; a graph that calls one runs where the same "
              "Function (same signature, same kernel) has been called "
              "inside tf.function first");
    goto cleanup;
  }
  int32_t nin, nout;
  const dlb_signature_param *params = dlb__function_params(fn, &nin, &nout);
  int32_t nmut = 0, ndims = 0, nshape = 0, nbres = 0, nbatch = 0;
  for (int32_t i = 0; i < nin + nout; i++) {
    ndims += params[i].ndim;
    if (i < nin) nmut += params[i].mut != 0;
    else nshape += params[i].ndim;
    if (i < nin && params[i].batch) ndims += DLB_MAX_NDIM;
    if (i >= nin) nbres += params[i].batch != 0;
  }
  /* What the node must say, from the signature: the inputs' dtypes, then
   * the results' and the `mut` inputs' (the outputs). */
  types = malloc(((size_t)nin + (size_t)nout + (size_t)nmut + 1) *
                 sizeof *types);
  if (types == NULL) {
    node_fail(ctx, status, TF_CODE_RESOURCE_EXHAUSTED, identity,
              "out of memory");
    goto cleanup;
  }
  int *in_types = types, *out_types = types + nin;
  for (int32_t i = 0, k = 0; i < nin + nout; i++) {
    int code = tf_dtype_of(params[i].dtype);
    if (code < 0) {
      node_fail(ctx, status, TF_CODE_UNIMPLEMENTED, identity,
                "%s has a parameter TensorFlow has no dtype for",
                dlb__function_name(fn));
      goto cleanup;
    }
    types[i] = code;
    if (i < nin && params[i].mut) out_types[nout + k++] = code;
  }
  /* result_shapes: the core extents, and the batch rank of the `...`
   * results (the same for all of them) as many times over */
  int32_t nlisted = attr_length(ctx, "result_shapes", status);
  if (nbres > 0 && nlisted > nshape && (nlisted - nshape) % nbres == 0 &&
      (nlisted - nshape) / nbres <= DLB_MAX_NDIM)
    nbatch = (nlisted - nshape) / nbres;
  nshape += nbatch * nbres;
  ndims += nbatch * nbres;
  if (!types_match(ctx, "Tin", in_types, nin, status) ||
      !types_match(ctx, "Tout", out_types, nout + nmut, status) ||
      nlisted != nshape) {
    node_fail(ctx, status, TF_CODE_INVALID_ARGUMENT, identity,
              "the node's dtypes or result shapes are not those of the "
              "Function's signature");
    goto cleanup;
  }
  size_t size = sizeof *node + (size_t)nmut * sizeof(int32_t) +
                (size_t)nout * sizeof(int) + (size_t)nshape * sizeof(int64_t);
  node = calloc(1, size);
  if (node == NULL) {
    node_fail(ctx, status, TF_CODE_RESOURCE_EXHAUSTED, identity,
              "out of memory");
    goto cleanup;
  }
  /* storage: shapes first (8-byte aligned), then the int arrays */
  int64_t *shapes = node->storage;
  int *node_types = (int *)(void *)(shapes + nshape);
  int32_t *muts = (int32_t *)(void *)(node_types + nout);
  if (nshape > 0) {
    tf.OpKernelConstruction_GetAttrInt64List(ctx, "result_shapes", shapes,
                                             nshape, status);
    if (tf.GetCode(status) != TF_CODE_OK) {
      tf.OpKernelConstruction_Failure(ctx, status);
      goto fail;
    }
  }
  /* Each result's bytes must be countable in int64 (checked again at run
   * time for extents the inputs give, -1 here). */
  for (int32_t o = 0, at = 0; o < nout; o++) {
    int32_t rank = params[nin + o].ndim + (params[nin + o].batch ? nbatch : 0);
    if (extents_out_of_range(shapes + at, rank)) {
      node_fail(ctx, status, TF_CODE_INVALID_ARGUMENT, identity,
                "result %d: an extent is out of range", (int)o);
      goto fail;
    }
    at += rank;
  }
  memcpy(node_types, out_types, (size_t)nout * sizeof *node_types);
  for (int32_t i = 0, k = 0; i < nin; i++)
    if (params[i].mut) muts[k++] = i;
  node->fn = fn;
  node->params = params;
  node->nin = nin;
  node->nout = nout;
  node->nmut = nmut;
  node->ndims = ndims;
  node->nbatch = nbatch;
  node->scratch = frame_size(nin + nout, nin + nout + nmut, ndims);
  node->muts = muts;
  node->out_types = node_types;
  node->shapes = shapes;
  goto cleanup;
fail:
  free(node);
  node = NULL;
cleanup:
  free(types);
  free(identity);
  tf.DeleteStatus(status);
  return node;
}

static void kernel_delete(void *kernel) { free(kernel); }

/* The kernel on TensorFlow's GPU device: refused, with the reason. */
static void *kernel_create_gpu(tf_kernel_construction *ctx) {
  tf_status *status = tf.NewStatus();
  char *identity = NULL;
  size_t len;
  if (read_identity(ctx, status, &identity, &len) < 0) identity = NULL;
  tf.SetStatus(status, TF_CODE_OK, "");
  node_fail(ctx, status, TF_CODE_UNIMPLEMENTED, identity,
            "a dlbridge Function cannot run on TensorFlow's GPU device: "
            "TensorFlow's C API gives a CUDA stream only to pluggable "
            "devices, not to its built-in GPU device, so the kernel could "
            "not be ordered with TensorFlow's work; place the call on the "
            "CPU (with tf.device(\"/CPU:0\"))");
  free(identity);
  tf.DeleteStatus(status);
  return NULL;
}

/* Describe TensorFlow tensor t as the DLTensor *out of the parameter p,
 * its extents and strides written at dims.  -1 (status set) when its rank
 * is not the signature's (at least its core rank for a `...` one, at most
 * DLB_MAX_NDIM): the node disagrees with the graph. */
static int describe(const tf_node *node, int32_t index, const tf_tensor *t,
                    DLTensor *out, int64_t *dims, tf_status *status) {
  const dlb_signature_param *p = &node->params[index];
  int ndim = tf.NumDims(t);
  if (p->batch ? ndim < p->ndim || ndim > DLB_MAX_NDIM : ndim != p->ndim) {
    char message[256];
    snprintf(message, sizeof message,
             TF_OP_NAME ": argument %d of %s() has %d dimensions at run "
             "time; the signature says %s%d",
             (int)index, dlb__function_name(node->fn), ndim,
             p->batch ? "at least " : "", (int)p->ndim);
    tf_fail_with(status, TF_CODE_INVALID_ARGUMENT, message);
    return -1;
  }
  out->data = tf.TensorData(t);
  out->device.device_type = kDLCPU;
  out->device.device_id = 0;
  out->ndim = ndim;
  out->dtype = p->dtype; /* the node's Tin is the signature's (checked) */
  out->shape = dims;
  out->strides = dims + ndim;
  out->byte_offset = 0;
  for (int a = 0; a < ndim; a++) dims[a] = tf.Dim(t, a);
  compact_strides(out);
  return 0;
}

static size_t element_bytes(const DLTensor *t) {
  size_t n = (size_t)(t->dtype.bits / 8);
  for (int32_t a = 0; a < t->ndim; a++) n *= (size_t)t->shape[a];
  return n;
}

static void kernel_compute(void *kernel, tf_kernel_context *ctx) {
  const tf_node *node = kernel;
  if (node == NULL) return; /* construction failed and said why */
  const int32_t nin = node->nin, nout = node->nout, nmut = node->nmut;
  const int32_t nargs = nin + nout;
  tf_status *status = tf.NewStatus();
  dlb_error err;
  alignas(max_align_t) unsigned char stack[1024];
  void *block = node->scratch <= sizeof stack ? stack : malloc(node->scratch);
  int32_t nheld = 0;
  tf_frame f;
  if (block == NULL) {
    tf.SetStatus(status, TF_CODE_RESOURCE_EXHAUSTED,
                 TF_OP_NAME ": out of memory");
    goto fail;
  }
  frame_layout(node, block, &f);
  int64_t *dims = f.dims;
  /* inputs: a `mut` one is described here and given its output below */
  for (int32_t i = 0; i < nin; i++) {
    f.argv[i] = &f.ts[i];
    tf_tensor *t = NULL;
    tf.GetInput(ctx, i, &t, status);
    if (tf.GetCode(status) != TF_CODE_OK) goto fail;
    if (node->params[i].mut) {
      int rc = describe(node, i, t, &f.ts[i], dims, status);
      tf.DeleteTensor(t); /* our reference would keep it from being taken */
      if (rc < 0) goto fail;
    } else {
      f.held[nheld++] = t;
      if (describe(node, i, t, &f.ts[i], dims, status) < 0) goto fail;
    }
    dims += 2 * f.ts[i].ndim;
  }
  /* the `mut` inputs' outputs: the input's buffer when nobody else holds
   * it, else a copy; the kernel writes there, never into the input */
  for (int32_t k = 0; k < nmut; k++) {
    int i = node->muts[k];
    DLTensor *t = &f.ts[i];
    int forwarded = -1;
    tf_tensor *out = tf.ForwardInputOrAllocateOutput(
        ctx, &i, 1, nout + k, t->shape, t->ndim, &forwarded, status);
    if (tf.GetCode(status) != TF_CODE_OK) goto fail;
    f.held[nheld++] = out;
    void *data = tf.TensorData(out);
    if (forwarded != i) {
      tf_tensor *src = NULL;
      tf.GetInput(ctx, i, &src, status);
      if (tf.GetCode(status) != TF_CODE_OK) goto fail;
      size_t bytes = tf.TensorByteSize(src);
      if (bytes > 0) memcpy(data, tf.TensorData(src), bytes);
      tf.DeleteTensor(src);
    }
    t->data = data;
  }
  /* the declared results, of the extents the node carries */
  for (int32_t o = 0, at = 0; o < nout; o++) {
    DLTensor *t = &f.ts[nin + o];
    const dlb_signature_param *p = &node->params[nin + o];
    const int32_t rank = p->ndim + (p->batch ? node->nbatch : 0);
    f.argv[nin + o] = t;
    t->ndim = rank;
    t->dtype = p->dtype;
    t->shape = dims;
    t->strides = dims + rank;
    t->byte_offset = 0;
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    memcpy(dims, node->shapes + at, (size_t)rank * sizeof *dims);
    for (int32_t a = 0; a < rank; a++)
      if (dims[a] < 0) {
        /* traced as unknown: the signature's answer for these inputs (a
         * `...` result's batch shape too, of the rank traced) */
        int64_t shape[DLB_MAX_NDIM];
        int32_t got = 0;
        char message[DLB_ERROR_MESSAGE_SIZE + 64];
        message[0] = '\0';
        if (dlb__function_result_shape(node->fn, f.argv, o, shape, &got,
                                       &err) != DLB_OK) {
          err.message[sizeof err.message - 1] = '\0';
          snprintf(message, sizeof message, "%s", err.message);
        } else if (got != rank) {
          snprintf(message, sizeof message,
                   "%s: result %d was traced with %d dimensions; these "
                   "inputs give it %d",
                   dlb__function_name(node->fn), (int)o, (int)rank,
                   (int)got);
        } else if (extents_out_of_range(shape, rank)) {
          snprintf(message, sizeof message,
                   "%s: result %d: an extent is out of range",
                   dlb__function_name(node->fn), (int)o);
        }
        if (message[0] != '\0') {
          tf_fail_with(status, TF_CODE_INVALID_ARGUMENT, message);
          goto fail;
        }
        for (int32_t k = 0; k < rank; k++)
          if (dims[k] < 0) dims[k] = shape[k];
        break;
      }
    compact_strides(t);
    at += rank;
    dims += 2 * rank;
    tf_tensor *out =
        tf.AllocateOutput(ctx, o, node->out_types[o], t->shape, t->ndim,
                          element_bytes(t), status);
    if (tf.GetCode(status) != TF_CODE_OK) goto fail;
    f.held[nheld++] = out;
    t->data = tf.TensorData(out);
  }
  int rc = dlb__function_run(node->fn, f.argv, nargs, NULL, &err);
  if (rc != DLB_OK) {
    err.message[sizeof err.message - 1] = '\0';
    tf_fail_with(status, tf_code_of(rc), err.message);
    goto fail;
  }
  goto cleanup;
fail:
  tf.OpKernelContext_Failure(ctx, status);
cleanup:
  for (int32_t h = 0; h < nheld; h++) tf.DeleteTensor(f.held[h]);
  if (block != stack) free(block);
  tf.DeleteStatus(status);
}

/* ---- registration ------------------------------------------------------------ */

/* Find TensorFlow's C API in the library `import tensorflow` loaded.  0, or
 * -1 with an exception. */
static int resolve_api(void) {
  void *lib = dlopen(TF_LIBRARY, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "TensorFlow's " TF_LIBRARY " is not loaded in this "
                    "process (import tensorflow first)");
    return -1;
  }
  /* The handle is kept: TensorFlow is never unloaded, and our op lives in
   * it until exit. */
  tf_api api;
  for (size_t i = 0; i < sizeof tf_symbols / sizeof tf_symbols[0]; i++) {
    void *sym = dlsym(lib, tf_symbols[i].name);
    if (sym == NULL) {
      PyErr_Format(PyExc_RuntimeError,
                   "this TensorFlow's C API has no %s, which dlbridge's "
                   "TensorFlow op needs",
                   tf_symbols[i].name);
      return -1;
    }
    /* ISO C has no cast from void * to a function pointer; POSIX (dlsym)
     * guarantees the representation is the same, so copy the bits. */
    memcpy((char *)&api + tf_symbols[i].offset, &sym, sizeof sym);
  }
  tf = api;
  return 0;
}

/* Exception from a failed TensorFlow status (consumed). */
static int raise_status(tf_status *status, const char *what) {
  PyErr_Format(PyExc_RuntimeError, "registering %s with TensorFlow: %s",
               what, tf.Message(status));
  tf.DeleteStatus(status);
  return -1;
}

static int register_op(void) {
  tf_status *status = tf.NewStatus();
  tf_op_builder *b = tf.NewOpDefinitionBuilder(TF_OP_NAME);
  tf.OpDefinitionBuilderAddAttr(b, "Tin: list(type) >= 0");
  tf.OpDefinitionBuilderAddAttr(b, "Tout: list(type) >= 0");
  tf.OpDefinitionBuilderAddAttr(b, "function: string");
  tf.OpDefinitionBuilderAddAttr(b, "result_shapes: list(int) >= 0");
  tf.OpDefinitionBuilderAddInput(b, "args: Tin");
  tf.OpDefinitionBuilderAddOutput(b, "outs: Tout");
  tf.OpDefinitionBuilderSetIsStateful(b, true);
  tf.OpDefinitionBuilderSetShapeInferenceFunction(b, tf_shape_unknown);
  tf.RegisterOpDefinition(b, status); /* frees b */
  if (tf.GetCode(status) != TF_CODE_OK) return raise_status(status, "the op");
  static const struct {
    const char *device, *name;
    void *(*create)(tf_kernel_construction *);
  } kernels[] = {
      {"CPU", TF_OP_NAME "_CPU", kernel_create},
      {"GPU", TF_OP_NAME "_GPU", kernel_create_gpu},
  };
  for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
    tf_kernel_builder *k =
        tf.NewKernelBuilder(TF_OP_NAME, kernels[i].device, kernels[i].create,
                            kernel_compute, kernel_delete);
    tf.RegisterKernelBuilder(kernels[i].name, k, status); /* owns k */
    if (tf.GetCode(status) != TF_CODE_OK)
      return raise_status(status, kernels[i].name);
  }
  tf.DeleteStatus(status);
  return 0;
}

/* _core._tf_register(taken) -> None: register DlbridgeCall and its kernels
 * with the TensorFlow loaded in this process, once.  taken: whether
 * TensorFlow already knows an op of that name (the caller asks TF's
 * registry) -- TensorFlow aborts on a second registration, so one that is
 * not ours is refused here. */
static PyObject *py_tf_register(PyObject *module, PyObject *taken) {
  (void)module;
  int is_taken = PyObject_IsTrue(taken);
  if (is_taken < 0) return NULL;
  int rc = 0;
  pthread_mutex_lock(&register_lock);
  if (registration < 0) {
    PyErr_SetString(PyExc_RuntimeError,
                    "registering the " TF_OP_NAME " op with TensorFlow "
                    "failed earlier in this process (see the first error)");
    rc = -1;
  } else if (registration == 0 && is_taken) {
    PyErr_SetString(PyExc_RuntimeError,
                    "TensorFlow already has an op named " TF_OP_NAME
                    " that this dlbridge did not register (another copy "
                    "of dlbridge in this process?)");
    rc = -1;
  } else if (registration == 0) {
    rc = resolve_api(); /* nothing registered if this fails: may retry */
    if (rc == 0) {
      rc = register_op();
      registration = rc == 0 ? 1 : -1;
    }
  }
  pthread_mutex_unlock(&register_lock);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

/* _core._tf_dtype(dtype) -> int or None: TensorFlow's TF_DataType for a
 * dtype (anything dlb.dtype takes), None when TensorFlow has none. */
static PyObject *py_tf_dtype(PyObject *module, PyObject *obj) {
  DLDataType dtype;
  if (dlb__dtype_converter(PyModule_GetState(module), obj, &dtype) < 0)
    return NULL;
  int code = tf_dtype_of(dtype);
  if (code < 0) Py_RETURN_NONE;
  return PyLong_FromLong(code);
}

static PyMethodDef tf_methods[] = {
    {"_tf_register", py_tf_register, METH_O,
     "_tf_register(taken) -> None\n\nRegister the " TF_OP_NAME " op and its "
     "kernels with the loaded TensorFlow, once per process; taken says "
     "whether TensorFlow already has an op of that name."},
    {"_tf_dtype", py_tf_dtype, METH_O,
     "_tf_dtype(dtype) -> int or None: TensorFlow's code for dtype."},
    {NULL, NULL, 0, NULL},
};

int dlb__ops_tf_init(PyObject *module) {
  if (PyModule_AddFunctions(module, tf_methods) < 0) return -1;
  return PyModule_AddStringConstant(module, "_TF_OP", TF_OP_NAME);
}

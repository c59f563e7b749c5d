/*
 * ops/xla.c -- a dlbridge.Function as an XLA FFI custom call: what runs
 * when a graph that jax.jit built calls a Function (python/dlbridge/
 * _ops_jax.py makes the call; docs/compiled.md, "JAX").
 *
 * One handler bundle per platform (host, CUDA), registered once under one
 * target name.  An XLA_FFI_Handler is a bare function pointer with no user
 * data, so the handler learns which Function it runs from the call's one
 * string attribute, the Function's identity, looked up in ops/registry.c:
 * a name that survives serialisation (jax.export) and means the same
 * Function in every process that made it.  No trampoline table, so no cap
 * beyond the registry's.  The lookup is made once per call site, at XLA's
 * instantiate stage, and kept as the site's state (xla_state below); a
 * call without a state looks it up itself, through a per-thread memo of
 * the last Functions found (compared byte for byte).
 *
 * The C ABI is transcribed below from the facts of the XLA FFI C API
 * (shared/reference/compiled-graphs.md, section 1): the subset the handler
 * touches, nothing more, no XLA or JAX header at build time.  What keeps it
 * valid across jaxlib releases:
 *  - the metadata handshake declares API version 0.1, the lowest XLA
 *    accepts (XLA takes any version from 0.1 to its own; older XLA wanted
 *    an exact match and is not supported);
 *  - the calls made on every XLA -- Error_Create, Stream_Get,
 *    DeviceOrdinal_Get -- have the same argument layout in every header
 *    version, and the function table only ever grew at its end, so their
 *    slots never moved; the state calls (Type_Register, State_Set,
 *    State_Get, Error_Destroy) are made only on an XLA whose table says
 *    0.3 or later, the layout transcribed (call_state_supported);
 *  - the structs XLA hands us (call frame, buffers, attributes) are read
 *    only after their struct_size says the fields are there;
 *  - every offset is pinned by a _Static_assert on LP64, and
 *    tests/python/test_compiled_jax.py compares each one with the installed
 *    jaxlib's own header (_core._xla_ffi_layout).
 *
 * Decisions:
 *  - Stages: `instantiate` and `execute` are registered, each its own
 *    function, so the stage field, whose numbering changed between
 *    versions, is never read (XLA asks both for their metadata at
 *    registration).  Instantiate never fails: what it cannot do is left to
 *    execute, which then behaves as it did before there were states.
 *  - Buffers are dense and row-major (ffi_call's default layouts; XLA
 *    relayouts operands before the call), so each DLTensor gets compact
 *    row-major strides, never NULL (kernels may index strides[] directly),
 *    and byte_offset 0.
 *  - `mut`: the Python side aliases each `mut` input with an extra result
 *    after the declared ones (input_output_aliases), so XLA hands both as
 *    one buffer and the kernel writes the result in place.  Should the two
 *    ever differ, the input is copied into the result first (on the
 *    stream), so the kernel still updates the input's value.
 *  - Command buffers: the handler does not declare
 *    COMMAND_BUFFER_COMPATIBLE.  A dlb_kernel launches on the stream it is
 *    given, but the ABI does not promise that it launches the same work on
 *    every call, or that it never synchronises, allocates with
 *    cuMemAlloc or reads device memory on the host -- each of which breaks
 *    or silently corrupts a CUDA-graph capture.  So XLA:GPU runs the call
 *    outside its command buffers, on the stream, in order.
 *  - Errors: a refused argument or a failed kernel is an XLA_FFI_Error
 *    whose message starts with the Function's name; jax raises it as a
 *    JaxRuntimeError (a RuntimeError) "<CODE>: <name>: <message>".
 *  - Numbers: a 0-d input may come as a typed scalar attribute
 *    "dlb_arg<i>" rather than an operand (what JAX would narrow without
 *    jax_enable_x64: scalar_inputs below); the kernel gets it as the eager
 *    call gives a number, a 0-d host tensor with NULL shape and strides.
 *  - Batch dimensions: a Function with `...` gets the eager call's rule in
 *    dlb__function_run (its results are traced with the broadcast batch
 *    shape in front, _result_specs; the kernel sees every `...` tensor
 *    padded to that rank).  Under a vmap its signature cannot batch, the
 *    call carries an integer attribute "loop_rank": that many leading dims
 *    of every operand and result are a loop, run in C, one kernel call per
 *    item on an unbatched view (dlb__function_run_looped); an operand
 *    without them (a number, one the vmap does not batch) is given whole
 *    to every item.
 *  - Platforms: the host (DLDevice kDLCPU 0, stream NULL, as the kernel ABI
 *    says) and CUDA (kDLCUDA with XLA's device ordinal; the stream from
 *    Stream_Get, XLA's own, so the kernel is ordered with the graph's other
 *    work without any synchronisation).
 */
#include "../python/dlbridge_py.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- the XLA FFI C ABI, the subset used (transcribed; names ours) ---------- */

typedef enum { XFFI_EXTENSION_METADATA = 1 } xffi_extension_type;

typedef struct xffi_extension {
  size_t struct_size;
  xffi_extension_type type;
  struct xffi_extension *next;
} xffi_extension;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  int major_version;
  int minor_version;
} xffi_api_version;

typedef enum {
  XFFI_OK = 0,
  XFFI_UNKNOWN = 2,
  XFFI_INVALID_ARGUMENT = 3,
  XFFI_NOT_FOUND = 5,
  XFFI_PERMISSION_DENIED = 7,
  XFFI_RESOURCE_EXHAUSTED = 8,
  XFFI_FAILED_PRECONDITION = 9,
  XFFI_OUT_OF_RANGE = 11,
  XFFI_UNIMPLEMENTED = 12,
  XFFI_INTERNAL = 13,
} xffi_error_code;

typedef struct xffi_error xffi_error; /* opaque; XLA owns it once returned */

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  const char *message; /* copied by XLA */
  xffi_error_code errc;
} xffi_error_create_args;

/* XLA's element types (xla_data.proto's numbering, every header since the
 * first: three fp8 codes moved after version 0.0, which we never accept). */
typedef enum {
  XFFI_PRED = 1,
  XFFI_S8 = 2,
  XFFI_S16 = 3,
  XFFI_S32 = 4,
  XFFI_S64 = 5,
  XFFI_U8 = 6,
  XFFI_U16 = 7,
  XFFI_U32 = 8,
  XFFI_U64 = 9,
  XFFI_F16 = 10,
  XFFI_F32 = 11,
  XFFI_F64 = 12,
  XFFI_C64 = 15,
  XFFI_BF16 = 16,
  XFFI_C128 = 18,
  XFFI_F8E5M2 = 19,
  XFFI_F8E4M3FN = 20,
  XFFI_F8E4M3B11FNUZ = 23,
  XFFI_F8E5M2FNUZ = 24,
  XFFI_F8E4M3FNUZ = 25,
  XFFI_F8E4M3 = 28,
  XFFI_F8E3M4 = 29,
  XFFI_F8E8M0FNU = 33,
} xffi_data_type;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  xffi_data_type dtype;
  void *data;
  int64_t rank;
  int64_t *dims; /* rank of them */
} xffi_buffer;

enum { XFFI_BUFFER_KIND = 1 };      /* XLA_FFI_ArgType / RetType BUFFER */
enum { XFFI_ATTR_SCALAR = 3 };      /* XLA_FFI_AttrType SCALAR */
enum { XFFI_ATTR_STRING = 4 };      /* XLA_FFI_AttrType STRING */
typedef int xffi_kind;              /* the C enums of those types */

typedef struct {
  const char *ptr; /* not NUL-terminated */
  size_t len;
} xffi_byte_span;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  int64_t size;
  xffi_kind *types;
  void **args; /* xffi_buffer * each */
} xffi_args;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  int64_t size;
  xffi_kind *types;
  void **rets;
} xffi_rets;

typedef struct {
  xffi_data_type dtype;
  void *value;
} xffi_scalar; /* XLA_FFI_Scalar */

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  int64_t size;
  xffi_kind *types;
  xffi_byte_span **names; /* sorted */
  void **attrs;           /* xffi_byte_span * for a string */
} xffi_attrs;

typedef struct xffi_api xffi_api;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start; /* the metadata query's marker */
  const xffi_api *api;
  void *ctx;
  int stage; /* renumbered across versions: never read */
  xffi_args args;
  xffi_rets rets;
  xffi_attrs attrs;
  void *future; /* out; outside struct_size */
} xffi_call_frame;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  void *ctx;
  void *stream; /* out: a CUstream on CUDA */
} xffi_stream_get_args;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  void *ctx;
  int32_t device_ordinal; /* out */
} xffi_device_ordinal_get_args;

/* The metadata a handler reports: later versions append state_type_id,
 * which a stateless handler leaves as XLA set it. */
typedef struct {
  size_t struct_size;
  xffi_api_version api_version;
  uint32_t traits;
} xffi_metadata;

typedef struct {
  xffi_extension extension_base;
  xffi_metadata *metadata;
} xffi_metadata_extension;

/* ---- per-call-site state (used only from API version 0.3 on: see
 * call_state_supported) ----
 * A user type is registered once per XLA instance (Type_Register, with the
 * deleter XLA calls when an executable is destroyed); the instantiate stage
 * sets a state of that type for its call site (State_Set), every execute
 * call of the site gets it back (State_Get with the INSTANTIATE stage).
 * In the 0.1 header State_Set took {ctx, type_id, state, deleter} with no
 * stage, and slot 5 was TypeId_Register (no type info): not called there. */
typedef struct {
  int64_t type_id;
} xffi_type_id; /* XLA_FFI_TypeId; 0: unknown */

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  void (*deleter)(void *object);
} xffi_type_info;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  xffi_byte_span name;
  xffi_type_id *type_id; /* in-out: 0 asks XLA to assign one */
  const xffi_type_info *type_info;
} xffi_type_register_args;

enum { XFFI_STAGE_INSTANTIATE = 0 }; /* in every version with the stage */

/* XLA_FFI_State_Set_Args and XLA_FFI_State_Get_Args: one layout. */
typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  void *ctx;
  int stage;
  xffi_type_id *type_id;
  void *state; /* in for Set, out for Get */
} xffi_state_args;

typedef struct {
  size_t struct_size;
  xffi_extension *extension_start;
  xffi_error *error;
} xffi_error_destroy_args;

typedef xffi_error *xffi_error_create_fn(xffi_error_create_args *);
typedef void xffi_error_destroy_fn(xffi_error_destroy_args *);
typedef xffi_error *xffi_stream_get_fn(xffi_stream_get_args *);
typedef xffi_error *xffi_type_register_fn(xffi_type_register_args *);
typedef xffi_error *xffi_state_fn(xffi_state_args *);
typedef xffi_error *xffi_device_ordinal_get_fn(xffi_device_ordinal_get_args *);
typedef void xffi_unused_fn(void);

/* XLA's function table, up to the last slot used (it only grows at the
 * end: slot 1 changed meaning once, GetMessage -> GetDetails, and slot 5
 * TypeId_Register -> Type_Register; neither is called). */
struct xffi_api {
  size_t struct_size;
  xffi_extension *extension_start;
  xffi_api_version api_version;
  const void *internal_api;
  xffi_error_create_fn *error_create;   /* slot 0 */
  xffi_unused_fn *error_get_details;
  xffi_error_destroy_fn *error_destroy; /* slot 2 */
  xffi_unused_fn *handler_register;
  xffi_stream_get_fn *stream_get;       /* slot 4 */
  xffi_type_register_fn *type_register; /* slot 5, from 0.3 on (above) */
  xffi_unused_fn *context_get;
  xffi_state_fn *state_set;             /* slot 7 */
  xffi_state_fn *state_get;             /* slot 8 */
  xffi_unused_fn *memory_allocate;
  xffi_unused_fn *memory_free;
  xffi_unused_fn *thread_pool_schedule;
  xffi_unused_fn *thread_pool_num_threads;
  xffi_unused_fn *future_create;
  xffi_unused_fn *future_set_available;
  xffi_unused_fn *future_set_error;
  xffi_unused_fn *run_id_get;
  xffi_device_ordinal_get_fn *device_ordinal_get; /* slot 17 */
};

typedef xffi_error *xffi_handler(xffi_call_frame *);

/* XLA's struct_size of a struct: up to the end of its last field. */
#define XFFI_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

/* The version the metadata answer declares (see the header comment). */
#define XFFI_DECLARED_MAJOR 0
#define XFFI_DECLARED_MINOR 1

/* The layout on LP64 (every platform jaxlib ships for), as in the header. */
#if SIZE_MAX == UINT64_MAX && UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(xffi_extension_type) == 4 && sizeof(xffi_data_type) == 4 &&
                   sizeof(xffi_error_code) == 4 && sizeof(xffi_kind) == 4,
               "XLA's enums are int-sized");
_Static_assert(XFFI_SIZE(xffi_extension, next) == 24, "XLA_FFI_Extension_Base");
_Static_assert(XFFI_SIZE(xffi_api_version, minor_version) == 24 &&
                   offsetof(xffi_api_version, major_version) == 16,
               "XLA_FFI_Api_Version");
_Static_assert(XFFI_SIZE(xffi_error_create_args, errc) == 28 &&
                   offsetof(xffi_error_create_args, message) == 16,
               "XLA_FFI_Error_Create_Args");
_Static_assert(offsetof(xffi_buffer, dtype) == 16 &&
                   offsetof(xffi_buffer, data) == 24 &&
                   offsetof(xffi_buffer, rank) == 32 &&
                   XFFI_SIZE(xffi_buffer, dims) == 48,
               "XLA_FFI_Buffer");
_Static_assert(offsetof(xffi_args, size) == 16 &&
                   offsetof(xffi_args, types) == 24 &&
                   XFFI_SIZE(xffi_args, args) == 40 &&
                   XFFI_SIZE(xffi_rets, rets) == 40,
               "XLA_FFI_Args, XLA_FFI_Rets");
_Static_assert(offsetof(xffi_scalar, value) == 8 && sizeof(xffi_scalar) == 16,
               "XLA_FFI_Scalar");
_Static_assert(offsetof(xffi_attrs, names) == 32 &&
                   XFFI_SIZE(xffi_attrs, attrs) == 48 &&
                   sizeof(xffi_byte_span) == 16,
               "XLA_FFI_Attrs, XLA_FFI_ByteSpan");
_Static_assert(offsetof(xffi_call_frame, api) == 16 &&
                   offsetof(xffi_call_frame, ctx) == 24 &&
                   offsetof(xffi_call_frame, stage) == 32 &&
                   offsetof(xffi_call_frame, args) == 40 &&
                   offsetof(xffi_call_frame, rets) == 80 &&
                   offsetof(xffi_call_frame, attrs) == 120 &&
                   XFFI_SIZE(xffi_call_frame, attrs) == 168 &&
                   offsetof(xffi_call_frame, future) == 168,
               "XLA_FFI_CallFrame");
_Static_assert(offsetof(xffi_stream_get_args, stream) == 24 &&
                   XFFI_SIZE(xffi_stream_get_args, stream) == 32,
               "XLA_FFI_Stream_Get_Args");
_Static_assert(offsetof(xffi_device_ordinal_get_args, device_ordinal) == 24 &&
                   XFFI_SIZE(xffi_device_ordinal_get_args, device_ordinal) == 28,
               "XLA_FFI_DeviceOrdinal_Get_Args");
_Static_assert(offsetof(xffi_metadata, api_version) == 8 &&
                   offsetof(xffi_metadata, traits) == 32 &&
                   offsetof(xffi_metadata_extension, metadata) == 24,
               "XLA_FFI_Metadata, XLA_FFI_Metadata_Extension");
_Static_assert(XFFI_SIZE(xffi_type_info, deleter) == 24 &&
                   offsetof(xffi_type_register_args, name) == 16 &&
                   offsetof(xffi_type_register_args, type_id) == 32 &&
                   XFFI_SIZE(xffi_type_register_args, type_info) == 48,
               "XLA_FFI_TypeInfo, XLA_FFI_Type_Register_Args");
_Static_assert(offsetof(xffi_state_args, ctx) == 16 &&
                   offsetof(xffi_state_args, stage) == 24 &&
                   offsetof(xffi_state_args, type_id) == 32 &&
                   XFFI_SIZE(xffi_state_args, state) == 48 &&
                   XFFI_SIZE(xffi_error_destroy_args, error) == 24,
               "XLA_FFI_State_Set_Args, XLA_FFI_State_Get_Args, "
               "XLA_FFI_Error_Destroy_Args");
_Static_assert(offsetof(xffi_api, api_version) == 16 &&
                   offsetof(xffi_api, error_create) == 48 &&
                   offsetof(xffi_api, error_destroy) == 64 &&
                   offsetof(xffi_api, stream_get) == 80 &&
                   offsetof(xffi_api, type_register) == 88 &&
                   offsetof(xffi_api, state_set) == 104 &&
                   offsetof(xffi_api, state_get) == 112 &&
                   offsetof(xffi_api, device_ordinal_get) == 184,
               "XLA_FFI_Api");
#endif

/* The one attribute of a dlbridge call: the Function's identity. */
#define XLA_IDENTITY_ATTR "dlb_identity"

/* The attribute of a 0-d input given as a number (a typed scalar, so JAX's
 * x64 narrowing never reaches it): "dlb_arg<input index>". */
#define XLA_SCALAR_ATTR "dlb_arg"

/* The attribute of a call under a vmap whose signature cannot batch it:
 * an integer, how many leading dims of every operand and result are loop
 * dims; the handler runs the kernel once per item of them
 * (dlb__function_run_looped).  Absent: 0. */
#define XLA_LOOP_ATTR "loop_rank"

/* Tensors and extents kept on the stack; a larger call allocates. */
#define XLA_INLINE_TENSORS 8
#define XLA_INLINE_EXTENTS 64

/* ---- the handler ------------------------------------------------------------ */

/* An XLA error with a message (XLA copies it). */
static xffi_error *xla_error(const xffi_call_frame *cf, xffi_error_code code,
                             const char *message) {
  xffi_error_create_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = XFFI_SIZE(xffi_error_create_args, errc);
  args.message = message;
  args.errc = code;
  return cf->api->error_create(&args);
}

static xffi_error *xla_errorf(const xffi_call_frame *cf, xffi_error_code code,
                              const char *fmt, ...) {
  char message[DLB_ERROR_MESSAGE_SIZE + 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return xla_error(cf, code, message);
}

static xffi_error_code xla_code(int status) {
  switch (status) {
    case DLB_EINVAL: return XFFI_INVALID_ARGUMENT;
    case DLB_ENOMEM: return XFFI_RESOURCE_EXHAUSTED;
    case DLB_EOVERFLOW: return XFFI_OUT_OF_RANGE;
    case DLB_EUNSUPPORTED: return XFFI_UNIMPLEMENTED;
    case DLB_EVERSION: return XFFI_FAILED_PRECONDITION;
    case DLB_EDEVICE: return XFFI_INTERNAL;
    case DLB_EREADONLY: return XFFI_PERMISSION_DENIED;
    default: return XFFI_UNKNOWN;
  }
}

/* The DLPack dtype of each XLA element type it can describe the same way;
 * bits 0 for the others (sub-byte types XLA packs, tokens).  A table, not
 * a switch: it is read for every buffer of every call. */
#define XLA_DTYPE(x, c, b) [x] = {(uint8_t)(c), (uint8_t)(b), 1}
static const DLDataType xla_dtypes[XFFI_F8E8M0FNU + 1] = {
    XLA_DTYPE(XFFI_PRED, kDLBool, 8),
    XLA_DTYPE(XFFI_S8, kDLInt, 8),
    XLA_DTYPE(XFFI_S16, kDLInt, 16),
    XLA_DTYPE(XFFI_S32, kDLInt, 32),
    XLA_DTYPE(XFFI_S64, kDLInt, 64),
    XLA_DTYPE(XFFI_U8, kDLUInt, 8),
    XLA_DTYPE(XFFI_U16, kDLUInt, 16),
    XLA_DTYPE(XFFI_U32, kDLUInt, 32),
    XLA_DTYPE(XFFI_U64, kDLUInt, 64),
    XLA_DTYPE(XFFI_F16, kDLFloat, 16),
    XLA_DTYPE(XFFI_F32, kDLFloat, 32),
    XLA_DTYPE(XFFI_F64, kDLFloat, 64),
    XLA_DTYPE(XFFI_BF16, kDLBfloat, 16),
    XLA_DTYPE(XFFI_C64, kDLComplex, 64),
    XLA_DTYPE(XFFI_C128, kDLComplex, 128),
    XLA_DTYPE(XFFI_F8E5M2, kDLFloat8_e5m2, 8),
    XLA_DTYPE(XFFI_F8E4M3FN, kDLFloat8_e4m3fn, 8),
    XLA_DTYPE(XFFI_F8E4M3B11FNUZ, kDLFloat8_e4m3b11fnuz, 8),
    XLA_DTYPE(XFFI_F8E5M2FNUZ, kDLFloat8_e5m2fnuz, 8),
    XLA_DTYPE(XFFI_F8E4M3FNUZ, kDLFloat8_e4m3fnuz, 8),
    XLA_DTYPE(XFFI_F8E4M3, kDLFloat8_e4m3, 8),
    XLA_DTYPE(XFFI_F8E3M4, kDLFloat8_e3m4, 8),
    XLA_DTYPE(XFFI_F8E8M0FNU, kDLFloat8_e8m0fnu, 8),
};
#undef XLA_DTYPE

/* The DLPack dtype of an XLA element type; 0, or -1 for one a DLTensor
 * cannot describe the same way. */
static inline int xla_dtype(int xla, DLDataType *out) {
  if (xla < 0 || xla > XFFI_F8E8M0FNU || xla_dtypes[xla].bits == 0) return -1;
  *out = xla_dtypes[xla];
  return 0;
}

/* The identity attribute's bytes, or NULL.  A dlbridge call has one
 * attribute, a string: taken without reading its name, which saves the
 * reads of memory XLA keeps per call site (cold in a graph of many calls:
 * a third of the handler's time); a wrong string is an identity no
 * Function has.  Any other call is searched by name. */
static const xffi_byte_span *find_identity(const xffi_attrs *attrs) {
  static const char name[] = XLA_IDENTITY_ATTR;
  if (attrs->size == 1)
    return attrs->types[0] == XFFI_ATTR_STRING
               ? (const xffi_byte_span *)attrs->attrs[0]
               : NULL;
  for (int64_t i = 0; i < attrs->size; i++) {
    const xffi_byte_span *key = attrs->names[i];
    if (attrs->types[i] == XFFI_ATTR_STRING && key->len == sizeof name - 1 &&
        memcmp(key->ptr, name, sizeof name - 1) == 0)
      return (const xffi_byte_span *)attrs->attrs[i];
  }
  return NULL;
}

/* The Function named by identity (len bytes), or NULL.  In front of the
 * registry (whose lookup hashes the whole name, a chain of multiplies), a
 * per-thread memo of the last few names seen, compared byte for byte: a
 * graph calls few Functions, many times.  A registered Function lives
 * until exit, so a remembered one stays valid. */
#define XLA_MEMO_SLOTS 8
#define XLA_MEMO_NAME 64
typedef struct {
  size_t len;
  PyObject *fn;
  char name[XLA_MEMO_NAME];
} xla_memo;

static _Thread_local xla_memo memo[XLA_MEMO_SLOTS];

static PyObject *find_function(const char *identity, size_t len) {
  /* the last two characters are hex digits of the signature's hash */
  size_t slot = len >= 2 ? ((unsigned char)identity[len - 1] ^
                            ((unsigned char)identity[len - 2] << 2)) &
                               (XLA_MEMO_SLOTS - 1)
                         : 0;
  xla_memo *m = &memo[slot];
  if (m->fn != NULL && m->len == len && memcmp(m->name, identity, len) == 0)
    return m->fn;
  PyObject *fn = dlb__ops_find(identity, len);
  if (fn != NULL && len <= XLA_MEMO_NAME) {
    memcpy(m->name, identity, len);
    m->len = len;
    m->fn = fn;
  }
  return fn;
}

/* ---- 0-d inputs passed as scalar attributes ---------------------------------
 *
 * _ops_jax.py passes a Python number or NumPy constant for a 0-d input whose
 * dtype JAX would narrow (int64, uint64, float64 without jax_enable_x64) as a
 * typed scalar attribute "dlb_arg<i>" instead of an operand: the kernel gets
 * it as the eager call gives a number, a 0-d host tensor of the value in the
 * parameter's dtype (the signature check below compares the dtype). */

/* The input index of scalar attribute name key, or -1 for another name. */
static int scalar_attr_index(const xffi_byte_span *key) {
  static const char prefix[] = XLA_SCALAR_ATTR;
  const size_t n = sizeof prefix - 1;
  if (key->len <= n || key->len > n + 9 || memcmp(key->ptr, prefix, n) != 0)
    return -1;
  int index = 0;
  for (size_t c = n; c < key->len; c++) {
    if (key->ptr[c] < '0' || key->ptr[c] > '9') return -1;
    index = index * 10 + (key->ptr[c] - '0');
  }
  return index;
}

/* Fill slot[i] (NULL for an operand) with the scalar attribute of each 0-d
 * input i given as one, its tensor at scalars[k]; *count the number found.
 * Status; err says which attribute is wrong (the caller names the
 * Function). */
static int scalar_inputs(const xffi_attrs *attrs,
                         const dlb_signature_param *params, int32_t nin,
                         DLTensor *scalars, DLTensor **slot, int32_t *count,
                         dlb_error *err) {
  int32_t k = 0;
  for (int32_t i = 0; i < nin; i++) slot[i] = NULL;
  for (int64_t a = 0; a < attrs->size; a++) {
    const xffi_byte_span *key = attrs->names[a];
    int i = scalar_attr_index(key);
    if (i < 0) continue;
    if (attrs->types[a] != XFFI_ATTR_SCALAR || i >= nin ||
        params[i].ndim != 0 || params[i].mut || slot[i] != NULL)
      return dlb_error_set(err, DLB_EINVAL,
                           "attribute '%.*s' does not name a 0-d input the "
                           "signature takes as a number",
                           (int)key->len, key->ptr);
    const xffi_scalar *v = (const xffi_scalar *)attrs->attrs[a];
    DLTensor *t = &scalars[k++];
    if (xla_dtype(v->dtype, &t->dtype) < 0)
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "attribute '%.*s' has XLA element type %d",
                           (int)key->len, key->ptr, (int)v->dtype);
    if (t->dtype.code == kDLInt && t->dtype.bits == 64 &&
        params[i].dtype.code == kDLUInt && params[i].dtype.bits == 64)
      t->dtype = params[i].dtype; /* a uint64's bits, sent as an int64 */
    t->data = v->value; /* never written: the input is not `mut` */
    t->device.device_type = kDLCPU; /* a number is on the host, as eagerly */
    t->device.device_id = 0;
    t->ndim = 0;
    t->shape = NULL;
    t->strides = NULL;
    t->byte_offset = 0;
    slot[i] = t;
  }
  *count = k;
  return DLB_OK;
}

/* The loop_rank attribute (0 when the call has none) into *nloop.  Status;
 * err says what is wrong with it (the caller names the Function). */
static int loop_rank_attr(const xffi_attrs *attrs, int32_t *nloop,
                          dlb_error *err) {
  static const char name[] = XLA_LOOP_ATTR;
  *nloop = 0;
  for (int64_t a = 0; a < attrs->size; a++) {
    const xffi_byte_span *key = attrs->names[a];
    if (key->len != sizeof name - 1 || memcmp(key->ptr, name, key->len) != 0)
      continue;
    const xffi_scalar *v = (const xffi_scalar *)attrs->attrs[a];
    int64_t rank = -1;
    if (attrs->types[a] == XFFI_ATTR_SCALAR) {
      switch (v->dtype) {
        case XFFI_S64: memcpy(&rank, v->value, sizeof rank); break;
        case XFFI_S32: {
          int32_t r;
          memcpy(&r, v->value, sizeof r);
          rank = r;
          break;
        }
        default: break;
      }
    }
    if (rank < 0 || rank > DLB_MAX_NDIM)
      return dlb_error_set(err, DLB_EINVAL,
                           "attribute '" XLA_LOOP_ATTR "' must be an int32 "
                           "or int64 scalar from 0 to %d (how many leading "
                           "dims are loop dims)",
                           DLB_MAX_NDIM);
    *nloop = (int32_t)rank;
  }
  return DLB_OK;
}

/* The metadata query XLA makes once, at registration: the version we were
 * written against and no traits (see the header comment).  1 when cf was
 * the query. */
static int answer_metadata(xffi_call_frame *cf) {
  xffi_extension *ext = cf->extension_start;
  if (ext == NULL || ext->type != XFFI_EXTENSION_METADATA) return 0;
  xffi_metadata *m = ((xffi_metadata_extension *)ext)->metadata;
  m->api_version.major_version = XFFI_DECLARED_MAJOR;
  m->api_version.minor_version = XFFI_DECLARED_MINOR;
  m->traits = 0;
  return 1;
}

/* Buffer b as DLTensor t on the host (the caller sets the device), its
 * compact row-major strides stored at strides.  Status; err says what is
 * wrong with "<what> <index>" (the caller names the Function). */
static int buffer_tensor(const xffi_buffer *b, DLTensor *t, int64_t *strides,
                         const char *what, int index, dlb_error *err) {
  if (b->struct_size < XFFI_SIZE(xffi_buffer, dims))
    return dlb_error_set(err, DLB_EVERSION,
                         "XLA passed %s %d in a buffer struct of %zu bytes; "
                         "dlbridge reads %zu",
                         what, index, b->struct_size,
                         XFFI_SIZE(xffi_buffer, dims));
  if (xla_dtype(b->dtype, &t->dtype) < 0)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "%s %d has XLA element type %d, which a dlbridge "
                         "kernel cannot be given (sub-byte types are packed "
                         "by XLA)",
                         what, index, (int)b->dtype);
  if (b->rank < 0 || b->rank > DLB_MAX_NDIM)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "%s %d has %lld dimensions; at most %d are supported",
                         what, index, (long long)b->rank, DLB_MAX_NDIM);
  int64_t step = 1;
  for (int64_t a = b->rank - 1; a >= 0; a--) {
    strides[a] = step;
    step *= b->dims[a] > 1 ? b->dims[a] : 1;
  }
  t->data = b->data;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = (int32_t)b->rank;
  t->shape = b->rank > 0 ? b->dims : strides; /* never NULL */
  t->strides = strides;
  t->byte_offset = 0;
  return DLB_OK;
}

/* XLA's buffers list (operands or results) as DLTensors at t, strides from
 * *strides on (advanced).  Status, err as buffer_tensor's. */
static int buffer_tensors(int64_t size, const xffi_kind *kinds,
                          void *const *buffers, const char *what, DLTensor *t,
                          int64_t **strides, dlb_error *err) {
  for (int64_t i = 0; i < size; i++) {
    const xffi_buffer *b = (const xffi_buffer *)buffers[i];
    if (kinds[i] != XFFI_BUFFER_KIND)
      return dlb_error_set(err, DLB_EINVAL, "%s %d is not a buffer", what,
                           (int)i);
    int rc = buffer_tensor(b, &t[i], *strides, what, (int)i, err);
    if (rc != DLB_OK) return rc;
    *strides += b->rank;
  }
  return DLB_OK;
}

/* The device and stream of a CUDA call, from XLA; NULL, or XLA's error. */
static xffi_error *cuda_context(const xffi_call_frame *cf, const char *fname,
                                int32_t *device_id, void **stream) {
  const xffi_api *api = cf->api;
  if (api->struct_size < XFFI_SIZE(xffi_api, device_ordinal_get))
    return xla_errorf(cf, XFFI_FAILED_PRECONDITION,
                      "%s: this XLA cannot tell which GPU the call runs on "
                      "(no DeviceOrdinal_Get)",
                      fname);
  xffi_device_ordinal_get_args ordinal;
  memset(&ordinal, 0, sizeof ordinal);
  ordinal.struct_size = XFFI_SIZE(xffi_device_ordinal_get_args, device_ordinal);
  ordinal.ctx = cf->ctx;
  xffi_error *e = api->device_ordinal_get(&ordinal);
  if (e != NULL) return e; /* XLA's own error, passed on */
  *device_id = ordinal.device_ordinal;
  xffi_stream_get_args s;
  memset(&s, 0, sizeof s);
  s.struct_size = XFFI_SIZE(xffi_stream_get_args, stream);
  s.ctx = cf->ctx;
  e = api->stream_get(&s);
  if (e != NULL) return e;
  *stream = s.stream;
  return NULL;
}

/* ---- the call site's state: its attributes decoded once ------------------
 *
 * What a call's attributes say is the same on every run of one call site:
 * which Function, its 0-d inputs given as numbers, the loop rank.  The
 * instantiate stage (run_instantiate, once per call site when XLA builds
 * an executable) decodes them into an xla_state that XLA keeps for the
 * site; each execute call gets it back with one State_Get and reads no
 * attribute at all.  Where there is no state -- an XLA older than 0.3, an
 * executable made before the instantiate handler was registered, a
 * refused allocation, a call XLA makes another way -- execute decodes the
 * attributes itself, as it did before states existed, so every behaviour
 * and every error is the same either way.
 *
 * The Function: a state holds the pointer that the registry's entry owns
 * (a strong reference the registry keeps until exit: ops/registry.c never
 * clears an entry), so the Function outlives every state and a state takes
 * no reference of its own.  That keeps the GIL out of both stages and out
 * of the deleter, which XLA may call on any thread, at any time, also
 * while the interpreter finalises.  A call site whose identity is not
 * registered when it is instantiated gets a state without a Function, and
 * each of its calls looks the identity up again: registered by then, it
 * runs; else the call fails with today's NOT_FOUND error. */

typedef struct {
  int32_t input; /* the parameter it is */
  DLDataType dtype;
  union {
    int64_t align; /* as a number of any type needs */
    unsigned char bytes[16]; /* a copy: the widest type is 16 bytes */
  } value;
} xla_number;

/* The dtypes and shapes of one call that passed every check (the
 * signature's, the operand and result counts, the `mut` aliases): a call
 * with the same ones passes them too, so execute skips them and copies
 * the DLTensor headers built then, each given its buffer's data.  XLA's
 * shapes are static: a call site presents the same ones every time.
 * Written once (ready 0 -> 1 by the thread that claims it, 2 published,
 * release) and never changed again, so a reader that saw 2 (acquire)
 * reads it without a lock. */
#define XLA_SEEN_SLOTS 2   /* interned states serve sites of other shapes */
#define XLA_SEEN_TENSORS 8 /* operands and results */
#define XLA_SEEN_DIMS 32   /* their extents in all */

typedef struct {
  atomic_int ready; /* 0 free, 1 being written, 2 published */
  int32_t nargs, nrets, nattr;
  int32_t as_is; /* the kernel takes the headers unpadded (batch dims
                    included): dlb__function_runs_as_is said so */
  int32_t xdtype[XLA_SEEN_TENSORS]; /* XLA's element types */
  DLTensor tensor[XLA_SEEN_TENSORS]; /* data NULL; shape, strides below */
  int64_t dims[XLA_SEEN_DIMS];
  int64_t strides[XLA_SEEN_DIMS + 1]; /* + 1: a 0-d shape, never NULL */
} xla_seen;

typedef struct xla_state {
  /* what execute reads, first (one cache line) */
  PyObject *fn; /* the registry's (see above); NULL: look it up per call */
  const char *fname;
  const dlb_signature_param *params;
  int32_t nin, nout, nmut, nloop, nscalar;
  /* the interning, under intern_lock */
  int64_t users;          /* call sites XLA keeps it for */
  struct xla_state *next; /* in interned */
  const dlb_allocator *allocator; /* made this block; releases it */
  xla_seen seen[XLA_SEEN_SLOTS];
  xla_number numbers[]; /* nscalar of them */
} xla_state;

/* States are interned: call sites that decode to the same state (same
 * Function, numbers and loop rank: a graph of many calls of one Function)
 * share one block, which stays in cache from one call to the next, where
 * a block per site would be one more cold read per call.  XLA calls the
 * deleter once per site; the last one frees the block. */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static xla_state *interned;

/* The state of a site whose Function is not known yet (or whose state
 * could not be allocated): decode per call.  Shared, never freed. */
static xla_state decode_per_call;

static int same_state(const xla_state *a, const xla_state *b) {
  if (a->fn != b->fn || a->nloop != b->nloop || a->nscalar != b->nscalar)
    return 0;
  for (int32_t k = 0; k < a->nscalar; k++) {
    const xla_number *x = &a->numbers[k], *y = &b->numbers[k];
    if (x->input != y->input || x->dtype.code != y->dtype.code ||
        x->dtype.bits != y->dtype.bits || x->dtype.lanes != y->dtype.lanes ||
        memcmp(x->value.bytes, y->value.bytes, sizeof x->value.bytes) != 0)
      return 0;
  }
  return 1;
}

/* st itself, interned, or the equal state interned already (st freed). */
static xla_state *intern_state(xla_state *st) {
  pthread_mutex_lock(&intern_lock);
  xla_state *found = interned;
  while (found != NULL && !same_state(found, st)) found = found->next;
  if (found != NULL) {
    found->users++;
  } else {
    st->users = 1;
    st->next = interned;
    interned = st;
  }
  pthread_mutex_unlock(&intern_lock);
  if (found == NULL) return st;
  st->allocator->release(st, st->allocator->ctx);
  return found;
}

/* XLA's deleter of a state, once per call site: any thread, no GIL. */
static void xla_state_delete(void *object) {
  xla_state *st = (xla_state *)object;
  if (st == NULL || st == &decode_per_call) return;
  pthread_mutex_lock(&intern_lock);
  int last = --st->users == 0;
  if (last) {
    xla_state **at = &interned;
    while (*at != NULL && *at != st) at = &(*at)->next;
    if (*at == st) *at = st->next;
  }
  pthread_mutex_unlock(&intern_lock);
  if (last) st->allocator->release(st, st->allocator->ctx);
}

static const xffi_type_info xla_state_info = {
    XFFI_SIZE(xffi_type_info, deleter), NULL, xla_state_delete};

/* The state type as registered with one XLA per platform handler (the host
 * and CUDA can be two XLA instances: jaxlib's, a GPU plugin's, each with
 * its own type registry).  api is published (release) after id is set and
 * never changes again; a call from another XLA runs without a state. */
typedef struct {
  _Atomic(const xffi_api *) api;
  xffi_type_id id;
} xla_state_type;

static xla_state_type state_types[2]; /* [0] host, [1] CUDA */
static pthread_mutex_t state_types_lock = PTHREAD_MUTEX_INITIALIZER;

static void destroy_error(const xffi_api *api, xffi_error *e) {
  xffi_error_destroy_args d;
  memset(&d, 0, sizeof d);
  d.struct_size = XFFI_SIZE(xffi_error_destroy_args, error);
  d.error = e;
  api->error_destroy(&d);
}

/* Whether api has the state calls with the layout above: 0.3 and later
 * (0.1 had another State_Set and TypeId_Register; 0.2 is not known). */
static int call_state_supported(const xffi_api *api) {
  return api != NULL && api->struct_size >= XFFI_SIZE(xffi_api, state_get) &&
         api->api_version.major_version == 0 &&
         api->api_version.minor_version >= 3 && api->error_destroy != NULL &&
         api->type_register != NULL && api->state_set != NULL &&
         api->state_get != NULL;
}

/* The state type of platform (0 host, 1 CUDA) in api's XLA, registered on
 * first use; NULL when it is registered with another XLA or XLA refused
 * it (execute then decodes per call). */
static xffi_type_id *state_type(const xffi_api *api, int platform) {
  xla_state_type *t = &state_types[platform];
  const xffi_api *known = atomic_load_explicit(&t->api, memory_order_acquire);
  if (known != NULL) return known == api ? &t->id : NULL;
  static const char *const names[2] = {"dlbridge.xla_call_state.host",
                                       "dlbridge.xla_call_state.cuda"};
  xffi_type_id *result = NULL;
  pthread_mutex_lock(&state_types_lock);
  known = atomic_load_explicit(&t->api, memory_order_relaxed);
  if (known != NULL) {
    result = known == api ? &t->id : NULL;
  } else {
    xffi_type_register_args r;
    memset(&r, 0, sizeof r);
    r.struct_size = XFFI_SIZE(xffi_type_register_args, type_info);
    r.name.ptr = names[platform];
    r.name.len = strlen(names[platform]);
    t->id.type_id = 0; /* XLA assigns one */
    r.type_id = &t->id;
    r.type_info = &xla_state_info;
    xffi_error *e = api->type_register(&r);
    if (e != NULL) {
      destroy_error(api, e); /* decode per call; asked again next time */
    } else if (t->id.type_id != 0) {
      atomic_store_explicit(&t->api, api, memory_order_release);
      result = &t->id;
    }
  }
  pthread_mutex_unlock(&state_types_lock);
  return result;
}

/* The state of a call site with attributes attrs: an interned one, or
 * &decode_per_call when the Function is not registered, an attribute does
 * not decode (execute then says what is wrong in its own words) or the
 * core's allocator refuses the block. */
static xla_state *make_state(const xffi_attrs *attrs) {
  const xffi_byte_span *id = find_identity(attrs);
  PyObject *fn = id != NULL ? dlb__ops_find(id->ptr, id->len) : NULL;
  if (fn == NULL) return &decode_per_call;
  const dlb_allocator *allocator = dlb_get_allocator();
  const int64_t nattr = attrs->size > 1 ? attrs->size - 1 : 0;
  xla_state *st = (xla_state *)allocator->alloc(
      sizeof *st + (size_t)nattr * sizeof(xla_number), allocator->ctx);
  if (st == NULL) return &decode_per_call;
  memset(st, 0, sizeof *st + (size_t)nattr * sizeof(xla_number));
  for (int k = 0; k < XLA_SEEN_SLOTS; k++) atomic_init(&st->seen[k].ready, 0);
  st->allocator = allocator;
  int32_t nin, nout, nmut = 0, nscalar = 0, nloop = 0;
  const dlb_signature_param *params = dlb__function_params(fn, &nin, &nout);
  for (int32_t i = 0; i < nin; i++) nmut += params[i].mut != 0;
  if (nattr > 0) {
    /* the decoders execute uses, on scratch space, then the numbers
     * copied: XLA's attribute storage is not promised to stay put */
    void *scratch = allocator->alloc(
        (size_t)nattr * sizeof(DLTensor) + (size_t)nin * sizeof(DLTensor *) + 1,
        allocator->ctx);
    if (scratch == NULL) {
      allocator->release(st, allocator->ctx);
      return &decode_per_call;
    }
    DLTensor *scalars = (DLTensor *)scratch;
    DLTensor **slot = (DLTensor **)(scalars + nattr);
    dlb_error err;
    err.code = DLB_OK;
    int rc = scalar_inputs(attrs, params, nin, scalars, slot, &nscalar, &err);
    if (rc == DLB_OK) rc = loop_rank_attr(attrs, &nloop, &err);
    for (int32_t i = 0, k = 0; rc == DLB_OK && i < nin; i++) {
      if (slot[i] == NULL) continue;
      xla_number *n = &st->numbers[k++];
      n->input = i;
      n->dtype = slot[i]->dtype;
      memcpy(n->value.bytes, slot[i]->data,
             ((size_t)slot[i]->dtype.bits + 7) / 8);
    }
    allocator->release(scratch, allocator->ctx);
    if (rc != DLB_OK) {
      allocator->release(st, allocator->ctx);
      return &decode_per_call;
    }
  }
  st->fname = dlb__function_name(fn);
  st->params = params;
  st->nin = nin;
  st->nout = nout;
  st->nmut = nmut;
  st->nloop = nloop;
  st->nscalar = nscalar;
  st->fn = fn;
  return intern_state(st);
}

/* The instantiate stage, once per call site: the site's state, set for
 * XLA to keep.  Never an error: whatever does not work here is left to
 * execute, which decodes per call (see above). */
static xffi_error *run_instantiate(xffi_call_frame *cf, int platform) {
  if (answer_metadata(cf)) return NULL;
  if (cf->struct_size < XFFI_SIZE(xffi_call_frame, attrs) ||
      !call_state_supported(cf->api))
    return NULL;
  xffi_type_id *type = state_type(cf->api, platform);
  if (type == NULL) return NULL;
  xla_state *st = make_state(&cf->attrs);
  xffi_state_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = XFFI_SIZE(xffi_state_args, state);
  a.ctx = cf->ctx;
  a.stage = XFFI_STAGE_INSTANTIATE;
  a.type_id = type;
  a.state = st;
  xffi_error *e = cf->api->state_set(&a);
  if (e != NULL) { /* XLA did not take it */
    destroy_error(cf->api, e);
    xla_state_delete(st);
  }
  return NULL;
}

/* The state of the call site cf runs, or NULL (decode per call). */
static xla_state *call_state(const xffi_call_frame *cf, int platform) {
  xla_state_type *t = &state_types[platform];
  const xffi_api *api = atomic_load_explicit(&t->api, memory_order_acquire);
  if (api == NULL || api != cf->api) return NULL;
  xffi_state_args a;
  a.struct_size = XFFI_SIZE(xffi_state_args, state);
  a.extension_start = NULL;
  a.ctx = cf->ctx;
  a.stage = XFFI_STAGE_INSTANTIATE;
  a.type_id = &t->id;
  a.state = NULL;
  xffi_error *e = api->state_get(&a);
  if (e != NULL) { /* an executable made before instantiate was known */
    destroy_error(api, e);
    return NULL;
  }
  return (xla_state *)a.state;
}

/* The slot of st that saw the dtypes and shapes of cf's buffers (nattr:
 * its attributes but the identity), or NULL. */
static const xla_seen *seen_match(const xla_state *st,
                                  const xffi_call_frame *cf, int64_t nattr) {
  const int64_t nargs = cf->args.size, nrets = cf->rets.size;
  for (int k = 0; k < XLA_SEEN_SLOTS; k++) {
    const xla_seen *s = &st->seen[k];
    if (atomic_load_explicit(&s->ready, memory_order_acquire) != 2) continue;
    if (s->nargs != nargs || s->nrets != nrets || s->nattr != nattr)
      continue;
    int64_t i = 0;
    for (; i < nargs + nrets; i++) {
      const int in = i < nargs;
      const xffi_kind kind = in ? cf->args.types[i] : cf->rets.types[i - nargs];
      const xffi_buffer *b = (const xffi_buffer *)(
          in ? cf->args.args[i] : cf->rets.rets[i - nargs]);
      const DLTensor *t = &s->tensor[i];
      if (kind != XFFI_BUFFER_KIND ||
          b->struct_size < XFFI_SIZE(xffi_buffer, dims) ||
          (int32_t)b->dtype != s->xdtype[i] || b->rank != t->ndim)
        break;
      int32_t a = 0; /* a loop, not memcmp: a few extents, no call */
      while (a < t->ndim && b->dims[a] == t->shape[a]) a++;
      if (a < t->ndim) break;
    }
    if (i == nargs + nrets) return s;
  }
  return NULL;
}

/* Keep the dtypes and shapes of a call that passed every check in a free
 * slot of st (none free, or too many to keep: nothing). */
static void seen_record(xla_state *st, const xffi_call_frame *cf,
                        int64_t nattr, const DLTensor *tensors, int as_is) {
  const int64_t nargs = cf->args.size, nrets = cf->rets.size;
  /* run_seen builds every header, the numbers' too, on its stack (the
   * caller records inline-sized calls only; said here where it matters) */
  if (nargs + nrets > XLA_SEEN_TENSORS ||
      nargs + nrets + nattr > XLA_INLINE_TENSORS)
    return;
  int64_t ndims = 0;
  for (int64_t i = 0; i < nargs + nrets; i++) ndims += tensors[i].ndim;
  if (ndims > XLA_SEEN_DIMS) return;
  for (int k = 0; k < XLA_SEEN_SLOTS; k++) {
    xla_seen *s = &st->seen[k];
    int expected = 0;
    if (!atomic_compare_exchange_strong_explicit(&s->ready, &expected, 1,
                                                 memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    s->nargs = (int32_t)nargs;
    s->nrets = (int32_t)nrets;
    s->nattr = (int32_t)nattr;
    s->as_is = as_is;
    int64_t at = 0;
    for (int64_t i = 0; i < nargs + nrets; i++) {
      const xffi_buffer *b = (const xffi_buffer *)(
          i < nargs ? cf->args.args[i] : cf->rets.rets[i - nargs]);
      const DLTensor *from = &tensors[i];
      DLTensor *t = &s->tensor[i];
      s->xdtype[i] = (int32_t)b->dtype;
      *t = *from;
      t->data = NULL;
      t->device.device_type = kDLCPU;
      t->device.device_id = 0;
      memcpy(&s->dims[at], from->shape, (size_t)from->ndim * sizeof(int64_t));
      memcpy(&s->strides[at], from->strides,
             (size_t)from->ndim * sizeof(int64_t));
      t->shape = from->ndim > 0 ? &s->dims[at] : &s->strides[at];
      t->strides = &s->strides[at];
      at += from->ndim;
    }
    atomic_store_explicit(&s->ready, 2, memory_order_release);
    return;
  }
}

/* argv[i] NULL for every input, then the headers of the state's numbers
 * (0-d, on the host, as scalar_inputs gives them) in at, argv[input] each
 * pointing at its own. */
static void state_numbers(const xla_state *st, int32_t nin, DLTensor *at,
                          DLTensor **argv) {
  for (int32_t i = 0; i < nin; i++) argv[i] = NULL;
  for (int32_t k = 0; k < st->nscalar; k++) {
    const xla_number *n = &st->numbers[k];
    DLTensor *t = &at[k];
    t->data = (void *)n->value.bytes; /* never written: not `mut` */
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    t->dtype = n->dtype;
    t->ndim = 0;
    t->shape = NULL;
    t->strides = NULL;
    t->byte_offset = 0;
    argv[n->input] = t;
  }
}

/* The call's CUDA device and stream (cuda_context), the first n tensors
 * (XLA's buffers) marked as on that device. */
static xffi_error *on_cuda(const xffi_call_frame *cf, const char *fname,
                           DLTensor *tensors, int64_t n, void **stream) {
  int32_t device_id = 0;
  xffi_error *e = cuda_context(cf, fname, &device_id, stream);
  if (e != NULL) return e;
  for (int64_t i = 0; i < n; i++) {
    tensors[i].device.device_type = kDLCUDA;
    tensors[i].device.device_id = device_id;
  }
  return NULL;
}

/* Inputs in signature order into argv: an operand each (tensors[0..nargs)),
 * but an input given as a scalar attribute (argv[i] already); a `mut`
 * input is the result XLA aliased with it (after the nout results), which
 * the kernel updates -- the input copied into it when XLA did not alias
 * them.  *mut_unlike is set when a `mut` input and its result are shaped
 * unlike (always found out: a call recorded as seen has them alike); an
 * unaliased unlike pair is refused. */
static int bind_inputs(const dlb_signature_param *params, int32_t nin,
                       int64_t nargs, int32_t nout, DLTensor *tensors,
                       DLTensor **argv, int device_type, void *stream,
                       int *mut_unlike, dlb_error *err) {
  int rc = DLB_OK;
  for (int32_t i = 0, j = 0, k = 0; i < nin && rc == DLB_OK; i++) {
    if (argv[i] != NULL) continue;
    DLTensor *input = &tensors[j++];
    argv[i] = input;
    if (!params[i].mut) continue;
    DLTensor *updated = &tensors[nargs + nout + k++];
    const int alike = updated->ndim == input->ndim &&
                      memcmp(updated->shape, input->shape,
                             (size_t)updated->ndim * sizeof(int64_t)) == 0 &&
                      updated->dtype.code == input->dtype.code &&
                      updated->dtype.bits == input->dtype.bits;
    *mut_unlike |= !alike;
    if (updated->data != input->data) {
      if (!alike)
        rc = dlb_error_set(err, DLB_EINVAL,
                           "the result XLA aliased with mut argument %d is "
                           "not shaped like it",
                           (int)i);
      else if (device_type == kDLCUDA)
        rc = dlb_cuda_copy(updated, input, stream, err);
      else
        rc = dlb_copy(updated, input, err);
    }
    argv[i] = updated;
  }
  return rc;
}

/* A call whose dtypes and shapes slot s of st saw pass (seen_match): the
 * headers from s, the data from cf, then what run_call does after its
 * checks, in the same order, with the same errors -- the batch rule's
 * padding skipped when s saw the kernel take the headers as they are. */
static xffi_error *run_seen(xffi_call_frame *cf, const xla_state *st,
                            const xla_seen *s, int device_type) {
  DLTensor tensors[XLA_INLINE_TENSORS];
  DLTensor *argv[XLA_INLINE_TENSORS];
  const int32_t nargs = s->nargs, nrets = s->nrets, nin = st->nin,
                nout = st->nout;
  dlb_error err;
  err.code = DLB_OK;
  err.message[0] = '\0';
  for (int32_t i = 0; i < nargs; i++) {
    tensors[i] = s->tensor[i];
    tensors[i].data = ((const xffi_buffer *)cf->args.args[i])->data;
  }
  for (int32_t i = 0; i < nrets; i++) {
    tensors[nargs + i] = s->tensor[nargs + i];
    tensors[nargs + i].data = ((const xffi_buffer *)cf->rets.rets[i])->data;
  }
  state_numbers(st, nin, &tensors[nargs + nrets], argv);
  void *stream = NULL;
  if (device_type == kDLCUDA) {
    xffi_error *e = on_cuda(cf, st->fname, tensors, nargs + nrets, &stream);
    if (e != NULL) return e;
  }
  int mut_unlike = 0; /* cannot be set: checked when seen */
  int rc = bind_inputs(st->params, nin, nargs, nout, tensors, argv,
                       device_type, stream, &mut_unlike, &err);
  if (rc != DLB_OK) {
    err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    return xla_errorf(cf, xla_code(rc), "%s: %s", st->fname, err.message);
  }
  for (int32_t o = 0; o < nout; o++) argv[nin + o] = &tensors[nargs + o];
  rc = s->as_is
           ? dlb__function_run_as_is(st->fn, argv, nin + nout, stream, &err)
           : dlb__function_run_checked(st->fn, argv, nin + nout, stream, &err);
  if (rc != DLB_OK) {
    err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    return xla_error(cf, xla_code(rc), err.message); /* named already */
  }
  return NULL;
}

/* The execute call, on one platform (device type kDLCPU or kDLCUDA).
 *
 * With the call site's state (call_state), the Function and what the
 * attributes say come from one block made at instantiation, and no
 * attribute is read.  Without it the order is for speed: XLA keeps a
 * call's attributes and buffers per call site, memory that a graph of
 * many calls finds cold, and the Function is reached through the identity
 * attribute, a chain of dependent reads.  So the chain is started first
 * and the buffers are read while it is in flight; the bytes of the
 * identity are read last.  (With find_function's memo, in a graph of
 * 1,000 calls, this took the handler from about 95 to about 75 ns a call
 * over a handler that does nothing: bench/bench_compiled.py.) */
static xffi_error *run_call(xffi_call_frame *cf, int device_type) {
  if (answer_metadata(cf)) return NULL;
  xffi_error *result = NULL;
  void *block = NULL;
  /* the core's allocator, which tests make fail (_fail_allocations) */
  const dlb_allocator *allocator = dlb_get_allocator();
  dlb_error err;
  err.code = DLB_OK;
  err.message[0] = '\0';

  if (cf->struct_size < XFFI_SIZE(xffi_call_frame, attrs))
    return xla_errorf(cf, XFFI_FAILED_PRECONDITION,
                      "dlbridge: XLA's call frame has %zu bytes; dlbridge "
                      "reads %zu (an XLA older than dlbridge supports)",
                      cf->struct_size, XFFI_SIZE(xffi_call_frame, attrs));
  /* at most this many 0-d inputs come as scalar attributes (all but the
   * identity); the usual call has none and reads no attribute for them */
  const int64_t nattr = cf->attrs.size > 1 ? cf->attrs.size - 1 : 0;
  xla_state *st = call_state(cf, device_type == kDLCUDA);
  if (st != NULL && (st->fn == NULL || st->nscalar > nattr))
    st = NULL; /* decode per call */
  if (st != NULL && st->nloop == 0) {
    const xla_seen *seen = seen_match(st, cf, nattr);
    if (seen != NULL) return run_seen(cf, st, seen, device_type);
  }
  const xffi_byte_span *id = st == NULL ? find_identity(&cf->attrs) : NULL;

  /* Every operand then every result as a DLTensor, on the host for now. */
  const int64_t nargs = cf->args.size, nrets = cf->rets.size;
  int64_t extents = 0;
  for (int64_t i = 0; i < nargs + nrets; i++) {
    const xffi_buffer *b = (const xffi_buffer *)(
        i < nargs ? cf->args.args[i] : cf->rets.rets[i - nargs]);
    if (b->struct_size >= XFFI_SIZE(xffi_buffer, dims) && b->rank > 0 &&
        b->rank <= DLB_MAX_NDIM)
      extents += b->rank;
  }
  DLTensor tensors_inline[XLA_INLINE_TENSORS];
  DLTensor *argv_inline[XLA_INLINE_TENSORS];
  int64_t strides_inline[XLA_INLINE_EXTENTS + 1]; /* + 1: never NULL */
  DLTensor *tensors = tensors_inline;
  DLTensor **argv = argv_inline;
  int64_t *strides = strides_inline;
  if (nargs < 0 || nrets < 0 || nargs + nrets + nattr > XLA_INLINE_TENSORS ||
      extents > XLA_INLINE_EXTENTS) {
    size_t count = (size_t)(nargs > 0 ? nargs : 0) +
                   (size_t)(nrets > 0 ? nrets : 0) + (size_t)nattr;
    if (count == 0) count = 1;
    block = allocator->alloc(count * (sizeof(DLTensor) + sizeof(DLTensor *)) +
                                 ((size_t)extents + 1) * sizeof(int64_t),
                             allocator->ctx);
    if (block == NULL)
      return xla_errorf(cf, XFFI_RESOURCE_EXHAUSTED,
                        "dlbridge: out of memory for a call of %lld tensors",
                        (long long)(nargs + nrets));
    tensors = (DLTensor *)block;
    argv = (DLTensor **)(tensors + count);
    strides = (int64_t *)(argv + count);
  }
  int64_t *next_strides = strides;
  int rc = buffer_tensors(nargs, cf->args.types, cf->args.args, "operand",
                          tensors, &next_strides, &err);
  if (rc == DLB_OK)
    rc = buffer_tensors(nrets, cf->rets.types, cf->rets.rets, "result",
                        tensors + nargs, &next_strides, &err);

  /* The Function. */
  PyObject *fn;
  const char *fname;
  int32_t nin, nout, nmut = 0, nscalar = 0, nloop = 0;
  const dlb_signature_param *params;
  if (st != NULL) {
    fn = st->fn;
    fname = st->fname;
    params = st->params;
    nin = st->nin;
    nout = st->nout;
    nmut = st->nmut;
    if (nin <= nargs + nattr) { /* else too few operands: refused below */
      state_numbers(st, nin, &tensors[nargs + nrets], argv);
      nscalar = st->nscalar;
      nloop = st->nloop;
    }
    goto counted;
  }
  if (id == NULL) {
    result = xla_error(cf, XFFI_INVALID_ARGUMENT,
                       "dlbridge: a custom call to dlbridge's XLA target "
                       "without the '" XLA_IDENTITY_ATTR "' attribute; only "
                       "calls made by a dlbridge.Function can run it");
    goto cleanup;
  }
  fn = find_function(id->ptr, id->len);
  if (fn == NULL) {
    result = xla_errorf(
        cf, XFFI_NOT_FOUND,
        "dlbridge: the graph calls the dlbridge Function '%.*s', which this "
        "process has not registered: create the same Function (same kernel "
        "and signature) and pass it to dlbridge.jax_register() before "
        "running a graph exported from another process",
        (int)(id->len < 200 ? id->len : 200), id->ptr);
    goto cleanup;
  }
  fname = dlb__function_name(fn);
  params = dlb__function_params(fn, &nin, &nout);
  for (int32_t i = 0; i < nin; i++) nmut += params[i].mut != 0;
  /* argv[i]: input i's scalar attribute, or NULL for an operand */
  if (nin <= nargs + nattr) { /* else too few operands: refused below */
    int src = DLB_OK;
    if (nattr > 0) {
      src = scalar_inputs(&cf->attrs, params, nin, tensors + nargs + nrets,
                          argv, &nscalar, &err);
      if (src == DLB_OK) src = loop_rank_attr(&cf->attrs, &nloop, &err);
    } else {
      for (int32_t i = 0; i < nin; i++) argv[i] = NULL;
    }
    if (src != DLB_OK) {
      rc = src;
      goto named;
    }
  }
counted:
  if (nargs + nscalar != nin || nrets != (int64_t)nout + nmut) {
    char numbers[48] = "";
    if (nscalar > 0)
      snprintf(numbers, sizeof numbers, " (and %d numbers)", (int)nscalar);
    result = xla_errorf(cf, XFFI_INVALID_ARGUMENT,
                        "%s: XLA passed %lld operands%s and %lld results; the "
                        "signature has %d parameters (%d of them mut) and %d "
                        "results",
                        fname, (long long)nargs, numbers, (long long)nrets,
                        (int)nin, (int)nmut, (int)nout);
    goto cleanup;
  }
  if (rc != DLB_OK) goto named;

  int mut_unlike = 0; /* a `mut` input and its result differ in shape */
  void *stream = NULL;
  if (device_type == kDLCUDA) {
    result = on_cuda(cf, fname, tensors, nargs + nrets, &stream);
    if (result != NULL) goto cleanup;
  }

  rc = bind_inputs(params, nin, nargs, nout, tensors, argv, device_type,
                   stream, &mut_unlike, &err);
  if (rc != DLB_OK) goto named;
  for (int32_t o = 0; o < nout; o++) argv[nin + o] = &tensors[nargs + o];
  /* under a vmap the signature cannot batch: one run per loop item */
  if (nloop > 0) {
    rc = dlb__function_run_looped(fn, argv, nin + nout, nloop, stream, &err);
  } else {
    rc = dlb__function_check_run(fn, argv, nin + nout, &err);
    /* passed: a later call of these dtypes and shapes skips the checks */
    if (rc == DLB_OK && st != NULL && block == NULL && !mut_unlike)
      seen_record(st, cf, nattr, tensors,
                  dlb__function_runs_as_is(fn, argv, nin + nout));
    if (rc == DLB_OK)
      rc = dlb__function_run_checked(fn, argv, nin + nout, stream, &err);
  }
  if (rc != DLB_OK) {
    err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    result = xla_error(cf, xla_code(rc), err.message); /* named already */
  }
  goto cleanup;
named:
  err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
  result = xla_errorf(cf, xla_code(rc), "%s: %s", fname, err.message);
cleanup:
  if (block != NULL) allocator->release(block, allocator->ctx);
  return result;
}

static xffi_error *xla_cpu_handler(xffi_call_frame *cf) {
  return run_call(cf, kDLCPU);
}

static xffi_error *xla_cuda_handler(xffi_call_frame *cf) {
  return run_call(cf, kDLCUDA);
}

static xffi_error *xla_cpu_instantiate(xffi_call_frame *cf) {
  return run_instantiate(cf, 0);
}

static xffi_error *xla_cuda_instantiate(xffi_call_frame *cf) {
  return run_instantiate(cf, 1);
}

/* The floor the benchmarks subtract (bench/bench_compiled.py): the
 * metadata answer, then nothing. */
static xffi_error *xla_noop_handler(xffi_call_frame *cf) {
  (void)answer_metadata(cf);
  return NULL;
}

/* ---- Python: the handlers as capsules, the layout for the tests ------------ */

/* _core._xla_handler(platform) -> an unnamed PyCapsule holding the handler
 * for platform "cpu" or "cuda", as jax.ffi.register_ffi_target takes it
 * ("noop": a handler that does nothing, for the benchmarks). */
static PyObject *py_xla_handler(PyObject *module, PyObject *platform) {
  (void)module;
  xffi_handler *handler;
  if (!PyUnicode_Check(platform)) {
    PyErr_Format(PyExc_TypeError, "_xla_handler() takes a str, not %.100s",
                 Py_TYPE(platform)->tp_name);
    return NULL;
  }
  if (PyUnicode_CompareWithASCIIString(platform, "cpu") == 0) {
    handler = xla_cpu_handler;
  } else if (PyUnicode_CompareWithASCIIString(platform, "cuda") == 0) {
    handler = xla_cuda_handler;
  } else if (PyUnicode_CompareWithASCIIString(platform, "noop") == 0) {
    handler = xla_noop_handler;
  } else {
    PyErr_Format(PyExc_ValueError,
                 "_xla_handler(): no handler for platform %R (\"cpu\" or "
                 "\"cuda\")",
                 platform);
    return NULL;
  }
  void *ptr;
  memcpy(&ptr, &handler, sizeof ptr);
  /* Unnamed: older jaxlib reads the pointer with a NULL name. */
  return PyCapsule_New(ptr, NULL, NULL);
}

static PyObject *handler_capsule(xffi_handler *handler) {
  void *ptr;
  memcpy(&ptr, &handler, sizeof ptr);
  return PyCapsule_New(ptr, NULL, NULL);
}

/* _core._xla_handlers(platform) -> {"instantiate": capsule, "execute":
 * capsule}: the bundle jax.ffi.register_ffi_target takes as a dict, for
 * platform "cpu" or "cuda" (the instantiate stage decodes each call
 * site's attributes once: xla_state). */
static PyObject *py_xla_handlers(PyObject *module, PyObject *platform) {
  (void)module;
  xffi_handler *instantiate, *execute;
  if (PyUnicode_Check(platform) &&
      PyUnicode_CompareWithASCIIString(platform, "cpu") == 0) {
    instantiate = xla_cpu_instantiate;
    execute = xla_cpu_handler;
  } else if (PyUnicode_Check(platform) &&
             PyUnicode_CompareWithASCIIString(platform, "cuda") == 0) {
    instantiate = xla_cuda_instantiate;
    execute = xla_cuda_handler;
  } else {
    PyErr_Format(PyExc_ValueError,
                 "_xla_handlers(): no handlers for platform %R (\"cpu\" or "
                 "\"cuda\")",
                 platform);
    return NULL;
  }
  PyObject *d = PyDict_New(), *cap = NULL;
  if (d == NULL) return NULL;
  if ((cap = handler_capsule(instantiate)) == NULL ||
      PyDict_SetItemString(d, "instantiate", cap) < 0)
    goto fail;
  Py_DECREF(cap);
  if ((cap = handler_capsule(execute)) == NULL ||
      PyDict_SetItemString(d, "execute", cap) < 0)
    goto fail;
  Py_DECREF(cap);
  return d;
fail:
  Py_XDECREF(cap);
  Py_DECREF(d);
  return NULL;
}

/* _core._xla_ffi_layout() -> {C expression in jaxlib's c_api.h: value in
 * our transcription}: offsets, struct sizes and enum values, for the test
 * that compiles the same expressions against the installed header. */
static PyObject *py_xla_ffi_layout(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
#define XFFI_ITEM(expr, value) {expr, (long long)(value)}
  static const struct {
    const char *expr;
    long long value;
  } items[] = {
      XFFI_ITEM("XLA_FFI_Extension_Metadata", XFFI_EXTENSION_METADATA),
      XFFI_ITEM("offsetof(XLA_FFI_Metadata_Extension, metadata)",
                offsetof(xffi_metadata_extension, metadata)),
      XFFI_ITEM("offsetof(XLA_FFI_Metadata, api_version)",
                offsetof(xffi_metadata, api_version)),
      XFFI_ITEM("offsetof(XLA_FFI_Metadata, traits)",
                offsetof(xffi_metadata, traits)),
      XFFI_ITEM("offsetof(XLA_FFI_Api_Version, major_version)",
                offsetof(xffi_api_version, major_version)),
      XFFI_ITEM("offsetof(XLA_FFI_Api_Version, minor_version)",
                offsetof(xffi_api_version, minor_version)),
      XFFI_ITEM("offsetof(XLA_FFI_Metadata_Extension, extension_base.type)",
                offsetof(xffi_metadata_extension, extension_base.type)),
      XFFI_ITEM("offsetof(XLA_FFI_Metadata_Extension, extension_base.next)",
                offsetof(xffi_metadata_extension, extension_base.next)),
      XFFI_ITEM("offsetof(XLA_FFI_CallFrame, api)",
                offsetof(xffi_call_frame, api)),
      XFFI_ITEM("offsetof(XLA_FFI_CallFrame, ctx)",
                offsetof(xffi_call_frame, ctx)),
      XFFI_ITEM("offsetof(XLA_FFI_CallFrame, args)",
                offsetof(xffi_call_frame, args)),
      XFFI_ITEM("offsetof(XLA_FFI_CallFrame, rets)",
                offsetof(xffi_call_frame, rets)),
      XFFI_ITEM("offsetof(XLA_FFI_CallFrame, attrs)",
                offsetof(xffi_call_frame, attrs)),
      XFFI_ITEM("XLA_FFI_CallFrame_STRUCT_SIZE",
                XFFI_SIZE(xffi_call_frame, attrs)),
      XFFI_ITEM("offsetof(XLA_FFI_Args, size)", offsetof(xffi_args, size)),
      XFFI_ITEM("offsetof(XLA_FFI_Args, types)", offsetof(xffi_args, types)),
      XFFI_ITEM("offsetof(XLA_FFI_Args, args)", offsetof(xffi_args, args)),
      XFFI_ITEM("offsetof(XLA_FFI_Rets, size)", offsetof(xffi_rets, size)),
      XFFI_ITEM("offsetof(XLA_FFI_Rets, types)", offsetof(xffi_rets, types)),
      XFFI_ITEM("offsetof(XLA_FFI_Rets, rets)", offsetof(xffi_rets, rets)),
      XFFI_ITEM("offsetof(XLA_FFI_Attrs, size)", offsetof(xffi_attrs, size)),
      XFFI_ITEM("offsetof(XLA_FFI_Attrs, types)", offsetof(xffi_attrs, types)),
      XFFI_ITEM("offsetof(XLA_FFI_Attrs, names)", offsetof(xffi_attrs, names)),
      XFFI_ITEM("offsetof(XLA_FFI_Attrs, attrs)", offsetof(xffi_attrs, attrs)),
      XFFI_ITEM("sizeof(XLA_FFI_ArgType)", sizeof(xffi_kind)),
      XFFI_ITEM("sizeof(XLA_FFI_AttrType)", sizeof(xffi_kind)),
      XFFI_ITEM("XLA_FFI_ArgType_BUFFER", XFFI_BUFFER_KIND),
      XFFI_ITEM("XLA_FFI_RetType_BUFFER", XFFI_BUFFER_KIND),
      XFFI_ITEM("XLA_FFI_AttrType_STRING", XFFI_ATTR_STRING),
      XFFI_ITEM("offsetof(XLA_FFI_ByteSpan, len)", offsetof(xffi_byte_span, len)),
      XFFI_ITEM("offsetof(XLA_FFI_Buffer, dtype)", offsetof(xffi_buffer, dtype)),
      XFFI_ITEM("offsetof(XLA_FFI_Buffer, data)", offsetof(xffi_buffer, data)),
      XFFI_ITEM("offsetof(XLA_FFI_Buffer, rank)", offsetof(xffi_buffer, rank)),
      XFFI_ITEM("offsetof(XLA_FFI_Buffer, dims)", offsetof(xffi_buffer, dims)),
      XFFI_ITEM("XLA_FFI_Buffer_STRUCT_SIZE", XFFI_SIZE(xffi_buffer, dims)),
      XFFI_ITEM("offsetof(XLA_FFI_Error_Create_Args, message)",
                offsetof(xffi_error_create_args, message)),
      XFFI_ITEM("offsetof(XLA_FFI_Error_Create_Args, errc)",
                offsetof(xffi_error_create_args, errc)),
      XFFI_ITEM("XLA_FFI_Error_Create_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_error_create_args, errc)),
      XFFI_ITEM("offsetof(XLA_FFI_Stream_Get_Args, ctx)",
                offsetof(xffi_stream_get_args, ctx)),
      XFFI_ITEM("offsetof(XLA_FFI_Stream_Get_Args, stream)",
                offsetof(xffi_stream_get_args, stream)),
      XFFI_ITEM("XLA_FFI_Stream_Get_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_stream_get_args, stream)),
      XFFI_ITEM("offsetof(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal)",
                offsetof(xffi_device_ordinal_get_args, device_ordinal)),
      XFFI_ITEM("XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_device_ordinal_get_args, device_ordinal)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, api_version)",
                offsetof(xffi_api, api_version)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_Error_Create)",
                offsetof(xffi_api, error_create)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_Stream_Get)",
                offsetof(xffi_api, stream_get)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get)",
                offsetof(xffi_api, device_ordinal_get)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_Error_Destroy)",
                offsetof(xffi_api, error_destroy)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_Type_Register)",
                offsetof(xffi_api, type_register)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_State_Set)",
                offsetof(xffi_api, state_set)),
      XFFI_ITEM("offsetof(XLA_FFI_Api, XLA_FFI_State_Get)",
                offsetof(xffi_api, state_get)),
      XFFI_ITEM("offsetof(XLA_FFI_Error_Destroy_Args, error)",
                offsetof(xffi_error_destroy_args, error)),
      XFFI_ITEM("XLA_FFI_Error_Destroy_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_error_destroy_args, error)),
      XFFI_ITEM("offsetof(XLA_FFI_TypeInfo, deleter)",
                offsetof(xffi_type_info, deleter)),
      XFFI_ITEM("XLA_FFI_TypeInfo_STRUCT_SIZE",
                XFFI_SIZE(xffi_type_info, deleter)),
      XFFI_ITEM("offsetof(XLA_FFI_Type_Register_Args, name)",
                offsetof(xffi_type_register_args, name)),
      XFFI_ITEM("offsetof(XLA_FFI_Type_Register_Args, type_id)",
                offsetof(xffi_type_register_args, type_id)),
      XFFI_ITEM("offsetof(XLA_FFI_Type_Register_Args, type_info)",
                offsetof(xffi_type_register_args, type_info)),
      XFFI_ITEM("sizeof(XLA_FFI_TypeId)", sizeof(xffi_type_id)),
      XFFI_ITEM("sizeof(XLA_FFI_ExecutionStage)", sizeof(int)),
      XFFI_ITEM("XLA_FFI_ExecutionStage_INSTANTIATE", XFFI_STAGE_INSTANTIATE),
      XFFI_ITEM("offsetof(XLA_FFI_State_Set_Args, ctx)",
                offsetof(xffi_state_args, ctx)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Set_Args, stage)",
                offsetof(xffi_state_args, stage)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Set_Args, type_id)",
                offsetof(xffi_state_args, type_id)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Set_Args, state)",
                offsetof(xffi_state_args, state)),
      XFFI_ITEM("XLA_FFI_State_Set_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_state_args, state)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Get_Args, ctx)",
                offsetof(xffi_state_args, ctx)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Get_Args, stage)",
                offsetof(xffi_state_args, stage)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Get_Args, type_id)",
                offsetof(xffi_state_args, type_id)),
      XFFI_ITEM("offsetof(XLA_FFI_State_Get_Args, state)",
                offsetof(xffi_state_args, state)),
      XFFI_ITEM("XLA_FFI_State_Get_Args_STRUCT_SIZE",
                XFFI_SIZE(xffi_state_args, state)),
      XFFI_ITEM("XLA_FFI_Error_Code_INVALID_ARGUMENT", XFFI_INVALID_ARGUMENT),
      XFFI_ITEM("XLA_FFI_Error_Code_NOT_FOUND", XFFI_NOT_FOUND),
      XFFI_ITEM("XLA_FFI_Error_Code_PERMISSION_DENIED", XFFI_PERMISSION_DENIED),
      XFFI_ITEM("XLA_FFI_Error_Code_RESOURCE_EXHAUSTED",
                XFFI_RESOURCE_EXHAUSTED),
      XFFI_ITEM("XLA_FFI_Error_Code_FAILED_PRECONDITION",
                XFFI_FAILED_PRECONDITION),
      XFFI_ITEM("XLA_FFI_Error_Code_OUT_OF_RANGE", XFFI_OUT_OF_RANGE),
      XFFI_ITEM("XLA_FFI_Error_Code_UNIMPLEMENTED", XFFI_UNIMPLEMENTED),
      XFFI_ITEM("XLA_FFI_Error_Code_INTERNAL", XFFI_INTERNAL),
      XFFI_ITEM("XLA_FFI_Error_Code_UNKNOWN", XFFI_UNKNOWN),
      XFFI_ITEM("XLA_FFI_DataType_PRED", XFFI_PRED),
      XFFI_ITEM("XLA_FFI_DataType_S8", XFFI_S8),
      XFFI_ITEM("XLA_FFI_DataType_S16", XFFI_S16),
      XFFI_ITEM("XLA_FFI_DataType_S32", XFFI_S32),
      XFFI_ITEM("XLA_FFI_DataType_S64", XFFI_S64),
      XFFI_ITEM("XLA_FFI_DataType_U8", XFFI_U8),
      XFFI_ITEM("XLA_FFI_DataType_U16", XFFI_U16),
      XFFI_ITEM("XLA_FFI_DataType_U32", XFFI_U32),
      XFFI_ITEM("XLA_FFI_DataType_U64", XFFI_U64),
      XFFI_ITEM("XLA_FFI_DataType_F16", XFFI_F16),
      XFFI_ITEM("XLA_FFI_DataType_F32", XFFI_F32),
      XFFI_ITEM("XLA_FFI_DataType_F64", XFFI_F64),
      XFFI_ITEM("XLA_FFI_DataType_C64", XFFI_C64),
      XFFI_ITEM("XLA_FFI_DataType_BF16", XFFI_BF16),
      XFFI_ITEM("XLA_FFI_DataType_C128", XFFI_C128),
      XFFI_ITEM("XLA_FFI_DataType_F8E5M2", XFFI_F8E5M2),
      XFFI_ITEM("XLA_FFI_DataType_F8E4M3FN", XFFI_F8E4M3FN),
      XFFI_ITEM("XLA_FFI_DataType_F8E4M3B11FNUZ", XFFI_F8E4M3B11FNUZ),
      XFFI_ITEM("XLA_FFI_DataType_F8E5M2FNUZ", XFFI_F8E5M2FNUZ),
      XFFI_ITEM("XLA_FFI_DataType_F8E4M3FNUZ", XFFI_F8E4M3FNUZ),
      XFFI_ITEM("XLA_FFI_DataType_F8E4M3", XFFI_F8E4M3),
      XFFI_ITEM("XLA_FFI_DataType_F8E3M4", XFFI_F8E3M4),
      XFFI_ITEM("XLA_FFI_DataType_F8E8M0FNU", XFFI_F8E8M0FNU),
  };
#undef XFFI_ITEM
  PyObject *d = PyDict_New();
  for (size_t i = 0; d != NULL && i < sizeof items / sizeof items[0]; i++) {
    PyObject *v = PyLong_FromLongLong(items[i].value);
    if (v == NULL || PyDict_SetItemString(d, items[i].expr, v) < 0)
      Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

static PyMethodDef xla_methods[] = {
    {"_xla_handler", py_xla_handler, METH_O,
     "_xla_handler(platform) -> capsule\n\nThe XLA FFI handler that runs "
     "dlbridge Functions in XLA graphs on platform \"cpu\" or \"cuda\", as "
     "an unnamed capsule for jax.ffi.register_ffi_target (\"noop\": one "
     "that does nothing, the benchmarks' floor)."},
    {"_xla_handlers", py_xla_handlers, METH_O,
     "_xla_handlers(platform) -> dict\n\nThe instantiate and execute "
     "handlers for platform \"cpu\" or \"cuda\", as the dict of capsules "
     "jax.ffi.register_ffi_target takes (what dlbridge registers)."},
    {"_xla_ffi_layout", py_xla_ffi_layout, METH_NOARGS,
     "_xla_ffi_layout() -> dict\n\nThe transcribed XLA FFI C ABI: each C "
     "expression of jaxlib's c_api.h that the handler relies on, with the "
     "value it has in dlbridge's transcription."},
    {NULL, NULL, 0, NULL},
};

int dlb__ops_xla_init(PyObject *module) {
  return PyModule_AddFunctions(module, xla_methods);
}

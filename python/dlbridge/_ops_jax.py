"""A dlbridge.Function as an op of JAX's compiler: an XLA FFI custom call.

A Function called with JAX tracers (inside ``jax.jit``, ``vmap``,
``make_jaxpr``, ``jax.export``, ``grad``) comes here from
``dlbridge._compiled.dispatch`` and becomes one ``jax.ffi.ffi_call`` to the
target ``dlbridge_function``, whose handler is C (src/ops/xla.c).  What the
call produces is the Function's own answer (``Function._result_specs``, the
checks and messages of the eager call); the handler finds the Function by
the identity passed as the call's one attribute.  docs/compiled.md, "JAX".

Decisions:

* arguments: JAX arrays and tracers, NumPy arrays and scalars (constants, as
  everywhere in JAX), and Python numbers for 0-d parameters (stored as the
  eager call stores them, then a 0-d constant of the parameter's dtype);
  any other framework's tensor in the same call is a TypeError;
* 64-bit values without jax_enable_x64 (JAX would narrow an operand): a
  number or NumPy 0-d constant for a 0-d int64/uint64/float64 parameter is
  a typed scalar attribute ``dlb_arg<i>`` instead of an operand, so the
  kernel gets the eager call's exact value; any other argument JAX would
  narrow is a TypeError at trace time saying so (_x64_plan);
* results: the declared results, then the new value of each ``mut``
  parameter (aliased with its input, so XLA updates it in place when it
  can); the caller's array is never written.  None, one array, or a tuple;
* shapes: concrete, or jax.export's symbolic dimensions, passed to
  ``_result_specs`` as unknown; a result extent it cannot give is the
  argument dimension the signature names alike (``Function._dims``);
* ``vmap``: ``sequential`` for every Function (the signature has no batch
  dimensions): one kernel call per batch element;
* differentiation: a TypeError naming the Function (a custom JVP rule that
  refuses), never JAX's generic "no differentiation rule for ffi_call";
* a call with no results at all is kept as a side effect (it would
  otherwise be dead code to XLA).
"""

import functools
import threading

import numpy as np

from . import _core

__all__ = ["call", "register", "export_checks", "TARGET"]

# The XLA custom-call target every Function call in a JAX graph names.
TARGET = "dlbridge_function"
# The attribute carrying the Function's identity (src/ops/xla.c).
IDENTITY_ATTR = "dlb_identity"
# The attribute of 0-d input i given as a number JAX would narrow:
# SCALAR_ATTR + str(i), a typed scalar (src/ops/xla.c).
SCALAR_ATTR = "dlb_arg"

_targets_lock = threading.Lock()
_targets_registered = False

# Python numbers (bool included), handed to _result_specs as they are: it
# applies the eager call's rule, for a 0-d parameter or any other.
_NUMBERS = (int, float, complex)


def _jax():
    import jax
    if not hasattr(jax, "ffi") or not hasattr(jax.ffi, "ffi_call"):
        raise TypeError("a dlbridge Function inside a JAX trace needs "
                        "jax.ffi.ffi_call (JAX 0.5 or newer); this is JAX "
                        + jax.__version__)
    return jax


def _register_targets(jax):
    """Register the handlers with XLA once per process: for the host and
    for CUDA (a CUDA registration waits until a CUDA backend comes up)."""
    global _targets_registered
    with _targets_lock:
        if _targets_registered:
            return
        jax.ffi.register_ffi_target(TARGET, _core._xla_handler("cpu"),
                                    platform="cpu")
        jax.ffi.register_ffi_target(TARGET, _core._xla_handler("cuda"),
                                    platform="CUDA")
        _targets_registered = True


def register(*functions):
    """Make ``functions`` runnable by XLA graphs in this process, and
    dlbridge's XLA target known to XLA.  A Function called inside
    ``jax.jit`` registers itself; a process that only runs a graph made
    elsewhere (``jax.export.deserialize``) must create the same Functions
    (same kernel, same signature) and register them before calling it.
    Public as ``dlbridge.jax_register``."""
    jax = _jax()
    for fn in functions:
        _core._ops_register(fn)
    _register_targets(jax)


def export_checks():
    """The ``disabled_checks`` ``jax.export.export`` needs for a function
    that calls dlbridge Functions: dlbridge's custom-call target is not on
    JAX's list of targets with a compatibility guarantee.  Public as
    ``dlbridge.jax_export_checks``."""
    from jax import export
    return [export.DisabledSafetyCheck.custom_call(TARGET)]


def _np_dtype(fn, dtype):
    """The NumPy (or ml_dtypes) dtype JAX uses for a dlbridge DType."""
    if dtype.lanes != 1 or dtype.bits < 8:
        raise TypeError(f"{fn.name}(): a {dtype.name} parameter or result "
                        f"cannot be used inside a JAX trace: XLA packs "
                        f"sub-byte and vector types its own way")
    try:
        return np.dtype(dtype.name)
    except TypeError:
        pass
    import ml_dtypes
    kind = getattr(ml_dtypes, dtype.name, None)
    if kind is None:
        raise TypeError(f"{fn.name}(): JAX has no dtype {dtype.name}")
    return np.dtype(kind)


def _constant(fn, dtype, value):
    """Python number ``value`` (checked by Function._result_specs) as a 0-d
    NumPy constant of its parameter's dtype, stored as the eager call
    stores it."""
    import dlbridge
    return np.array(dlbridge.tensor(value, dtype=dtype).tolist(),
                    dtype=_np_dtype(fn, dtype))


def _refuse(fn, name, arg):
    """Raise for an argument a traced call cannot take: what the eager call
    raises for an object that is no tensor, else the mixing error."""
    import dlbridge
    kind = type(arg)
    try:
        dlbridge.from_dlpack(arg)
    except TypeError as e:
        raise TypeError(f"{fn.name}() argument '{name}': an object of type "
                        f"'{kind.__qualname__}' is not tensor-like") from e
    except Exception:
        pass                         # a tensor, of some other framework
    raise TypeError(
        f"{fn.name}() argument '{name}': a {kind.__module__}."
        f"{kind.__qualname__} in a call traced by JAX; every tensor argument "
        f"must be a JAX array (NumPy arrays and Python numbers are taken as "
        f"constants): one call cannot mix frameworks")


def _no_derivative(fn):
    raise TypeError(f"{fn.name}: a dlbridge Function has no derivative, so "
                    f"jax.grad, jax.vjp and jax.jvp cannot differentiate "
                    f"through it; give the call a rule with jax.custom_vjp, "
                    f"or apply jax.lax.stop_gradient to its arguments")


@functools.lru_cache(maxsize=256)
def _op(jax, fn, out_specs, nout, aliases, scalars=()):
    """The traced op for a call of fn producing out_specs ((shape, dtype)
    per result, the `mut` values last; aliases: the `mut` inputs; scalars:
    (input, dtype str, value bytes) of each 0-d input given as a scalar
    attribute, by its bytes so -0.0 and 0.0 differ): one ffi_call under a
    JVP rule that refuses.  Cached (bounded) because a fresh custom_jvp
    costs about three times as much to trace as a cached one, and a graph
    usually calls a Function with few shapes."""
    custom_call = jax.ffi.ffi_call(
        TARGET,
        [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in out_specs],
        vmap_method="sequential",
        input_output_aliases={i: nout + k for k, i in enumerate(aliases)}
        or None,
        has_side_effect=not out_specs)
    attrs = {IDENTITY_ATTR: fn._identity}
    for i, dtype, value in scalars:
        attrs[f"{SCALAR_ATTR}{i}"] = np.frombuffer(value, dtype)[0]

    @jax.custom_jvp
    def op(*xs):
        return custom_call(*xs, **attrs)

    op.defjvp(lambda primals, tangents: _no_derivative(fn))
    return op


# ---- 64-bit values without jax_enable_x64 -----------------------------------

def _narrowed(jax, dtype):
    """The dtype JAX would turn NumPy dtype ``dtype`` into (int64 -> int32
    and so on without jax_enable_x64), or None when it keeps it."""
    kept = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    return None if kept == dtype else kept


def _x64_refusal(fn, name, dtype, narrowed, what):
    return TypeError(
        f"{fn.name}() argument '{name}': {what}; the signature says "
        f"{dtype}, which JAX narrows to {narrowed} while jax_enable_x64 is "
        f"False, so the kernel would not get {dtype} data.  Enable it "
        f"(jax.config.update('jax_enable_x64', True)) before making the "
        f"arrays"
        + (", or pass a Python number (given to the kernel as a "
           f"{dtype} exactly as eagerly)" if what.startswith("a JAX") and
           dtype.kind in "iuf" else ""))


def _x64_plan(jax, fn, args):
    """Which arguments must not reach XLA as operands because JAX would
    narrow them (without jax_enable_x64): the indices of the 0-d inputs
    given a Python number or a NumPy constant, passed to the kernel as
    typed scalar attributes instead (int, uint and float dtypes); any other
    argument of a dtype JAX narrows is a TypeError saying why."""
    scalars = []
    for i, ((name, dtype, ndim, mut), arg) in enumerate(zip(fn._inputs,
                                                              args)):
        if dtype.lanes != 1 or dtype.bits < 8:
            continue                 # refused by _np_dtype below
        want = _np_dtype(fn, dtype)
        narrowed = _narrowed(jax, want)
        if narrowed is None:
            continue
        constant = isinstance(arg, (np.generic, np.ndarray) + _NUMBERS)
        if constant and ndim == 0 and not mut and np.ndim(arg) == 0:
            if want.kind not in "iuf":
                raise _x64_refusal(fn, name, want, narrowed,
                                   "a number for a 0-d complex parameter")
            if not isinstance(arg, _NUMBERS) and np.dtype(arg.dtype) != want:
                continue             # the eager dtype error, from _result_specs
            scalars.append(i)
        elif isinstance(arg, np.ndarray) and np.dtype(arg.dtype) == want:
            raise _x64_refusal(fn, name, want, narrowed,
                               f"a NumPy {want} constant")
        elif isinstance(arg, jax.Array) and np.dtype(arg.dtype) == narrowed:
            raise _x64_refusal(fn, name, want, narrowed,
                               f"a JAX {narrowed} array")
    return scalars


def _as_attr(value):
    value = np.asarray(value)
    return value.view(np.int64) if value.dtype == np.uint64 else value


def _extent(d):
    """A shape entry for _result_specs: an int, or None for a symbolic
    dimension (jax.export's shape polymorphism), checked at run time."""
    return d if isinstance(d, int) else None


def _result_shape(fn, o, shape, shapes):
    """Result o's shape with each extent _result_specs could not know (it
    comes from a symbolic dimension) taken from the argument whose
    dimension the signature names the same: jax.export's symbolic
    expression, which XLA resolves when the exported graph runs."""
    if all(d is not None for d in shape):
        return tuple(shape)
    dims = fn._dims
    names = dims[fn.nin + o]
    out = []
    for a, d in enumerate(shape):
        if d is None:
            d = next(shapes[i][axis] for i in range(fn.nin)
                     if shapes[i] is not None
                     for axis, name in enumerate(dims[i])
                     if name == names[a])
        out.append(d)
    return tuple(out)


def call(fn, args):
    """Call Function ``fn`` on ``args`` (a tuple, in parameter order) while
    JAX traces: one XLA custom call, its results as JAX arrays."""
    jax = _jax()
    operands = []
    specs = []
    shapes = []      # each tensor argument's shape, symbolic dimensions kept
    for (name, dtype, ndim, mut), arg in zip(fn._inputs, args):
        if isinstance(arg, _NUMBERS):
            specs.append(arg)        # _result_specs checks it as eagerly
            operands.append(arg)     # made a constant once checked
            shapes.append(None)
        elif isinstance(arg, (jax.Array, np.ndarray, np.generic)):
            shape = tuple(arg.shape)
            specs.append((tuple(_extent(d) for d in shape), arg.dtype))
            operands.append(arg)
            shapes.append(shape)
        else:
            _refuse(fn, name, arg)
    as_attrs = _x64_plan(jax, fn, args)
    results, aliases = fn._result_specs(specs)
    operands = [_constant(fn, dtype, arg) if isinstance(arg, _NUMBERS)
                else arg for arg, (_, dtype, _, _) in zip(operands, fn._inputs)]
    # the exact value in the parameter's dtype, as bytes (kept out of the
    # operands: JAX would narrow it)
    # (a uint64 goes as an int64 of the same bits, which the handler takes
    # back: MLIR's Python binding makes only signed 64-bit integers)
    scalars = tuple((i, v.dtype.str, v.tobytes()) for i, v in
                    ((i, _as_attr(operands[i])) for i in as_attrs))
    # Checked, so the Function may be named by graphs: first compiled use.
    _core._ops_register(fn)
    _register_targets(jax)
    out_specs = tuple((_result_shape(fn, o, shape, shapes), _np_dtype(fn, dtype))
                      for o, (shape, dtype) in enumerate(results))
    out_specs += tuple((shapes[i], np.dtype(operands[i].dtype))
                       for i in aliases)
    for _, dtype, _, _ in fn._inputs:
        _np_dtype(fn, dtype)         # sub-byte inputs refused here too
    if scalars:
        skip = set(as_attrs)
        operands = [a for i, a in enumerate(operands) if i not in skip]
    try:
        op = _op(jax, fn, out_specs, len(results), aliases, scalars)
    except TypeError:                # a symbolic extent that cannot be hashed
        op = _op.__wrapped__(jax, fn, out_specs, len(results), aliases,
                             scalars)
    outs = op(*operands)
    if not out_specs:
        return None
    if len(out_specs) == 1:
        return outs[0]
    return tuple(outs)

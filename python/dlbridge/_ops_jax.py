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
* ``vmap``: a batching rule of dlbridge's own (``custom_vmap``), never
  JAX's ``vmap_method``: a Function with ``...`` is called once on the whole
  batch (the vmapped axis becomes its leading batch dim); one without (or a
  batched argument of a parameter without ``...``) is one custom call whose
  handler loops in C over ``loop_rank`` leading dims;
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
# The attribute of a call under vmap's loop route: how many leading dims of
# every operand and result are loop dims (an i64; absent: none).
LOOP_ATTR = "loop_rank"

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
        # instantiate + execute: each call site's attributes are decoded
        # once, when XLA instantiates it (src/ops/xla.c, xla_state)
        jax.ffi.register_ffi_target(TARGET, _core._xla_handlers("cpu"),
                                    platform="cpu")
        jax.ffi.register_ffi_target(TARGET, _core._xla_handlers("cuda"),
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
        # a graph exported with its vjp (serialize(vjp_order=1)) names the
        # derivative kernels' Functions too
        for d in (getattr(fn, "_vjp", None), getattr(fn, "_jvp", None)):
            if d is not None:
                register(d)
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
                    f"through it; declare its vjp= (and jvp=) kernels, or "
                    f"apply jax.lax.stop_gradient to its arguments")


def _no_second_order(primal):
    """The refusal of a derivative of ``primal``'s vjp or jvp Function,
    which declares none of its own (JAX's TypeError, the text every
    framework gives)."""
    from . import _autodiff
    raise TypeError(f"{_autodiff.no_second_order(primal)}: jax.hessian, "
                    f"jacfwd(jacrev) and grad of grad cannot go through it")


@functools.lru_cache(maxsize=256)
def _op(jax, fn, out_specs, nout, aliases, scalars=(), second_order_of=None,
        loop_rank=0):
    """The traced op for a call of fn producing out_specs ((shape, dtype)
    per result, the `mut` values last; aliases: the `mut` inputs' operand
    positions (the inputs less those given as attributes); scalars:
    (input, dtype str, value bytes) of each 0-d input given as a scalar
    attribute, by its bytes so -0.0 and 0.0 differ; loop_rank: the leading
    loop dims of every operand and result, for the handler's C loop): one
    ffi_call under dlbridge's batching rule (_vmap_rule) and a JVP rule that
    refuses.  Cached (bounded) because a fresh custom_jvp costs about three
    times as much to trace as a cached one, and a graph usually calls a
    Function with few shapes."""
    custom_call = jax.ffi.ffi_call(
        TARGET,
        [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in out_specs],
        input_output_aliases={i: nout + k for k, i in enumerate(aliases)}
        or None,
        has_side_effect=not out_specs)
    attrs = {IDENTITY_ATTR: fn._identity}
    for i, dtype, value in scalars:
        # (a uint64 goes as an int64 of the same bits, which the handler
        # takes back: MLIR's Python binding makes only signed 64-bit ints)
        attrs[f"{SCALAR_ATTR}{i}"] = _as_attr(np.frombuffer(value, dtype)[0])
    if loop_rank:
        attrs[LOOP_ATTR] = np.int64(loop_rank)

    # no vmap_method: a vmap reaches the rule below, never ffi_call's own
    @jax.custom_batching.custom_vmap
    def batched(*xs):
        return tuple(custom_call(*xs, **attrs))

    batched.def_vmap(functools.partial(_vmap_rule, jax, fn, scalars,
                                       second_order_of, loop_rank))

    @jax.custom_jvp
    def op(*xs):
        return batched(*xs)

    if second_order_of is None:
        op.defjvp(lambda primals, tangents: _no_derivative(fn))
    else:
        op.defjvp(lambda primals, tangents: _no_second_order(second_order_of))
    return op


# ---- vmap: dlbridge's batching rule (docs/compiled.md, "JAX", vmap) ----------

def _signature_route(fn, loop_rank, batched):
    """Whether a vmap of a call can be the same Function called once on the
    whole batch: it has `...` on every result, every batched input is a
    `...` one, and the call is not a loop already.  batched: input index ->
    whether vmap batches it (inputs given as attributes are absent)."""
    if loop_rank or not any(fn._batch[:fn.nin]):
        return False
    if not all(fn._batch[fn.nin:]):
        return False
    return all(fn._batch[i] for i, b in batched.items() if b)


def _batch_args(jnp, fn, loop_rank, size, xs, batched):
    """The arguments of the one call that does a vmap of fn (loop_rank: the
    loop dims fn's call has already), and its loop rank.  xs: input index
    -> operand; batched: input index -> whether it has the vmapped axis, at
    axis 0.  Signature route: each batched `...` operand keeps the vmapped
    axis first, with size-1 axes after it so that its batch part lines up
    with the others' (right-aligned broadcasting); unbatched ones are left
    as they are (a `...` one broadcasts), except a `mut` one, which must
    have the whole batch shape and is broadcast.  Loop route: every operand
    broadcast to the vmapped size at axis 0, one more loop dim."""
    if _signature_route(fn, loop_rank, batched):
        inputs = fn._inputs

        def rank(i):            # an operand's batch rank per vmapped item
            return (np.ndim(xs[i]) - (1 if batched[i] else 0)
                    - inputs[i][2])
        r = max((rank(i) for i in xs if fn._batch[i]), default=0)
        out = {}
        for i, x in xs.items():
            if batched[i] and rank(i) < r:
                x = jnp.expand_dims(x, tuple(range(1, 1 + r - rank(i))))
            elif not batched[i] and inputs[i][3]:
                x = jnp.broadcast_to(x, (size,) + tuple(np.shape(x)))
            out[i] = x
        return out, 0
    return {i: x if batched[i] else
            jnp.broadcast_to(x, (size,) + tuple(np.shape(x)))
            for i, x in xs.items()}, loop_rank + 1


def _vmap_rule(jax, fn, scalars, second_order_of, loop_rank, size,
               in_batched, *xs):
    """custom_vmap's rule of one call: the vmapped axis is at 0 of every
    batched operand; one new call of fn (_batch_args), its results batched
    at 0.  A Python number or a 0-d input given as an attribute is never
    batched."""
    import jax.numpy as jnp
    given = {i: np.frombuffer(value, dtype)[0] for i, dtype, value in scalars}
    positions = [i for i in range(fn.nin) if i not in given]
    # (an eager vmap hands a batched NumPy argument over as it is)
    xs = [jnp.asarray(x) if b else x for x, b in zip(xs, in_batched)]
    args, rank = _batch_args(jnp, fn, loop_rank, size,
                             dict(zip(positions, xs)),
                             dict(zip(positions, in_batched)))
    args.update(given)
    outs = _plain_call(jax, fn, [args[i] for i in range(fn.nin)],
                       second_order_of, rank)
    outs = () if outs is None else outs if isinstance(outs, tuple) else (outs,)
    return outs, (True,) * len(outs)


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
    """NumPy scalar ``value`` as a scalar attribute (a uint64 as the int64
    of its bits)."""
    return value.view(np.int64) if value.dtype == np.uint64 else value


def _extent(d):
    """A shape entry for _result_specs: an int, or None for a symbolic
    dimension (jax.export's shape polymorphism), checked at run time."""
    return d if isinstance(d, int) else None


def _core_dims(fn, k):
    """Parameter (or result, k >= nin) k's core dims as the signature
    writes them (no "...")."""
    dims = fn._dims[k]
    return dims[1:] if fn._batch[k] else dims


def _batch_extent(fn, shapes, k):
    """The extent at batch axis -k (from the right) of the broadcast batch
    shape, from the inputs' shapes (symbolic dimensions kept): the first
    `...` input whose batch part has there an extent other than 1."""
    for i in range(fn.nin):
        if shapes[i] is None or not fn._batch[i]:
            continue
        part = shapes[i][:len(shapes[i]) - len(_core_dims(fn, i))]
        if len(part) >= k and not (isinstance(part[-k], int)
                                   and part[-k] == 1):
            return part[-k]
    return 1


def _result_shape(fn, o, shape, shapes):
    """Result o's shape with each extent _result_specs could not know (it
    comes from a symbolic dimension) taken from the arguments: a core
    extent from the argument dimension the signature names the same, a
    batch extent from the broadcast of the inputs' batch parts --
    jax.export's symbolic expressions, which XLA resolves when the
    exported graph runs."""
    if all(d is not None for d in shape):
        return tuple(shape)
    names = _core_dims(fn, fn.nin + o)
    nb = len(shape) - len(names)
    out = []
    for a, d in enumerate(shape):
        if d is None and a < nb:
            d = _batch_extent(fn, shapes, nb - a)
        elif d is None:
            d = next(shapes[i][len(shapes[i]) - len(_core_dims(fn, i)) + axis]
                     for i in range(fn.nin) if shapes[i] is not None
                     for axis, name in enumerate(_core_dims(fn, i))
                     if name == names[a - nb])
        out.append(d)
    return tuple(out)


def call(fn, args, second_order_of=None, loop_rank=0):
    """Call Function ``fn`` on ``args`` (a tuple, in parameter order) while
    JAX traces: one XLA custom call, its results as JAX arrays; under the
    derivative rules of its vjp/jvp kernels when it declares them.
    ``second_order_of``: the Function whose derivative ``fn`` is (its
    refusal to be differentiated then says so); ``loop_rank``: the leading
    loop dims every JAX array argument has (vmap's loop route)."""
    jax = _jax()
    if not loop_rank and (getattr(fn, "_vjp", None) is not None
                          or getattr(fn, "_jvp", None) is not None):
        return _differentiable_call(jax, fn, args)
    return _plain_call(jax, fn, args, second_order_of, loop_rank)


def _plain_call(jax, fn, args, second_order_of=None, loop_rank=0):
    """One custom call under dlbridge's batching rule and a JVP rule that
    refuses.  With loop_rank, every JAX array argument has that many
    leading loop dims (all of one extent); the Function checks what is
    after them, and numbers and NumPy constants (one value for every item)
    are broadcast to them."""
    operands = []
    specs = []
    shapes = []      # each tensor argument's item shape, symbolic dims kept
    loop = None      # the loop dims' extents
    for (name, dtype, ndim, mut), arg in zip(fn._inputs, args):
        if isinstance(arg, _NUMBERS):
            specs.append(arg)        # _result_specs checks it as eagerly
            operands.append(arg)     # made a constant once checked
            shapes.append(None)
        elif isinstance(arg, (jax.Array, np.ndarray, np.generic)):
            shape = tuple(arg.shape)
            if loop_rank and isinstance(arg, jax.Array):
                loop = loop or shape[:loop_rank]
                shape = shape[loop_rank:]
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
    scalars = tuple((i, v.dtype.str, v.tobytes()) for i, v in
                    ((i, np.asarray(operands[i])) for i in as_attrs))
    if loop_rank:                    # constants: the same for every item
        import jax.numpy as jnp
        skip = set(as_attrs)
        operands = [jnp.broadcast_to(a, loop + tuple(np.shape(a)))
                    if i not in skip and not isinstance(a, jax.Array) else a
                    for i, a in enumerate(operands)]
    else:
        loop = ()
    # Checked, so the Function may be named by graphs: first compiled use.
    _core._ops_register(fn)
    _register_targets(jax)
    out_specs = tuple((loop + _result_shape(fn, o, shape, shapes),
                       _np_dtype(fn, dtype))
                      for o, (shape, dtype) in enumerate(results))
    out_specs += tuple((tuple(operands[i].shape), np.dtype(operands[i].dtype))
                       for i in aliases)
    for _, dtype, _, _ in fn._inputs:
        _np_dtype(fn, dtype)         # sub-byte inputs refused here too
    if scalars:
        # the operands less the attributes: a `mut` input's position among
        # them is what its alias names
        skip = set(as_attrs)
        at = [i for i in range(len(operands)) if i not in skip]
        aliases = tuple(at.index(i) for i in aliases)
        operands = [operands[i] for i in at]
    key = (jax, fn, out_specs, len(results), aliases, scalars,
           second_order_of, loop_rank)
    try:
        op = _op(*key)
    except TypeError:                # a symbolic extent that cannot be hashed
        op = _op.__wrapped__(*key)
    outs = op(*operands)
    if not out_specs:
        return None
    if len(out_specs) == 1:
        return outs[0]
    return tuple(outs)


# ---- derivatives: the vjp and jvp kernels (docs/compiled.md, "JAX") ---------
#
# A Function with a vjp and no jvp: jax.custom_vjp around the custom call
# (the stable API; forward mode is JAX's own refusal).  With a jvp as well:
# the HiJAX primitive of _hijax.py, the one route that carries both.  Either
# way the derivative kernels are Functions called through this module's
# call() (so each is its own custom call, and differentiating one again is
# its refusal, naming the primal), and the rules are the same:
#   * the forward saves exactly the inputs/results its vjp names;
#   * a cotangent JAX gives as a symbolic zero (a result the loss did not
#     use) reaches the kernel as zeros; a non-differentiable input gets None;
#   * vjp kernels compute JAX's ct . J (complex: no conjugation), so their
#     results are the cotangents as they are.
# Python numbers (and 0-d constants kept out of the operands, _x64_plan) are
# not arguments of the differentiable op: they are constants, closed over
# by the call site's rules and handed to the derivative kernels as they are.

_STATIC = object()


def _static_key(v):
    """A hashable key of a constant argument that tells apart what == does
    not (0.0 and -0.0, 1 and 1.0 and True)."""
    if isinstance(v, _NUMBERS):
        return (type(v).__name__, repr(v))
    v = np.asarray(v)
    return (v.dtype.str, v.shape, v.tobytes())


class _Rules:
    """How one call site's forward, vjp and jvp Functions are called, on
    the operands of the differentiable op (the arguments less the constants
    in ``statics``: input index -> value); ``loop_rank``: the loop dims
    every operand has (vmap's loop route, ``looped``)."""

    def __init__(self, jax, fn, statics, loop_rank=0):
        self.jax, self.fn, self.name = jax, fn, fn.name
        self.statics = statics
        self.loop_rank = loop_rank
        self._looped = {}
        self.operand_of = {}               # input index -> operand position
        for i in range(fn.nin):
            if i not in statics:
                self.operand_of[i] = len(self.operand_of)
        diff = fn._diff_inputs or ()
        self._diff = frozenset(self.operand_of[i] for i in diff
                               if i in self.operand_of)
        self.nout = fn.nout
        self._diff_results = frozenset(fn._diff_results or ())

    def __repr__(self):
        return (f"loop{self.loop_rank}({self.name})" if self.loop_rank
                else self.name)

    def looped(self, loop_rank):
        """These rules for operands with loop_rank leading loop dims."""
        rules = self._looped.get(loop_rank)
        if rules is None:
            rules = self._looped[loop_rank] = _Rules(self.jax, self.fn,
                                                     self.statics, loop_rank)
        return rules

    def inputs(self, xs):
        """Every input of the primal, the constants put back."""
        return [self.statics[i] if i in self.statics
                else xs[self.operand_of[i]] for i in range(self.fn.nin)]

    def diff_operands(self):
        return self._diff

    def out_nzs(self):
        return tuple(o in self._diff_results for o in range(self.nout))

    def check_reverse(self):
        if self.fn._vjp is None:
            _no_derivative(self.fn)

    def primal(self, *xs):
        outs = _plain_call(self.jax, self.fn, self.inputs(xs),
                           loop_rank=self.loop_rank)
        return outs if self.nout != 1 else (outs,)

    def save(self, xs, outs):
        """(saved inputs by index, saved results by index): what the vjp
        names, nothing else."""
        ins = sorted({i for kind, i in self.fn._vjp_args
                      if kind == "input" and i in self.operand_of})
        res = sorted({o for kind, o in self.fn._vjp_args if kind == "result"})
        return (tuple(xs[self.operand_of[i]] for i in ins),
                tuple(outs[o] for o in res))

    def vjp(self, res, cts, shapes):
        """The cotangent of each operand (None: not differentiable) from
        the saved values and the result cotangents (zeros where unused);
        ``shapes``: the operands' shapes, to which each cotangent the vjp
        kernel writes at the call's broadcast batch shape is summed down."""
        fn = self.fn
        ins = sorted({i for kind, i in fn._vjp_args
                      if kind == "input" and i in self.operand_of})
        outs = sorted({o for kind, o in fn._vjp_args if kind == "result"})
        inputs = dict(zip(ins, res[0]))
        inputs.update(self.statics)
        results = dict(zip(outs, res[1]))
        args = []
        for kind, i in fn._vjp_args:
            args.append(inputs[i] if kind == "input" else
                        results[i] if kind == "result" else cts[i])
        got = call(fn._vjp, tuple(args), second_order_of=fn,
                   loop_rank=self.loop_rank)
        got = got if isinstance(got, tuple) else (got,)
        out = [None] * len(self.operand_of)
        for k, i in enumerate(fn._vjp_results):
            if i in self.operand_of:
                at = self.operand_of[i]
                out[at] = _sum_to(got[k], shapes[at])
        return tuple(out)

    def jvp(self, xs, outs, ts):
        """The tangent of each result (None: not differentiable) from the
        operands, the results and the operands' tangents (None where the
        operand has none)."""
        fn = self.fn
        inputs = self.inputs(xs)
        args = []
        for kind, i in fn._jvp_args:
            if kind == "input":
                args.append(inputs[i])
            elif kind == "result":
                args.append(outs[i])
            elif i in self.operand_of:
                args.append(ts[self.operand_of[i]])
            else:                        # a constant: its tangent is zero
                args.append(np.zeros((), _np_dtype(fn, fn._inputs[i][1])))
        got = call(fn._jvp, tuple(args), second_order_of=fn,
                   loop_rank=self.loop_rank)
        got = got if isinstance(got, tuple) else (got,)
        out = [None] * self.nout
        for k, o in enumerate(fn._jvp_results):
            out[o] = got[k]
        return tuple(out)

    def batch(self, size, xs, dims):
        """A vmap of this call site on operands ``xs`` batched along
        ``dims`` (None: unbatched): the rules and operands of the one call
        that does it (_batch_args), every result batched at 0."""
        import jax.numpy as jnp
        xs = [x if d is None else jnp.moveaxis(jnp.asarray(x), d, 0)
              for x, d in zip(xs, dims)]
        input_of = {k: i for i, k in self.operand_of.items()}
        args, rank = _batch_args(
            jnp, self.fn, self.loop_rank, size,
            {input_of[k]: x for k, x in enumerate(xs)},
            {input_of[k]: d is not None for k, d in enumerate(dims)})
        rules = self.looped(rank) if rank else self
        return rules, [args[input_of[k]] for k in range(len(xs))]


def _sum_to(g, shape):
    """Cotangent g, written at the call's broadcast batch shape, summed
    down to its input's ``shape`` (_autodiff.sum_down)."""
    from . import _autodiff
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    return g.sum(axis=_autodiff.sum_down(shape, g.shape)).reshape(shape)


_rules_cache = {}


def _rules(jax, fn, key, statics):
    """The rules of (fn, its constants): one object per call site kind, so
    its custom_vjp is traced once (bounded: cleared when full)."""
    rules = _rules_cache.get((fn, key))
    if rules is None:
        if len(_rules_cache) >= 256:
            _rules_cache.clear()
        rules = _rules_cache[fn, key] = _Rules(jax, fn, statics)
    return rules


@functools.lru_cache(maxsize=256)
def _custom_vjp(rules, shapes):
    """jax.custom_vjp of one call site's rules on operands of ``shapes``
    (cached: a fresh one costs more to trace)."""
    jax = rules.jax
    nout = rules.nout

    @jax.custom_vjp
    def op(*xs):
        outs = rules.primal(*xs)
        return outs[0] if nout == 1 else tuple(outs)

    def fwd(*xs):
        out = op(*xs)            # op again: an outer grad differentiates it
        outs = (out,) if nout == 1 else out
        return out, rules.save(xs, outs)

    def bwd(res, cts):
        return rules.vjp(res, (cts,) if nout == 1 else tuple(cts), shapes)

    op.defvjp(fwd, bwd)
    return op


def _differentiable_call(jax, fn, args):
    """A call of a Function with derivative kernels: its custom call under
    custom_vjp (a vjp only) or inside the HiJAX primitive (a jvp too)."""
    args = tuple(args)
    scalars = set(_x64_plan(jax, fn, args))
    statics, operands = {}, []
    for i, ((name, _, _, _), arg) in enumerate(zip(fn._inputs, args)):
        if isinstance(arg, _NUMBERS) or i in scalars:
            statics[i] = arg
        elif isinstance(arg, (jax.Array, np.ndarray, np.generic)):
            operands.append(arg)
        else:
            _refuse(fn, name, arg)
    key = tuple((i, _static_key(v)) for i, v in sorted(statics.items()))
    rules = _rules(jax, fn, key, statics)
    if fn._jvp is None:
        shapes = tuple(tuple(np.shape(x)) for x in operands)
        try:
            try:
                op = _custom_vjp(rules, shapes)
            except TypeError:        # a symbolic extent that cannot be hashed
                op = _custom_vjp.__wrapped__(rules, shapes)
            out = op(*operands)
        except TypeError as e:
            if "forward-mode autodiff" not in str(e):
                raise
            raise TypeError(f"{fn.name}: a dlbridge Function has no "
                            f"derivative for forward mode (jax.jvp, jacfwd, "
                            f"linearize): {_forward_hint(fn)}") from e
        return out
    from . import _hijax
    if not _hijax.available():
        raise TypeError(f"{fn.name}(): a Function with a jvp= kernel needs "
                        f"JAX's HiJAX primitives (jax.experimental.hijax), "
                        f"which JAX {jax.__version__} lacks")
    import jax.numpy as jnp
    operands = [jnp.asarray(x) if isinstance(x, (np.ndarray, np.generic))
                else x for x in operands]
    out_avals = jax.eval_shape(rules.primal, *operands)
    in_avals = [_hijax.ShapedArray(tuple(x.shape), x.dtype) for x in operands]
    out_avals = [_hijax.ShapedArray(tuple(a.shape), a.dtype)
                 for a in out_avals]
    outs = _hijax.primitive(rules, in_avals, out_avals)(*operands)
    return outs[0] if fn.nout == 1 else tuple(outs)


def _forward_hint(fn):
    from . import _autodiff
    return str(_autodiff.no_forward_ad(fn))

"""A dlbridge.Function as a torch operator (docs/compiled.md, "PyTorch").

Each Function becomes, on its first traced use, an operator
``torch.ops.dlbridge.<identity>`` defined with ``torch.library`` (the route
chosen by measurement: bench/bench_torch_ops.py):

* schema from the signature: a ``Tensor`` per input, ``Tensor(a!)`` for a
  ``mut`` one (in-place, as eagerly), a ``Tensor`` per declared result.  A
  0-d input given a Python number is a ``Scalar``: one overload per set of
  such inputs (``default`` when none, ``n<mask>`` otherwise), so the kernel
  gets the number on the host exactly as the eager call gives it;
* the real kernel, for CPU and CUDA, is the Function object itself: its
  eager C path checks the arguments, allocates the results through torch
  and passes torch's current stream;
* the fake kernel asks the Function what the call produces
  (``Function._result_specs``, the eager checks and messages);
* autograd: a Function without a vjp has none -- the Autograd key falls
  through and the kernels refuse a call with grad mode on and an argument
  that requires grad (the fake kernel here, the eager C path for real
  tensors).  A Function with a vjp gets ``register_autograd``, whose
  backward runs the vjp Function's operator (``<identity>.vjp``) through
  ``_DerivFn``, an ``autograd.Function`` whose own backward refuses a
  second derivative.  Eagerly (real tensors that require grad, a dual
  tensor, a functorch transform's tensor: the eager C path hands the call
  here, function_mut.c) the Function applies ``_Fn``, an
  ``autograd.Function`` with ``setup_context``, ``backward`` and ``jvp``,
  which ``torch.func`` and forward AD need and the dispatcher route would
  not give (docs/compiled.md, "Gradients").

Dynamo learns every Function at once: ``Function.__call__`` (the type's
slot, one object for all Functions) gets a polyfill through
``torch.compiler.substitute_in_graph``, which Dynamo inlines in place of
the C call: it names the Function's operator, and the graph holds the
operator.  The polyfill is installed when ``torch._dynamo`` is imported
(watch_dynamo, called by dlbridge's __init__): importing dlbridge never
imports torch, and a Function made before torch was imported is known too.

Nothing here imports torch at module level.
"""

import _thread
import importlib
import keyword
import sys
import weakref

from . import _autodiff, _core, _frameworks

# Kept across importlib.reload of this module (see the end of the file).
_kept = {name: globals()[name] for name in (
    "_lock", "_library", "_overloads", "_dynamo_taught", "_tm", "_NUMBERS",
    "_plan", "_function_call", "_DynamoWatcher", "_classes")
    if name in globals()}

__all__ = ["call", "op", "watch_dynamo"]

#: The namespace of the operators: torch.ops.dlbridge.<identity>.
NAMESPACE = "dlbridge"

_lock = _thread.RLock()  # _thread: threading costs ms to import
_library = None        # torch.library.Library(NAMESPACE, "FRAGMENT")
_overloads = {}        # (identity, mask) -> OpOverload
_dynamo_taught = False

# Extents never seen in a real tensor, standing for symbolic ones while the
# Function checks a call (_result_specs takes ints only).
_PLACEHOLDER_BASE = 1 << 62


_torch_module = None


def _torch():
    # Only called once torch is in use: one of its tensors got us here.
    # Kept: importlib.import_module costs ~2 us a call, and the autograd
    # route asks several times a training step.
    global _torch_module
    if _torch_module is None:
        _torch_module = importlib.import_module("torch")
    return _torch_module


# ---- the operator of a Function ------------------------------------------------

def _arg_name(name, i):
    """The schema's name for input ``i``: the signature's, unless it is a
    word TorchScript's schema parser reserves."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    return f"arg{i}"


def _schema(fn, mask, overload, generic_names=False, opname=None):
    """``<opname>[.<overload>](...) -> ...`` for the inputs of ``fn``, bit
    i of ``mask`` set when input i is a Python number; ``opname`` is fn's
    identity unless given."""
    parts = []
    nmut = 0
    for i, (name, _dtype, _ndim, mut) in enumerate(fn._inputs):
        arg = f"arg{i}" if generic_names else _arg_name(name, i)
        if mask >> i & 1:
            parts.append(f"Scalar {arg}")
        elif mut:
            parts.append(f"Tensor(a{nmut}!) {arg}")
            nmut += 1
        else:
            parts.append(f"Tensor {arg}")
    nout = fn.nout
    returns = ("()" if nout == 0 else "Tensor" if nout == 1
               else "(" + ", ".join(["Tensor"] * nout) + ")")
    opname = opname or fn._identity
    if overload != "default":
        opname = f"{opname}.{overload}"
    return f"{opname}({', '.join(parts)}) -> {returns}"


def _overload_name(mask):
    return "default" if mask == 0 else f"n{mask}"


def op(fn, mask=0, grad=True):
    """The OpOverload of Function ``fn`` for calls where the 0-d inputs in
    ``mask`` (bit i: input i) are Python numbers, defined on first use.
    The Function is registered under its identity first (src/ops/
    registry.c): another kernel under a registered identity is a
    ValueError, and the Function registered first serves every equal
    one.  ``grad`` False: for a call site where nothing needs a gradient
    -- a Function with a vjp then gets its ``nograd`` overload, whose
    Autograd key falls through (``register_autograd``'s Python kernel
    costs ~4-5 us a call even under no_grad, measured in inductor
    graphs)."""
    # Asked of every Function object (cheap, lock-free when registered):
    # another kernel under the identity is refused at its first use too.
    fn = _core._ops_register(fn)
    nograd = not grad and fn._vjp is not None
    key = (fn._identity, mask, "nograd") if nograd else (fn._identity, mask)
    found = _overloads.get(key)
    if found is not None:
        return found
    with _lock:
        found = _overloads.get(key)
        if found is None:
            found = _overloads[key] = _define(fn, mask, nograd)
        return found


def _overload_of(fn, mask, nograd):
    if not nograd:
        return _overload_name(mask)
    return "nograd" if mask == 0 else f"n{mask}_nograd"


def _define(fn, mask, nograd=False):
    global _library
    torch = _torch()
    if _library is None:
        # Kept for the life of the process: a compiled graph may call any
        # of its operators at any time (docs/compiled.md, lifetime).
        _library = torch.library.Library(NAMESPACE, "FRAGMENT")
    overload = _overload_of(fn, mask, nograd)
    try:
        _library.define(_schema(fn, mask, overload))
    except RuntimeError:
        # A parameter name the schema parser refuses: positional names.
        _library.define(_schema(fn, mask, overload, generic_names=True))
    qualname = fn._identity if overload == "default" \
        else f"{fn._identity}.{overload}"
    for key in ("CPU", "CUDA"):
        _library.impl(qualname, fn, key)
    if fn._vjp is None or nograd:
        # No backward: nothing to record, and a Python Autograd kernel
        # would cost every call (docs/compiled.md, Cost).
        _library.impl(qualname, torch.library.fallthrough_kernel, "Autograd")
    else:
        _register_autograd(torch, fn, qualname)
    torch.library.register_fake(f"{NAMESPACE}::{qualname}",
                                _fake_kernel(fn, refuse_grad=fn._vjp is None
                                             or nograd),
                                lib=_library)
    found = getattr(getattr(getattr(torch.ops, NAMESPACE), fn._identity),
                    overload)
    _register_vmap(torch, fn, qualname, found)
    if fn.nout == 0 and not any(item[3] for item in fn._inputs):
        # No result and nothing written: the call is there for what the
        # kernel does besides (an error it raises, say), which dead-code
        # elimination must not drop.  (A `mut` operator is kept by its
        # schema; one with results is dropped when they are unused, as any
        # torch operator.)
        torch.fx.node.has_side_effect(found)
    if not nograd:
        _define_derivatives(fn, mask)
    return found


def _define_derivatives(fn, mask):
    """The vjp and jvp operators a compiled graph of ``fn``'s operator
    (overload ``mask``) may call, defined with it: a graph that inductor's
    or AOTAutograd's cache hands a later process holds the backward's
    ``<identity>.vjp`` call, and nothing traces the backward there to
    define it first (seen: the second run of a script failing "has no
    overload name 'vjp'").  Python numbers among the forward's inputs stay
    numbers in the derivative's call (saved as they are; a number's
    tangent is a zero number)."""
    for kind, spelled in (("vjp", fn._vjp_args), ("jvp", fn._jvp_args)):
        if _derivative_fn(fn, kind) is None or spelled is None:
            continue
        dmask = 0
        for k, (what, i) in enumerate(spelled):
            if what in ("input", "tangent") and mask >> i & 1:
                dmask |= 1 << k
        derivative_op(fn, kind, dmask)


# ---- the fake kernel: shapes and dtypes from the signature ------------------------

def _dtype_name(dtype):
    return str(dtype).rpartition(".")[2]


def _fake_kernel(fn, refuse_grad=None):
    """The fake kernel of ``fn``'s operator: the eager call's checks (dtype
    and extents by the Function itself, numbers by the eager rule, one
    device, no grad unless ``fn`` has a vjp), then empty results of the
    signature's shapes on the first tensor argument's device (compact, as
    the eager call allocates them).  ``refuse_grad`` False: a derivative's
    operator, whose Autograd kernel refuses a second derivative itself."""
    names = [item[0] for item in fn._inputs]
    if refuse_grad is None:
        refuse_grad = fn._vjp is None
    mut = [i for i, item in enumerate(fn._inputs) if item[3]]

    def fake(*args):
        torch = _torch()
        specs = []
        tensors = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                specs.append((tuple(a.shape), _dtype_name(a.dtype)))
                tensors.append(i)
            elif isinstance(a, (bool, int, float, complex)):
                specs.append(a)  # checked by the eager call's own steps
            else:
                specs.append(None)
        results = result_specs(fn, specs)
        if not tensors:
            raise TypeError(f"{fn.name}(): its torch operator needs a torch "
                            f"tensor among the arguments")
        first = tensors[0]
        device = args[first].device
        for i in tensors[1:]:
            if args[i].device != device:
                raise ValueError(
                    f"{fn.name}() argument '{names[i]}' is on "
                    f"{args[i].device} but argument '{names[first]}' is on "
                    f"{device}")
        if refuse_grad and torch.is_grad_enabled() and \
                any(args[i].requires_grad for i in tensors):
            raise _autodiff.no_backward(fn)
        if mut:
            _refuse_overlap(fn, torch, args, tensors, mut)
        outs = tuple(torch.empty(shape, dtype=_torch_dtype(torch, dtype),
                                 device=device)
                     for shape, dtype in results)
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs

    fake.__name__ = f"{fn.name}_fake"
    return fake


def _storage(t):
    """What names the memory fake tensor ``t`` is a view of (the same for
    every view of one storage), or None when it has none."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _refuse_overlap(fn, torch, args, tensors, mut):
    """The eager call's refusal of a `mut` input whose memory overlaps
    another input's (src/core's rule, through ``Function._refuse_overlap``)
    for fake tensors: views of one storage are compared by their layout in
    it.  Checked where Dynamo first runs the call on fake views of the
    caller's tensors, before a backend's functionalisation copies `mut`
    inputs, so every backend raises the eager BufferError.  The layout of
    a tensor sharing a storage with a `mut` one is read as ints, which
    specialises its symbolic extents -- only for such calls."""
    storages = {i: _storage(args[i]) for i in tensors}
    shared = {storages[i] for i in mut if storages.get(i) is not None}
    if not any(storages[i] in shared for i in tensors if i not in mut) and \
            len([i for i in mut if storages.get(i) in shared]) < 2:
        return
    specs = [None] * len(args)
    for i in tensors:
        a = args[i]
        if storages[i] in shared:
            size = a.element_size()
            specs[i] = (storages[i], int(a.storage_offset()) * size,
                        tuple(int(d) for d in a.shape),
                        tuple(int(d) for d in a.stride()),
                        _dtype_name(a.dtype))
    fn._refuse_overlap(specs)


def _torch_dtype(torch, dtype):
    found = getattr(torch, dtype.name, None)
    if not isinstance(found, torch.dtype):
        raise BufferError(f"torch has no dtype {dtype.name} for a result")
    return found


def result_specs(fn, specs):
    """``fn._result_specs(specs)[0]`` where extents may be torch SymInts:
    the result shapes in terms of the inputs' symbols.

    The Function checks ints only, so each symbolic extent stands in as an
    int: its own placeholder (a value no real extent has), a placeholder
    shared with the other symbols of the same value at trace time, or that
    value itself.  The first keeps the graph most general and is tried
    first; a signature that ties an extent to another symbol or to a
    literal needs one of the others.  Then, starting from every symbol
    fixed to its value (which must pass: otherwise the eager error, with
    the real values), each group of equal values is relaxed to a shared
    placeholder and each member to its own, as far as the check allows;
    what stays is guarded with torch._check (shared: the symbols are
    equal; fixed: the symbol is that value).  Sound, and as general as a
    greedy choice finds.  An extent with no value (data-dependent) can only
    be a placeholder: TypeError when that fails."""
    torch = sys.modules.get("torch")
    symbols = {}
    if torch is not None:
        for spec in specs:
            if isinstance(spec, tuple):
                for d in spec[0]:
                    if isinstance(d, torch.SymInt) and not _concrete(d):
                        symbols.setdefault(d.node.expr, d)
    if not symbols:
        return fn._result_specs([_concrete_spec(s) for s in specs])[0]

    exprs = list(symbols)
    hint = {e: (None if symbols[e].node.hint is None
                else int(symbols[e].node.hint)) for e in exprs}
    own = {e: _PLACEHOLDER_BASE + 2 * k for k, e in enumerate(exprs)}
    shared = {}
    for e in exprs:
        if hint[e] is not None:
            shared.setdefault(hint[e], _PLACEHOLDER_BASE + 2 * len(shared) + 1)
    FREE, MERGED, FIXED = 0, 1, 2

    def value(e, state):
        return (own[e] if state[e] == FREE else
                shared[hint[e]] if state[e] == MERGED else hint[e])

    def attempt(state):
        try:
            return fn._result_specs(
                [s if not isinstance(s, tuple) else
                 (tuple(value(d.node.expr, state)
                        if isinstance(d, torch.SymInt) and not _concrete(d)
                        else int(d) for d in s[0]), s[1])
                 for s in specs])[0]
        except (TypeError, ValueError):
            return None

    state = {e: FREE for e in exprs}
    if attempt(state) is None:
        state = {e: FREE if hint[e] is None else FIXED for e in exprs}
        if attempt(state) is None:
            if any(h is None for h in hint.values()):
                raise TypeError(
                    f"{fn.name}(): an extent that depends on tensor data "
                    f"cannot be checked against the signature when the call "
                    f"is traced")
            fn._result_specs([  # every extent at its value: the eager error
                s if not isinstance(s, tuple) else
                (tuple(hint[d.node.expr] if isinstance(d, torch.SymInt)
                       and not _concrete(d) else int(d) for d in s[0]), s[1])
                for s in specs])
            raise AssertionError("unreachable: the values passed the check")
        # Relax a group of equal values at a time (its members tied to each
        # other), then each member on its own.
        groups = {}
        for e in exprs:
            if hint[e] is not None:
                groups.setdefault(hint[e], []).append(e)
        for members in groups.values():
            for e in members:
                state[e] = MERGED
            if attempt(state) is None:
                for e in members:
                    state[e] = FIXED
                continue
            for e in members:
                state[e] = FREE
                if attempt(state) is None:
                    state[e] = MERGED
    results = attempt(state)
    symbol_of = {}
    for e in exprs:
        d = symbols[e]
        if state[e] == FREE:
            symbol_of[own[e]] = d
        elif state[e] == MERGED:
            first = symbol_of.setdefault(shared[hint[e]], d)
            if first is not d:
                torch._check(d == first)
        else:
            torch._check(d == hint[e])
    return tuple((tuple(symbol_of.get(v, v) for v in shape), dtype)
                 for shape, dtype in results)


def _concrete(d):
    return d.node.maybe_as_int() is not None


def _concrete_spec(spec):
    if not isinstance(spec, tuple):
        return spec  # a number, or None
    return (tuple(int(d) for d in spec[0]), spec[1])


# ---- the hand-over: a call with fake or functional tensors ------------------------

def _number_mask(fn, args, number_types):
    """Bit i set for each 0-d, non-``mut`` input given a Python number."""
    mask = 0
    for i, (a, (_name, _dtype, ndim, mut)) in enumerate(zip(args, fn._inputs)):
        if ndim == 0 and not mut and isinstance(a, number_types):
            mask |= 1 << i
    return mask


def call(fn, args):
    """Call Function ``fn`` on ``args`` (parameter order) where some are
    torch placeholders (fake or functional tensors): the call of its
    operator, which the tracer records.  Called by dlbridge._compiled --
    also for an eager call with real tensors that torch's autograd must
    see (function_mut.c: one requires grad, may carry a tangent, or is a
    functorch transform's), which goes to autograd_call."""
    if not any(map(_placeholder_type, map(type, args))):
        return autograd_call(fn, args)
    torch = _torch()
    numbers = (bool, int, float, complex, torch.SymInt, torch.SymFloat,
               torch.SymBool)
    for i, a in enumerate(args):
        if not isinstance(a, (torch.Tensor,) + numbers):
            raise TypeError(
                f"{fn.name}() argument '{fn._inputs[i][0]}' is a "
                f"{type(a).__module__}.{type(a).__qualname__}; inside torch's "
                f"compiler every tensor argument of a dlbridge Function must "
                f"be a torch tensor (frameworks cannot be mixed in a traced "
                f"call)")
    mask = _number_mask(fn, args, numbers)
    if any(isinstance(a, numbers) and not mask >> i & 1
           for i, a in enumerate(args)):
        # A number where the signature takes none: the eager error.
        result_specs(fn, [None if isinstance(a, numbers) else
                          (tuple(a.shape), _dtype_name(a.dtype))
                          for a in args])
    return op(fn, mask)(*args)


# ---- autograd: the eager route and the derivatives' operators ------------------

_placeholders = {}    # type -> whether it is a compiler's placeholder


def _placeholder_type(tp):
    found = _placeholders.get(tp)
    if found is None:
        found = _placeholders[tp] = _frameworks._is_traced(tp)
    return found


def _numbers(torch):
    return (bool, int, float, complex, torch.SymInt, torch.SymFloat,
            torch.SymBool)


class _Plan:
    """What a Function's autograd route reads of its declaration, once per
    Function: which inputs and results are saved (what the vjp and jvp
    bindings name, nothing else), which results are not differentiable."""

    __slots__ = ("saved_inputs", "saved_results", "nondiff_results",
                 "diff_inputs", "nin", "batched")

    def __init__(self, fn):
        ins, outs = _autodiff.saved(fn)
        jvp_args = fn._jvp_args or ()
        jins = {i for kind, i in jvp_args if kind == "input"}
        jouts = {o for kind, o in jvp_args if kind == "result"}
        self.saved_inputs = tuple(sorted(set(ins) | jins))
        self.saved_results = tuple(sorted(set(outs) | jouts))
        diff = set(fn._diff_results or ())
        self.nondiff_results = tuple(o for o in range(fn.nout)
                                     if o not in diff)
        self.diff_inputs = tuple(fn._diff_inputs or ())
        self.nin = len(fn._inputs)
        # `...` inputs with a cotangent: the vjp writes theirs at the
        # call's broadcast batch shape, summed down to the input's.
        self.batched = tuple(i for i in self.diff_inputs if fn._batch[i])


_plans = weakref.WeakKeyDictionary()


def _plan_of(fn):
    plan = _plans.get(fn)
    if plan is None:
        plan = _plans[fn] = _Plan(fn)
    return plan


def _save(ctx, fn, inputs, output):
    """setup_context of a Function's autograd: the inputs and results its
    vjp/jvp bindings name -- tensors through save_for_backward (and
    save_for_forward with a jvp), a Python number for a 0-d input on ctx --
    and its non-differentiable results marked so."""
    torch = _torch()
    plan = _plan_of(fn)
    outs = output if isinstance(output, tuple) else (output,)
    ctx.dlb_fn = fn
    tensors = []
    where = {}   # ("input", i) / ("result", o) -> index in tensors, or a number
    for i in plan.saved_inputs:
        a = inputs[i]
        if isinstance(a, torch.Tensor):
            where["input", i] = len(tensors)
            tensors.append(a)
        else:
            where["input", i] = (a,)
    for o in plan.saved_results:
        where["result", o] = len(tensors)
        tensors.append(outs[o])
    ctx.dlb_where = where
    if plan.batched:
        ctx.dlb_shapes = {i: tuple(inputs[i].shape) for i in plan.batched
                          if isinstance(inputs[i], torch.Tensor)}
    ctx.save_for_backward(*tensors)
    if fn._jvp is not None:
        ctx.save_for_forward(*tensors)
    if plan.nondiff_results:
        ctx.mark_non_differentiable(*(outs[o] for o in plan.nondiff_results
                                      if isinstance(outs[o], torch.Tensor)))


def _saved_value(ctx, saved, key):
    at = ctx.dlb_where[key]
    return at[0] if isinstance(at, tuple) else saved[at]


def _conj(torch, t):
    # A lazy conj() would be refused by the kernel's reading (its bit):
    # a physical one.
    return torch.conj_physical(t) if t.is_complex() else t


def _backward(ctx, grads, needs):
    """The cotangents of a Function's inputs from its results' (``grads``,
    one per result, zeros for a result the loss did not use): its vjp
    Function called on what _save kept.  ``needs``: needs_input_grad over
    the inputs.  Complex tensors: the vjp kernel computes JAX's ct.J;
    torch's gradient is its conjugate, so the cotangents go in conjugated
    and come out conjugated (docs/decisions.md section 25)."""
    fn = ctx.dlb_fn
    plan = _plan_of(fn)
    out = [None] * plan.nin
    if not any(needs[i] for i in plan.diff_inputs):
        return out
    if fn._vjp is None:
        raise _autodiff.no_backward(fn)
    torch = _torch()
    saved = ctx.saved_tensors
    args = []
    for kind, i in fn._vjp_args:
        if kind == "cotangent":
            g = grads[i]
            if g is None:
                # torch materialises unused results' gradients as zeros;
                # a None here would be a hole the kernel cannot read.
                ref = _saved_value(ctx, saved, ("result", i)) \
                    if ("result", i) in ctx.dlb_where else None
                if ref is None:
                    raise RuntimeError(
                        f"{fn.name}: torch gave no gradient for result "
                        f"{fn._result_names[i]!r}")
                g = torch.zeros_like(ref)
            args.append(_conj(torch, g))
        else:
            args.append(_saved_value(ctx, saved, (kind, i)))
    res = _derivative(fn, "vjp", args)
    if not isinstance(res, tuple):
        res = (res,)
    shapes = ctx.dlb_shapes if plan.batched else {}
    for k, i in enumerate(fn._vjp_results):
        if needs[i]:
            g = res[k]
            shape = shapes.get(i)
            if shape is not None and tuple(g.shape) != shape:
                g = _sum_down(g, shape)
            out[i] = _conj(torch, g)
    return out


def _sum_down(g, shape):
    """Cotangent ``g``, written by the vjp kernel at the call's broadcast
    batch shape, summed over the batch axes its input (of ``shape``) was
    broadcast along (_autodiff.sum_down: one rule for every framework)."""
    axes = _autodiff.sum_down(shape, tuple(g.shape))
    return g.sum(dim=axes, keepdim=True).reshape(shape) if axes else \
        g.reshape(shape)


def _jvp(ctx, tangents):
    """The tangents of a Function's results from its inputs' (one per
    input, None for a number or an input without one): its jvp Function
    called on what _save kept (inputs, and results a spelled jvp names);
    the refusal without a jvp.  Forward mode is
    the same linear map in torch's and JAX's conventions (no conjugate)."""
    fn = ctx.dlb_fn
    if fn._jvp is None:
        raise _autodiff.no_forward_ad(fn)
    torch = _torch()
    saved = ctx.saved_tensors
    args = []
    for kind, i in fn._jvp_args:
        if kind != "tangent":   # an input, or a result saved from the forward
            args.append(_saved_value(ctx, saved, (kind, i)))
            continue
        t = tangents[i]
        if t is None:
            primal = _saved_value(ctx, saved, ("input", i)) \
                if ("input", i) in ctx.dlb_where else None
            if isinstance(primal, torch.Tensor):
                t = torch.zeros_like(primal)
            elif primal is not None:
                t = type(primal)(0)
            else:
                raise RuntimeError(f"{fn.name}: torch gave no tangent for "
                                   f"input {fn._inputs[i][0]!r}")
        args.append(t)
    res = _derivative(fn, "jvp", args)
    if not isinstance(res, tuple):
        res = (res,)
    out = [None] * fn.nout
    for k, o in enumerate(fn._jvp_results):
        out[o] = res[k]
    return out[0] if fn.nout == 1 else tuple(out)


def _derivative(fn, kind, args):
    """fn's vjp or jvp (``kind``) Function called on ``args``: its
    operator when tracing (placeholders: the graph records
    ``<identity>.<kind>``), through _DerivFn when torch may record it
    (grad mode on: create_graph, a functorch transform) so that a second
    derivative raises, else the Function itself (the eager C path)."""
    torch = _torch()
    if any(map(_placeholder_type, map(type, args))):
        return derivative_op(fn, kind, _number_mask(
            _derivative_fn(fn, kind), args, _numbers(torch)))(*args)
    if torch.is_grad_enabled() or \
            torch._C._are_functorch_transforms_active():
        return _classes_of(torch)[1].apply(fn, kind, *args)
    return _derivative_fn(fn, kind)(*args)


def _no_second_order(fn, kind):
    if kind == "vjp":
        return _autodiff.no_second_order(fn)
    return RuntimeError(f"{fn.name}: its jvp has no derivative (no "
                        f"second-order jvp declared)")


def _derivative_fn(fn, kind):
    return fn._vjp if kind == "vjp" else fn._jvp


def _run(fn, args, kind=None):
    """Inside an autograd.Function's forward: fn itself (its eager C path,
    grad and forward grad off here), or its operator while a functorch
    transform is active -- vmap's BatchedTensors have no memory to read,
    and the operator is what torch's batching rule (today: its loop)
    applies to."""
    torch = _torch()
    if torch._C._are_functorch_transforms_active():
        target = fn if kind is None else _derivative_fn(fn, kind)
        mask = _number_mask(target, args, _numbers(torch))
        found = op(fn, mask) if kind is None else derivative_op(fn, kind, mask)
        return found(*args)
    return (fn if kind is None else _derivative_fn(fn, kind))(*args)


_classes = None      # (_Fn, _DerivFn, _EagerFn), made on first use


def _classes_of(torch):
    global _classes
    if _classes is None:
        _classes = _make_classes(torch)
    return _classes


def _make_classes(torch):
    class _Fn(torch.autograd.Function):
        """A Function's autograd where torch.func and forward AD see it:
        applied from Python (never inside a dispatcher kernel, where
        functorch cannot handle it), with setup_context and jvp.  Dynamo
        never sees it: compiled code calls the operator."""
        generate_vmap_rule = True

        @staticmethod
        def forward(fn, *args):
            return _run(fn, args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            _save(ctx, inputs[0], inputs[1:], output)

        @staticmethod
        def backward(ctx, *grads):
            return (None, *_backward(ctx, grads, ctx.needs_input_grad[1:]))

        @staticmethod
        def jvp(ctx, *tangents):
            return _jvp(ctx, tangents[1:])

    class _EagerFn(torch.autograd.Function):
        """_Fn for plain eager autograd (no functorch transform, no
        forward-AD level): the same backward, with the saving done in
        forward.  torch binds the arguments of an autograd.Function with a
        setup_context through inspect.signature on every apply (~10 us
        measured here, most of a training step's dlbridge share), which
        this older form skips; torch.func needs setup_context, so it gets
        _Fn."""

        @staticmethod
        def forward(ctx, fn, *args):
            output = fn(*args)
            _save(ctx, fn, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return (None, *_backward(ctx, grads, ctx.needs_input_grad[1:]))

    class _DerivFn(torch.autograd.Function):
        """A vjp or jvp Function's call where torch may record it: its own
        derivative is refused -- double backward, forward over reverse --
        never a silently constant vjp (its operator alone would be)."""
        generate_vmap_rule = True

        @staticmethod
        def forward(fn, kind, *args):
            return _run(fn, args, kind)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.dlb_fn, ctx.dlb_kind = inputs[0], inputs[1]

        @staticmethod
        def backward(ctx, *grads):
            raise _no_second_order(ctx.dlb_fn, ctx.dlb_kind)

        @staticmethod
        def jvp(ctx, *tangents):
            raise _no_second_order(ctx.dlb_fn, ctx.dlb_kind)

    return _Fn, _DerivFn, _EagerFn


def autograd_call(fn, args):
    """An eager call of ``fn`` with real torch tensors that autograd must
    see (function_mut.c handed it over: a tensor requires grad under grad
    mode, a forward-AD level is entered, or a functorch transform wrapped
    a tensor).  A Function with a derivative applies _Fn.  One without:
    a tangent or a tensor that requires grad is refused (never a silent
    zero), a transform's tensors go to its operator (vmap loops it), and
    anything else runs the kernel with forward grad off (which stops the
    C path from handing it over again)."""
    torch = _torch()
    fwad = torch.autograd.forward_ad
    if fn._vjp is not None or fn._jvp is not None:
        classes = _classes_of(torch)
        if fwad._current_level < 0 and \
                not torch._C._are_functorch_transforms_active():
            return classes[2].apply(fn, *args)
        return classes[0].apply(fn, *args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if fwad._current_level >= 0 and any(
            fwad.unpack_dual(t).tangent is not None for t in tensors):
        raise _autodiff.no_forward_ad(fn)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise _autodiff.no_backward(fn)
    if torch._C._are_functorch_transforms_active():
        return op(fn, _number_mask(fn, args, _numbers(torch)))(*args)
    with fwad._set_fwd_grad_enabled(False):
        return fn(*args)


def _register_autograd(torch, fn, qualname):
    """register_autograd on the operator of ``fn`` (which has a vjp): what
    AOTAutograd differentiates under torch.compile, export and opcheck;
    the backward graph holds the vjp's operator."""
    def setup_context(ctx, inputs, output):
        _save(ctx, fn, inputs, output)

    def backward(ctx, *grads):
        out = _backward(ctx, grads, ctx.needs_input_grad)
        return out[0] if len(out) == 1 else tuple(out)

    torch.library.register_autograd(f"{NAMESPACE}::{qualname}", backward,
                                    setup_context=setup_context, lib=_library)


def derivative_op(fn, kind, mask=0):
    """The OpOverload ``torch.ops.dlbridge.<fn identity>.<kind>`` (kind
    "vjp" or "jvp"; ``_n<mask>`` appended when inputs of the derivative
    are Python numbers): the derivative Function as an operator, named by
    the forward's identity (which covers the derivative's signature; the
    registry compares its kernel).  Its Autograd kernel refuses a second
    derivative."""
    fn = _core._ops_register(fn)
    key = (fn._identity, mask, kind)
    found = _overloads.get(key)
    if found is not None:
        return found
    with _lock:
        found = _overloads.get(key)
        if found is None:
            found = _overloads[key] = _define_derivative(fn, kind, mask)
        return found


def _define_derivative(fn, kind, mask):
    global _library
    torch = _torch()
    d = _derivative_fn(fn, kind)
    if d is None:
        raise ValueError(f"{fn.name}: no {kind}= declared")
    if _library is None:
        _library = torch.library.Library(NAMESPACE, "FRAGMENT")
    overload = kind if mask == 0 else f"{kind}_n{mask}"
    try:
        _library.define(_schema(d, mask, overload, opname=fn._identity))
    except RuntimeError:
        _library.define(_schema(d, mask, overload, generic_names=True,
                                opname=fn._identity))
    qualname = f"{fn._identity}.{overload}"
    for key in ("CPU", "CUDA"):
        _library.impl(qualname, d, key)

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, *grads):
        raise _no_second_order(fn, kind)

    torch.library.register_autograd(f"{NAMESPACE}::{qualname}", backward,
                                    setup_context=setup_context, lib=_library)
    torch.library.register_fake(f"{NAMESPACE}::{qualname}",
                                _fake_kernel(d, refuse_grad=False),
                                lib=_library)
    found = getattr(getattr(getattr(torch.ops, NAMESPACE), fn._identity),
                    overload)
    _register_vmap(torch, d, qualname, found)
    return found


# ---- torch.vmap: the batching rule of every operator ------------------------------

def _register_vmap(torch, fn, qualname, found):
    """torch.library.register_vmap on operator ``found`` (overload
    ``qualname``) of Function ``fn`` (the forward, or a derivative): the
    rule of _vmap_rule.  It is a Python kernel on the FuncTorchBatched key
    only: calls outside torch.vmap never reach it."""
    torch.library.register_vmap(f"{NAMESPACE}::{qualname}",
                                _vmap_rule(fn, found), lib=_library)


def _vmap_rule(fn, found):
    """The batching rule of ``found``, Function ``fn``'s operator
    (docs/compiled.md, "torch.vmap").  Where every batched argument is a
    `...` parameter, ONE call: each batched argument's vmap dim is moved
    to the front (``movedim``, a view) and, when its own batch part is
    shorter than the call's longest, size-1 dims are inserted after it so
    that the vmap dim lines up with the first batch axis; unbatched
    arguments are passed as they are (the eager call broadcasts them,
    src/python/function_call.c); every result then carries the vmap dim
    first.  Otherwise -- a batched parameter without `...`, or a Function
    without `...` -- one call per item, stacked (the kernel never sees a
    batch dim its signature lacks).  A `mut` argument not batched while
    another is would be written once per item: refused, as torch refuses
    an in-place op on an unbatched tensor."""
    nin = len(fn._inputs)
    batch = tuple(fn._batch[:nin])
    core = tuple(item[2] for item in fn._inputs)
    muts = tuple(i for i, item in enumerate(fn._inputs) if item[3])
    nout = fn.nout
    names = [item[0] for item in fn._inputs]

    def rule(info, in_dims, *args):
        torch = _torch()
        batched = [i for i, d in enumerate(in_dims) if d is not None]
        for i in muts:
            if in_dims[i] is None:
                j = batched[0]
                raise RuntimeError(
                    f"vmap: {fn.name}() writes its mut argument "
                    f"'{names[i]}' in place, but '{names[i]}' is not "
                    f"batched while '{names[j]}' is: each item would "
                    f"write it (vmap over '{names[i]}' too)")
        if all(batch[i] for i in batched):
            return _vmap_once(torch, args, in_dims, batched)
        return _vmap_loop(torch, info.batch_size, args, in_dims)

    def _vmap_once(torch, args, in_dims, batched):
        # The longest batch part among the `...` tensors (per item).
        rank = 0
        for i, a in enumerate(args):
            if batch[i] and isinstance(a, torch.Tensor):
                r = a.dim() - core[i] - (in_dims[i] is not None)
                rank = max(rank, r)
        new = list(args)
        for i in batched:
            a = args[i].movedim(in_dims[i], 0)
            pad = rank - (a.dim() - 1 - core[i])
            for _ in range(pad):
                a = a.unsqueeze(1)   # a view, also of a `mut` argument
            new[i] = a
        out = found(*new)
        return out, _out_dims(0)

    def _vmap_loop(torch, size, args, in_dims):
        if size == 0:
            return _vmap_empty(torch, args, in_dims)
        items = []
        for b in range(size):
            items.append(found(*(a if d is None else a.select(d, b)
                                 for a, d in zip(args, in_dims))))
        if nout == 0:
            return None, None
        if nout == 1:
            return torch.stack(items), 0
        return (tuple(torch.stack([item[k] for item in items])
                      for k in range(nout)), _out_dims(0))

    def _vmap_empty(torch, args, in_dims):
        # No item to call the kernel on: the results' item shapes come
        # from the signature (as the fake kernel's do), each with a
        # leading 0.
        specs = []
        device = None
        for a, d in zip(args, in_dims):
            if isinstance(a, torch.Tensor):
                shape = list(a.shape)
                if d is not None:
                    del shape[d]
                specs.append((tuple(shape), _dtype_name(a.dtype)))
                device = a.device if device is None else device
            elif isinstance(a, (bool, int, float, complex)):
                specs.append(a)
            else:
                specs.append(None)
        outs = tuple(torch.empty((0,) + tuple(shape),
                                 dtype=_torch_dtype(torch, dtype),
                                 device=device)
                     for shape, dtype in result_specs(fn, specs))
        if nout == 0:
            return None, None
        return (outs[0] if nout == 1 else outs), _out_dims(0)

    def _out_dims(d):
        if nout == 0:
            return None
        return d if nout == 1 else (d,) * nout

    rule.__name__ = f"{fn.name}_vmap"
    return rule


# ---- Dynamo: Function.__call__ inlined as the operator ----------------------------

# What the polyfill reads, as module globals (Dynamo guards globals by their
# source; a closure of a polyfill would be sourceless): set by _teach_dynamo.
_tm = None             # the torch module
_NUMBERS = ()          # what a 0-d input takes for a number, Sym* included


def _plan(fn, npositional, keywords, types, grad=True):
    """How to call ``fn``'s operator, decided on the real Function while
    Dynamo traces a call (the result is a constant of the graph): the
    arguments, positional then keyword (``keywords`` their names), are of
    ``types``.  Returns (identity, overload, order) -- ``order`` the
    arguments' indices in parameter order -- or, for a call the operator
    cannot take, the reason (a graph break)."""
    names = [item[0] for item in fn._inputs]
    if npositional > len(names):
        return _BAD_ARGUMENTS
    order = list(range(npositional))
    for name in names[npositional:]:
        if name not in keywords:
            return _BAD_ARGUMENTS
        order.append(npositional + keywords.index(name))
    if len(order) != len(types):
        return _BAD_ARGUMENTS
    mask = 0
    tensors = 0
    for i, j in enumerate(order):
        _name, _dtype, ndim, mut = fn._inputs[i]
        if issubclass(types[j], _tm.Tensor):
            tensors += 1
        elif issubclass(types[j], _NUMBERS) and ndim == 0 and not mut:
            # checked by the fake kernel (a constant) or by the Function
            # itself when the graph runs (a symbolic number)
            mask |= 1 << i
        else:
            return _NOT_A_TORCH_TENSOR
    if tensors == 0:
        return _NO_TORCH_TENSOR
    nograd = not grad and fn._vjp is not None
    op(fn, mask, grad=not nograd)
    return fn._identity, _overload_of(fn, mask, nograd), tuple(order)


def _function_call(self, /, *args, **kwargs):
    """Function.__call__ as Dynamo sees it: the call of the Function's
    operator.  What the operator cannot take -- wrong arguments, another
    framework's array, a number where the signature has no 0-d input, no
    torch tensor at all (the eager call then returns dlbridge Tensors) --
    is a graph break naming the reason: without fullgraph the eager call
    then decides, exactly as without compiling.  Kept to a few steps:
    Dynamo traces them at every call site."""
    values = args + tuple(kwargs.values()) if kwargs else args
    # Whether this call site needs a gradient: constants of the trace,
    # guarded by Dynamo (grad mode, each tensor's requires_grad).  Under
    # torch.vmap a BatchedTensor says False for a value that requires
    # grad: a functorch transform keeps the overload with a backward.
    grad = _tm.is_grad_enabled() and (
        _tm._C._are_functorch_transforms_active() or any(
            isinstance(v, _tm.Tensor) and v.requires_grad for v in values))
    plan = _plan(self, len(args), tuple(kwargs), tuple(map(type, values)),
                 grad)
    if isinstance(plan, str):
        _tm._dynamo.graph_break(msg=plan)
    identity, overload, order = plan
    if kwargs:
        values = [values[i] for i in order]
    return getattr(getattr(_tm.ops.dlbridge, identity), overload)(*values)


_BAD_ARGUMENTS = ("a dlbridge Function called with arguments its signature "
                  "does not take: the eager call raises the error")
_NOT_A_TORCH_TENSOR = (
    "a dlbridge Function inside torch.compile takes torch tensors, and "
    "Python numbers for 0-d parameters; another framework's array (or a "
    "number for a tensor parameter) runs the call eagerly")
_NO_TORCH_TENSOR = ("a dlbridge Function called without a torch tensor "
                    "returns dlbridge Tensors: the call runs eagerly")


def _teach_dynamo():
    """Give Function.__call__ (the type's slot: one object for every
    Function) the polyfill _function_call, which Dynamo inlines in place of
    the C call.  Once per process, when torch._dynamo is there."""
    global _dynamo_taught, _tm, _NUMBERS
    with _lock:
        if _dynamo_taught:
            return
        torch = _torch()
        _tm = torch
        _NUMBERS = (bool, int, float, complex, torch.SymInt, torch.SymFloat,
                    torch.SymBool)
        # Evaluated by Dynamo on the real Function when it traces a call,
        # its result a constant of the graph, with a guard on the
        # Function's id (a registered Function lives until exit: the id is
        # never reused).
        torch.compiler.assume_constant_result(_plan)
        torch.compiler.substitute_in_graph(_core.Function.__call__)(
            _function_call)
        _dynamo_taught = True


class _DynamoWatcher:
    """Installs the polyfill (_teach_dynamo) once torch._dynamo is really
    imported, whatever route imported it; stays on sys.meta_path until the
    polyfill is in.  Two ways in:

    * asked for ``torch._dynamo`` while it is not imported, it finds the
      module with the finders after it and wraps the loader, whose
      exec_module is then followed by the installation (a post-import hook).
      A spec only looked at (``importlib.util.find_spec``) and never loaded
      installs nothing and uses nothing up: the next request wraps again;
    * asked about any module while a fully imported ``torch._dynamo`` is in
      sys.modules (it was loaded past this finder: a finder ahead of it that
      serves torch's modules), it installs the polyfill there and then.

    A non-torch import before torch._dynamo costs one dict lookup."""

    _dlbridge_dynamo_watcher = True

    def find_spec(self, fullname, path, target=None):
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            if getattr(getattr(dynamo, "__spec__", None), "_initializing",
                       False):
                return None   # being imported: its own loader's turn
            _unwatch()
            _teach_dynamo_or_warn()
            return None
        if fullname != "torch._dynamo":
            return None
        me = _thread.get_ident()
        if me in _finding:
            return None   # another finder asked sys.meta_path again
        _finding.add(me)
        try:
            spec = None
            for finder in sys.meta_path:
                if getattr(finder, "_dlbridge_dynamo_watcher", False):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            _finding.discard(me)
        if spec is None or spec.loader is None or \
                isinstance(spec.loader, _AfterExec):
            return spec
        spec.loader = _AfterExec(spec.loader)
        return spec


_finding = set()   # threads in _DynamoWatcher's search of the other finders


def _unwatch():
    # Every watcher: there is one, unless a reload of this module made
    # another class of it (the one kept across reloads avoids that).
    for finder in list(sys.meta_path):
        if getattr(finder, "_dlbridge_dynamo_watcher", False):
            try:
                sys.meta_path.remove(finder)
            except ValueError:
                pass   # removed by another thread meanwhile


def _teach_dynamo_or_warn():
    try:
        _teach_dynamo()
    except Exception as exc:  # never break torch's import
        import warnings
        warnings.warn(f"dlbridge: torch.compile will not see dlbridge "
                      f"Functions as operators: {exc!r}", RuntimeWarning,
                      stacklevel=3)


class _AfterExec:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader, not this wrapper.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _unwatch()
        _teach_dynamo_or_warn()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def watch_dynamo():
    """Make Dynamo know every Function: now if torch._dynamo is imported,
    else once it is (called by dlbridge's __init__, again on a reload)."""
    if "torch._dynamo" in sys.modules:
        _teach_dynamo()
    elif not any(getattr(f, "_dlbridge_dynamo_watcher", False)
                 for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoWatcher())


# importlib.reload of this module runs it again in the same namespace, but
# what it installed in torch outlives that: the operators' library and the
# polyfill, whose helpers Dynamo holds by identity.  The state describing
# them is kept, so a reload neither forgets the polyfill (nor installs it
# twice: torch refuses) nor defines an operator twice.
globals().update(_kept)
del _kept

"""A dlbridge.Function as a TensorFlow op inside tf.function (see
dlbridge._compiled and docs/compiled.md).

A Function called with TensorFlow's graph tensors while tf.function traces
becomes one node of the generic op ``DlbridgeCall`` (src/ops/tf.c), whose
``function`` attribute names the Function by its identity.  The op and its
kernels are registered with TensorFlow through its C API from dlbridge's
own extension on the first such call; the node is built with the helper
that TensorFlow's generated op wrappers call.  What the node says -- its
outputs' dtypes and shapes, which inputs come back updated -- is
``Function._result_specs``'s answer, the shape function of the eager call,
so a mismatch is the same exception with the same message as eagerly.

A ``mut`` parameter is never written in the caller's tensor: its updated
value is an output of the op, returned after the declared results.
"""

import threading

from . import _core

__all__ = ["call"]

_lock = threading.Lock()
_ready = False


# identity of a vjp Function -> the Function whose vjp it is: the gradient
# of a vjp node names the second order that is missing, not the vjp.
_VJP_OWNER = {}


def _autodiff():
    from . import _autodiff
    return _autodiff


def _no_derivative(fn):
    """The RuntimeError for a backward through ``fn`` that has no vjp."""
    owner = _VJP_OWNER.get(fn._identity)
    if owner is not None:
        return _autodiff().no_second_order(owner)
    return _autodiff().no_backward(fn)


def _conj(tf, t):
    return tf.math.conj(t) if t is not None and t.dtype.is_complex else t


def _backward(tf, fn, inputs, results, grads):
    """The cotangents of ``fn``'s inputs (one per parameter, None where an
    input is not differentiable), running its vjp Function on ``inputs``
    (per parameter), ``results`` (the declared results) and ``grads`` (one
    per result, None where TensorFlow has none): eagerly a kernel call,
    inside tf.function another DlbridgeCall node.  A differentiable
    result's missing cotangent is zeros (the kernel always gets a buffer).
    Complex: the kernels compute JAX's ct.J; TensorFlow's gradients are
    its conjugate (as torch's), so the cotangents go in conjugated and come
    out conjugated.  Shapes: the vjp's signature binds every cotangent's
    extents to its primal's (checked when the Function was made), and the
    vjp call checks its inputs against it, so a result is its input's
    shape -- TensorFlow would accept any."""
    diff = set(fn._diff_results)
    cts = []
    for r, (res, g) in enumerate(zip(results, grads)):
        if r not in diff:
            cts.append(None)
        elif g is None:
            cts.append(tf.zeros_like(res))
        else:
            cts.append(_conj(tf, tf.convert_to_tensor(g, dtype=res.dtype)))
    args = _autodiff().vjp_arguments(fn, list(inputs), list(results), cts)
    outs = fn._vjp(*args)
    if not isinstance(outs, (tuple, list)):
        outs = (outs,)
    out = [None] * len(fn._inputs)
    batch = fn._batch
    for k, i in enumerate(fn._vjp_results):
        ct = _conj(tf, outs[k])
        if batch[i] and isinstance(inputs[i], (tf.Tensor, tf.Variable)):
            ct = _sum_to(tf, ct, inputs[i])
        out[i] = ct
    return out


def _sum_to(tf, ct, like):
    """A `...` input's cotangent, which the vjp kernel wrote at the call's
    broadcast batch shape, summed over the batch axes the input was
    broadcast along (_autodiff.sum_down) back to the input's shape.  With
    extents unknown while traced, the same rule on the run-time shapes
    (TensorFlow's BroadcastGradientArgs, as its own broadcasting ops'
    gradients do)."""
    shape, full = like.shape, ct.shape
    if shape.is_fully_defined() and full.is_fully_defined():
        axes = _autodiff().sum_down(shape.as_list(), full.as_list())
        if not axes:
            return ct
        return tf.reshape(tf.reduce_sum(ct, axis=axes), shape)
    want = tf.shape(like)
    _, axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(ct), s1=want)
    return tf.reshape(tf.reduce_sum(ct, axis=axes), want)


def _gradient(op, *grads):
    """The gradient of DlbridgeCall, for every Function: the node's
    ``function`` attribute names it; its vjp Function runs (another
    DlbridgeCall node inside tf.function), or, without one, the
    RuntimeError says so."""
    import tensorflow as tf

    identity = op.get_attr("function")
    if isinstance(identity, bytes):
        identity = identity.decode("utf-8", "replace")
    fn = _core._ops_find(identity)
    if fn is None:
        raise RuntimeError(f"{identity}: dlbridge Function has no backward "
                           f"(no Function with this identity is registered)")
    if getattr(fn, "_vjp", None) is None:
        raise _no_derivative(fn)
    nres = len(fn._result_names)
    outputs = list(op.outputs)
    return _backward(tf, fn, list(op.inputs), outputs[:nres],
                     list(grads[:nres]))


def _ensure_op(tf):
    """Register DlbridgeCall with TensorFlow once per process, and its
    one gradient (_gradient)."""
    global _ready
    if _ready:
        return
    with _lock:
        if _ready:
            return
        from tensorflow.python.framework import op_def_registry
        # TensorFlow aborts the process on a second registration of a name:
        # the extension registers only when TF does not know it yet.
        _core._tf_register(op_def_registry.get(_core._TF_OP) is not None)
        try:
            tf.RegisterGradient(_core._TF_OP)(_gradient)
        except KeyError:  # this module was imported again
            pass
        _register_pfor()
        _ready = True


# ---- tf.vectorized_map / tape.jacobian: a pfor converter -------------------
#
# pfor (tensorflow.python.ops.parallel_for, what tf.vectorized_map and
# tape.jacobian run) rewrites the loop body op by op through converters
# registered per op type.  Its registry is TensorFlow-private
# (RegisterPFor, ConversionNotImplementedError, wrap are not exported):
# everything used from it is looked up here, once, and when any of it has
# moved no converter is registered -- pfor then runs DlbridgeCall in its
# while_loop fallback (correct, one kernel call per item; TensorFlow logs
# why).

_PFOR = None  # the pfor module, once the converter is registered


def _register_pfor():
    """Register _pfor_convert for DlbridgeCall (once per process: a second
    registration of a type is an assertion in pfor)."""
    global _PFOR
    try:
        from tensorflow.python.ops.parallel_for import pfor
        registry = pfor._pfor_converter_registry
        register = pfor.RegisterPFor
        pfor.ConversionNotImplementedError, pfor.wrap  # noqa: B018
    except (ImportError, AttributeError):
        return
    if _core._TF_OP not in registry:
        register(_core._TF_OP)(_pfor_convert)
    _PFOR = pfor


class _Replaced:
    """The control-flow context of a loop-body node that pfor has replaced
    (see _retire): it says "inside a while loop", which is what
    tf.function's automatic control dependencies skip."""

    outer_context = None

    def IsWhileContext(self):  # noqa: N802 (TensorFlow's name)
        return True


def _retire(op):
    """pfor leaves the loop body it converted in the graph, its input the
    loop index's default 0.  DlbridgeCall is stateful, so tf.function's
    automatic control dependencies would make that original node run: the
    kernel once more, on item 0, next to the converted call.  Once pfor
    replaces the node, nothing reads it; marked as a while-loop node,
    automatic control dependencies leave it out and TensorFlow prunes it.
    TensorFlow-private (Operation._set_control_flow_context, used only on
    a node with no control-flow context, i.e. TF2 control flow): if it has
    moved, the item-0 run stays -- one more call, same results."""
    try:
        if op._get_control_flow_context() is None:
            op._set_control_flow_context(_Replaced())
    except AttributeError:
        pass


def _pfor_convert(pfor_input):
    """pfor's converter for DlbridgeCall.  The inputs come stacked (the
    loop axis first) or loop-invariant.  For a Function with `...`, the
    loop axis becomes the leading batch axis: one node, one kernel call
    for the whole loop.  Each stacked `...` input gets size-1 axes after
    the loop axis up to the items' broadcast batch rank (so that the loop
    axis lines up across inputs, NumPy's broadcasting being right-aligned);
    a loop-invariant `...` input is left as it is (the run pads and
    broadcasts it), and a loop-invariant `mut` one is tiled along the loop
    (a `mut` argument has the full batch shape; its new value is an
    output).  Where the loop cannot be batch dimensions -- a Function
    without `...`, a stacked parameter without `...`, a `mut` parameter
    without `...` or a result without `...` (one value per item) --
    ConversionNotImplementedError sends the node to pfor's while_loop
    fallback, which runs it per item (logged at debug level only)."""
    import tensorflow as tf

    pfor = _PFOR
    refuse = pfor.ConversionNotImplementedError
    op = pfor_input.op
    identity = op.get_attr("function")
    if isinstance(identity, bytes):
        identity = identity.decode("utf-8", "replace")
    fn = _core._ops_find(identity)
    if fn is None:
        raise refuse(f"no dlbridge Function {identity} is registered")
    _retire(op)
    wrapped = list(pfor_input.inputs)
    if any(w.is_sparse_stacked for w in wrapped):
        raise refuse(f"{fn.name}: sparsely stacked inputs")
    params = fn._inputs
    nin = len(params)
    batch = fn._batch
    stacked = [w.is_stacked for w in wrapped]
    if not any(stacked):
        # loop-invariant inputs (pfor converts a stateful op even then):
        # the same value for every item, computed once
        new_op, outs = _node(tf, fn, [w.t for w in wrapped])
        return [pfor.wrap(o, False) for o in outs] if outs else new_op
    if not any(batch):
        raise refuse(f"{fn.name} has no batch dimensions ('...')")
    for i, (name, _, _, mut) in enumerate(params):
        if batch[i]:
            continue
        if stacked[i]:
            raise refuse(f"{fn.name}: argument '{name}' has no '...' and "
                         f"differs per item")
        if mut:
            raise refuse(f"{fn.name}: argument '{name}' is mut without '...'")
    if not all(batch[nin:]):
        raise refuse(f"{fn.name}: a result without '...'")
    if any(w.t.shape.rank is None for w in wrapped):
        raise refuse(f"{fn.name}: an input of unknown rank")
    # the items' batch rank of each `...` input, and their broadcast rank
    ranks = {i: w.t.shape.rank - int(w.is_stacked) - params[i][2]
             for i, w in enumerate(wrapped) if batch[i]}
    rank = max(ranks.values())
    try:
        loop_len = tf.cast(pfor_input.pfor.loop_len_vector, tf.int32)
    except AttributeError as exc:  # pfor moved: its fallback still works
        raise refuse(f"{fn.name}: {exc}") from exc
    args = []
    for i, w in enumerate(wrapped):
        t = w.t
        if batch[i] and w.is_stacked:
            for _ in range(rank - ranks[i]):
                t = tf.expand_dims(t, 1)
        elif batch[i] and params[i][3]:
            tile = tf.concat([loop_len, tf.ones([t.shape.rank], tf.int32)], 0)
            t = tf.tile(tf.expand_dims(t, 0), tile)
            for _ in range(rank - ranks[i]):
                t = tf.expand_dims(t, 1)
        args.append(t)
    new_op, outs = _node(tf, fn, args)
    return [pfor.wrap(o, True) for o in outs] if outs else new_op


def _mixing_error(fn, name, arg):
    tp = type(arg)
    return TypeError(
        f"{fn.name}() argument '{name}': {tp.__module__}.{tp.__qualname__} "
        f"cannot be mixed with TensorFlow's graph tensors: inside "
        f"tf.function every tensor argument of a dlbridge Function must be "
        f"a TensorFlow tensor")


def _tf_dtype(tf, dtype):
    """TensorFlow's DType for a dlbridge dtype, or None."""
    code = _core._tf_dtype(dtype)
    return None if code is None else tf.as_dtype(code)


def _spec_dtype(fn, name, tf_dtype):
    """The dlbridge dtype of a TensorFlow tensor of dtype tf_dtype: the same
    name, when the element layouts agree."""
    try:
        dtype = _core.dtype(tf_dtype.name)
    except ValueError:
        dtype = None
    if dtype is None or _core._tf_dtype(dtype) != tf_dtype.as_datatype_enum:
        raise BufferError(f"{fn.name}() argument '{name}': TensorFlow's "
                          f"{tf_dtype.name} tensors cannot be described to a "
                          f"dlbridge kernel")
    return dtype


def _constant(tf, fn, name, dtype, value):
    """A Python number for a 0-d parameter, as a constant of its dtype,
    converted by the eager call's rule (same exceptions, same messages)."""
    try:
        element = _core.tensor(value, dtype=dtype).tolist()
    except (TypeError, ValueError, OverflowError) as exc:
        # named as the eager call names it (errors.c's argument prefix)
        raise type(exc)(f"{fn.name}() argument '{name}': {exc}") from exc
    tf_dtype = _tf_dtype(tf, dtype)
    if tf_dtype is None:
        raise BufferError(f"{fn.name}() argument '{name}': TensorFlow has no "
                          f"{dtype} dtype")
    return tf.constant(element, dtype=tf_dtype)


def _eager(tf, fn, args):
    """The eager call of ``fn`` on ``args`` when the C call handed it here:
    a tf.Variable is among them, or a GradientTape or ForwardAccumulator is
    recording on this thread (function_call.c asks TF's own
    TFE_Py_TapeSetIsEmpty before it reads a TF tensor: a kernel run
    directly is nothing a tape can see, and tape.gradient would be None).
    A Variable is read with v.value(): a ReadVariableOp, which a recording
    tape sees and which makes it watch a trainable variable.  Then, when a
    tape watches a tensor argument, the call is recorded with the
    Function's vjp, or refused (RuntimeError) when it has none; a
    ForwardAccumulator carrying a tangent for one is refused (no forward
    mode here).  When nothing watches one, the kernel runs directly with
    recording stopped (which the C call's check sees: no second trip)."""
    from tensorflow.python.eager import record

    args = tuple(a.value() if isinstance(a, tf.Variable) else a
                 for a in args)
    if not record.could_possibly_record():
        return fn(*args)
    from tensorflow.python import pywrap_tfe

    inputs = [a for a in args if isinstance(a, tf.Tensor)]
    backward = record.should_record_backprop(inputs)
    # ForwardAccumulators: the tangents they carry for these tensors
    forward = bool(pywrap_tfe.TFE_Py_PackJVPs(inputs)[1])
    if forward:
        # TF would otherwise build the jvp from the backward twice over,
        # through the vjp's vjp, which no Function has.
        raise _autodiff().no_forward_ad(fn)
    if backward and getattr(fn, "_vjp", None) is None:
        raise _no_derivative(fn)
    with record.stop_recording():
        out = fn(*args)
    if not backward:
        return out
    outs = list(out) if isinstance(out, tuple) else [out]
    where = [i for i, a in enumerate(args) if isinstance(a, tf.Tensor)]

    def backward_function(*grads):
        cts = _backward_eager(tf, fn, args, outs, grads)
        return [cts[i] for i in where]

    record.record_operation(_core._TF_OP, outs, inputs, backward_function)
    return out


def _backward_eager(tf, fn, args, outs, grads):
    """_backward run eagerly, its vjp call recorded in turn when a tape
    still records (tape.gradient inside a persistent tape's block, nested
    tapes) with a backward that refuses: a second derivative is asked for
    only when that backward runs, and it is then an error, never a
    silently missing term."""
    from tensorflow.python.eager import record

    with record.stop_recording():
        cts = _backward(tf, fn, args, outs, list(grads))
    if record.could_possibly_record():
        sources = [a for a in args if isinstance(a, tf.Tensor)]
        sources += [o for o in outs if isinstance(o, tf.Tensor)]
        sources += [g for g in grads if isinstance(g, tf.Tensor)]
        if record.should_record_backprop(sources):
            results = [c for c in cts if c is not None]

            def refuse(*unused):
                raise _autodiff().no_second_order(fn)

            record.record_operation(_core._TF_OP, results, sources, refuse)
    return cts


def call(fn, args):
    """Call Function ``fn`` on ``args`` (parameter order) while tf.function
    traces: add a DlbridgeCall node to the graph and return its outputs --
    the declared results, then the updated value of each ``mut`` input;
    None when there are none, the tensor itself when there is one.
    Eagerly (a tf.Variable argument, a tape recording): ``_eager``."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return _eager(tf, fn, args)
    _, outs = _node(tf, fn, args)
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _node(tf, fn, args):
    """The DlbridgeCall node of ``fn`` on ``args`` in the graph being
    built: (the node, its outputs as a list)."""
    from tensorflow.python.eager import execute
    from tensorflow.python.framework import op_def_library, ops
    from tensorflow.python.ops import control_flow_util

    if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
        raise TypeError(
            f"{fn.name}(): a dlbridge Function cannot be compiled by XLA "
            f"(tf.function(jit_compile=True)); call it from a tf.function "
            f"without jit_compile")
    params = fn._inputs
    specs = []
    for (name, dtype, ndim, mut), arg in zip(params, args):
        if isinstance(arg, (int, float, complex)):
            specs.append(arg)  # checked by the eager call's own steps
        elif isinstance(arg, (tf.Tensor, tf.Variable)):
            shape = arg.shape
            if shape.rank is None:
                raise TypeError(f"{fn.name}() argument '{name}': its rank is "
                                f"unknown; a dlbridge Function needs the "
                                f"rank of every tensor when it is traced")
            specs.append((tuple(shape), _spec_dtype(fn, name, arg.dtype)))
        else:
            raise _mixing_error(fn, name, arg)
    results, aliases = fn._result_specs(specs)
    out_dtypes = []
    for o, (_, dtype) in enumerate(results):
        tf_dtype = _tf_dtype(tf, dtype)
        if tf_dtype is None:
            raise BufferError(f"{fn.name}(): result {o} is {dtype}, which "
                              f"TensorFlow has no dtype for")
        out_dtypes.append(tf_dtype)

    _ensure_op(tf)
    _core._ops_register(fn)  # ValueError: another kernel has this identity
    vjp = getattr(fn, "_vjp", None)
    if vjp is not None:
        # with the forward: the gradient of this node (_gradient) finds it,
        # and a gradient of its node names the missing second order
        _core._ops_register(vjp)
        _VJP_OWNER[vjp._identity] = fn

    inputs = []
    for (name, dtype, ndim, mut), arg, spec in zip(params, args, specs):
        if not isinstance(spec, tuple):  # a Python number
            inputs.append(_constant(tf, fn, name, dtype, arg))
        else:
            inputs.append(tf.convert_to_tensor(arg))
    out_dtypes += [inputs[i].dtype for i in aliases]
    # -1: an extent not known when traced, the inputs' answer at run time
    result_shapes = [-1 if e is None else int(e)
                     for shape, _ in results for e in shape]
    attrs = dict(Tout=out_dtypes, function=fn._identity,
                 result_shapes=result_shapes)
    _, _, op, outs = op_def_library._apply_op_helper(
        _core._TF_OP, name=fn.name, args=inputs, **attrs)
    outs = list(outs)
    for out, (shape, _) in zip(outs, results):
        out.set_shape(shape)
    for out, i in zip(outs[len(results):], aliases):
        out.set_shape(inputs[i].shape)
    if outs and execute.must_record_gradient():
        execute.record_gradient(
            _core._TF_OP, op.inputs,
            ("Tin", op.get_attr("Tin"), "Tout", op.get_attr("Tout"),
             "function", op.get_attr("function"),
             "result_shapes", op.get_attr("result_shapes")), outs)
    return op, outs

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
    for k, i in enumerate(fn._vjp_results):
        out[i] = _conj(tf, outs[k])
    return out


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
        _ready = True


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
    from tensorflow.python.eager import execute
    from tensorflow.python.framework import op_def_library, ops
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return _eager(tf, fn, args)
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
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)

"""What every framework's gradient route for a Function shares.

A Function declared with ``vjp=`` / ``jvp=`` (src/python/function_grad.c)
carries its derivative Functions and, per derivative parameter, what it
receives (``_vjp_args`` / ``_jvp_args``: ``("input", i)``, ``("result", o)``,
``("cotangent", o)``, ``("tangent", i)``) and per derivative result which
primal it belongs to (``_vjp_results`` / ``_jvp_results``).  The routes
(_ops_torch, _ops_jax, _ops_tf) differ in how they hold tensors; what to
hand the derivative kernel, what to save from the forward and the messages
of a refusal are one rule, here.
"""

__all__ = ["vjp_arguments", "jvp_arguments", "jvp_needs_results", "saved",
           "sum_down", "no_backward",
           "no_forward_ad", "no_second_order"]


def saved(fn):
    """What a forward must keep for fn's vjp: (input indices, result
    indices), each sorted; ((), ()) without a vjp."""
    if fn._vjp_args is None:
        return (), ()
    ins = sorted({i for kind, i in fn._vjp_args if kind == "input"})
    outs = sorted({o for kind, o in fn._vjp_args if kind == "result"})
    return tuple(ins), tuple(outs)


def vjp_arguments(fn, inputs, results, cotangents):
    """The vjp kernel's arguments, in its parameters' order: ``inputs`` and
    ``results`` are indexable by primal input / result index (only the
    saved ones are read), ``cotangents`` by result index (one per
    differentiable result; the route has already made zeros for one the
    loss did not use)."""
    args = []
    for kind, i in fn._vjp_args:
        if kind == "input":
            args.append(inputs[i])
        elif kind == "result":
            args.append(results[i])
        else:
            args.append(cotangents[i])
    return args


def jvp_arguments(fn, inputs, results, tangents):
    """The jvp kernel's arguments: ``results`` (the forward's, by result
    index) is read only when the jvp names one (softmax's reads y);
    ``tangents`` is indexable by input index (one per differentiable input;
    the route has made zeros where the caller gave none)."""
    pick = {"input": inputs, "result": results, "tangent": tangents}
    return [pick[kind][i] for kind, i in fn._jvp_args]


def jvp_needs_results(fn):
    """Whether fn's jvp reads a result of the forward (then the route runs
    the forward first and hands its results over)."""
    return fn._jvp_args is not None and any(
        kind == "result" for kind, _ in fn._jvp_args)


def sum_down(shape, full):
    """How a cotangent of extents ``full`` (the vjp kernel writes it at the
    call's broadcast batch shape) becomes one of the primal's ``shape``,
    which it was broadcast from (NumPy's rules, leading dims): the axes of
    ``full`` to sum, every leading axis ``shape`` lacks and every axis where
    it has extent 1 against a larger one.  Reshaping the sum to ``shape``
    is the route's.  A ``full`` that ``shape`` does not broadcast to is a
    ValueError: a vjp kernel's result of the wrong shape is never summed
    into a plausible one."""
    shape, full = tuple(shape), tuple(full)
    lead = len(full) - len(shape)
    if lead < 0:
        raise ValueError(f"a cotangent of shape {full} cannot belong to an "
                         f"input of shape {shape}")
    axes = list(range(lead))
    for k, (n, m) in enumerate(zip(shape, full[lead:])):
        if n == m:
            continue
        if n != 1:
            raise ValueError(f"a cotangent of shape {full} cannot belong to "
                             f"an input of shape {shape}")
        axes.append(lead + k)
    return tuple(axes)


def no_backward(fn):
    """The error of a derivative asked of a Function without a vjp (torch
    and TensorFlow raise it; JAX its TypeError, _ops_jax)."""
    return RuntimeError(f"{fn.name}: dlbridge Function has no backward "
                        f"(declare vjp= to differentiate through it)")


def no_forward_ad(fn):
    """Forward-mode AD (a jvp, jacfwd, a dual tensor) through a Function
    without a jvp: never a silently zero tangent."""
    return RuntimeError(f"{fn.name}: forward-mode AD needs a jvp= kernel")


def no_second_order(fn):
    """A derivative of fn's vjp, which declares none of its own."""
    return RuntimeError(f"{fn.name}: its vjp has no derivative (no "
                        f"second-order vjp declared)")

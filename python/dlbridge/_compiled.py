"""A dlbridge.Function inside a graph compiler.

``Function.__call__`` (src/python/function_call.c) reads its arguments in C.  When
one of them is a compiler's placeholder for a tensor -- a JAX tracer, a
torch fake or functional tensor, a TensorFlow symbolic tensor (the
registry's ``_is_traced``) -- there is no memory to read, and the call is
handed here, once per trace, to become the compiler's own op:

* JAX: an XLA FFI custom call (``_ops_jax``, handler in src/ops/xla.c);
* torch: a registered operator with a fake kernel (``_ops_torch``);
* TensorFlow: a generic op registered through TF's C API (``_ops_tf``,
  src/ops/tf.c).

Every route asks the Function itself what the call produces
(``Function._result_specs``): the eager call and every compiler check the
same signature with the same messages.  See docs/compiled.md.
"""

import importlib

__all__ = ["dispatch"]

# framework name -> the module that makes the Function an op of that
# framework's compiler, imported on first use.
_ROUTES = {
    "jax": "dlbridge._ops_jax",
    "torch": "dlbridge._ops_torch",
    "tensorflow": "dlbridge._ops_tf",
}


def dispatch(fn, framework, args):
    """Call Function ``fn`` on ``args`` (a tuple, in parameter order) inside
    ``framework``'s compiler: some argument is one of its placeholders.
    Called from C; returns what the compiled op returns."""
    route = _ROUTES.get(framework)
    if route is None:
        raise TypeError(f"{fn.name}(): cannot be called with {framework} "
                        f"placeholder tensors")
    return importlib.import_module(route).call(fn, args)

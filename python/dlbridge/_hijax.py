"""The one JAX primitive that carries a Function's vjp *and* jvp kernels.

``jax.custom_vjp`` forbids forward mode and ``jax.custom_jvp`` cannot take a
vjp kernel; HiJAX (``jax.experimental.hijax``) is the route that holds
both, plus ``linearize`` and a batching rule, on one object.  Its API moved
between the two JAX versions dlbridge is tested on: 0.10.2 names the base
class ``VJPHiPrimitive``, 0.12 ``HiPrim`` (with new ``dce``/``remat``
signatures, which this class does not override, and ``linearize_from_jvp``,
which it does not need: its own ``lin``/``linearized`` run the jvp kernel).
Everything version-specific is this module's first lines.

The primitive knows nothing of kernels: ``rules`` (_ops_jax._Rules, looped
or not) says how to call the forward, the vjp and the jvp Functions;
this class turns JAX's symbolic zeros into what the rules take (zeros for a
cotangent, None for an input that has no tangent) and back.
"""

from jax.experimental import hijax as _hijax

# 0.12 and later, else 0.10.2's name; None: this JAX has neither (the
# caller says so when a Function with a jvp is traced).
BASE = getattr(_hijax, "HiPrim", None) or getattr(_hijax, "VJPHiPrimitive",
                                                   None)
Zero = _hijax.Zero
ShapedArray = _hijax.ShapedArray

__all__ = ["BASE", "available", "primitive"]


def available():
    return BASE is not None


def _instantiate(aval, t):
    """t, or zeros of aval's tangent type for a symbolic zero."""
    import jax.numpy as jnp
    if isinstance(t, Zero):
        return jnp.zeros(aval.shape, aval.dtype)
    return t


def _tangent_zero(aval):
    return Zero(aval.to_tangent_aval())


if BASE is not None:
    class DlbridgeFunction(BASE):
        """A call of a dlbridge Function with derivatives (params: the
        rules, and its name for printed jaxprs)."""

        def __init__(self, rules, in_avals, out_avals):
            self.in_avals = tuple(in_avals)
            self.out_aval = tuple(out_avals)
            self.params = {"_rules": rules, "name": rules.name}
            super().__init__()

        # the lowered form: the forward kernel's custom call
        def expand(self, *xs):
            return tuple(self._rules.primal(*xs))

        # reverse mode: the forward (this primitive again, so an outer
        # transformation sees a differentiable call), then the vjp kernel
        def vjp_fwd(self, nzs_in, *xs):
            self._rules.check_reverse()
            outs = self(*xs)
            return outs, self._rules.save(xs, outs), self._rules.out_nzs()

        def vjp_bwd_retval(self, res, cts):
            cts = tuple(_instantiate(a, c) for a, c in zip(self.out_aval, cts))
            return tuple(self._rules.vjp(res, cts, [a.shape for a in
                                                    self.in_avals]))

        # forward mode: the forward, then the jvp kernel
        def _tangents_in(self, tangents):
            diff = self._rules.diff_operands()
            return tuple(_instantiate(a, t) if k in diff else None
                         for k, (a, t) in enumerate(zip(self.in_avals,
                                                        tangents)))

        def _tangents_out(self, ts):
            return tuple(_tangent_zero(a) if t is None else t
                         for a, t in zip(self.out_aval, ts))

        def jvp(self, primals, tangents):
            outs = self(*primals)
            ts = self._rules.jvp(primals, outs, self._tangents_in(tangents))
            return outs, self._tangents_out(ts)

        def lin(self, nzs_in, *xs):
            outs = self(*xs)
            return outs, (tuple(xs), outs), self._rules.out_nzs()

        def linearized(self, res, *tangents):
            xs, outs = res
            ts = self._rules.jvp(xs, outs, self._tangents_in(tangents))
            return self._tangents_out(ts)

        # vmap: one call of the Function on the whole batch, or the loop
        # route (_ops_jax._batch_args), as a primitive of the batched types
        # (so grad of vmap still finds the kernels)
        def batch(self, axis_data, args, dims):
            dims = tuple(dims)
            if all(d is None for d in dims):   # JAX asks even then
                return self(*args), (None,) * len(self.out_aval)
            rules, args = self._rules.batch(axis_data.size, args, dims)
            import jax
            in_avals = tuple(ShapedArray(tuple(x.shape), x.dtype)
                             for x in args)
            out_avals = tuple(ShapedArray(tuple(a.shape), a.dtype)
                              for a in jax.eval_shape(rules.primal, *args))
            prim = DlbridgeFunction(rules, in_avals, out_avals)
            return prim(*args), (0,) * len(out_avals)
else:
    DlbridgeFunction = None


def primitive(rules, in_avals, out_avals):
    """The primitive of one call site (``rules``), on these types."""
    return DlbridgeFunction(rules, in_avals, out_avals)

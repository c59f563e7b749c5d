"""What graph compilers ask of a dlbridge.Function (src/python/function.c's
compiled-call section, src/ops/registry.c, python/dlbridge/_compiled.py):
the shape function shared with the eager call, the identity, the registry
and the hand-over of a call made with a compiler's placeholder tensors.
The compilers' own routes are tested in test_compiled_<compiler>.py."""
import subprocess
import sys

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core, _frameworks

MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"
SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"


# `lib`, the example kernels library, is conftest's fixture (the build's,
# DLB_EXAMPLE_KERNELS', or one it compiles).


def test_result_specs_derive_shapes_and_aliases(lib):
    mm = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    results, aliases = mm._result_specs([((2, 3), "float32"),
                                         ((3, 5), np.dtype("float32"))])
    assert results == (((2, 5), "float32"),) and aliases == ()
    sx = dlb.load(lib, "dlb_kernel_saxpy", SAXPY)
    assert sx._result_specs([None, ((4,), "float32"), ((4,), "float32")]) \
        == ((), (2,))


@pytest.mark.parametrize("specs, shapes", [
    ([((2, 3), "float32"), ((4, 5), "float32")], [(2, 3), (4, 5)]),
    ([((2, 3), "float64"), ((3, 5), "float32")], None),
    ([((2, 3, 1), "float32"), ((3, 5), "float32")], [(2, 3, 1), (3, 5)]),
])
def test_result_specs_raise_what_the_eager_call_raises(lib, specs, shapes):
    mm = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    with pytest.raises(Exception) as traced:
        mm._result_specs(specs)
    args = [np.zeros(s, d) for (s, d) in specs]
    with pytest.raises(Exception) as eager:
        mm(*args)
    assert type(traced.value) is type(eager.value)
    assert str(traced.value) == str(eager.value)


def test_result_specs_refuse_bad_specs(lib):
    mm = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        mm._result_specs([((2, 3), "float32")])
    with pytest.raises(TypeError, match="pair or None"):
        mm._result_specs([[(2, 3), "float32"], ((3, 5), "float32")])
    with pytest.raises(TypeError, match="an extent is an int, or None"):
        mm._result_specs([(("m", 3), "float32"), ((3, 5), "float32")])
    with pytest.raises(TypeError, match="0-d parameter"):
        mm._result_specs([None, ((3, 5), "float32")])
    sx = dlb.load(lib, "dlb_kernel_saxpy", SAXPY)
    with pytest.raises(TypeError, match="'mut'"):
        dlb.load(lib, "dlb_kernel_saxpy", "s(a: mut float32)")._result_specs(
            [None])
    with pytest.raises(ValueError, match="dtype"):
        sx._result_specs([None, ((4,), "nosuchtype"), ((4,), "float32")])


def test_identity_ignores_spacing_and_is_the_same_in_every_process(lib):
    a = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    b = dlb.load(lib, "dlb_kernel_matmul",
                 "matmul( a:float32[m,k],b : float32[ k , n ] )->(float32[m,n])")
    assert a._identity == b._identity
    assert a._normalized_signature == \
        "matmul(a: float32[m, k], b: float32[k, n]) -> (float32[m, n])"
    assert a._identity.startswith("matmul_") and len(a._identity) == 23
    code = ("import dlbridge as dlb; print(dlb.load(%r, 'dlb_kernel_matmul', "
            "%r)._identity)" % (lib, MATMUL))
    other = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert other == a._identity
    c = dlb.load(lib, "dlb_kernel_matmul",
                 "matmul(a: float32[m, k], b: float32[k, n]) -> float64[m, n]")
    assert c._identity != a._identity


def test_registry_is_idempotent_and_refuses_another_kernel(lib):
    sig = "reg_case(x: float32[n]) -> float32[n]"
    first = dlb.load(lib, "dlb_kernel_copy", sig)
    again = dlb.load(lib, "dlb_kernel_copy", sig)
    assert _core._ops_register(first) is first
    assert _core._ops_register(again) is first
    assert _core._ops_register(first) is first
    assert _core._ops_find(first._identity) is first
    assert _core._ops_find("reg_case_00000000") is None
    other = dlb.load(lib, "dlb_kernel_noop", sig)
    with pytest.raises(ValueError, match="another kernel"):
        _core._ops_register(other)
    with pytest.raises(TypeError):
        _core._ops_register(object())


def test_placeholder_arguments_hand_the_call_to_the_compiler(lib, monkeypatch):
    calls = []
    from dlbridge import _compiled

    def fake_call(fn, args):
        calls.append((fn, args))
        return "compiled result"

    class Traced:
        __module__ = "jax._fake_tracer"

    monkeypatch.setattr(_frameworks, "_TRACED_BASES",
                        _frameworks._TRACED_BASES |
                        {("jax._fake_tracer", Traced.__qualname__)})
    import types
    fake = types.ModuleType("dlbridge._ops_jax_fake")
    fake.call = fake_call
    monkeypatch.setitem(sys.modules, "dlbridge._ops_jax_fake", fake)
    monkeypatch.setitem(_compiled._ROUTES, "jax", "dlbridge._ops_jax_fake")
    mm = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    x = np.ones((2, 3), np.float32)
    t = Traced()
    assert mm(x, t) == "compiled result"
    assert calls == [(mm, (x, t))]
    assert mm(b=t, a=x) == "compiled result"
    assert calls[-1] == (mm, (x, t))


@pytest.mark.parametrize("sig, specs, args", [
    ("n8(x: float32[n], a: int8)", [((3,), "float32"), 1000], None),
    ("n8(x: float32[n], a: int8)", [((3,), "float32"), 2.5], None),
    ("m(x: float32[n], a: mut float32)", [((3,), "float32"), 2.0], None),
    ("t(x: float32[n], y: float32[n])", [((3,), "float32"), 2.0], None),
])
def test_result_specs_check_numbers_as_the_eager_call(lib, sig, specs, args):
    fn = dlb.load(lib, "dlb_kernel_noop", sig)
    with pytest.raises(Exception) as traced:
        fn._result_specs(specs)
    eager_args = [np.zeros(s[0], s[1]) if isinstance(s, tuple) else s
                  for s in specs]
    with pytest.raises(Exception) as eager:
        fn(*eager_args)
    assert type(traced.value) is type(eager.value)
    assert str(traced.value) == str(eager.value)


def test_result_specs_take_unknown_extents(lib):
    mm = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
    # unknown where bound, known further on: the known extent stands
    assert mm._result_specs([((None, 3), "float32"), ((3, 5), "float32")]) \
        == ((((None, 5), "float32"),), ())
    assert mm._result_specs([((2, None), "float32"), ((4, 5), "float32")]) \
        == ((((2, 5), "float32"),), ())
    assert mm._result_specs([((2, 3), "float32"), ((None, None), "float32")]) \
        == ((((2, None), "float32"),), ())
    with pytest.raises(ValueError, match="dimension k is 4 here but 3"):
        mm._result_specs([((None, 3), "float32"), ((4, None), "float32")])
    assert mm._dims == (("m", "k"), ("k", "n"), ("m", "n"))
    lit = dlb.load(lib, "dlb_kernel_noop", "l(x: float32[2, n]) -> float32[n, 4]")
    assert lit._dims == ((2, "n"), ("n", 4))

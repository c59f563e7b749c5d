"""What a user's first minutes with an installed dlbridge wheel exercise,
run by scripts/wheel-smoke inside a fresh virtual environment that has the
wheel and its peers but no compiler and no build tree:

    python -I smoke.py KERNELS_SO REPO_INCLUDE_DIR

NumPy interop (zero copy both ways, convert), on a free-threaded
interpreter the GIL still off after the import, the C headers the wheel
ships, a Function running a C kernel eagerly on NumPy, dlbridge and JAX
arrays, and the same Function under jax.jit and tf.function where those are
installed (both routes are required: a failure there fails the smoke test).
Prints one line per check; exits non-zero on the first failure."""
import filecmp
import os
import sys
import sysconfig

SIG = "scale(a: float32, x: float32[n]) -> float32[n]"


def say(what, result="ok"):
    print(f"  {result:4} {what}", flush=True)


def main(kernels, include):
    import numpy as np
    import dlbridge as dlb

    here = os.path.dirname(os.path.abspath(dlb.__file__))
    assert here.startswith(sys.prefix), (here, sys.prefix)
    ft = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    say(f"import dlbridge {dlb.__version__} from {here}"
        + (" (free-threaded CPython)" if ft else ""))
    if ft:
        # A module without Py_mod_gil turns the GIL back on for the process.
        assert not sys._is_gil_enabled(), "importing dlbridge turned the GIL on"
        say("the GIL stays off after import numpy, dlbridge")

    # NumPy interop: zero copy both ways.
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = dlb.from_dlpack(a)
    assert t.shape == (3, 2) and t.data_ptr == a.__array_interface__["data"][0]
    back = np.from_dlpack(t)
    assert back.__array_interface__["data"][0] == t.data_ptr
    assert np.array_equal(back, a)
    c = dlb.convert(t, "numpy")
    assert isinstance(c, np.ndarray) and np.array_equal(c, a)
    assert dlb.tensor([[1, 2], [3, 4]], dtype="int16").tolist() == [[1, 2], [3, 4]]
    say("NumPy <-> dlbridge without copies, convert, tensor().tolist()")

    # The C headers extension authors compile against are in the wheel.
    inc = dlb.get_include()
    for h in ("dlbridge/dlbridge.h", "dlbridge/python.h", "dlpack/dlpack.h"):
        assert filecmp.cmp(os.path.join(inc, h), os.path.join(include, h),
                           shallow=False), h
    say(f"headers in {inc}")

    # A Function eagerly.
    f = dlb.load(kernels, "smoke_scale", SIG)
    x = np.arange(5, dtype=np.float32)
    r = f(3.0, x)
    assert isinstance(r, np.ndarray) and r.tolist() == [0, 3, 6, 9, 12], r
    r = f(2.0, dlb.from_dlpack(x[::2]))
    assert isinstance(r, dlb.Tensor) and r.tolist() == [0, 4, 8], r
    say("Function eagerly on NumPy and dlbridge tensors")

    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        say(f"JAX: not installed here ({exc})", "SKIP")
    else:
        xj = jnp.arange(4, dtype=jnp.float32)
        r = f(2.0, xj)
        assert isinstance(r, jax.Array) and r.tolist() == [0, 2, 4, 6], r
        say(f"Function eagerly on JAX {jax.__version__} arrays")
        r = jax.jit(lambda v: f(2.0, v))(xj)
        assert r.tolist() == [0, 2, 4, 6], r
        say("Function under jax.jit")
        if ft:
            say(f"GIL enabled after import jax: {sys._is_gil_enabled()}", "info")

    try:
        import tensorflow as tf
    except ImportError as exc:
        say(f"TensorFlow: not installed here ({exc})", "SKIP")
    else:
        xt = tf.constant([0.0, 1.0, 2.0], dtype=tf.float32)
        r = f(2.0, xt)
        assert isinstance(r, tf.Tensor) and r.numpy().tolist() == [0, 2, 4], r
        say(f"Function eagerly on TensorFlow {tf.__version__} tensors")
        r = tf.function(lambda v: f(2.0, v))(xt)
        assert r.numpy().tolist() == [0, 2, 4], r
        say("Function under tf.function")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(*sys.argv[1:3])
    print("smoke: OK")

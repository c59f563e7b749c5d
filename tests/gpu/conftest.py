"""Fixtures for the real-GPU tests (tests/gpu), run by scripts/gpu-check.

Without a CUDA device every test here is skipped, with the reason, so CI and
CPU machines collect the directory cleanly.  scripts/gpu-check sets
DLB_GPU_REQUIRED=1: then a machine without a GPU fails test_gpu_present
instead of passing by skipping everything.

"A GPU" means torch sees one: torch is the reference framework of these
tests (its streams, its sleep kernel, its graph capture).  Each other
framework is a fixture that skips the tests needing it when it is missing
or has no GPU backend.  Nothing here imports a framework at collection time
except torch (to ask whether there is a GPU).
"""

import glob
import os
import pathlib

# JAX preallocates 75% of the GPU on first use; these tests share the GPU
# between four frameworks.  Set before anything can import jax.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from gpu_helpers import NO_GPU, TORCH  # noqa: E402  (the probe)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "runs_without_gpu: a tests/gpu test that runs (and "
        "decides for itself) on a machine without a GPU")


def pytest_collection_modifyitems(config, items):
    if NO_GPU is None:
        return
    skip = pytest.mark.skip(reason="no GPU: " + NO_GPU)
    for item in items:
        if (HERE in pathlib.Path(str(item.fspath)).resolve().parents
                and item.get_closest_marker("runs_without_gpu") is None):
            item.add_marker(skip)


# ---- frameworks ----------------------------------------------------------------

@pytest.fixture(scope="session")
def dlb():
    import dlbridge
    return dlbridge


@pytest.fixture(scope="session")
def torch():
    if TORCH is None:
        pytest.skip("no GPU: " + NO_GPU)
    return TORCH


@pytest.fixture(scope="session")
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no CUDA device")
    except Exception as exc:
        pytest.skip("CuPy cannot reach CUDA (%s)" % exc)
    return cp


@pytest.fixture(scope="session")
def jax():
    jx = pytest.importorskip("jax")
    pytest.importorskip("jax.dlpack")
    try:
        gpus = jx.devices("gpu")
    except Exception as exc:
        pytest.skip("JAX has no GPU backend (%s)" % exc)
    if not gpus:
        pytest.skip("JAX has no GPU device")
    return jx


@pytest.fixture(scope="session")
def numba_cuda():
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("numba.cuda sees no CUDA device")
    return cuda


@pytest.fixture(scope="session")
def smv_type():
    """cuda.core's StridedMemoryView class (its home moved between
    releases: cuda.core.utils, then cuda.core)."""
    pytest.importorskip("cuda.core")
    for mod in ("cuda.core.utils", "cuda.core", "cuda.core.experimental.utils"):
        try:
            m = __import__(mod, fromlist=["StridedMemoryView"])
            return m.StridedMemoryView
        except (ImportError, AttributeError):
            continue
    pytest.skip("cuda.core has no StridedMemoryView")


@pytest.fixture(scope="session")
def cuda_kernels_lib():
    """libdlb_example_cuda_kernels.so (examples/kernels/*.cu, built by Meson
    when nvcc is found): $DLB_EXAMPLE_CUDA_KERNELS, set by scripts/gpu-check,
    else the first one under a build directory of this tree."""
    path = os.environ.get("DLB_EXAMPLE_CUDA_KERNELS")
    if path and os.path.exists(path):
        return path
    hits = sorted(glob.glob(str(ROOT / "build*" / "libdlb_example_cuda_kernels.so")))
    if hits:
        return hits[0]
    pytest.skip("libdlb_example_cuda_kernels.so not built (needs nvcc; "
                "set DLB_EXAMPLE_CUDA_KERNELS)")


@pytest.fixture(scope="session")
def gpu_count(torch):
    return torch.cuda.device_count()


@pytest.fixture(autouse=True)
def _settled():
    """Each test starts and ends with the device idle, so one test's pending
    work can neither satisfy nor break the next one's ordering checks."""
    if TORCH is not None and NO_GPU is None:
        TORCH.cuda.synchronize()
        yield
        TORCH.cuda.synchronize()
    else:
        yield

"""The GPU is there and dlbridge reaches it: the first thing scripts/gpu-check
needs to know, so a broken setup shows as one clear failure rather than as
everything skipped."""

import os

import pytest

from gpu_helpers import NO_GPU, REQUIRED


@pytest.mark.runs_without_gpu
def test_gpu_present():
    if NO_GPU is None:
        return
    if REQUIRED:
        pytest.fail("DLB_GPU_REQUIRED=1 but there is no GPU: " + NO_GPU)
    pytest.skip("no GPU: " + NO_GPU)


def test_dlbridge_reaches_cuda(dlb, torch):
    t = dlb.empty((3,), device="cuda:0")
    assert t.device == "cuda:0" and str(t.device) == "cuda:0"
    assert t.device == (2, 0) and t.__dlpack_device__() == (2, 0)
    assert dlb.device("cuda:0").type == 2


def test_kernels_library_built_when_nvcc_found():
    # scripts/gpu-check builds with nvcc; a missing library would silently
    # skip every Function test, so it is an error there.
    path = os.environ.get("DLB_EXAMPLE_CUDA_KERNELS")
    if not REQUIRED or not path:
        pytest.skip("not run by scripts/gpu-check")
    assert os.path.exists(path), path + " was not built (is nvcc on PATH?)"

"""Stream ordering on a real GPU (issue 8, item 4).

Each ordering test writes a value on one stream after a ~0.1 s spin
(torch.cuda._sleep) and reads it through dlbridge on ANOTHER stream right
away, without any host synchronisation in between.  Only a GPU-side wait
(event record on the writer's stream + wait on the reader's) makes the read
see the written value; without it the reader runs during the spin and sees
the old one.  torch's side streams are non-blocking, so the legacy stream's
implicit synchronisation cannot hide a missing wait.
"""

import numpy as np
import pytest

from gpu_helpers import slow_fill

N = 1 << 20


def _zeros(torch):
    x = torch.zeros(N, device="cuda:0")
    torch.cuda.synchronize()
    return x


def test_from_dlpack_orders_producer_before_dlbridge_stream(dlb, torch):
    """Consumer side: dlbridge passes its current stream (dlb.stream(...))
    to the producer, which orders its current stream's work before it."""
    writer, reader = torch.cuda.Stream(), torch.cuda.Stream()
    x = _zeros(torch)
    with torch.cuda.stream(writer):
        slow_fill(torch, x, 42.0, writer)
        with dlb.stream(reader):
            t = dlb.from_dlpack(x)
            host = np.asarray(t.copy(device="cpu"))  # runs on `reader`
    assert (host == 42.0).all(), "read before the write finished: %r" % host[:4]


@pytest.mark.parametrize("consumer", ["torch", "cupy"])
def test_tensor_export_orders_dlbridge_stream_before_consumer(
        request, dlb, torch, consumer):
    """Producer side: a dlbridge.Tensor whose pending work is on dlbridge's
    current stream is ordered before the stream the consumer passes to
    __dlpack__ (an event record + cuStreamWaitEvent, no host wait)."""
    writer = torch.cuda.Stream()
    x = _zeros(torch)
    t = dlb.from_dlpack(x)
    slow_fill(torch, x, 7.0, writer)
    with dlb.stream(writer):
        if consumer == "torch":
            reader = torch.cuda.Stream()
            with torch.cuda.stream(reader):
                y = torch.from_dlpack(t)       # passes `reader` as stream
                host = y.clone().cpu().numpy()  # clone on `reader`
        else:
            cupy = request.getfixturevalue("cupy")
            reader = cupy.cuda.Stream(non_blocking=True)
            with reader:
                y = cupy.from_dlpack(t)         # passes reader.ptr
                host = cupy.asnumpy(y.copy())   # copy on `reader`
    assert (host == 7.0).all(), "read before the write finished: %r" % host[:4]


def test_function_launches_on_the_callers_current_stream(
        dlb, torch, cuda_kernels_lib):
    """Function passes torch's current stream to the kernel: launched on
    the stream that holds the pending write, it reads the written value."""
    saxpy_out = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_saxpy_out",
                         "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]")
    side = torch.cuda.Stream()
    x = _zeros(torch)
    y = torch.ones(N, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        slow_fill(torch, x, 3.0, side)
        out = saxpy_out(2.0, x, y)
        host = out.cpu().numpy()
    assert (host == 7.0).all()


def test_stream_minus_one_asks_for_no_ordering(dlb, torch):
    """__dlpack__(stream=-1): the consumer declares it orders the work
    itself, so dlbridge makes no event and no wait.  Whether a read that
    follows at once races the producer depends on timing, so that is not
    asserted: only that the export works, shares memory, and that after the
    consumer's own synchronisation the value is right."""
    writer = torch.cuda.Stream()
    x = _zeros(torch)
    t = dlb.from_dlpack(x)
    slow_fill(torch, x, 5.0, writer)
    with dlb.stream(writer):
        cap = t.__dlpack__(stream=-1)
    torch.cuda.synchronize()  # the consumer's own ordering
    u = dlb.from_dlpack(cap)
    assert u.data_ptr == x.data_ptr()
    assert (np.asarray(u.copy(device="cpu")) == 5.0).all()


def test_stream_zero_refused_on_cuda(dlb, torch):
    # 0 is ambiguous on CUDA (the array API disallows it).
    t = dlb.from_dlpack(torch.zeros(4, device="cuda:0"))
    with pytest.raises((ValueError, BufferError)):
        t.__dlpack__(stream=0)


@pytest.mark.parametrize("value", [None, 1, 2])
def test_special_stream_values_accepted(dlb, torch, value):
    t = dlb.from_dlpack(torch.arange(8.0, device="cuda:0"))
    u = dlb.from_dlpack(t.__dlpack__(stream=value))
    torch.cuda.synchronize()
    assert u.data_ptr == t.data_ptr
    assert np.asarray(u.copy(device="cpu")).tolist() == list(range(8))


# ---- dlb.stream --------------------------------------------------------------

def _cai_stream(t):
    return t.__cuda_array_interface__.get("stream")


def test_dlb_stream_accepts_framework_streams_and_handles(request, dlb, torch):
    t = dlb.zeros((4,), device="cuda:0")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    outside = _cai_stream(t)
    assert outside != 0
    with dlb.stream(s1):
        assert _cai_stream(t) == s1.cuda_stream
        with dlb.stream(s2.cuda_stream):          # a raw handle
            assert _cai_stream(t) == s2.cuda_stream
        assert _cai_stream(t) == s1.cuda_stream  # restored on exit
    assert _cai_stream(t) == outside
    try:
        cupy = request.getfixturevalue("cupy")
    except pytest.skip.Exception:
        return
    cs = cupy.cuda.Stream(non_blocking=True)
    with dlb.stream(cs):
        assert _cai_stream(t) == cs.ptr
    assert _cai_stream(t) == outside


def test_dlb_stream_restored_after_exception(dlb, torch):
    t = dlb.zeros((4,), device="cuda:0")
    outside = _cai_stream(t)
    s = torch.cuda.Stream()
    with pytest.raises(KeyError):
        with dlb.stream(s):
            raise KeyError("x")
    assert _cai_stream(t) == outside


# ---- __cuda_array_interface__ ------------------------------------------------

def test_cai_export_v3(dlb, torch):
    t = dlb.from_dlpack(torch.arange(12.0, device="cuda:0").reshape(3, 4).t())
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (4, 3)
    assert cai["typestr"] == "<f4"
    assert cai["data"] == (t.data_ptr, False)
    assert cai["strides"] == (4, 16)
    assert "stream" in cai and cai["stream"] != 0


def test_cai_export_consumed_by_cupy_and_numba(request, dlb, torch):
    x = torch.arange(20.0, device="cuda:0").reshape(4, 5)
    t = dlb.from_dlpack(x)
    seen = 0
    for fixture in ("cupy", "numba_cuda"):
        try:
            mod = request.getfixturevalue(fixture)
        except pytest.skip.Exception:
            continue
        seen += 1
        if fixture == "cupy":
            arr = mod.asarray(t)  # CuPy reads __cuda_array_interface__
            assert arr.data.ptr == x.data_ptr()
            host = mod.asnumpy(arr)
        else:
            arr = mod.as_cuda_array(t)
            assert arr.__cuda_array_interface__["data"][0] == x.data_ptr()
            host = arr.copy_to_host()
        np.testing.assert_array_equal(host, x.cpu().numpy())
    if not seen:
        pytest.skip("neither CuPy nor numba-cuda is installed")


def test_cai_export_stream_orders_numba_read(dlb, torch, numba_cuda):
    """The stream field names dlbridge's current stream; numba (which
    synchronises on it, as CAI v3 allows) then reads the written value."""
    writer = torch.cuda.Stream()
    x = _zeros(torch)
    t = dlb.from_dlpack(x)
    slow_fill(torch, x, 9.0, writer)
    with dlb.stream(writer):
        arr = numba_cuda.as_cuda_array(t)
    assert (arr.copy_to_host() == 9.0).all()


class _CAIOnly:
    """Exposes nothing but a captured __cuda_array_interface__ dict."""

    def __init__(self, cai, owner):
        self.__cuda_array_interface__ = cai
        self.owner = owner


def test_cai_import_waits_on_the_producers_stream(dlb, torch, cupy):
    """A CuPy array written on a non-default stream, exported through CAI v3
    with that stream: dlbridge's reader on another stream waits for it on
    the GPU (no host sync required of the caller)."""
    cs = cupy.cuda.Stream(non_blocking=True)
    a = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    with cs:
        with torch.cuda.stream(torch.cuda.ExternalStream(cs.ptr)):
            torch.cuda._sleep(200_000_000)
        a.fill(5.0)
        cai = dict(a.__cuda_array_interface__)
    if cai.get("stream") != cs.ptr:
        pytest.skip("this CuPy does not export its stream in CAI (%r)"
                    % cai.get("stream"))
    reader = torch.cuda.Stream()
    with dlb.stream(reader):
        t = dlb.from_dlpack(_CAIOnly(cai, a))
        host = np.asarray(t.copy(device="cpu"))
    assert t.data_ptr == a.data.ptr and t.device == "cuda:0"
    assert (host == 5.0).all()


def test_cai_import_device_comes_from_the_pointer(dlb, cupy, gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    with cupy.cuda.Device(1):
        a = cupy.arange(8, dtype=cupy.float32)
    cai = dict(a.__cuda_array_interface__)
    t = dlb.from_dlpack(_CAIOnly(cai, a))
    assert t.device == "cuda:1"
    assert np.asarray(t.copy(device="cpu")).tolist() == list(range(8))


def test_cai_host_pointer_claimed_as_cuda_refused(dlb, torch):
    host = np.arange(8, dtype=np.float32)
    cai = {"shape": (8,), "typestr": "<f4", "data": (host.ctypes.data, False),
           "version": 3, "strides": None}
    with pytest.raises(BufferError):
        dlb.from_dlpack(_CAIOnly(cai, host))


# ---- a stream destroyed before the memory allocated on it ---------------------------

def test_tensor_outlives_the_stream_it_was_allocated_on(request, dlb, torch):
    """dlbridge allocates on the current stream but frees on the legacy
    stream: the allocation stream may be gone by then (a framework stream
    object dropped first).  Freeing on a destroyed stream crashed (CuPy 14,
    H100) before this was so."""
    import gc
    keep = []
    for _ in range(20):
        s = torch.cuda.Stream()
        with dlb.stream(s):
            keep.append(dlb.zeros((1 << 16,), device="cuda:0"))
        del s
    try:
        cupy = request.getfixturevalue("cupy")
    except pytest.skip.Exception:
        cupy = None
    if cupy is not None:
        for _ in range(20):
            cs = cupy.cuda.Stream(non_blocking=True)
            with cs:
                keep.append(dlb.zeros((1 << 16,), device="cuda:0"))
            del cs
    gc.collect()
    torch.cuda.synchronize()
    for t in keep:
        assert not np.asarray(t.copy(device="cpu")).any()
    del keep, t
    gc.collect()
    torch.cuda.synchronize()
    z = dlb.zeros((1 << 16,), device="cuda:0")
    assert not np.asarray(z.copy(device="cpu")).any()

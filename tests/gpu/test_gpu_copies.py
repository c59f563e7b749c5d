"""Copies between host and device and between layouts on a real GPU (issue
8, item 3), and CUDA allocation (item 2).  Every comparison is of raw bytes
(random bit patterns, NaNs included), so "bit-exact" means exactly that.

Device layouts are made with CuPy (it has negative strides; torch has none)
or with torch where CuPy lacks the dtype (bfloat16).  The bytes of a result
are read back twice: through dlbridge's own device-to-host copy, and through
cudaMemcpy of its memory (CuPy's runtime binding) where CuPy is installed,
so a copy that is wrong both ways cannot pass.
"""

import numpy as np
import pytest

from gpu_helpers import device_bytes

# NumPy dtypes here; bfloat16 (which NumPy lacks) has its own test below.
DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16",
          "float32", "float64", "complex64", "complex128"]
LAYOUTS = ["contiguous", "transposed", "negative", "offset", "permuted3d"]


def _host_base(name, seed=0):
    dt = np.dtype(name)
    rng = np.random.default_rng(seed)
    n = 37 * 24
    if name == "bool":
        return (rng.integers(0, 2, n) == 1).reshape(37, 24)
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(37, 24)


def _view(a, layout):
    if layout == "contiguous":
        return a
    if layout == "transposed":
        return a.T
    if layout == "negative":
        return a[::-2, ::-1]
    if layout == "offset":
        return a[3:, 5:]
    if layout == "permuted3d":
        return a.reshape(37, 4, 6).transpose(2, 0, 1)
    raise ValueError(layout)


def _bytes(a):
    return np.ascontiguousarray(a).tobytes()


def _check_device_result(request, t, want):
    """t: a CUDA dlbridge.Tensor made by a copy; want: the host array it must
    equal.  Its memory is also read raw with cudaMemcpy when it is compact
    (a copy into a new tensor is expected to be, but only the values are
    promised)."""
    assert t.device == "cuda:0"
    assert t.shape == want.shape
    back = np.asarray(t.copy(device="cpu"))
    assert _bytes(back) == _bytes(want)
    if not t.is_contiguous:
        return
    try:
        cupy = request.getfixturevalue("cupy")
    except pytest.skip.Exception:
        return
    assert device_bytes(cupy, t.data_ptr, t.nbytes) == _bytes(want)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_to_device_copy(request, dlb, torch, dtype, layout):
    host = _view(_host_base(dtype), layout)
    src = dlb.from_dlpack(host)
    t = src.copy(device="cuda:0")
    _check_device_result(request, t, host)
    t2 = dlb.from_dlpack(host, device="cuda:0", copy=True)
    _check_device_result(request, t2, host)
    t3 = dlb.from_dlpack(host, device="cuda:0")  # copy=None: copies as needed
    _check_device_result(request, t3, host)


def test_host_to_device_copy_false_refused(dlb, torch):
    with pytest.raises(BufferError):
        dlb.from_dlpack(np.zeros(4, np.float32), device="cuda:0", copy=False)


def _device_view(request, dlb, torch, dtype, layout):
    """(a device view of the given layout, the host array it equals)."""
    host = _host_base(dtype, seed=1)
    want = _view(host, layout)
    try:
        cupy = request.getfixturevalue("cupy")
    except pytest.skip.Exception:
        cupy = None
    if cupy is not None:
        return _view(cupy.asarray(host), layout), want
    if layout == "negative":
        pytest.skip("a negative-stride device view of %s needs CuPy" % dtype)
    dev = dlb.convert(dlb.from_dlpack(host, device="cuda:0", copy=True), "torch")
    if layout == "transposed":
        return dev.t(), want
    if layout == "offset":
        return dev[3:, 5:], want
    if layout == "permuted3d":
        return dev.reshape(37, 4, 6).permute(2, 0, 1), want
    return dev, want


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_to_host_copy(request, dlb, torch, dtype, layout):
    view, want = _device_view(request, dlb, torch, dtype, layout)
    t = dlb.from_dlpack(view)
    assert t.device == "cuda:0"
    # Tensor.copy(device="cpu")
    h = t.copy(device="cpu")
    assert h.device == "cpu" and _bytes(np.asarray(h)) == _bytes(want)
    # from_dlpack(x, device="cpu", copy=True) of the framework's own array
    h2 = dlb.from_dlpack(view, device="cpu", copy=True)
    assert h2.device == "cpu" and _bytes(np.asarray(h2)) == _bytes(want)
    # __dlpack__(dl_device=(kDLCPU, 0), copy=True): a host capsule
    cap = t.__dlpack__(dl_device=(1, 0), copy=True, max_version=(1, 3))
    h3 = dlb.from_dlpack(cap)
    assert h3.device == "cpu" and _bytes(np.asarray(h3)) == _bytes(want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_numpy_from_dlpack_of_cuda_tensor_to_cpu(request, dlb, torch, layout):
    # NumPy's from_dlpack(x, device="cpu") asks the producer for a host copy
    # through dl_device (and copy=None lets it copy).
    view, want = _device_view(request, dlb, torch, "float64", layout)
    t = dlb.from_dlpack(view)
    got = np.from_dlpack(t, device="cpu")
    assert _bytes(got) == _bytes(want)
    got = np.from_dlpack(t, device="cpu", copy=True)
    assert _bytes(got) == _bytes(want)


def test_device_to_host_copy_false_refused(dlb, torch):
    t = dlb.from_dlpack(torch.zeros(4, device="cuda:0"))
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError):
        dlb.from_dlpack(t, device="cpu", copy=False)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["int8", "float16", "float32", "complex128"])
def test_device_to_device_strided_copy(request, dlb, torch, dtype, layout):
    view, want = _device_view(request, dlb, torch, dtype, layout)
    t = dlb.from_dlpack(view)
    for c in (t.copy(), t.copy(device="cuda:0"),
              dlb.from_dlpack(view, copy=True)):
        assert c.data_ptr != t.data_ptr
        _check_device_result(request, c, want)


TORCH_LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.t(),
    "offset": lambda x: x[3:, 5:],
    "permuted3d": lambda x: x.reshape(37, 4, 6).permute(2, 0, 1),
}


@pytest.mark.parametrize("layout", list(TORCH_LAYOUTS))
def test_bfloat16_copies(dlb, torch, layout):
    """bfloat16 (no NumPy dtype): host and device arrays made by torch, bytes
    compared as int16."""
    def bits(x):  # a bfloat16 torch tensor (any device) -> its bytes
        return x.contiguous().view(torch.int16).cpu().numpy().tobytes()

    to = TORCH_LAYOUTS[layout]
    base = torch.randint(-32768, 32767, (37, 24), dtype=torch.int16).view(torch.bfloat16)
    want = bits(to(base))
    up = dlb.from_dlpack(to(base)).copy(device="cuda:0")
    assert up.device == "cuda:0" and up.dtype == "bfloat16" and up.is_contiguous
    assert bits(torch.from_dlpack(up)) == want
    dev = to(base.to("cuda:0"))
    down = dlb.from_dlpack(dev, device="cpu", copy=True)
    assert down.device == "cpu" and bits(torch.from_dlpack(down)) == want
    d2d = dlb.from_dlpack(dev).copy()
    assert d2d.device == "cuda:0" and bits(torch.from_dlpack(d2d)) == want


def test_large_transposed_copies(request, dlb, torch):
    """Many blocks of the strided-copy kernel, both directions and on the
    device: a 2048 x 1536 float32 transpose."""
    x = torch.randn(2048, 1536, device="cuda:0")
    want = x.t().contiguous().cpu().numpy()
    t = dlb.from_dlpack(x.t())
    d = t.copy()
    _check_device_result(request, d, want)
    h = t.copy(device="cpu")
    assert _bytes(np.asarray(h)) == _bytes(want)
    host_t = x.cpu().numpy().T
    up = dlb.from_dlpack(host_t, device="cuda:0", copy=True)
    _check_device_result(request, up, want)


def test_copy_is_ordered_on_dlbridge_stream(dlb, torch):
    """A device copy made under dlb.stream(s) runs on s: reading the copy
    on s gives the source's final value, written on s before the copy."""
    s = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        x.fill_(11.0)
    with dlb.stream(s):
        c = dlb.from_dlpack(x).copy()
        host = np.asarray(c.copy(device="cpu"))
    assert (host == 11.0).all()


# ---- allocation -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "bfloat16", "complex64"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_empty_and_zeros_on_cuda(request, dlb, torch, dtype, device):
    # zeros are checked as bytes through torch (NumPy has no bfloat16)
    e = dlb.empty((5, 7), dtype=dtype, device=device)
    z = dlb.zeros((5, 7), dtype=dtype, device=device)
    for t in (e, z):
        assert t.device == "cuda:0" and t.__dlpack_device__() == (2, 0)
        assert t.shape == (5, 7) and t.dtype == dtype and t.is_contiguous
        assert t.data_ptr % 256 == 0 and not t.readonly
    assert e.data_ptr != z.data_ptr
    assert not torch.from_dlpack(z).view(torch.uint8).any().item()
    try:
        cupy = request.getfixturevalue("cupy")
    except pytest.skip.Exception:
        return
    assert not any(device_bytes(cupy, z.data_ptr, z.nbytes))


def test_zero_size_and_0d_cuda_tensors(dlb, torch):
    for shape in [(0,), (3, 0), ()]:
        z = dlb.zeros(shape, device="cuda:0")
        assert z.shape == shape and z.device == "cuda:0"
        back = dlb.convert(z, "torch")
        assert back.is_cuda and tuple(back.shape) == shape
        assert np.asarray(z.copy(device="cpu")).shape == shape


def test_tensor_from_data_on_cuda(dlb, torch):
    t = dlb.tensor([[1, 2, 3], [4, 5, 6]], dtype="int32", device="cuda:0")
    assert t.device == "cuda:0" and t.dtype == "int32"
    assert dlb.convert(t, "torch").cpu().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_cuda_tensor_refuses_host_access(dlb, torch):
    t = dlb.zeros((4,), device="cuda:0")
    with pytest.raises(BufferError):
        memoryview(t)
    with pytest.raises((BufferError, AttributeError)):
        t.__array_interface__
    try:  # tolist may copy to the host; if it does not, it must refuse so
        got = t.tolist()
    except BufferError:
        pass
    else:
        assert got == [0.0] * 4


def test_cuda_tensor_freed_exactly_once(dlb, torch):
    """Many short-lived CUDA tensors (and views handed to torch and back):
    memory returns to the driver's pool, nothing double-frees (a double
    free would fault or corrupt a later allocation checked here)."""
    free0 = torch.cuda.mem_get_info()[0]
    for i in range(200):
        t = dlb.zeros((1 << 18,), device="cuda:0")   # 1 MiB
        y = dlb.convert(t, "torch")
        del t
        y += i
        assert float(y[7]) == i
        del y
    torch.cuda.synchronize()
    z = dlb.zeros((1 << 18,), device="cuda:0")
    assert not any(np.asarray(z.copy(device="cpu")))
    # 200 MiB allocated in all; a leak of them would show.
    assert torch.cuda.mem_get_info()[0] > free0 - (100 << 20)

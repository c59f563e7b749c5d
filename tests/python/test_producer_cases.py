"""dlbridge.from_dlpack against an independent producer of every corner case.

The producer (_dlb_testproducer, C) counts deleter calls, so every test
checks the ownership rule as well as the result: no deleter call while the
imported Tensor lives, exactly one once it is gone, and exactly one on every
error path (whether the consumer took the capsule and deleted it, or left it
unconsumed for its own destructor).  The `tp` fixture also fails a test in
which any deleter ran twice.

Fill: with fill=True the producer writes the value k at the strided location
of the k-th element in row-major order, so a correct import of any layout
reads back range(n) reshaped; memory the layout does not name holds 0x7f
bytes, so reading the wrong place shows.
"""

import gc
import math
import subprocess
import sys
import threading

import pytest

# DLPack dtype codes
INT, UINT, FLOAT, OPAQUE, BFLOAT, COMPLEX, BOOL = 0, 1, 2, 3, 4, 5, 6
FP8 = list(range(7, 15))
FP6 = [15, 16]
FP4 = 17

CPU = (1, 0)


def collect():
    gc.collect()
    gc.collect()


def rowmajor(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def nested(shape, f):
    """range(prod(shape)) mapped through f, as nested lists of shape."""
    if len(shape) == 0:
        return f(0)
    n = math.prod(shape)
    flat = [f(k) for k in range(n)]

    def build(dims, off):
        if len(dims) == 1:
            return flat[off:off + dims[0]]
        step = math.prod(dims[1:])
        return [build(dims[1:], off + i * step) for i in range(dims[0])]
    return build(list(shape), 0)


def capsule_name(cap):
    # repr is '<capsule object "NAME" at 0x...>'
    return repr(cap).split('"')[1]


def imported(dlb, src, producer=None, **kw):
    """from_dlpack(src) with the ownership check every test repeats; src is
    the producer itself or something made from `producer`."""
    t = dlb.from_dlpack(src, **kw)
    collect()
    p = src if producer is None else producer
    assert p.deleter_calls == 0, "deleter ran while the Tensor is alive"
    return t


def released(p, expect=1):
    collect()
    assert p.deleter_calls == expect, (
        "deleter ran %d times, expected %d" % (p.deleter_calls, expect))
    assert p.live_exports == 0


def refused(dlb, obj, exc=BufferError, **kw):
    with pytest.raises(exc) as info:
        dlb.from_dlpack(obj, **kw)
    collect()
    return info


# ---------------------------------------------------------------------------
# dtypes

NUMERIC = [
    ((INT, 8, 1), int), ((INT, 16, 1), int), ((INT, 32, 1), int),
    ((INT, 64, 1), int),
    ((UINT, 8, 1), int), ((UINT, 16, 1), int), ((UINT, 32, 1), int),
    ((UINT, 64, 1), int),
    ((FLOAT, 16, 1), float), ((FLOAT, 32, 1), float),
    ((FLOAT, 64, 1), float),
    ((BFLOAT, 16, 1), float),
    ((COMPLEX, 64, 1), complex), ((COMPLEX, 128, 1), complex),
    ((BOOL, 8, 1), bool),
]

NAMES = {
    (INT, 8): "int8", (INT, 16): "int16", (INT, 32): "int32",
    (INT, 64): "int64", (UINT, 8): "uint8", (UINT, 16): "uint16",
    (UINT, 32): "uint32", (UINT, 64): "uint64", (FLOAT, 16): "float16",
    (FLOAT, 32): "float32", (FLOAT, 64): "float64", (BFLOAT, 16): "bfloat16",
    (COMPLEX, 64): "complex64", (COMPLEX, 128): "complex128",
    (BOOL, 8): "bool",
    (7, 8): "float8_e3m4", (8, 8): "float8_e4m3",
    (9, 8): "float8_e4m3b11fnuz", (10, 8): "float8_e4m3fn",
    (11, 8): "float8_e4m3fnuz", (12, 8): "float8_e5m2",
    (13, 8): "float8_e5m2fnuz", (14, 8): "float8_e8m0fnu",
    (15, 6): "float6_e2m3fn", (16, 6): "float6_e3m2fn",
    (17, 4): "float4_e2m1fn",
    (INT, 1): "int1", (INT, 2): "int2", (INT, 4): "int4",
    (UINT, 1): "uint1", (UINT, 2): "uint2", (UINT, 4): "uint4",
    (INT, 24): "int24", (UINT, 128): "uint128",
}


def value_of(kind, k):
    if kind is bool:
        return bool(k & 1)
    return kind(k)


@pytest.mark.parametrize("dtype,kind", NUMERIC, ids=lambda v: str(v))
@pytest.mark.parametrize("versioned", [True, False])
def test_numeric_dtypes_values(tp, dlb, dtype, kind, versioned):
    shape = (2, 3)
    p = tp.Producer(shape=shape, strides=rowmajor(shape), dtype=dtype,
                    fill=True)
    src = p if versioned else p.legacy_capsule()
    t = imported(dlb, src, p)
    del src
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == dtype
    assert t.dtype == NAMES[dtype[:2]]
    assert t.dtype.name == NAMES[dtype[:2]]
    assert t.itemsize == dtype[1] // 8
    assert t.shape == shape and t.strides == rowmajor(shape)
    assert t.data_ptr == p.data_ptr
    got = t.tolist()
    assert got == nested(shape, lambda k: value_of(kind, k))
    assert all(type(x) is kind for row in got for x in row)
    collect()
    assert p.deleter_calls == 0
    del t
    released(p)


@pytest.mark.parametrize("code,bits", [
    (INT, 4), (UINT, 4), (INT, 2), (UINT, 2), (INT, 1), (UINT, 1),
    (INT, 24), (UINT, 128), (COMPLEX, 32)] + [(c, 8) for c in FP8]
    + [(c, 6) for c in FP6] + [(FP4, 4)])
def test_other_valid_dtypes_metadata(tp, dlb, code, bits):
    # Sub-byte and narrow types: no values, but the description must hold.
    shape = (6,)
    p = tp.Producer(shape=shape, strides=None, dtype=(code, bits, 1))
    t = imported(dlb, p)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    if (code, bits) in NAMES:
        assert t.dtype == NAMES[(code, bits)]
    assert t.shape == shape
    assert t.size == 6
    assert t.nbytes == (6 * bits + 7) // 8  # packed sub-byte data
    assert t.data_ptr == p.data_ptr
    del t
    released(p)


def test_subbyte_padded_flag_nbytes(tp, dlb):
    p = tp.Producer(shape=(6,), dtype=(FP4, 4, 1),
                    flags=tp.FLAG_IS_SUBBYTE_TYPE_PADDED)
    t = imported(dlb, p)
    assert t.nbytes == 6  # one byte per padded element
    del t
    released(p)


@pytest.mark.parametrize("versioned", [True, False])
def test_int2_packed_unless_padded(tp, dlb, versioned):
    # onnxruntime's int2 arrives in legacy capsules, which cannot say
    # "padded": read as packed, DLPack's default (docs/decisions.md,
    # "Dtypes").  A versioned capsule's flag decides.
    p = tp.Producer(shape=(2, 5), strides=(5, 1), dtype=(INT, 2, 1))
    t = imported(dlb, p if versioned else p.legacy_capsule(), p)
    assert t.dtype == "int2" and t.dtype.bits == 2 and t.itemsize == 1
    assert t.nbytes == 3  # 20 bits
    assert t.data_ptr == p.data_ptr
    with pytest.raises(BufferError, match="below a byte"):
        memoryview(t)
    del t
    released(p)
    p = tp.Producer(shape=(2, 5), dtype=(UINT, 2, 1),
                    flags=tp.FLAG_IS_SUBBYTE_TYPE_PADDED)
    t = imported(dlb, p)
    assert t.dtype == "uint2" and t.nbytes == 10
    del t
    released(p)


def test_subbyte_strided_still_refused(tp, dlb):
    # An element below a byte has no address: int2 and uint1 only in compact
    # layouts, like int4.
    for dt in ((INT, 2, 1), (UINT, 1, 1)):
        p = tp.Producer(shape=(3,), strides=(2,), dtype=dt)
        info = refused(dlb, p)
        assert "sub-byte" in str(info.value)
        released(p)


def test_wide_and_vector_integers(tp, dlb):
    # Any integer width whose bits x lanes fills whole bytes: int24,
    # int12x2; strided layouts are fine there.
    for dt, name, itemsize in (((INT, 24, 1), "int24", 3),
                               ((INT, 12, 2), "int12x2", 3),
                               ((UINT, 2, 4), "uint2x4", 1)):
        p = tp.Producer(shape=(3,), strides=(2,), dtype=dt)
        t = imported(dlb, p)
        assert t.dtype == name and t.itemsize == itemsize
        assert t.strides == (2,)
        with pytest.raises(BufferError, match="Python scalars"):
            t.tolist()  # no Python number holds them
        del t
        released(p)


def test_dtype_names_of_new_integers(dlb):
    assert dlb.dtype("int2") == "int2" and dlb.dtype("int2").bits == 2
    assert dlb.dtype("uint1").itemsize == 1
    assert dlb.dtype("int12x2").itemsize == 3
    assert dlb.empty((9,), "uint1").nbytes == 2
    assert dlb.zeros((5,), "int2").nbytes == 2
    for bad in ("int3", "uint12", "int0", "int256"):
        with pytest.raises(ValueError, match=bad):
            dlb.dtype(bad)


@pytest.mark.parametrize("lanes", [2, 4])
def test_vector_lanes(tp, dlb, lanes):
    p = tp.Producer(shape=(3,), strides=(1,), dtype=(FLOAT, 32, lanes))
    t = imported(dlb, p)
    assert t.dtype.lanes == lanes
    assert t.itemsize == 4 * lanes
    assert t.nbytes == 3 * 4 * lanes
    del t
    released(p)


INVALID_DTYPES = [
    (15, 8, 1),        # fp6 with 8 bits
    (16, 8, 1), (15, 4, 1),
    (FP4, 8, 1),       # fp4 with 8 bits
    (7, 16, 1), (10, 4, 1), (14, 6, 1),
    (BOOL, 1, 1),      # bool is (6, 8, 1), never 1 bit
    (BOOL, 16, 1),
    (BFLOAT, 32, 1), (BFLOAT, 8, 1),
    (COMPLEX, 16, 1),
    (FLOAT, 0, 1), (INT, 0, 1), (UINT, 0, 1),
    (INT, 3, 1), (UINT, 12, 1), (INT, 5, 3), (UINT, 0, 8),  # not whole bytes
    (FLOAT, 8, 1), (FLOAT, 24, 1), (FLOAT, 4, 2),  # floats: defined widths
    (OPAQUE, 64, 1),   # opaque handles: meaning private to the producer
    (18, 8, 1), (99, 32, 1), (255, 8, 1),   # unknown codes
    (FLOAT, 32, 0), (INT, 8, 0),            # lanes 0
]


@pytest.mark.parametrize("dtype", INVALID_DTYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("via", ["dunder", "versioned_capsule",
                                 "legacy_capsule"])
def test_invalid_dtype_refused(tp, dlb, dtype, via):
    p = tp.Producer(shape=(4,), strides=(1,), dtype=dtype)
    if via == "dunder":
        info = refused(dlb, p)
        # The message names the three fields (or the dtype's name, for the
        # lanes-0 refusal of a known scalar).
        assert "code %d, bits %d, lanes %d" % dtype in str(info.value)
        released(p)
        return
    cap = p.capsule(versioned=(via == "versioned_capsule"))
    name = capsule_name(cap)
    refused(dlb, cap)
    # Rejected, so left unconsumed: its own destructor still owns it.
    assert capsule_name(cap) == name
    assert p.deleter_calls == 0
    del cap
    released(p)


# ---------------------------------------------------------------------------
# layouts

def test_null_strides_reported_row_major(tp, dlb):
    shape = (2, 3, 4)
    p = tp.Producer(shape=shape, strides=None, fill=True)
    t = imported(dlb, p)
    assert t.strides == (12, 4, 1)
    assert t.is_contiguous
    assert t.tolist() == nested(shape, float)
    del t
    released(p)


def test_null_strides_legacy(tp, dlb):
    shape = (3, 2)
    p = tp.Producer(shape=shape, strides=None, fill=True, dtype=(INT, 32, 1))
    t = imported(dlb, p.legacy_capsule(), p)
    assert t.strides == (2, 1)
    assert t.tolist() == nested(shape, int)
    del t
    released(p)


@pytest.mark.parametrize("shape,strides", [
    ((4,), (-1,)),
    ((2, 3), (-3, -1)),
    ((2, 3), (3, -1)),
    ((2, 3), (-1, 2)),
    ((3, 2, 2), (-4, 1, -2)),
])
def test_negative_strides(tp, dlb, shape, strides):
    p = tp.Producer(shape=shape, strides=strides, fill=True,
                    dtype=(FLOAT, 64, 1))
    t = imported(dlb, p)
    assert t.strides == strides
    assert t.data_ptr == p.data_ptr
    assert not t.is_contiguous
    assert t.tolist() == nested(shape, float)
    del t
    released(p)


@pytest.mark.parametrize("shape,strides,expect", [
    ((3,), (0,), [2, 2, 2]),
    ((2, 3), (0, 1), [[3, 4, 5], [3, 4, 5]]),
    ((2, 3), (1, 0), [[2, 2, 2], [5, 5, 5]]),
])
def test_zero_strides_broadcast(tp, dlb, shape, strides, expect):
    # Every logical element aliases a few locations; the last write wins.
    p = tp.Producer(shape=shape, strides=strides, fill=True,
                    dtype=(INT, 16, 1))
    t = imported(dlb, p)
    assert t.strides == strides
    assert t.tolist() == expect
    del t
    released(p)


@pytest.mark.parametrize("shape,strides,contig", [
    ((2, 3), (3, 1), True),
    ((2, 3), (1, 2), False),
    ((2, 3), (6, 2), False),
    ((1, 3), (99, 1), True),     # stride of an extent-1 dim means nothing
    ((3, 1), (1, -7), True),
    ((0, 3), (7, 9), True),      # no elements: any strides
])
def test_contiguity_and_values(tp, dlb, shape, strides, contig):
    p = tp.Producer(shape=shape, strides=strides, fill=True,
                    dtype=(UINT, 8, 1))
    t = imported(dlb, p)
    assert t.shape == shape and t.strides == strides
    assert t.is_contiguous is contig
    assert t.tolist() == nested(shape, int)
    del t
    released(p)


@pytest.mark.parametrize("byte_offset", [4, 8, 3, 4096])
def test_byte_offset(tp, dlb, byte_offset):
    # 3 is not a multiple of the item size: nothing may assume alignment.
    shape = (2, 2)
    p = tp.Producer(shape=shape, strides=(2, 1), byte_offset=byte_offset,
                    fill=True)
    t = imported(dlb, p)
    assert t.data_ptr == p.data_ptr  # element 0, i.e. data + byte_offset
    assert t.tolist() == nested(shape, float)
    del t
    released(p)


def test_byte_offset_with_negative_strides_legacy(tp, dlb):
    shape = (3,)
    p = tp.Producer(shape=shape, strides=(-2,), byte_offset=16, fill=True,
                    dtype=(INT, 64, 1))
    t = imported(dlb, p.legacy_capsule(), p)
    assert t.data_ptr == p.data_ptr
    assert t.tolist() == [0, 1, 2]
    del t
    released(p)


def test_zero_d(tp, dlb):
    p = tp.Producer(shape=(), fill=True, dtype=(INT, 32, 1))
    t = imported(dlb, p)
    assert t.shape == () and t.strides == () and t.ndim == 0
    assert t.size == 1
    assert t.tolist() == 0
    del t
    released(p)


def test_zero_d_null_shape_and_strides(tp, dlb):
    # ndim == 0: NULL shape and strides are legal (NumPy sends exactly that).
    p = tp.Producer(shape=(), strides=None, shape_null=True, fill=True)
    t = imported(dlb, p)
    assert t.shape == () and t.tolist() == 0.0
    del t
    released(p)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0, 2)])
def test_null_data_zero_size_ok(tp, dlb, shape):
    p = tp.Producer(shape=shape, strides=rowmajor(shape), data="null")
    t = imported(dlb, p)
    assert t.shape == shape and t.size == 0 and t.nbytes == 0
    assert t.tolist() == nested(shape, float)
    del t
    released(p)


def test_zero_size_non_null_data(tp, dlb):
    p = tp.Producer(shape=(0, 3), strides=(0, 0))
    t = imported(dlb, p)
    assert t.shape == (0, 3) and t.size == 0
    del t
    released(p)


def test_external_data_address(tp, dlb):
    owner = tp.Producer(shape=(4,), strides=(1,), fill=True,
                        dtype=(INT, 32, 1))
    p = tp.Producer(shape=(4,), strides=(1,), data=owner.data_ptr,
                    dtype=(INT, 32, 1))
    t = imported(dlb, p)
    assert t.data_ptr == owner.data_ptr
    assert t.tolist() == [0, 1, 2, 3]
    del t
    released(p)
    assert owner.deleter_calls == 0


def test_tensor_outlives_producer_reference(tp, dlb):
    cap = tp.make_capsule(shape=(3,), strides=(1,), fill=True,
                          dtype=(INT, 64, 1))
    t = dlb.from_dlpack(cap)
    del cap
    collect()
    assert tp.deleter_calls() == 0
    assert t.tolist() == [0, 1, 2]
    del t
    collect()
    assert tp.deleter_calls() == 1


def test_max_ndim_accepted(tp, dlb):
    shape = (1,) * 64
    p = tp.Producer(shape=shape, strides=(1,) * 64, fill=True)
    t = imported(dlb, p)
    assert t.ndim == 64 and t.size == 1
    del t
    released(p)


# ---------------------------------------------------------------------------
# read-only and legacy

def test_readonly_versioned(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,), readonly=True, fill=True)
    t = imported(dlb, p)
    assert t.readonly is True
    assert memoryview(t).readonly
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p)


def test_readonly_flag_on_raw_versioned_capsule(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,), readonly=True)
    t = imported(dlb, p.capsule(versioned=True), p)
    assert t.readonly is True
    del t
    released(p)


def test_writable_versioned(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,))
    t = imported(dlb, p)
    assert t.readonly is False
    assert not memoryview(t).readonly
    del t
    released(p)


def test_legacy_capsule_imports_writable(tp, dlb):
    # DESIGN decision: the legacy protocol cannot say read-only.
    p = tp.Producer(shape=(2,), strides=(1,), fill=True)
    t = imported(dlb, p.legacy_capsule(), p)
    assert t.readonly is False
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p)


def test_unknown_flag_bits_ignored(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,), flags=1 << 40)
    t = imported(dlb, p)
    assert t.readonly is False
    del t
    released(p)


def test_legacy_toDlpack_object(tp, dlb):
    obj = tp.Legacy(shape=(2, 2), strides=(2, 1), fill=True,
                    dtype=(INT, 32, 1))
    p = obj.producer
    t = imported(dlb, obj, p)
    assert t.tolist() == [[0, 1], [2, 3]]
    assert t.readonly is False
    del t
    released(p)


# ---------------------------------------------------------------------------
# versions

@pytest.mark.parametrize("version", [(1, 0), (1, 1), (1, 2), (1, 3), (1, 99)])
def test_supported_versions(tp, dlb, version):
    # A newer minor is fine as long as every value met is understood.
    p = tp.Producer(shape=(2,), strides=(1,), version=version, fill=True)
    t = imported(dlb, p)
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p)


@pytest.mark.parametrize("version", [(2, 0), (3, 7), (0, 8), (2**32 - 1, 0)])
@pytest.mark.parametrize("via", ["dunder", "capsule"])
def test_unsupported_major_deleted_once(tp, dlb, version, via):
    # The consumer must call the deleter and read nothing else: the rest of
    # the struct is made hostile so reading it would give another error.
    p = tp.Producer(shape=(2,), strides=(1,), version=version, ndim=-1,
                    shape_null=True, dtype=(99, 3, 0))
    if via == "dunder":
        info = refused(dlb, p)
    else:
        cap = p.capsule(versioned=True)
        info = refused(dlb, cap)
        # Consumed (renamed) by the consumer, which called the deleter.
        assert capsule_name(cap) == "used_dltensor_versioned"
        assert p.deleter_calls == 1
        del cap
    msg = str(info.value).lower()
    assert "version" in msg or "major" in msg, msg
    released(p)


# ---------------------------------------------------------------------------
# hostile metadata: BufferError, capsule left unconsumed, one deleter call

HOSTILE = {
    "ndim_65": dict(shape=(2,), strides=(1,), ndim=65),
    "ndim_65_real": dict(shape=(1,) * 65, strides=(1,) * 65),
    "ndim_minus_1": dict(shape=(2,), strides=(1,), ndim=-1),
    "ndim_int32_min": dict(shape=(2,), strides=(1,), ndim=-2**31),
    "null_shape": dict(shape=(2, 3), strides=(3, 1), shape_null=True),
    "null_shape_null_strides": dict(shape=(2, 3), strides=None,
                                    shape_null=True),
    "negative_extent": dict(shape=(-1, 3), strides=(3, 1)),
    "negative_extent_last": dict(shape=(3, -2), strides=(1, 1)),
    "product_overflow": dict(shape=(2**62, 4), strides=(4, 1)),
    "product_overflow_null_strides": dict(shape=(2**62, 4), strides=None),
    "product_overflow_3d": dict(shape=(2**32, 2**32, 16),
                                strides=(2**36, 16, 1), dtype=(INT, 32, 1)),
    "span_overflow": dict(shape=(2, 2), strides=(2**62, 2**62)),
    "span_overflow_negative": dict(shape=(3,), strides=(-2**62,)),
    "int64_max_extent": dict(shape=(2**63 - 1,), strides=(1,),
                             dtype=(FLOAT, 64, 1)),
    "null_data_with_elements": dict(shape=(2, 2), strides=(2, 1),
                                    data="null"),
    "null_data_0d": dict(shape=(), data="null"),
    # data + byte_offset wraps around: a negative offset in disguise (B35).
    "wrapping_byte_offset": dict(shape=(2,), strides=(1,),
                                 byte_offset=2**64 - 8),
    # Types >= 1 without a name (5, 6, newer than the header) are foreign
    # devices, held (tests/python/test_hardening4_enums.py); 0 and below
    # are no device.
    "device_type_0": dict(shape=(2,), strides=(1,), device=(0, 0)),
    "device_type_negative": dict(shape=(2,), strides=(1,), device=(-3, 0)),
    "device_negative_id": dict(shape=(2,), strides=(1,), device=(1, -1)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("via", ["dunder", "versioned_capsule",
                                 "legacy_capsule"])
def test_hostile_metadata(tp, dlb, case, via):
    p = tp.Producer(**HOSTILE[case])
    if via == "dunder":
        # A bad __dlpack_device__ may be refused before __dlpack__ is
        # called; either way it is a BufferError and nothing leaks.
        refused(dlb, p)
        exported = 1 if p.calls.get("total", 0) else 0
        released(p, expect=exported)
        return
    cap = p.capsule(versioned=(via == "versioned_capsule"))
    name = capsule_name(cap)
    refused(dlb, cap)
    assert capsule_name(cap) == name, "a rejected capsule must stay unused"
    assert p.deleter_calls == 0
    del cap
    released(p)


def test_zero_extent_with_huge_extents_no_crash(tp, dlb):
    # An overflow check dividing by an extent must not trap on 0 (B79), and
    # a product that reaches 0 is an empty tensor, not an overflow.
    for shape in [(2**62, 0), (0, 2**62, 4), (2**40, 2**40, 0)]:
        p = tp.Producer(shape=shape, strides=(0,) * len(shape), data="null")
        try:
            t = dlb.from_dlpack(p)
        except BufferError:
            released(p)
            continue
        assert t.size == 0 and t.shape == shape
        del t
        released(p)


def test_null_deleter(tp, dlb):
    # A NULL deleter means nothing to release: the consumer must not call
    # it; the producer keeps the memory alive while we hold it.
    p = tp.Producer(shape=(2,), strides=(1,), fill=True, deleter_null=True)
    t = dlb.from_dlpack(p)
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p, expect=0)
    t = dlb.from_dlpack(p.legacy_capsule())
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p, expect=0)


def test_used_capsule(tp, dlb):
    cap = tp.used_capsule()
    refused(dlb, cap, BufferError)
    assert capsule_name(cap) == "used_dltensor"
    del cap
    collect()
    assert tp.deleter_calls() == 0  # stray calls are checked by the fixture


def test_wrong_name_capsule(tp, dlb):
    cap = tp.wrong_name_capsule()
    refused(dlb, cap, TypeError)
    assert capsule_name(cap) == "not_a_dltensor"


@pytest.mark.parametrize("versioned", [True, False])
def test_capsule_imported_twice(tp, dlb, versioned):
    p = tp.Producer(shape=(2,), strides=(1,), fill=True)
    cap = p.capsule(versioned=versioned)
    t = dlb.from_dlpack(cap)
    assert capsule_name(cap).startswith("used_")
    refused(dlb, cap, BufferError)
    del cap
    collect()
    assert p.deleter_calls == 0
    assert t.tolist() == [0.0, 1.0]
    del t
    released(p)


# ---------------------------------------------------------------------------
# negotiation

def test_asks_for_versioned_first(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,))
    t = imported(dlb, p)
    log = p.call_log
    assert len(log) == 1
    assert log[0].get("max_version") == (1, 3)
    # A CPU producer is passed no stream (or None), never 0 or -1.
    assert log[0].get("stream") is None
    assert "copy" not in log[0] or log[0]["copy"] is None
    del t
    released(p)


@pytest.mark.parametrize("kw", [dict(legacy_only=True),
                                dict(raise_on_kwargs=("max_version",))])
def test_retry_without_kwargs(tp, dlb, kw):
    p = tp.Producer(shape=(2,), strides=(1,), fill=True, **kw)
    t = imported(dlb, p)
    assert t.tolist() == [0.0, 1.0]
    assert t.readonly is False  # legacy import
    log = p.call_log
    assert len(log) == 2, log
    assert log[0].get("max_version") == (1, 3)
    assert log[1] == {}
    assert p.calls["total"] == 2
    del t
    released(p)


def test_retry_then_readonly_legacy_refused(tp, dlb):
    # The producer can only say read-only in a versioned capsule; once the
    # consumer has fallen back it refuses with BufferError, which propagates.
    p = tp.Producer(shape=(2,), strides=(1,), legacy_only=True, readonly=True)
    refused(dlb, p, BufferError)
    assert p.calls["total"] == 2
    released(p, expect=0)


@pytest.mark.parametrize("copy", [True, False])
def test_typeerror_with_copy_retried_and_honoured(tp, dlb, copy):
    # Issue 7: the retry drops copy=, and dlbridge does what it asked: a copy
    # of its own for copy=True (the producer's export is released at once),
    # the producer's memory for copy=False.
    p = tp.Producer(shape=(2,), strides=(1,), fill=True,
                    raise_on_kwargs=("copy",))
    t = dlb.from_dlpack(p, copy=copy)
    assert t.tolist() == [0.0, 1.0]
    assert p.calls["total"] == 2, p.call_log
    assert p.call_log[0].get("copy") is copy
    assert p.call_log[1] == {}
    if copy:
        released(p)
    else:
        collect()
        assert p.deleter_calls == 0
        del t
        released(p)


@pytest.mark.parametrize("copy", [True, False])
def test_legacy_only_with_copy_retried(tp, dlb, copy):
    p = tp.Producer(shape=(2,), strides=(1,), fill=True, legacy_only=True)
    t = dlb.from_dlpack(p, copy=copy)
    assert t.tolist() == [0.0, 1.0]
    assert p.calls["total"] == 2
    del t
    released(p)


@pytest.mark.parametrize("exc", ["BufferError", "RuntimeError",
                                 "ValueError"])
def test_producer_error_propagated(tp, dlb, exc):
    p = tp.Producer(shape=(2,), strides=(1,), refuse=exc)
    types = {"BufferError": BufferError, "RuntimeError": RuntimeError,
             "ValueError": ValueError}
    refused(dlb, p, types[exc])
    assert p.calls["total"] == 1  # not retried
    released(p, expect=0)


def test_producer_typeerror_retried_once_then_propagated(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,), refuse="TypeError")
    refused(dlb, p, TypeError)
    assert p.calls["total"] == 2
    assert p.call_log[1] == {}
    released(p, expect=0)


def test_copy_true_uses_producer_copy(tp, dlb):
    p = tp.Producer(shape=(3,), strides=(1,), fill=True)
    t = imported(dlb, p, copy=True)
    assert p.call_log[0].get("copy") is True
    assert t.data_ptr != p.data_ptr
    assert t.readonly is False
    assert t.tolist() == [0.0, 1.0, 2.0]
    del t
    released(p)


def test_copy_true_of_readonly_is_writable(tp, dlb):
    p = tp.Producer(shape=(3,), strides=(-1,), fill=True, readonly=True)
    t = dlb.from_dlpack(p, copy=True)
    assert t.readonly is False
    assert t.data_ptr != p.data_ptr
    assert t.tolist() == [0.0, 1.0, 2.0]
    # The consumer may have copied again and released the export at once,
    # or kept it; either way exactly one call once the Tensor is gone.
    collect()
    assert p.deleter_calls in (0, 1)
    del t
    released(p)


def test_copy_false_is_zero_copy(tp, dlb):
    p = tp.Producer(shape=(3,), strides=(1,), fill=True)
    t = imported(dlb, p, copy=False)
    assert t.data_ptr == p.data_ptr
    del t
    released(p)


def test_device_cpu_requested_same_device(tp, dlb):
    p = tp.Producer(shape=(3,), strides=(1,), fill=True)
    t = imported(dlb, p, device="cpu")
    assert t.data_ptr == p.data_ptr
    assert "dl_device" not in p.call_log[0] or \
        p.call_log[0]["dl_device"] in (None, (1, 0))
    del t
    released(p)


def test_cuda_producer_gets_a_valid_stream(tp, dlb):
    # Host memory labelled CUDA: the consumer must not touch it, only
    # describe it, and must pass a stream that is legal on CUDA (not 0).
    p = tp.Producer(shape=(3,), strides=(1,), device=(2, 0))
    t = imported(dlb, p)
    assert t.device == (2, 0)
    assert t.data_ptr == p.data_ptr
    stream = p.call_log[0].get("stream")
    assert stream is None or stream == -1 or stream >= 1, stream
    del t
    released(p)


# ---------------------------------------------------------------------------
# lifetime across threads, re-export and shutdown

def test_deleter_from_another_thread(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,))
    box = [dlb.from_dlpack(p)]
    th = threading.Thread(target=box.clear)
    th.start()
    th.join()
    released(p)


def test_reexport_to_numpy_keeps_producer_alive(tp, dlb):
    np = pytest.importorskip("numpy")
    p = tp.Producer(shape=(2, 3), strides=(1, 2), fill=True,
                    dtype=(INT, 32, 1))
    t = imported(dlb, p)
    a = np.from_dlpack(t)
    del t
    collect()
    assert p.deleter_calls == 0, "freed while numpy still views the data"
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    del a
    released(p)


def test_tensor_alive_at_interpreter_exit():
    # The deleter runs (or deliberately leaks) during finalization: no
    # crash, no hang.
    code = (
        "import dlbridge, _dlb_testproducer as tp\n"
        "p = tp.Producer(shape=(2,), strides=(1,))\n"
        "t = dlbridge.from_dlpack(p)\n"
        "cap = tp.make_capsule(shape=(2,), strides=(1,))\n"
        "keep = [t, cap, dlbridge.from_dlpack(p.legacy_capsule())]\n"
        "del p\n")
    pytest.importorskip("_dlb_testproducer")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr.decode()


# ---------------------------------------------------------------------------
# devices from producers (docs/decisions.md, "Devices from producers")

class Wrapped:
    """A producer whose __dlpack_device__ says `device`, exporting p."""

    def __init__(self, p, device):
        self.p, self.device = p, device

    def __dlpack__(self, **kw):
        return self.p.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device


def _plain_enum():
    import enum

    class DLDeviceType(enum.Enum):  # Open3D 0.20's: a plain Enum
        CPU = 1
        CUDA = 2
    return DLDeviceType


def test_plain_enum_device_type(tp, dlb):
    # Open3D returns (DLDeviceType.CPU, 0) with a plain enum.Enum, which is
    # no int; the array API types the result Tuple[Enum, int].
    DLDeviceType = _plain_enum()
    p = tp.Producer(shape=(3,), strides=(1,), fill=True)
    t = imported(dlb, Wrapped(p, (DLDeviceType.CPU, 0)), p)
    assert t.device == "cpu" and t.tolist() == [0.0, 1.0, 2.0]
    assert t.data_ptr == p.data_ptr
    del t
    released(p)
    # The same rule for a caller's device tuple.
    assert dlb.device((DLDeviceType.CUDA, 1)) == "cuda:1"


def test_none_device_id_on_host(tp, dlb):
    # PaddlePaddle 3.3 on the CPU: (kDLCPU, None).  None means 0 on devices
    # whose memory is the host's.
    import enum

    class Kind(enum.IntEnum):
        kDLCPU = 1
    for device in ((1, None), (Kind.kDLCPU, None)):
        p = tp.Producer(shape=(2,), strides=(1,), fill=True)
        t = imported(dlb, Wrapped(p, device), p)
        assert t.device == (1, 0) and t.tolist() == [0.0, 1.0]
        del t
        released(p)


@pytest.mark.parametrize("device,exc,match", [
    (("cpu", 0), TypeError, "device type must be an int or an enum.Enum"),
    ((1.0, 0), TypeError, "not float"),
    ((1, "0"), TypeError, "device id must be an int, not str"),
    ((1, 0.0), TypeError, "device id must be an int"),
    ((2, None), BufferError, "None is read as 0 only for host memory"),
    ((2**70, 0), BufferError, "does not fit in 64 bits"),
    ((1, -1), BufferError, "not a valid device"),
    ((-123, 7), BufferError, "device type -123 is not a DLPack device type"),
    ((0, 0), BufferError, "device type 0 is not a DLPack device type"),
    ([1, 0], TypeError, "expected a \\(device_type, device_id\\) tuple"),
    ((1, 0, 0), TypeError, "tuple"),
    ("STR_ENUM", TypeError, "device type must be an int or an enum.Enum"),
    ("NO_VALUE", TypeError, "device type must be"),
])
def test_garbage_device_refused(tp, dlb, device, exc, match):
    import enum
    if device == "STR_ENUM":
        device = (enum.Enum("Kind", {"CPU": "cpu"}).CPU, 0)
    elif device == "NO_VALUE":
        device = (object(), 0)
    p = tp.Producer(shape=(2,), strides=(1,))
    with pytest.raises(exc, match=match):
        dlb.from_dlpack(Wrapped(p, device))
    # Refused before __dlpack__ was called: nothing was exported.
    assert p.call_log == []
    released(p, expect=0)


def test_enum_value_that_raises_propagates(tp, dlb):
    import enum

    class Odd(enum.Enum):
        CPU = 1

        @property
        def value(self):
            raise KeyError("no value")
    p = tp.Producer(shape=(2,), strides=(1,))
    with pytest.raises(KeyError, match="no value"):
        dlb.from_dlpack(Wrapped(p, (Odd.CPU, 0)))
    released(p, expect=0)


# ---------------------------------------------------------------------------
# keywords producers refuse (docs/decisions.md, "Keywords producers refuse")

class Refusing:
    """A producer that raises `exc` when asked for a keyword it cannot
    honour (TensorFlow 2.21: RuntimeError for copy=True), and exports p
    otherwise.  Records the keywords of every call."""

    def __init__(self, p, exc, when, device=None):
        self.p, self.exc, self.when, self.calls = p, exc, when, []
        self.device = device

    def __dlpack__(self, **kw):
        self.calls.append(dict(kw))
        if self.when(kw):
            raise self.exc("does not support that")
        return self.p.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device or self.p.__dlpack_device__()


@pytest.mark.parametrize("exc", [RuntimeError, BufferError, ValueError,
                                 NotImplementedError])
def test_copy_true_refused_then_copied_here(tp, dlb, exc):
    p = tp.Producer(shape=(3,), strides=(1,), fill=True)
    r = Refusing(p, exc, lambda kw: kw.get("copy") is True)
    t = dlb.from_dlpack(r, copy=True)
    assert t.tolist() == [0.0, 1.0, 2.0]
    assert t.data_ptr != p.data_ptr and not t.readonly
    # asked again without copy=, the versioned capsule still asked for
    assert [c.get("copy") for c in r.calls] == [True, None]
    assert r.calls[1] == {"max_version": (1, 3)}
    released(p)  # our copy does not keep the producer's export


def test_copy_false_refusal_is_not_retried(tp, dlb):
    # A producer that cannot share must say so; dlbridge never drops
    # copy=False to get memory anyway.
    p = tp.Producer(shape=(3,), strides=(1,))
    r = Refusing(p, BufferError, lambda kw: kw.get("copy") is False)
    with pytest.raises(BufferError, match="does not support"):
        dlb.from_dlpack(r, copy=False)
    assert len(r.calls) == 1
    released(p, expect=0)


def test_memory_error_is_not_retried(tp, dlb):
    p = tp.Producer(shape=(3,), strides=(1,))
    r = Refusing(p, MemoryError, lambda kw: kw.get("copy") is True)
    with pytest.raises(MemoryError):
        dlb.from_dlpack(r, copy=True)
    assert len(r.calls) == 1
    released(p, expect=0)


def test_dl_device_refused_then_moved_here(tp, dlb):
    # A producer of host memory labelled cuda_host cannot give it as CPU
    # memory (BufferError, as the spec says); dlbridge asks for it where it
    # is and copies it to the CPU itself.
    p = tp.Producer(shape=(3,), strides=(1,), fill=True, device=(3, 0))
    r = Refusing(p, BufferError, lambda kw: kw.get("dl_device") is not None)
    t = dlb.from_dlpack(r, device="cpu")
    assert t.device == "cpu" and t.tolist() == [0.0, 1.0, 2.0]
    assert t.data_ptr != p.data_ptr
    assert r.calls[0]["dl_device"] == (1, 0)
    assert "dl_device" not in r.calls[1] and r.calls[1]["max_version"] == (1, 3)
    released(p)


def test_refusal_then_typeerror_then_old_signature(tp, dlb):
    # copy=True refused, then max_version= not understood either: the
    # pre-2023.12 call, and the copy made here.
    p = tp.Producer(shape=(2,), strides=(1,), fill=True)

    def when(kw):
        if "max_version" in kw and "copy" not in kw:
            raise TypeError("unexpected keyword argument 'max_version'")
        return kw.get("copy") is True
    r = Refusing(p, RuntimeError, when)
    t = dlb.from_dlpack(r, copy=True)
    assert t.tolist() == [0.0, 1.0] and t.data_ptr != p.data_ptr
    assert [sorted(c) for c in r.calls] == [["copy", "max_version"],
                                           ["max_version"], []]
    del t
    released(p)


def test_retry_failure_keeps_the_first_error(tp, dlb):
    p = tp.Producer(shape=(2,), strides=(1,))
    r = Refusing(p, RuntimeError, lambda kw: True)
    with pytest.raises(RuntimeError) as info:
        dlb.from_dlpack(r, copy=True)
    assert len(r.calls) == 2
    assert isinstance(info.value.__context__, RuntimeError)
    released(p, expect=0)

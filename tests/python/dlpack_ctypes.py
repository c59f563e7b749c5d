"""ctypes mirrors of the C structs the tests build or read by hand.

Only the structs every test file agrees on live here: DLPack's tensor, its
C exchange table, and dlbridge's C API table and error; each file keeps its
own mirror of the managed-tensor structs, whose field names its assertions
use.  Layouts are those of include/dlpack/dlpack.h (checked in C by
tests/c/test_abi.c) and include/dlbridge/python.h.  The child interpreters
of the findings tests import it too (_findings_util puts this directory on
their path)."""

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class Header(ctypes.Structure):
    _fields_ = [("version", Version), ("prev_api", ctypes.c_void_p)]


class ExchangeAPI(ctypes.Structure):
    """DLPackExchangeAPI (DLPack 1.3), the entries as addresses."""
    _fields_ = [("header", Header),
                ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
                ("current_work_stream", ctypes.c_void_p)]


class CAPI(ctypes.Structure):
    """dlbridge's C API table (dlbridge._C_API), the entries as addresses."""
    _fields_ = [("abi_version", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("view_size", ctypes.c_uint32), ("reserved_", ctypes.c_uint32),
                ("view_get", ctypes.c_void_p), ("view_release", ctypes.c_void_p),
                ("import_managed", ctypes.c_void_p),
                ("export_managed", ctypes.c_void_p),
                ("alloc_like", ctypes.c_void_p),
                ("current_stream", ctypes.c_void_p),
                ("raise_error", ctypes.c_void_p)]


class DLBError(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 256)]

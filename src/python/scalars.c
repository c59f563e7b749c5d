/*
 * scalars.c -- Python numbers <-> single elements of every dtype that has a
 * Python scalar equivalent: reading an element as a Python number
 * (Tensor.tolist), and storing a Python number as an element (dlb.tensor()
 * and 0-d Function parameters).
 *
 * Storing follows ONE rule, written once (dlb__store_scalar); dlb.tensor()
 * calls it for every leaf and a 0-d Function parameter for its Python
 * number (dlb__scalar_from_number), so the two cannot disagree:
 *  - an int (or anything with __index__, NumPy integers included) goes into
 *    an integer dtype when it is in range, else OverflowError; into bool
 *    only as 0 or 1 (2 is OverflowError, not "truthy");
 *  - a float is never stored into an integer or bool dtype: TypeError, not
 *    a silent truncation (1.5 -> 1) -- the caller converts explicitly;
 *  - a finite float that becomes infinite in a narrower float dtype is
 *    OverflowError; NaN and inf are stored as they are;
 *  - a complex number only into a complex dtype (TypeError otherwise);
 *  - a dtype with no Python scalar (fp8, sub-byte, lanes > 1): TypeError.
 */
#include "dlbridge_py.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- scalar kinds ------------------------------------------------------------ */

scalar_kind dlb__scalar_kind(DLDataType dt) {
  if (dt.lanes != 1) return K_NONE;
  switch (dt.code) {
    case kDLBool:
      return dt.bits == 8 ? K_BOOL : K_NONE;
    case kDLInt:
      switch (dt.bits) {
        case 8: return K_I8;
        case 16: return K_I16;
        case 32: return K_I32;
        case 64: return K_I64;
        default: return K_NONE;
      }
    case kDLUInt:
      switch (dt.bits) {
        case 8: return K_U8;
        case 16: return K_U16;
        case 32: return K_U32;
        case 64: return K_U64;
        default: return K_NONE;
      }
    case kDLFloat:
      switch (dt.bits) {
        case 16: return K_F16;
        case 32: return K_F32;
        case 64: return K_F64;
        default: return K_NONE;
      }
    case kDLBfloat:
      return dt.bits == 16 ? K_BF16 : K_NONE;
    case kDLComplex:
      switch (dt.bits) {
        case 32: return K_C32;
        case 64: return K_C64;
        case 128: return K_C128;
        default: return K_NONE;
      }
    default:
      return K_NONE;
  }
}

/* ---- element -> Python number ------------------------------------------------ */

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even, keeping NaN a (quiet) NaN. */
static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* The element at p as a new Python scalar.  memcpy: tensors need not be
 * aligned. */
PyObject *dlb__read_scalar(scalar_kind k, const char *p) {
  switch (k) {
    case K_BOOL: return PyBool_FromLong(*(const unsigned char *)p != 0);
    case K_I8: return PyLong_FromLong(*(const int8_t *)p);
    case K_U8: return PyLong_FromLong(*(const uint8_t *)p);
    case K_I16: { int16_t v; memcpy(&v, p, 2); return PyLong_FromLong(v); }
    case K_U16: { uint16_t v; memcpy(&v, p, 2); return PyLong_FromLong(v); }
    case K_I32: { int32_t v; memcpy(&v, p, 4); return PyLong_FromLong(v); }
    case K_U32: {
      uint32_t v; memcpy(&v, p, 4);
      return PyLong_FromUnsignedLong(v);
    }
    case K_I64: {
      int64_t v; memcpy(&v, p, 8);
      return PyLong_FromLongLong((long long)v);
    }
    case K_U64: {
      uint64_t v; memcpy(&v, p, 8);
      return PyLong_FromUnsignedLongLong((unsigned long long)v);
    }
    case K_F16: {
      double d = PyFloat_Unpack2(p, PY_LITTLE_ENDIAN);
      if (d == -1.0 && PyErr_Occurred()) return NULL;
      return PyFloat_FromDouble(d);
    }
    case K_F32: { float v; memcpy(&v, p, 4); return PyFloat_FromDouble(v); }
    case K_F64: { double v; memcpy(&v, p, 8); return PyFloat_FromDouble(v); }
    case K_BF16: {
      uint16_t v; memcpy(&v, p, 2);
      return PyFloat_FromDouble(bf16_to_float(v));
    }
    case K_C32: {
      double re = PyFloat_Unpack2(p, PY_LITTLE_ENDIAN);
      if (re == -1.0 && PyErr_Occurred()) return NULL;
      double im = PyFloat_Unpack2(p + 2, PY_LITTLE_ENDIAN);
      if (im == -1.0 && PyErr_Occurred()) return NULL;
      return PyComplex_FromDoubles(re, im);
    }
    case K_C64: {
      float v[2]; memcpy(v, p, 8);
      return PyComplex_FromDoubles(v[0], v[1]);
    }
    case K_C128: {
      double v[2]; memcpy(v, p, 16);
      return PyComplex_FromDoubles(v[0], v[1]);
    }
    default:
      PyErr_SetString(PyExc_BufferError, "dtype has no Python scalar type");
      return NULL;
  }
}

/* ---- Python number -> element: dlb.tensor() ------------------------------------ */

/* The class of a leaf; -1 with TypeError when it is not a number. */
int dlb__number_class(PyObject *o) {
  if (PyBool_Check(o)) return C_BOOL;
  if (PyLong_Check(o)) return C_INT;
  if (PyFloat_Check(o)) return C_FLOAT;
  if (PyComplex_Check(o)) return C_COMPLEX;
  /* Foreign scalars (numpy.bool, numpy.int8, numpy.float32, ...), by the
   * protocols they implement; numpy.bool has neither __index__ nor a bool
   * base, so it is recognised by name. */
  const char *tn = Py_TYPE(o)->tp_name;
  if (strcmp(tn, "numpy.bool") == 0 || strcmp(tn, "numpy.bool_") == 0)
    return C_BOOL;
  if (PyIndex_Check(o)) return C_INT;
  if (strncmp(tn, "numpy.complex", 13) == 0 ||
      strcmp(tn, "numpy.clongdouble") == 0)
    return C_COMPLEX; /* they also have __float__, which drops the imag */
  if (Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_float)
    return C_FLOAT;
  if (PyObject_HasAttrString(o, "__complex__")) return C_COMPLEX;
  PyErr_Format(PyExc_TypeError,
               "tensor() data must be nested lists/tuples of numbers; got "
               "%.200s",
               tn);
  return -1;
}

static int out_of_range(PyObject *o, const char *name) {
  PyErr_Format(PyExc_OverflowError, "value %R is out of range for %s", o,
               name);
  return -1;
}

static int store_int(PyObject *o, int cls, scalar_kind k, const char *name,
                     char *p) {
  long long v = 0;
  unsigned long long u = 0;
  int is_unsigned = k == K_U8 || k == K_U16 || k == K_U32 || k == K_U64;
  if (cls == C_COMPLEX) {
    PyErr_Format(PyExc_TypeError, "cannot store complex value %R in %s", o,
                 name);
    return -1;
  }
  if (cls == C_FLOAT) {
    /* No silent truncation (see the header). */
    PyErr_Format(PyExc_TypeError,
                 "cannot store float value %R in integer dtype %s: floats "
                 "are not truncated; pass an int",
                 o, name);
    return -1;
  } else {
    PyObject *idx = cls == C_BOOL ? PyLong_FromLong(PyObject_IsTrue(o))
                                  : PyNumber_Index(o);
    if (idx == NULL) return -1;
    int overflow = 0;
    v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(idx);
      return -1;
    }
    if (is_unsigned) {
      if (overflow < 0 || (overflow == 0 && v < 0)) {
        Py_DECREF(idx);
        return out_of_range(o, name);
      }
      u = PyLong_AsUnsignedLongLong(idx);
      Py_DECREF(idx);
      if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return out_of_range(o, name);
      }
    } else {
      Py_DECREF(idx);
      if (overflow) return out_of_range(o, name);
    }
  }
  switch (k) {
    case K_I8:
      if (v < INT8_MIN || v > INT8_MAX) return out_of_range(o, name);
      { int8_t x = (int8_t)v; memcpy(p, &x, 1); }
      return 0;
    case K_I16:
      if (v < INT16_MIN || v > INT16_MAX) return out_of_range(o, name);
      { int16_t x = (int16_t)v; memcpy(p, &x, 2); }
      return 0;
    case K_I32:
      if (v < INT32_MIN || v > INT32_MAX) return out_of_range(o, name);
      { int32_t x = (int32_t)v; memcpy(p, &x, 4); }
      return 0;
    case K_I64:
      { int64_t x = (int64_t)v; memcpy(p, &x, 8); }
      return 0;
    case K_U8:
      if (u > UINT8_MAX) return out_of_range(o, name);
      { uint8_t x = (uint8_t)u; memcpy(p, &x, 1); }
      return 0;
    case K_U16:
      if (u > UINT16_MAX) return out_of_range(o, name);
      { uint16_t x = (uint16_t)u; memcpy(p, &x, 2); }
      return 0;
    case K_U32:
      if (u > UINT32_MAX) return out_of_range(o, name);
      { uint32_t x = (uint32_t)u; memcpy(p, &x, 4); }
      return 0;
    case K_U64:
      { uint64_t x = (uint64_t)u; memcpy(p, &x, 8); }
      return 0;
    default:
      PyErr_SetString(PyExc_TypeError, "not an integer dtype");
      return -1;
  }
}

/* A double narrowed to float, OverflowError when a finite value becomes
 * infinite (NumPy would give inf silently; tensor() promises range
 * checks). */
static int narrow_float(PyObject *o, double d, const char *name, float *out) {
  float f = (float)d;
  if (isinf(f) && isfinite(d)) return out_of_range(o, name);
  *out = f;
  return 0;
}

int dlb__store_scalar(PyObject *o, int cls, scalar_kind k, const char *name,
                        char *p) {
  switch (k) {
    case K_BOOL: {
      int b;
      if (cls == C_BOOL) {
        b = PyObject_IsTrue(o);
        if (b < 0) return -1;
      } else if (cls == C_INT) {
        /* 0 or 1 only, through the uint8 range check below. */
        unsigned char byte;
        if (store_int(o, cls, K_U8, name, (char *)&byte) < 0) return -1;
        if (byte > 1) return out_of_range(o, name);
        b = byte;
      } else {
        PyErr_Format(PyExc_TypeError,
                     "cannot store %.50s value %R in bool: pass a bool, or "
                     "the int 0 or 1",
                     Py_TYPE(o)->tp_name, o);
        return -1;
      }
      *(unsigned char *)p = (unsigned char)b;
      return 0;
    }
    case K_I8: case K_I16: case K_I32: case K_I64:
    case K_U8: case K_U16: case K_U32: case K_U64:
      return store_int(o, cls, k, name, p);
    case K_F16: case K_F32: case K_F64: case K_BF16: {
      if (cls == C_COMPLEX) {
        PyErr_Format(PyExc_TypeError, "cannot store complex value %R in %s",
                     o, name);
        return -1;
      }
      double d = PyFloat_AsDouble(o);
      if (d == -1.0 && PyErr_Occurred()) return -1;
      if (k == K_F64) {
        memcpy(p, &d, 8);
        return 0;
      }
      if (k == K_F16) return PyFloat_Pack2(d, p, PY_LITTLE_ENDIAN);
      float f = 0.0f; /* set by narrow_float; -O3 cannot see it on every path */
      if (narrow_float(o, d, name, &f) < 0) return -1;
      if (k == K_F32) {
        memcpy(p, &f, 4);
        return 0;
      }
      uint16_t h = float_to_bf16(f);
      if (isfinite(f) && (h & 0x7fffu) == 0x7f80u) return out_of_range(o, name);
      memcpy(p, &h, 2);
      return 0;
    }
    case K_C32: case K_C64: case K_C128: {
      Py_complex c = PyComplex_AsCComplex(o);
      if (c.real == -1.0 && PyErr_Occurred()) return -1;
      if (k == K_C128) {
        double v[2] = {c.real, c.imag};
        memcpy(p, v, 16);
        return 0;
      }
      if (k == K_C32) {
        if (PyFloat_Pack2(c.real, p, PY_LITTLE_ENDIAN) < 0) return -1;
        return PyFloat_Pack2(c.imag, p + 2, PY_LITTLE_ENDIAN);
      }
      float v[2];
      if (narrow_float(o, c.real, name, &v[0]) < 0 ||
          narrow_float(o, c.imag, name, &v[1]) < 0)
        return -1;
      memcpy(p, v, 8);
      return 0;
    }
    default:
      PyErr_Format(PyExc_TypeError, "cannot convert Python numbers to %s",
                   name);
      return -1;
  }
}

/* ---- Python number -> element: 0-d Function parameters -------------------------- */

/* The canonical dtype name of a kind, for messages (a constant: the hot
 * path formats nothing until it fails). */
static const char *kind_name(scalar_kind k) {
  static const char *const names[] = {
      [K_NONE] = "?",        [K_BOOL] = "bool",       [K_I8] = "int8",
      [K_I16] = "int16",     [K_I32] = "int32",       [K_I64] = "int64",
      [K_U8] = "uint8",      [K_U16] = "uint16",      [K_U32] = "uint32",
      [K_U64] = "uint64",    [K_F16] = "float16",     [K_F32] = "float32",
      [K_F64] = "float64",   [K_BF16] = "bfloat16",   [K_C32] = "complex32",
      [K_C64] = "complex64", [K_C128] = "complex128"};
  return names[k];
}

/* Store Python number obj as dtype dt in *out, for argument argname of
 * function fname: dlb__store_scalar's rule, the argument named in the
 * message ("f() argument 'a': ...", the same exception type).  0 or -1. */
int dlb__scalar_from_number(PyObject *fname, PyObject *argname, PyObject *obj,
                            DLDataType dt, dlb_scalar *out) {
  scalar_kind k = dlb__scalar_kind(dt);
  if (k == K_NONE) {
    char dts[48];
    dlb__dtype_str(dt, dts, sizeof dts);
    PyErr_Format(PyExc_TypeError,
                 "%U() argument '%U': no Python number converts to %s; pass "
                 "a 0-d tensor",
                 fname, argname, dts);
    return -1;
  }
  int cls = dlb__number_class(obj);
  if (cls < 0 || dlb__store_scalar(obj, cls, k, kind_name(k),
                                   (char *)out->bytes) < 0) {
    dlb__error_prefix_argument(fname, argname);
    return -1;
  }
  return 0;
}

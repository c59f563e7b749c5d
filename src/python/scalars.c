/*
 * scalars.c -- Python numbers <-> single elements of every dtype that has a
 * Python scalar equivalent: reading an element as a Python number
 * (Tensor.tolist), and storing a Python number as an element (dlb.tensor()
 * and 0-d Function parameters).
 *
 * Storing is written TWICE below, and the two disagree; they are kept side
 * by side here, unchanged, until they are unified (issue 7, section 2):
 *  - dlb__store_scalar (dlb.tensor(data)): accepts any object with
 *    __index__ / __float__ / __complex__ (NumPy scalars included), truncates
 *    a float stored into an integer dtype toward zero (as NumPy and PyTorch
 *    do) when in range, NaN/inf into an integer dtype is ValueError, an int
 *    out of range is OverflowError.
 *  - dlb__scalar_from_number (0-d Function parameters): accepts only int,
 *    bool, float and complex, and raises TypeError for a float given to an
 *    integer or bool dtype; out of range is OverflowError.
 * So dlb.tensor(1.5, dtype="int32") truncates while a 0-d int32 Function
 * parameter raises.
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
    double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (!isfinite(d)) {
      PyErr_Format(PyExc_ValueError, "cannot store %R in integer dtype %s",
                   o, name);
      return -1;
    }
    d = trunc(d);
    if (is_unsigned) {
      if (d < 0 || d >= 18446744073709551616.0) return out_of_range(o, name);
      u = (unsigned long long)d;
    } else {
      if (d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return out_of_range(o, name);
      v = (long long)d;
    }
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
      int b = PyObject_IsTrue(o);
      if (b < 0) return -1;
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
      float f;
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

/* Out-of-line so the hot loop stays small. */
static int scalar_range_error(PyObject *fname, PyObject *argname,
                              const char *dt) {
  PyErr_Format(PyExc_OverflowError,
               "%U() argument '%U': value out of range for %s", fname,
               argname, dt);
  return -1;
}

static uint16_t bf16_from_double(double d) {
  float f = (float)d;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

/* Store Python number obj as dtype dt in *out, for argument argname of
 * function fname (messages).  0 or -1. */
int dlb__scalar_from_number(PyObject *fname, PyObject *argname, PyObject *obj,
                            DLDataType dt, dlb_scalar *out) {
  char dts[48];
  int is_int = PyLong_Check(obj); /* bool included */
  int is_float = PyFloat_Check(obj);
  if (dt.lanes != 1) goto unsupported;
  switch (dt.code) {
    case kDLBool:
      if (dt.bits != 8) goto unsupported;
      if (!is_int) goto wrong_kind;
      {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (overflow || (v != 0 && v != 1)) goto range;
        out->bytes[0] = (unsigned char)v;
      }
      return 0;
    case kDLInt: {
      if (!is_int) goto wrong_kind;
      int overflow;
      long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
      if (v == -1 && PyErr_Occurred()) return -1;
      if (overflow) goto range;
      switch (dt.bits) {
        case 8:
          if (v < INT8_MIN || v > INT8_MAX) goto range;
          {
            int8_t x = (int8_t)v;
            memcpy(out->bytes, &x, sizeof x);
          }
          return 0;
        case 16:
          if (v < INT16_MIN || v > INT16_MAX) goto range;
          {
            int16_t x = (int16_t)v;
            memcpy(out->bytes, &x, sizeof x);
          }
          return 0;
        case 32:
          if (v < INT32_MIN || v > INT32_MAX) goto range;
          {
            int32_t x = (int32_t)v;
            memcpy(out->bytes, &x, sizeof x);
          }
          return 0;
        case 64:
          out->i = (int64_t)v;
          return 0;
        default:
          goto unsupported;
      }
    }
    case kDLUInt: {
      if (!is_int) goto wrong_kind;
      unsigned long long v = PyLong_AsUnsignedLongLong(obj);
      if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        goto range;
      }
      switch (dt.bits) {
        case 8:
          if (v > UINT8_MAX) goto range;
          out->bytes[0] = (uint8_t)v;
          return 0;
        case 16:
          if (v > UINT16_MAX) goto range;
          {
            uint16_t x = (uint16_t)v;
            memcpy(out->bytes, &x, sizeof x);
          }
          return 0;
        case 32:
          if (v > UINT32_MAX) goto range;
          {
            uint32_t x = (uint32_t)v;
            memcpy(out->bytes, &x, sizeof x);
          }
          return 0;
        case 64:
          out->u = (uint64_t)v;
          return 0;
        default:
          goto unsupported;
      }
    }
    case kDLFloat:
    case kDLBfloat:
    case kDLComplex: {
      double re, im = 0.0;
      if (PyComplex_Check(obj)) {
        if (dt.code != kDLComplex) goto wrong_kind;
        re = PyComplex_RealAsDouble(obj);
        im = PyComplex_ImagAsDouble(obj);
      } else if (is_int || is_float) {
        re = PyFloat_AsDouble(obj);
        if (re == -1.0 && PyErr_Occurred()) {
          if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
          PyErr_Clear();
          goto range;
        }
      } else {
        goto wrong_kind;
      }
      int parts = dt.code == kDLComplex ? 2 : 1;
      int bits = dt.code == kDLComplex ? dt.bits / 2 : dt.bits;
      double v[2] = {re, im};
      for (int k = 0; k < parts; k++) {
        if (dt.code == kDLBfloat) {
          if (bits != 16) goto unsupported;
          if (isfinite(v[k]) && fabs(v[k]) > (double)FLT_MAX) goto range;
          uint16_t h = bf16_from_double(v[k]);
          memcpy(out->bytes, &h, sizeof h);
        } else if (bits == 16) {
          if (PyFloat_Pack2(v[k], (char *)out->bytes + 2 * k, PY_LITTLE_ENDIAN)
              < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
            PyErr_Clear();
            goto range;
          }
        } else if (bits == 32) {
          if (isfinite(v[k]) && fabs(v[k]) > (double)FLT_MAX) goto range;
          float f = (float)v[k];
          memcpy(out->bytes + 4 * k, &f, sizeof f);
        } else if (bits == 64) {
          memcpy(out->bytes + 8 * k, &v[k], sizeof v[k]);
        } else {
          goto unsupported;
        }
      }
      return 0;
    }
    default:
      goto unsupported;
  }
range:
  dlb__dtype_str(dt, dts, sizeof dts);
  return scalar_range_error(fname, argname, dts);
wrong_kind:
  dlb__dtype_str(dt, dts, sizeof dts);
  PyErr_Format(PyExc_TypeError,
               "%U() argument '%U': a Python %.50s cannot be passed as %s",
               fname, argname, Py_TYPE(obj)->tp_name, dts);
  return -1;
unsupported:
  dlb__dtype_str(dt, dts, sizeof dts);
  PyErr_Format(PyExc_TypeError,
               "%U() argument '%U': no Python number converts to %s; pass a "
               "0-d tensor",
               fname, argname, dts);
  return -1;
}


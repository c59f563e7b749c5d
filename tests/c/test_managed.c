/* test_managed.c -- managed tensors: creation, wrapping, legacy <->
 * versioned conversion, ownership on every failure path, and freeing
 * through the allocator that made each tensor. */
#include <stdint.h>
#include <string.h>

#include "check.h"

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType U8 = {kDLUInt, 8, 1};
static const DLDataType I4 = {kDLInt, 4, 1};
static const DLDevice CPU = {kDLCPU, 0};

/* ---- helpers ------------------------------------------------------------- */

/* A release function that counts calls per context. */
typedef struct counter {
  int calls;
} counter;

static void count_release(void *ctx) { ((counter *)ctx)->calls++; }

/* A legacy tensor owned by a counting deleter, its arrays beside it. */
typedef struct legacy_fixture {
  DLManagedTensor m;
  int64_t shape[3];
  int64_t strides[3];
  float data[24];
  int deleted;
} legacy_fixture;

static void legacy_fixture_deleter(DLManagedTensor *self) {
  legacy_fixture *f = (legacy_fixture *)self->manager_ctx;
  f->deleted++;
}

static void legacy_fixture_init(legacy_fixture *f, bool with_strides) {
  memset(f, 0, sizeof *f);
  f->shape[0] = 2;
  f->shape[1] = 3;
  f->shape[2] = 4;
  /* A transposed-ish layout so copying it is visible. */
  f->strides[0] = 1;
  f->strides[1] = 2;
  f->strides[2] = 6;
  f->m.dl_tensor.data = f->data;
  f->m.dl_tensor.device = CPU;
  f->m.dl_tensor.ndim = 3;
  f->m.dl_tensor.dtype = F32;
  f->m.dl_tensor.shape = f->shape;
  f->m.dl_tensor.strides = with_strides ? f->strides : NULL;
  f->m.dl_tensor.byte_offset = 8;
  f->m.manager_ctx = f;
  f->m.deleter = legacy_fixture_deleter;
}

/* An allocator that tags its blocks, to prove which one frees what. */
typedef struct tag_alloc {
  long allocs;
  long frees;
  size_t last_size;
  unsigned char fill; /* poison new blocks with this byte */
  size_t refuse_above;/* return NULL for larger requests (0: never) */
} tag_alloc;

static void *tag_alloc_fn(size_t size, void *ctx) {
  tag_alloc *t = ctx;
  if (t->refuse_above != 0 && size > t->refuse_above) return NULL;
  void *p = malloc(size);
  if (p != NULL) {
    t->allocs++;
    t->last_size = size;
    memset(p, t->fill, size);
  }
  return p;
}

static void tag_release_fn(void *ptr, void *ctx) {
  tag_alloc *t = ctx;
  if (ptr != NULL) t->frees++;
  free(ptr);
}

static void tag_install(tag_alloc *t) {
  dlb_allocator a = {tag_alloc_fn, tag_release_fn, t};
  dlb_set_allocator(&a);
}

static bool aligned(const void *p) {
  return ((uintptr_t)p % DLB_DATA_ALIGNMENT) == 0;
}

/* ---- empty / zeros -------------------------------------------------------- */

static void test_empty_basic(void) {
  int64_t shape[3] = {2, 3, 4};
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_managed_empty(3, shape, F32, CPU, false, &m, &err), DLB_OK);
  CHECK(m != NULL);
  if (m == NULL) return;
  CHECK_EQ(failing_allocator_total(), 1); /* one allocation, all in it */
  CHECK_EQ(failing_allocator_live(), base + 1);
  CHECK_EQ(m->version.major, 1);
  CHECK_EQ(m->version.minor, 3);
  CHECK_EQ(m->flags, 0);
  CHECK(m->deleter != NULL);
  CHECK(m->manager_ctx != NULL);
  const DLTensor *t = &m->dl_tensor;
  CHECK_EQ(t->ndim, 3);
  CHECK_EQ(t->device.device_type, kDLCPU);
  CHECK_EQ(t->device.device_id, 0);
  CHECK_EQ(t->dtype.code, kDLFloat);
  CHECK_EQ(t->dtype.bits, 32);
  CHECK_EQ(t->dtype.lanes, 1);
  CHECK_EQ(t->byte_offset, 0);
  CHECK(t->shape != shape);
  CHECK_EQ(t->shape[0], 2);
  CHECK_EQ(t->shape[1], 3);
  CHECK_EQ(t->shape[2], 4);
  CHECK(t->strides != NULL);
  CHECK_EQ(t->strides[0], 12);
  CHECK_EQ(t->strides[1], 4);
  CHECK_EQ(t->strides[2], 1);
  CHECK(aligned(t->data));
  CHECK(((uintptr_t)t->shape % _Alignof(int64_t)) == 0);
  /* Touch every byte: the sanitizers and valgrind catch a short block. */
  memset(t->data, 0x5a, 24 * sizeof(float));
  /* Caller's shape is not aliased. */
  shape[0] = 99;
  CHECK_EQ(t->shape[0], 2);
  dlb_managed_delete(m);
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

static void test_zeros_clears(void) {
  tag_alloc tag = {0};
  tag.fill = 0xAB; /* so a missing memset shows */
  tag_install(&tag);
  int64_t shape[2] = {7, 9};
  DLManagedTensorVersioned *m = NULL;
  CHECK_EQ(dlb_managed_zeros(2, shape, U8, CPU, false, &m, NULL), DLB_OK);
  if (m != NULL) {
    const unsigned char *p = m->dl_tensor.data;
    int nonzero = 0;
    for (int i = 0; i < 63; i++) nonzero += p[i] != 0;
    CHECK_EQ(nonzero, 0);
    CHECK(aligned(p));
    dlb_managed_delete(m);
  }
  /* empty does not clear: the poison is still there. */
  CHECK_EQ(dlb_managed_empty(2, shape, U8, CPU, false, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK_EQ(((const unsigned char *)m->dl_tensor.data)[0], 0xAB);
    dlb_managed_delete(m);
  }
  CHECK_EQ(tag.allocs, 2);
  CHECK_EQ(tag.frees, 2);
  failing_allocator_remove();
}

static void test_alignment_many(void) {
  /* Shapes of every ndim up to 9 and odd sizes: data aligned each time, no
   * matter where the header ends. */
  DLDataType types[4] = {U8, F32, {kDLComplex, 128, 1}, {kDLUInt, 8, 3}};
  for (int nd = 0; nd <= 9; nd++) {
    for (int ti = 0; ti < 4; ti++) {
      int64_t shape[9];
      for (int i = 0; i < nd; i++) shape[i] = 1 + (i * 7 + ti) % 3;
      DLManagedTensorVersioned *m = NULL;
      CHECK_EQ(dlb_managed_zeros(nd, shape, types[ti], CPU, false, &m, NULL),
               DLB_OK);
      if (m == NULL) continue;
      CHECK(aligned(m->dl_tensor.data));
      int64_t nbytes = 0;
      CHECK_EQ(dlb_tensor_nbytes(&m->dl_tensor, false, &nbytes, NULL), DLB_OK);
      memset(m->dl_tensor.data, 1, (size_t)nbytes);
      dlb_managed_delete(m);
    }
  }
}

static void test_zero_dim(void) {
  DLManagedTensorVersioned *m = NULL;
  /* ndim 0 with shape NULL. */
  CHECK_EQ(dlb_managed_zeros(0, NULL, F32, CPU, false, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK_EQ(m->dl_tensor.ndim, 0);
    CHECK(m->dl_tensor.shape == NULL);
    CHECK(m->dl_tensor.strides == NULL);
    CHECK(m->dl_tensor.data != NULL);
    CHECK(aligned(m->dl_tensor.data));
    CHECK_EQ(*(float *)m->dl_tensor.data, 0.0f);
    *(float *)m->dl_tensor.data = 3.5f;
    dlb_managed_delete(m);
  }
  /* ndim 0 with a non-NULL shape that must not be read. */
  int64_t junk = -5;
  m = NULL;
  CHECK_EQ(dlb_managed_empty(0, &junk, F32, CPU, false, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.shape == NULL);
    dlb_managed_delete(m);
  }
}

static void test_zero_size(void) {
  int64_t shape[3] = {3, 0, 2};
  DLManagedTensorVersioned *m = NULL;
  CHECK_EQ(dlb_managed_zeros(3, shape, F32, CPU, false, &m, NULL), DLB_OK);
  if (m == NULL) return;
  int64_t expect[3];
  CHECK_EQ(dlb_strides_row_major(3, shape, expect, NULL), DLB_OK);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ(m->dl_tensor.shape[i], shape[i]);
    CHECK_EQ(m->dl_tensor.strides[i], expect[i]);
  }
  CHECK(m->dl_tensor.data != NULL); /* allowed, and aligned */
  CHECK(aligned(m->dl_tensor.data));
  CHECK(dlb_tensor_is_contiguous(&m->dl_tensor));
  dlb_managed_delete(m);
}

static void test_padded_subbyte(void) {
  tag_alloc tag = {0};
  tag_install(&tag);
  int64_t shape[1] = {5};
  DLManagedTensorVersioned *packed = NULL, *padded = NULL;
  CHECK_EQ(dlb_managed_zeros(1, shape, I4, CPU, false, &packed, NULL), DLB_OK);
  size_t packed_size = tag.last_size;
  CHECK_EQ(dlb_managed_zeros(1, shape, I4, CPU, true, &padded, NULL), DLB_OK);
  size_t padded_size = tag.last_size;
  /* 5 int4: 3 bytes packed, 5 padded; the rest of the block is the same. */
  CHECK_EQ(padded_size - packed_size, 2);
  if (packed != NULL && padded != NULL) {
    CHECK_EQ(packed->flags, 0);
    CHECK_EQ(padded->flags, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
    CHECK_EQ(padded->dl_tensor.strides[0], 1);
  }
  dlb_managed_delete(packed);
  dlb_managed_delete(padded);
  CHECK_EQ(tag.frees, 2);
  /* 5 int2: 2 bytes packed, 5 padded. */
  DLDataType i2 = {kDLInt, 2, 1};
  packed = padded = NULL;
  CHECK_EQ(dlb_managed_zeros(1, shape, i2, CPU, false, &packed, NULL), DLB_OK);
  packed_size = tag.last_size;
  CHECK_EQ(dlb_managed_zeros(1, shape, i2, CPU, true, &padded, NULL), DLB_OK);
  padded_size = tag.last_size;
  CHECK_EQ(padded_size - packed_size, 3);
  dlb_managed_delete(packed);
  dlb_managed_delete(padded);
  CHECK_EQ(tag.frees, 4);
  failing_allocator_remove();
}

static void test_empty_errors(void) {
  int64_t shape[2] = {2, 3};
  DLManagedTensorVersioned *sentinel = (DLManagedTensorVersioned *)&shape;
  DLManagedTensorVersioned *m = sentinel;
  dlb_error err;

  CHECK_EQ(dlb_managed_empty(-1, shape, F32, CPU, false, &m, &err),
           DLB_EINVAL);
  CHECK_EQ(err.code, DLB_EINVAL);
  CHECK_MSG(err, "ndim");
  CHECK_EQ(dlb_managed_empty(DLB_MAX_NDIM + 1, shape, F32, CPU, false, &m,
                             &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "DLB_MAX_NDIM");
  CHECK_EQ(dlb_managed_empty(2, NULL, F32, CPU, false, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape is NULL");
  int64_t neg[2] = {2, -3};
  CHECK_EQ(dlb_managed_zeros(2, neg, F32, CPU, false, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[1]");
  CHECK_MSG(err, "-3");
  DLDevice cuda = {kDLCUDA, 0};
  CHECK_EQ(dlb_managed_empty(2, shape, F32, cuda, false, &m, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "device API");
  DLDevice pinned = {kDLCUDAHost, 0};
  CHECK_EQ(dlb_managed_zeros(2, shape, F32, pinned, false, &m, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "cuda_host");
  DLDevice negid = {kDLCPU, -1};
  CHECK_EQ(dlb_managed_empty(2, shape, F32, negid, false, &m, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "device_id");
  DLDataType bad = {kDLFloat, 12, 1};
  CHECK_EQ(dlb_managed_empty(2, shape, bad, CPU, false, &m, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "bits 12");
  int64_t huge[2] = {INT64_MAX / 2, 4};
  CHECK_EQ(dlb_managed_empty(2, huge, U8, CPU, false, &m, &err),
           DLB_EOVERFLOW);
  int64_t huge_bytes[1] = {INT64_MAX / 2};
  CHECK_EQ(dlb_managed_empty(1, huge_bytes, F32, CPU, false, &m, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(dlb_managed_empty(2, shape, F32, CPU, false, NULL, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "out");
  /* out is written only on success. */
  CHECK(m == sentinel);

  /* A size the allocator refuses: ENOMEM, with the size in the message. */
  tag_alloc tag = {0};
  tag.refuse_above = (size_t)1 << 30;
  tag_install(&tag);
  int64_t big[1] = {(int64_t)1 << 40};
  CHECK_EQ(dlb_managed_empty(1, big, U8, CPU, false, &m, &err), DLB_ENOMEM);
  CHECK_MSG(err, "out of memory");
  CHECK(m == sentinel);
  CHECK_EQ(tag.allocs, 0);
  failing_allocator_remove();
}

/* ---- allocator swap ------------------------------------------------------- */

static void test_allocator_swap(void) {
  tag_alloc a = {0}, b = {0};
  int64_t shape[1] = {10};
  counter rel = {0};
  legacy_fixture fx;
  legacy_fixture_init(&fx, true);

  tag_install(&a);
  DLManagedTensorVersioned *e = NULL, *w = NULL, *fl = NULL, *inner = NULL;
  DLManagedTensor *tl = NULL;
  int64_t wshape[1] = {4};
  DLTensor view = {fx.data, CPU, 1, F32, wshape, NULL, 0};
  CHECK_EQ(dlb_managed_empty(1, shape, F32, CPU, false, &e, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_wrap(&view, 0, count_release, &rel, &w, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &fl, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_zeros(1, shape, F32, CPU, false, &inner, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(inner, &tl, NULL), DLB_OK);
  CHECK_EQ(a.allocs, 5);

  /* Swap to b, then to malloc: every block still goes back to a. */
  tag_install(&b);
  dlb_managed_delete(e);
  dlb_managed_delete(w);
  failing_allocator_remove();
  dlb_managed_delete(fl);
  dlb_managed_delete_legacy(tl);
  CHECK_EQ(a.frees, 5);
  CHECK_EQ(b.allocs, 0);
  CHECK_EQ(b.frees, 0);
  CHECK_EQ(rel.calls, 1);
  CHECK_EQ(fx.deleted, 1);

  /* And the other way round: made with malloc, deleted while b is in. */
  DLManagedTensorVersioned *m = NULL;
  CHECK_EQ(dlb_managed_empty(1, shape, F32, CPU, false, &m, NULL), DLB_OK);
  tag_install(&b);
  dlb_managed_delete(m);
  CHECK_EQ(b.frees, 0);
  failing_allocator_remove();
}

/* dlb_allocator_is_default: true exactly while no allocator is installed,
 * whichever way the default came back. */
static void test_allocator_is_default(void) {
  tag_alloc a = {0};
  dlb_set_allocator(NULL);
  CHECK(dlb_allocator_is_default());
  tag_install(&a);
  CHECK(!dlb_allocator_is_default());
  dlb_set_allocator(NULL);
  CHECK(dlb_allocator_is_default());
  /* An allocator with either function missing is refused: the default is
   * back. */
  dlb_allocator half = {tag_alloc_fn, NULL, &a};
  tag_install(&a);
  dlb_set_allocator(&half);
  CHECK(dlb_allocator_is_default());
  /* The default's own functions with a context of the caller's are an
   * allocator of the caller's. */
  dlb_allocator copied = *dlb_get_allocator();
  copied.ctx = &a;
  dlb_set_allocator(&copied);
  CHECK(!dlb_allocator_is_default());
  failing_allocator_remove();
  CHECK(dlb_allocator_is_default());
}

/* ---- wrap ------------------------------------------------------------------- */

static void test_wrap(void) {
  float buf[12];
  int64_t shape[2] = {3, 2};
  int64_t strides[2] = {1, 3}; /* transposed */
  DLTensor view = {buf, {kDLCUDAHost, 2}, 2, F32, shape, strides, 4};
  counter rel = {0};
  DLManagedTensorVersioned *m = NULL;
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_managed_wrap(&view, DLPACK_FLAG_BITMASK_READ_ONLY,
                            count_release, &rel, &m, NULL),
           DLB_OK);
  CHECK_EQ(failing_allocator_total(), 1);
  if (m != NULL) {
    const DLTensor *t = &m->dl_tensor;
    CHECK(t->data == buf);
    CHECK_EQ(t->byte_offset, 4);
    CHECK_EQ(t->device.device_type, kDLCUDAHost);
    CHECK_EQ(t->device.device_id, 2);
    CHECK_EQ(t->dtype.bits, 32);
    CHECK_EQ(m->flags, DLPACK_FLAG_BITMASK_READ_ONLY);
    CHECK_EQ(m->version.major, 1);
    CHECK_EQ(m->version.minor, 3);
    CHECK(t->shape != shape);
    CHECK(t->strides != strides);
    /* Copied, not aliased. */
    shape[0] = 100;
    strides[0] = 100;
    CHECK_EQ(t->shape[0], 3);
    CHECK_EQ(t->shape[1], 2);
    CHECK_EQ(t->strides[0], 1);
    CHECK_EQ(t->strides[1], 3);
    CHECK_EQ(rel.calls, 0);
    /* What it will release can be looked at (a GC visiting it). */
    dlb_release_fn got = NULL;
    void *ctx = NULL;
    CHECK(dlb_managed_wrap_context(m, &got, &ctx));
    CHECK(got == count_release);
    CHECK(ctx == &rel);
    CHECK_EQ(rel.calls, 0);
    dlb_managed_delete(m);
  }
  CHECK_EQ(rel.calls, 1);
  CHECK_EQ(failing_allocator_live(), base);
  /* Not a wrapped tensor: NULL, an owning tensor, a foreign deleter. */
  CHECK(!dlb_managed_wrap_context(NULL, NULL, NULL));
  {
    DLManagedTensorVersioned *own = NULL;
    CHECK_EQ(dlb_managed_empty(2, shape, F32, CPU, false, &own, NULL), DLB_OK);
    CHECK(!dlb_managed_wrap_context(own, NULL, NULL));
    DLManagedTensorVersioned foreign = *own;
    foreign.deleter = NULL;
    CHECK(!dlb_managed_wrap_context(&foreign, NULL, NULL));
    dlb_managed_delete(own);
  }

  /* NULL strides are synthesised row-major. */
  int64_t shape3[3] = {2, 3, 4};
  DLTensor v2 = {buf, CPU, 3, F32, shape3, NULL, 0};
  m = NULL;
  CHECK_EQ(dlb_managed_wrap(&v2, 0, NULL, NULL, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.strides != NULL);
    CHECK_EQ(m->dl_tensor.strides[0], 12);
    CHECK_EQ(m->dl_tensor.strides[1], 4);
    CHECK_EQ(m->dl_tensor.strides[2], 1);
    dlb_managed_delete(m); /* NULL release is fine */
  }

  /* 0-d, shape and strides NULL in and out; data kept even if odd. */
  DLTensor v0 = {buf, CPU, 0, F32, NULL, NULL, 0};
  m = NULL;
  rel.calls = 0;
  CHECK_EQ(dlb_managed_wrap(&v0, 0, count_release, &rel, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.shape == NULL);
    CHECK(m->dl_tensor.strides == NULL);
    CHECK(m->dl_tensor.data == buf);
    dlb_managed_delete(m);
  }
  CHECK_EQ(rel.calls, 1);

  /* Zero-size view with NULL data is described as it is. */
  int64_t zshape[2] = {0, 5};
  DLTensor vz = {NULL, CPU, 2, F32, zshape, NULL, 0};
  m = NULL;
  CHECK_EQ(dlb_managed_wrap(&vz, 0, NULL, NULL, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.data == NULL);
    CHECK_EQ(m->dl_tensor.shape[0], 0);
    dlb_managed_delete(m);
  }
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

/* The widest view wrap accepts: every extent and stride (negative and
 * zero ones too) copied into the one block, none aliased. */
static void test_wrap_max_ndim(void) {
  float buf[1];
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  for (int i = 0; i < DLB_MAX_NDIM; i++) {
    shape[i] = 1 + (i % 3);
    strides[i] = (i % 4) - 2; /* -2, -1, 0, 1, ... */
  }
  DLTensor view = {buf, CPU, DLB_MAX_NDIM, F32, shape, strides, 0};
  counter rel = {0};
  DLManagedTensorVersioned *m = NULL;
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_managed_wrap(&view, 0, count_release, &rel, &m, NULL), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 1);
  if (m != NULL) {
    const DLTensor *t = &m->dl_tensor;
    CHECK_EQ(t->ndim, DLB_MAX_NDIM);
    CHECK(t->strides == t->shape + DLB_MAX_NDIM);
    int same = 1;
    for (int i = 0; i < DLB_MAX_NDIM; i++)
      same &= t->shape[i] == shape[i] && t->strides[i] == strides[i];
    CHECK(same);
    shape[DLB_MAX_NDIM - 1] = 99;
    strides[0] = 99;
    CHECK_EQ(t->shape[DLB_MAX_NDIM - 1], 1 + ((DLB_MAX_NDIM - 1) % 3));
    CHECK_EQ(t->strides[0], -2);
    dlb_managed_delete(m);
  }
  CHECK_EQ(rel.calls, 1);
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

static void test_wrap_errors(void) {
  float buf[4];
  int64_t shape[2] = {2, 2};
  counter rel = {0};
  DLManagedTensorVersioned *sentinel = (DLManagedTensorVersioned *)&rel;
  DLManagedTensorVersioned *m = sentinel;
  dlb_error err;
  CHECK_EQ(dlb_managed_wrap(NULL, 0, count_release, &rel, &m, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "view is NULL");
  DLTensor v = {buf, CPU, -2, F32, shape, NULL, 0};
  CHECK_EQ(dlb_managed_wrap(&v, 0, count_release, &rel, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "ndim is -2");
  v.ndim = DLB_MAX_NDIM + 1;
  CHECK_EQ(dlb_managed_wrap(&v, 0, count_release, &rel, &m, &err),
           DLB_EUNSUPPORTED);
  v.ndim = 2;
  v.shape = NULL;
  CHECK_EQ(dlb_managed_wrap(&v, 0, count_release, &rel, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape is NULL");
  /* Synthesising strides needs extents >= 0. */
  int64_t neg[2] = {2, -1};
  v.shape = neg;
  CHECK_EQ(dlb_managed_wrap(&v, 0, count_release, &rel, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[1]");
  v.shape = shape;
  CHECK_EQ(dlb_managed_wrap(&v, 0, count_release, &rel, NULL, &err),
           DLB_EINVAL);
  CHECK(m == sentinel);
  CHECK_EQ(rel.calls, 0); /* never released on failure */
  /* A strides-NULL view whose row-major strides overflow: the failure comes
   * after the block was allocated, so it must be freed. */
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  int64_t big[3] = {2, INT64_MAX / 2, 4};
  DLTensor vb = {buf, CPU, 3, F32, big, NULL, 0};
  CHECK_EQ(dlb_managed_wrap(&vb, 0, count_release, &rel, &m, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(failing_allocator_live(), base);
  CHECK_EQ(rel.calls, 0);
  CHECK(m == sentinel);
  failing_allocator_remove();
}

/* ---- legacy <-> versioned ----------------------------------------------- */

static void test_from_legacy(void) {
  legacy_fixture fx;
  legacy_fixture_init(&fx, true);
  DLManagedTensorVersioned *m = NULL;
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, NULL), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 1);
  if (m != NULL) {
    CHECK_EQ(m->version.major, 1);
    CHECK_EQ(m->version.minor, 3);
    CHECK_EQ(m->flags, 0);
    CHECK(m->dl_tensor.data == fx.data);
    CHECK_EQ(m->dl_tensor.byte_offset, 8);
    CHECK_EQ(m->dl_tensor.ndim, 3);
    CHECK(m->dl_tensor.shape != fx.shape); /* copied, see managed.c */
    for (int i = 0; i < 3; i++) {
      CHECK_EQ(m->dl_tensor.shape[i], fx.shape[i]);
      CHECK_EQ(m->dl_tensor.strides[i], fx.strides[i]);
    }
    CHECK_EQ(fx.deleted, 0);
    dlb_managed_delete(m);
  }
  CHECK_EQ(fx.deleted, 1);
  CHECK_EQ(failing_allocator_live(), base);

  /* Legacy NULL strides: the versioned result always has them. */
  legacy_fixture_init(&fx, false);
  m = NULL;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.strides != NULL);
    CHECK_EQ(m->dl_tensor.strides[0], 12);
    CHECK_EQ(m->dl_tensor.strides[1], 4);
    CHECK_EQ(m->dl_tensor.strides[2], 1);
    CHECK(fx.m.dl_tensor.strides == NULL); /* producer's struct untouched */
    dlb_managed_delete(m);
  }
  CHECK_EQ(fx.deleted, 1);

  /* NULL legacy deleter is fine. */
  legacy_fixture_init(&fx, true);
  fx.m.deleter = NULL;
  m = NULL;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, NULL), DLB_OK);
  dlb_managed_delete(m);
  CHECK_EQ(fx.deleted, 0);

  /* 0-d legacy with a shape pointer that must not be read. */
  legacy_fixture_init(&fx, true);
  fx.m.dl_tensor.ndim = 0;
  m = NULL;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, NULL), DLB_OK);
  if (m != NULL) {
    CHECK(m->dl_tensor.shape == NULL);
    CHECK(m->dl_tensor.strides == NULL);
    dlb_managed_delete(m);
  }
  CHECK_EQ(fx.deleted, 1);
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

static void test_from_legacy_errors(void) {
  legacy_fixture fx;
  legacy_fixture_init(&fx, true);
  DLManagedTensorVersioned *sentinel = (DLManagedTensorVersioned *)&fx;
  DLManagedTensorVersioned *m = sentinel;
  dlb_error err;
  CHECK_EQ(dlb_managed_from_legacy(NULL, &m, &err), DLB_EINVAL);
  CHECK_MSG(err, "legacy is NULL");
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, NULL, &err), DLB_EINVAL);
  fx.m.dl_tensor.ndim = 1000;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "1000");
  fx.m.dl_tensor.ndim = 3;
  fx.m.dl_tensor.shape = NULL;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &m, &err), DLB_EINVAL);
  CHECK(m == sentinel);
  CHECK_EQ(fx.deleted, 0); /* still the caller's */
}

static void test_to_legacy(void) {
  float buf[6];
  int64_t shape[2] = {2, 3};
  DLTensor view = {buf, CPU, 2, F32, shape, NULL, 12};
  counter rel = {0};
  DLManagedTensorVersioned *m = NULL;
  DLManagedTensor *l = NULL;
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_managed_wrap(&view, DLPACK_FLAG_BITMASK_IS_COPIED,
                            count_release, &rel, &m, NULL),
           DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(m, &l, NULL), DLB_OK);
  if (l != NULL) {
    CHECK(l->dl_tensor.data == buf);
    CHECK_EQ(l->dl_tensor.byte_offset, 12);
    CHECK_EQ(l->dl_tensor.ndim, 2);
    CHECK_EQ(l->dl_tensor.shape[1], 3);
    CHECK_EQ(l->dl_tensor.strides[0], 3);
    CHECK(l->deleter != NULL);
    CHECK(l->manager_ctx != NULL);
    CHECK_EQ(rel.calls, 0);
    dlb_managed_delete_legacy(l);
  }
  CHECK_EQ(rel.calls, 1);
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

static void test_to_legacy_errors(void) {
  float buf[6];
  int64_t shape[2] = {2, 3};
  DLTensor view = {buf, CPU, 2, F32, shape, NULL, 0};
  counter rel = {0};
  DLManagedTensorVersioned *m = NULL;
  DLManagedTensor *sentinel = (DLManagedTensor *)&rel;
  DLManagedTensor *l = sentinel;
  dlb_error err;

  CHECK_EQ(dlb_managed_to_legacy(NULL, &l, &err), DLB_EINVAL);
  CHECK_MSG(err, "m is NULL");

  CHECK_EQ(dlb_managed_wrap(&view, DLPACK_FLAG_BITMASK_READ_ONLY,
                            count_release, &rel, &m, NULL),
           DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(m, &l, &err), DLB_EREADONLY);
  CHECK_EQ(err.code, DLB_EREADONLY);
  CHECK_MSG(err, "read-only");
  CHECK(l == sentinel);
  CHECK_EQ(rel.calls, 0);
  CHECK_EQ(dlb_managed_to_legacy(m, NULL, &err), DLB_EINVAL);
  CHECK_MSG(err, "out is NULL");

  /* A major we do not speak. */
  m->flags = 0;
  m->version.major = 2;
  CHECK_EQ(dlb_managed_to_legacy(m, &l, &err), DLB_EVERSION);
  CHECK_MSG(err, "major version 2");
  CHECK(l == sentinel);
  CHECK_EQ(rel.calls, 0);
  /* Its deleter still works (the caller's job to run it). */
  dlb_managed_delete(m);
  CHECK_EQ(rel.calls, 1);

  /* Padded sub-byte cannot be said in the legacy format. */
  int64_t n[1] = {5};
  CHECK_EQ(dlb_managed_zeros(1, n, I4, CPU, true, &m, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(m, &l, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "padded");
  CHECK(l == sentinel);
  dlb_managed_delete(m);
  /* Packed sub-byte is fine, and so is the flag on a whole-byte type. */
  CHECK_EQ(dlb_managed_zeros(1, n, I4, CPU, false, &m, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(m, &l, &err), DLB_OK);
  dlb_managed_delete_legacy(l);
  l = sentinel;
  CHECK_EQ(dlb_managed_zeros(1, n, F32, CPU, true, &m, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(m, &l, &err), DLB_OK);
  dlb_managed_delete_legacy(l);
}

static void test_round_trips(void) {
  failing_allocator_install(-1);
  long base = failing_allocator_live();

  /* legacy -> versioned -> legacy -> versioned -> delete: one deleter run. */
  legacy_fixture fx;
  legacy_fixture_init(&fx, true);
  DLManagedTensorVersioned *v1 = NULL, *v2 = NULL;
  DLManagedTensor *l1 = NULL;
  CHECK_EQ(dlb_managed_from_legacy(&fx.m, &v1, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(v1, &l1, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_from_legacy(l1, &v2, NULL), DLB_OK);
  if (v2 != NULL) {
    CHECK(v2->dl_tensor.data == fx.data);
    CHECK_EQ(v2->dl_tensor.byte_offset, 8);
    for (int i = 0; i < 3; i++) {
      CHECK_EQ(v2->dl_tensor.shape[i], fx.shape[i]);
      CHECK_EQ(v2->dl_tensor.strides[i], fx.strides[i]);
    }
  }
  CHECK_EQ(fx.deleted, 0);
  dlb_managed_delete(v2);
  CHECK_EQ(fx.deleted, 1);
  CHECK_EQ(failing_allocator_live(), base);

  /* versioned -> legacy -> versioned -> legacy -> delete legacy. */
  float buf[4];
  int64_t shape[1] = {4};
  DLTensor view = {buf, CPU, 1, F32, shape, NULL, 0};
  counter rel = {0};
  DLManagedTensorVersioned *w = NULL, *w2 = NULL;
  DLManagedTensor *la = NULL, *lb = NULL;
  CHECK_EQ(dlb_managed_wrap(&view, 0, count_release, &rel, &w, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(w, &la, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_from_legacy(la, &w2, NULL), DLB_OK);
  CHECK_EQ(dlb_managed_to_legacy(w2, &lb, NULL), DLB_OK);
  CHECK_EQ(rel.calls, 0);
  dlb_managed_delete_legacy(lb);
  CHECK_EQ(rel.calls, 1);
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
}

static void test_delete_null(void) {
  dlb_managed_delete(NULL);
  dlb_managed_delete_legacy(NULL);
  DLManagedTensorVersioned v;
  memset(&v, 0, sizeof v);
  dlb_managed_delete(&v); /* NULL deleter: nothing to run */
  DLManagedTensor l;
  memset(&l, 0, sizeof l);
  dlb_managed_delete_legacy(&l);
  CHECK(1);
}

/* ---- every allocation fails in turn ---------------------------------------- */

/* Runs op with allocation k failing, for k = 0, 1, ... until op succeeds.
 * Each failing run must return DLB_ENOMEM, leak nothing, leave *out alone
 * and run no deleter/release.  Returns how many failing runs there were. */
enum { OP_EMPTY, OP_ZEROS, OP_ZEROS_0D, OP_WRAP, OP_FROM_LEGACY, OP_TO_LEGACY,
       OP_COUNT };

static void test_enomem_everywhere(void) {
  for (int op = 0; op < OP_COUNT; op++) {
    bool succeeded = false;
    for (long k = 0; k < 16 && !succeeded; k++) {
      int64_t shape[2] = {4, 5};
      float buf[20];
      DLTensor view = {buf, CPU, 2, F32, shape, NULL, 0};
      counter rel = {0};
      legacy_fixture fx;
      legacy_fixture_init(&fx, false);
      DLManagedTensorVersioned *prepared = NULL;
      if (op == OP_TO_LEGACY) {
        /* The input is made before failures are switched on. */
        dlb_set_allocator(NULL);
        CHECK_EQ(dlb_managed_wrap(&view, 0, count_release, &rel, &prepared,
                                  NULL),
                 DLB_OK);
      }
      failing_allocator_install(k);
      long base = failing_allocator_live();
      DLManagedTensorVersioned *vs = (DLManagedTensorVersioned *)&rel;
      DLManagedTensorVersioned *v = vs;
      DLManagedTensor *ls = (DLManagedTensor *)&rel;
      DLManagedTensor *l = ls;
      dlb_error err;
      dlb_error_clear(&err);
      int rc = DLB_EINVAL;
      switch (op) {
        case OP_EMPTY:
          rc = dlb_managed_empty(2, shape, F32, CPU, false, &v, &err);
          break;
        case OP_ZEROS:
          rc = dlb_managed_zeros(2, shape, I4, CPU, true, &v, &err);
          break;
        case OP_ZEROS_0D:
          rc = dlb_managed_zeros(0, NULL, F32, CPU, false, &v, &err);
          break;
        case OP_WRAP:
          rc = dlb_managed_wrap(&view, 0, count_release, &rel, &v, &err);
          break;
        case OP_FROM_LEGACY:
          rc = dlb_managed_from_legacy(&fx.m, &v, &err);
          break;
        case OP_TO_LEGACY:
          rc = dlb_managed_to_legacy(prepared, &l, &err);
          break;
      }
      if (rc == DLB_OK) {
        succeeded = true;
        CHECK_EQ(k, 1); /* exactly one allocation in every constructor */
        CHECK_EQ(failing_allocator_live(), base + 1);
        if (op == OP_TO_LEGACY) {
          dlb_managed_delete_legacy(l);
        } else {
          dlb_managed_delete(v);
        }
        CHECK_EQ(failing_allocator_live(), base);
        if (op == OP_WRAP || op == OP_TO_LEGACY) CHECK_EQ(rel.calls, 1);
        if (op == OP_FROM_LEGACY) CHECK_EQ(fx.deleted, 1);
      } else {
        CHECK_EQ(rc, DLB_ENOMEM);
        CHECK_EQ(err.code, DLB_ENOMEM);
        CHECK_MSG(err, "out of memory");
        CHECK_EQ(failing_allocator_live(), base);
        CHECK(v == vs);
        CHECK(l == ls);
        CHECK_EQ(rel.calls, 0);
        CHECK_EQ(fx.deleted, 0);
        if (op == OP_TO_LEGACY) {
          /* m is still the caller's and still works. */
          dlb_set_allocator(NULL);
          dlb_managed_delete(prepared);
          CHECK_EQ(rel.calls, 1);
        }
      }
      failing_allocator_remove();
    }
    CHECK(succeeded);
  }
}

int main(void) {
  test_empty_basic();
  test_zeros_clears();
  test_alignment_many();
  test_zero_dim();
  test_zero_size();
  test_padded_subbyte();
  test_empty_errors();
  test_allocator_swap();
  test_allocator_is_default();
  test_wrap();
  test_wrap_max_ndim();
  test_wrap_errors();
  test_from_legacy();
  test_from_legacy_errors();
  test_to_legacy();
  test_to_legacy_errors();
  test_round_trips();
  test_delete_null();
  test_enomem_everywhere();
  return check_summary("managed");
}

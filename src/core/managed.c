/* managed.c -- owning DLPack tensors: fresh CPU buffers, wrappers around
 * memory someone else owns, and conversion between the legacy and versioned
 * managed structs.
 *
 * Every managed tensor made here is ONE allocation: a bookkeeping block
 * (which embeds the managed struct), then shape and strides, then -- for
 * empty/zeros -- the data, aligned by hand to DLB_DATA_ALIGNMENT.  One
 * allocation means one failure point per constructor and a deleter that
 * cannot be left half-built.  The block keeps a copy of the allocator that
 * made it, so the deleter frees through that allocator even after
 * dlb_set_allocator installed another one.
 *
 * Ownership on failure: every constructor either succeeds and owns what it
 * was given, or fails having touched nothing -- no deleter or release
 * function runs on a failure path, and the block is freed directly (the
 * managed deleter is only set once the block is complete).
 *
 * ndim == 0: the tensors made here carry shape == NULL and strides == NULL,
 * as DLPack 1.3 allows and NumPy does (known-bugs B24): a pointer to a
 * zero-length area tempts nobody into reading it, and there is no allocation
 * edge to point past.  As inputs, 0-d tensors are accepted with NULL or
 * non-NULL shape/strides, which are then never read.
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* The bookkeeping block of a versioned tensor made by empty, zeros, wrap or
 * from_legacy.  manager_ctx points here.  release/release_ctx are what runs
 * when the tensor is deleted (NULL for tensors that own their data). */
typedef struct versioned_block {
  dlb_allocator allocator;
  dlb_release_fn release;
  void *release_ctx;
  DLManagedTensorVersioned managed;
} versioned_block;

/* The bookkeeping block of a legacy tensor made by to_legacy: it owns the
 * versioned tensor it describes, and borrows that tensor's shape and
 * strides, which live exactly as long as it does. */
typedef struct legacy_block {
  dlb_allocator allocator;
  DLManagedTensorVersioned *inner;
  DLManagedTensor managed;
} legacy_block;

/* Offset of shape inside a versioned block.  sizeof a struct holding
 * pointers and a uint64_t is a multiple of 8 on every ABI we meet, but round
 * anyway: shape must be int64_t-aligned. */
static size_t block_head_bytes(void) {
  const size_t a = _Alignof(int64_t);
  return (sizeof(versioned_block) + (a - 1)) & ~(a - 1);
}

/* Bytes of the block header plus shape and strides of ndim dims.  ndim is
 * at most DLB_MAX_NDIM, so this cannot overflow. */
static size_t versioned_meta_bytes(int32_t ndim) {
  return block_head_bytes() + 2u * (size_t)ndim * sizeof(int64_t);
}

static int64_t *block_shape(versioned_block *b) {
  return (int64_t *)(void *)((char *)b + block_head_bytes());
}

/* The one deleter of every versioned tensor made here. */
static void versioned_deleter(DLManagedTensorVersioned *self) {
  if (self == NULL) return;
  versioned_block *b = (versioned_block *)self->manager_ctx;
  /* Copy out everything needed before the block is gone. */
  dlb_allocator allocator = b->allocator;
  dlb_release_fn release = b->release;
  void *release_ctx = b->release_ctx;
  allocator.release(b, allocator.ctx);
  if (release != NULL) release(release_ctx);
}

static void legacy_deleter(DLManagedTensor *self) {
  if (self == NULL) return;
  legacy_block *b = (legacy_block *)self->manager_ctx;
  dlb_allocator allocator = b->allocator;
  DLManagedTensorVersioned *inner = b->inner;
  allocator.release(b, allocator.ctx);
  dlb_managed_delete(inner);
}

void dlb_managed_delete(DLManagedTensorVersioned *m) {
  /* The deleter sits at the same offset in every major version, so it may
   * be called without looking at version (the DLPack rule for a major we
   * do not speak). */
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

void dlb_managed_delete_legacy(DLManagedTensor *m) {
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* Checks shared by every constructor that reads a shape. */
static int check_ndim_shape(const char *what, int32_t ndim,
                            const int64_t *shape, dlb_error *err) {
  if (ndim < 0) {
    return dlb_error_set(err, DLB_EINVAL, "%s: ndim is %d; it must be >= 0",
                         what, (int)ndim);
  }
  if (ndim > DLB_MAX_NDIM) {
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "%s: ndim is %d; dlbridge handles at most %d "
                         "dimensions (DLB_MAX_NDIM)",
                         what, (int)ndim, DLB_MAX_NDIM);
  }
  if (ndim > 0 && shape == NULL) {
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: shape is NULL but ndim is %d", what, (int)ndim);
  }
  return DLB_OK;
}

/* Allocate a versioned block with room for ndim dims plus data_bytes of
 * data aligned to DLB_DATA_ALIGNMENT (data_bytes < 0: no data area).
 * Fills in the allocator copy, version and deleter-less managed struct;
 * the caller completes it and sets the deleter last. */
static int alloc_versioned(const char *what, int32_t ndim, int64_t data_bytes,
                           versioned_block **out_block, void **out_data,
                           dlb_error *err) {
  size_t meta = versioned_meta_bytes(ndim);
  size_t total = meta;
  if (data_bytes >= 0) {
    /* The allocator only promises malloc alignment, so reserve
     * DLB_DATA_ALIGNMENT - 1 bytes of slack and align inside the block. */
    if (dlb__size_overflow(data_bytes, meta + (DLB_DATA_ALIGNMENT - 1),
                           &total)) {
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "%s: %lld bytes of data do not fit in memory "
                           "(size_t overflow)",
                           what, (long long)data_bytes);
    }
  }
  const dlb_allocator *allocator = dlb_get_allocator();
  versioned_block *b = allocator->alloc(total, allocator->ctx);
  if (b == NULL) {
    return dlb_error_set(err, DLB_ENOMEM,
                         "%s: out of memory allocating %zu bytes", what,
                         total);
  }
  memset(b, 0, sizeof *b);
  b->allocator = *allocator;
  b->managed.version.major = DLPACK_MAJOR_VERSION;
  b->managed.version.minor = DLPACK_MINOR_VERSION;
  b->managed.manager_ctx = b;
  if (ndim > 0) {
    b->managed.dl_tensor.shape = block_shape(b);
    b->managed.dl_tensor.strides = block_shape(b) + ndim;
  }
  b->managed.dl_tensor.ndim = ndim;
  if (out_data != NULL) {
    *out_data = NULL;
    if (data_bytes >= 0) {
      uintptr_t p = (uintptr_t)((char *)b + meta);
      uintptr_t aligned = (p + (DLB_DATA_ALIGNMENT - 1)) &
                          ~(uintptr_t)(DLB_DATA_ALIGNMENT - 1);
      *out_data = (char *)b + meta + (size_t)(aligned - p);
    }
  }
  *out_block = b;
  return DLB_OK;
}

static void free_block(versioned_block *b) {
  dlb_allocator allocator = b->allocator;
  allocator.release(b, allocator.ctx);
}

static int make_owned(const char *what, int32_t ndim, const int64_t *shape,
                      DLDataType dtype, DLDevice device, bool padded,
                      bool clear, DLManagedTensorVersioned **out,
                      dlb_error *err) {
  int rc;
  versioned_block *b = NULL;
  void *data = NULL;
  int64_t numel = 0, nbytes = 0;

  if (out == NULL) {
    rc = dlb_error_set(err, DLB_EINVAL, "%s: out is NULL", what);
    goto cleanup;
  }
  rc = check_ndim_shape(what, ndim, shape, err);
  if (rc != DLB_OK) goto cleanup;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      rc = dlb_error_set(err, DLB_EINVAL,
                         "%s: shape[%d] is %lld; extents must be >= 0", what,
                         (int)i, (long long)shape[i]);
      goto cleanup;
    }
  }
  if (device.device_type != kDLCPU) {
    char d[DLB_DESCRIBE_MAX];
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: device %s is not plain CPU memory; pinned, "
                       "managed and device memory need the device API",
                       what, dlb_device_describe(device, d, sizeof d));
    goto cleanup;
  }
  if (device.device_id < 0) {
    rc = dlb_error_set(err, DLB_EINVAL, "%s: device_id is %d; it must be >= 0",
                       what, (int)device.device_id);
    goto cleanup;
  }
  rc = dlb_dtype_check(dtype, err);
  if (rc != DLB_OK) goto cleanup;
  rc = dlb_shape_numel(ndim, shape, &numel, err);
  if (rc != DLB_OK) goto cleanup;
  rc = dlb_dtype_storage_bytes(dtype, numel, padded, &nbytes, err);
  if (rc != DLB_OK) goto cleanup;

  rc = alloc_versioned(what, ndim, nbytes, &b, &data, err);
  if (rc != DLB_OK) goto cleanup;

  DLTensor *t = &b->managed.dl_tensor;
  if (ndim > 0) {
    memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    rc = dlb_strides_row_major(ndim, t->shape, t->strides, err);
    if (rc != DLB_OK) goto cleanup; /* cannot happen: shape was checked */
  }
  t->data = data;
  t->device = device;
  t->dtype = dtype;
  t->byte_offset = 0;
  b->managed.flags = padded ? DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED : 0;
  if (clear) memset(data, 0, (size_t)nbytes);
  b->managed.deleter = versioned_deleter;
  *out = &b->managed;
  b = NULL;

cleanup:
  if (b != NULL) free_block(b);
  return rc;
}

int dlb_managed_empty(int32_t ndim, const int64_t *shape, DLDataType dtype,
                      DLDevice device, bool padded,
                      DLManagedTensorVersioned **out, dlb_error *err) {
  return make_owned("dlb_managed_empty", ndim, shape, dtype, device, padded,
                    false, out, err);
}

int dlb_managed_zeros(int32_t ndim, const int64_t *shape, DLDataType dtype,
                      DLDevice device, bool padded,
                      DLManagedTensorVersioned **out, dlb_error *err) {
  return make_owned("dlb_managed_zeros", ndim, shape, dtype, device, padded,
                    true, out, err);
}

/* The common body of wrap and from_legacy: a versioned block describing
 * view, with shape and strides copied in, that runs release(ctx) when
 * deleted.  Does not call release on failure. */
static int wrap_view(const char *what, const DLTensor *view, uint64_t flags,
                     dlb_release_fn release, void *ctx,
                     DLManagedTensorVersioned **out, dlb_error *err) {
  int rc;
  versioned_block *b = NULL;

  if (out == NULL) {
    rc = dlb_error_set(err, DLB_EINVAL, "%s: out is NULL", what);
    goto cleanup;
  }
  rc = check_ndim_shape(what, view->ndim, view->shape, err);
  if (rc != DLB_OK) goto cleanup;

  rc = alloc_versioned(what, view->ndim, -1, &b, NULL, err);
  if (rc != DLB_OK) goto cleanup;

  DLTensor *t = &b->managed.dl_tensor;
  int32_t ndim = view->ndim;
  if (ndim > 0) {
    memcpy(t->shape, view->shape, (size_t)ndim * sizeof(int64_t));
    if (view->strides != NULL) {
      memcpy(t->strides, view->strides, (size_t)ndim * sizeof(int64_t));
    } else {
      /* Legacy and pre-1.2 producers send NULL for compact row-major; the
       * versioned result always carries strides (the 1.2 rule). */
      rc = dlb_strides_row_major(ndim, t->shape, t->strides, err);
      if (rc != DLB_OK) goto cleanup;
    }
  }
  t->data = view->data;
  t->device = view->device;
  t->dtype = view->dtype;
  t->byte_offset = view->byte_offset;
  b->managed.flags = flags;
  b->release = release;
  b->release_ctx = ctx;
  b->managed.deleter = versioned_deleter;
  *out = &b->managed;
  b = NULL;

cleanup:
  if (b != NULL) free_block(b);
  return rc;
}

/* dlb_managed_wrap is on the import path of every zero-copy import (NumPy
 * arrays, buffers, array interfaces), so it is built with straight-line
 * code rather than through alloc_versioned: every field is written
 * exactly once (no memset of the header), shape and strides are copied by
 * a plain loop (ndim is small; no memcpy call), and row-major strides are
 * synthesised only when the view has none.  The layout is the same as
 * every other versioned block, so versioned_deleter frees it.  Inputs that
 * fail the ndim/shape checks take the shared, slower path for its error
 * messages. */
int dlb_managed_wrap(const DLTensor *view, uint64_t flags,
                     dlb_release_fn release, void *ctx,
                     DLManagedTensorVersioned **out, dlb_error *err) {
  if (view == NULL) {
    return dlb_error_set(err, DLB_EINVAL, "dlb_managed_wrap: view is NULL");
  }
  int32_t ndim = view->ndim;
  if (out == NULL || ndim < 0 || ndim > DLB_MAX_NDIM ||
      (ndim > 0 && view->shape == NULL)) {
    return wrap_view("dlb_managed_wrap", view, flags, release, ctx, out, err);
  }

  size_t total = versioned_meta_bytes(ndim);
  const dlb_allocator *allocator = dlb_get_allocator();
  versioned_block *b = allocator->alloc(total, allocator->ctx);
  if (b == NULL) {
    return dlb_error_set(err, DLB_ENOMEM,
                         "dlb_managed_wrap: out of memory allocating %zu "
                         "bytes",
                         total);
  }
  DLTensor *t = &b->managed.dl_tensor;
  t->shape = NULL;
  t->strides = NULL;
  if (ndim > 0) {
    int64_t *shape = block_shape(b), *strides = shape + ndim;
    for (int32_t i = 0; i < ndim; i++) shape[i] = view->shape[i];
    if (view->strides != NULL) {
      for (int32_t i = 0; i < ndim; i++) strides[i] = view->strides[i];
    } else {
      /* Legacy and pre-1.2 producers send NULL for compact row-major; the
       * versioned result always carries strides (the 1.2 rule). */
      int rc = dlb_strides_row_major(ndim, shape, strides, err);
      if (rc != DLB_OK) {
        allocator->release(b, allocator->ctx);
        return rc;
      }
    }
    t->shape = shape;
    t->strides = strides;
  }
  t->data = view->data;
  t->device = view->device;
  t->ndim = ndim;
  t->dtype = view->dtype;
  t->byte_offset = view->byte_offset;
  b->allocator = *allocator;
  b->release = release;
  b->release_ctx = ctx;
  b->managed.version.major = DLPACK_MAJOR_VERSION;
  b->managed.version.minor = DLPACK_MINOR_VERSION;
  b->managed.manager_ctx = b;
  b->managed.flags = flags;
  b->managed.deleter = versioned_deleter;
  *out = &b->managed;
  return DLB_OK;
}

bool dlb_managed_wrap_context(const DLManagedTensorVersioned *m,
                              dlb_release_fn *release, void **ctx) {
  /* Every tensor made here has versioned_deleter and its block as
   * manager_ctx; empty/zeros blocks have no release and say false too. */
  if (m == NULL || m->deleter != versioned_deleter) return false;
  const versioned_block *b = (const versioned_block *)m->manager_ctx;
  if (b == NULL || b->release == NULL) return false;
  if (release != NULL) *release = b->release;
  if (ctx != NULL) *ctx = b->release_ctx;
  return true;
}

/* release function of from_legacy: ctx is the legacy tensor it owns. */
static void release_legacy(void *ctx) {
  dlb_managed_delete_legacy((DLManagedTensor *)ctx);
}

int dlb_managed_from_legacy(DLManagedTensor *legacy,
                            DLManagedTensorVersioned **out, dlb_error *err) {
  if (legacy == NULL) {
    return dlb_error_set(err, DLB_EINVAL,
                         "dlb_managed_from_legacy: legacy is NULL");
  }
  /* Shape and strides are COPIED rather than pointed at, although the
   * legacy arrays would live long enough: the strides must be synthesised
   * when the legacy tensor has none, so there is storage in the block
   * anyway; copying keeps one layout for every tensor made here; and a
   * consumer that writes to our arrays can never corrupt the producer's
   * (known-bugs B11).  It costs at most 1 KiB inside the allocation we make
   * regardless.  Flags are 0: the legacy format cannot say read-only. */
  return wrap_view("dlb_managed_from_legacy", &legacy->dl_tensor, 0,
                   release_legacy, legacy, out, err);
}

int dlb_managed_to_legacy(DLManagedTensorVersioned *m, DLManagedTensor **out,
                          dlb_error *err) {
  /* Every check comes before the one allocation, so failures need no
   * cleanup and leave m untouched. */
  if (m == NULL || out == NULL) {
    return dlb_error_set(err, DLB_EINVAL, "dlb_managed_to_legacy: %s is NULL",
                         m == NULL ? "m" : "out");
  }
  /* A major we do not speak: nothing past flags may be read. */
  if (m->version.major != DLPACK_MAJOR_VERSION) {
    return dlb_error_set(err, DLB_EVERSION,
                         "dlb_managed_to_legacy: DLPack major version %u; "
                         "dlbridge speaks %d",
                         (unsigned)m->version.major, DLPACK_MAJOR_VERSION);
  }
  if (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
    return dlb_error_set(err, DLB_EREADONLY,
                         "dlb_managed_to_legacy: the tensor is read-only and "
                         "the legacy format cannot say so; copy it first");
  }
  if ((m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) &&
      dlb_dtype_is_subbyte(m->dl_tensor.dtype)) {
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dlb_managed_to_legacy: padded sub-byte data "
                         "(IS_SUBBYTE_TYPE_PADDED) cannot be described in "
                         "the legacy format, which assumes packed elements");
  }

  const dlb_allocator *allocator = dlb_get_allocator();
  legacy_block *b = allocator->alloc(sizeof *b, allocator->ctx);
  if (b == NULL) {
    return dlb_error_set(err, DLB_ENOMEM,
                         "dlb_managed_to_legacy: out of memory allocating "
                         "%zu bytes",
                         sizeof *b);
  }
  b->allocator = *allocator;
  b->inner = m;
  /* shape and strides point at m's arrays, which live until m's deleter
   * runs -- and that happens only when this legacy tensor is deleted.  The
   * legacy format allows NULL strides, so they are passed on as they are. */
  b->managed.dl_tensor = m->dl_tensor;
  b->managed.manager_ctx = b;
  b->managed.deleter = legacy_deleter;
  *out = &b->managed;
  return DLB_OK;
}

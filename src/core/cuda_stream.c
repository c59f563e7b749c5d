/* cuda_stream.c -- stream values and cross-stream ordering.
 *
 * Ordering uses a fresh event per call (cuEventCreate with
 * CU_EVENT_DISABLE_TIMING, record, wait, destroy), as CuPy does, rather than
 * a cached pool: a pooled event re-recorded while an earlier wait on it is
 * still pending, or while it belongs to a graph being captured, would order
 * the wrong work, and a pool needs per-context bookkeeping and locking.
 * Destroying right after the wait is allowed: the driver keeps the event
 * until the wait has been resolved.  Creating an event costs on the order of
 * a microsecond, small next to what crosses frameworks.
 */
#include "internal.h"

/* The shared table of stream values; none_orders says what None means. */
static int decode(const char *what, const int64_t *value, bool none_orders,
                  bool minus_one_allowed, void **stream, bool *order,
                  dlb_error *err) {
  if (stream == NULL || order == NULL)
    return dlb_error_set(err, DLB_EINVAL, "%s: stream or order is NULL", what);
  if (value == NULL) {
    *stream = none_orders ? DLB_CUDA_STREAM_LEGACY : NULL;
    *order = none_orders;
    return DLB_OK;
  }
  int64_t v = *value;
  if (v == -1 && minus_one_allowed) {
    *stream = NULL;
    *order = false;
    return DLB_OK;
  }
  if (v == 0) {
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: stream 0 is not allowed for CUDA (it is "
                         "ambiguous); pass 1 for the legacy default stream, "
                         "2 for the per-thread default stream",
                         what);
  }
  if (v < 0) {
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: stream %lld is not a valid stream value "
                         "(expected %s1, 2 or a stream handle)",
                         what, (long long)v,
                         minus_one_allowed ? "None, -1, " : "None, ");
  }
  *stream = (void *)(uintptr_t)(uint64_t)v;
  *order = true;
  return DLB_OK;
}

int dlb_cuda_stream_from_dlpack(const int64_t *value, void **stream,
                                bool *order, dlb_error *err) {
  return decode("__dlpack__", value, true, true, stream, order, err);
}

int dlb_cuda_stream_from_cai(const int64_t *value, void **stream, bool *order,
                             dlb_error *err) {
  return decode("__cuda_array_interface__", value, false, false, stream, order,
                err);
}

/* Capture status of a non-legacy stream; scope is entered. */
static int capturing(const dlb__cuda_scope *scope, const char *what,
                     void *stream, bool *out, dlb_error *err) {
  int status = DLB__CU_STREAM_CAPTURE_STATUS_NONE;
  if (dlb__cuda_stream_is_legacy(stream)) {
    *out = false; /* never asked: see dlbridge.h */
    return DLB_OK;
  }
  dlb__CUresult cu = scope->api->cuStreamIsCapturing(stream, &status);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, what, "cuStreamIsCapturing", cu);
  *out = status != DLB__CU_STREAM_CAPTURE_STATUS_NONE;
  return DLB_OK;
}

int dlb_cuda_stream_is_capturing(int device_id, void *stream, bool *out,
                                 dlb_error *err) {
  dlb__cuda_scope scope;
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_stream_is_capturing: out is NULL");
  int rc = dlb__cuda_enter("dlb_cuda_stream_is_capturing", device_id, &scope,
                           err);
  if (rc == DLB_OK)
    rc = capturing(&scope, "dlb_cuda_stream_is_capturing", stream, out, err);
  dlb__cuda_leave(&scope);
  return rc;
}

static const char *stream_text(const void *s) {
  return dlb__cuda_stream_is_legacy(s) ? "the legacy stream" : "its stream";
}

int dlb_cuda_stream_order(int device_id, void *producer, void *consumer,
                          dlb_error *err) {
  static const char what[] = "dlb_cuda_stream_order";
  dlb__cuda_scope scope;
  dlb__CUevent event = NULL;
  bool producer_capturing = false, consumer_capturing = false;

  /* NULL and 1 are the same stream. */
  if (producer == consumer ||
      (dlb__cuda_stream_is_legacy(producer) &&
       dlb__cuda_stream_is_legacy(consumer)))
    return DLB_OK;
  int rc = dlb__cuda_enter(what, device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  rc = capturing(&scope, what, producer, &producer_capturing, err);
  if (rc != DLB_OK) goto cleanup;
  rc = capturing(&scope, what, consumer, &consumer_capturing, err);
  if (rc != DLB_OK) goto cleanup;
  if ((producer_capturing || consumer_capturing) &&
      (dlb__cuda_stream_is_legacy(producer) ||
       dlb__cuda_stream_is_legacy(consumer))) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: the %s stream is being captured into a CUDA "
                       "graph and the %s is %s, which must not be touched "
                       "during a capture; use the capturing stream as the "
                       "consumer stream (or -1 for no ordering)",
                       what, producer_capturing ? "producer" : "consumer",
                       producer_capturing ? "consumer" : "producer",
                       stream_text(producer_capturing ? consumer : producer));
    goto cleanup;
  }
  dlb__CUresult cu =
      scope.api->cuEventCreate(&event, DLB__CU_EVENT_DISABLE_TIMING);
  if (cu != DLB__CUDA_SUCCESS) {
    event = NULL;
    rc = dlb__cuda_fail(err, what, "cuEventCreate", cu);
    goto cleanup;
  }
  cu = scope.api->cuEventRecord(event, producer);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuEventRecord", cu);
    goto cleanup;
  }
  /* A capturing consumer may not wait on an event recorded outside its
   * capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION, seen on driver 580);
   * CU_EVENT_WAIT_EXTERNAL makes the wait an event-wait node of the graph
   * instead.  That node refers to the event when the graph runs, so the
   * event is then not destroyed: one small event per such capture-time
   * ordering stays alive for the life of the process. */
  bool external = consumer_capturing && !producer_capturing;
  cu = scope.api->cuStreamWaitEvent(consumer, event,
                                    external ? DLB__CU_EVENT_WAIT_EXTERNAL : 0);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuStreamWaitEvent", cu);
    goto cleanup;
  }
  if (external) event = NULL;

cleanup:
  if (event != NULL) (void)scope.api->cuEventDestroy(event);
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_stream_synchronize(int device_id, void *stream, dlb_error *err) {
  static const char what[] = "dlb_cuda_stream_synchronize";
  dlb__cuda_scope scope;
  bool is_capturing = false;
  int rc = dlb__cuda_enter(what, device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  rc = capturing(&scope, what, stream, &is_capturing, err);
  if (rc != DLB_OK) goto cleanup;
  if (is_capturing) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: the stream is being captured into a CUDA graph; "
                       "the host cannot wait for it (copy to the host after "
                       "the capture ends)",
                       what);
    goto cleanup;
  }
  dlb__CUresult cu = scope.api->cuStreamSynchronize(stream);
  if (cu != DLB__CUDA_SUCCESS)
    rc = dlb__cuda_fail(err, what, "cuStreamSynchronize", cu);

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}

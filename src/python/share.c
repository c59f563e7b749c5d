/* share.c -- dlbridge.share() and what makes a Tensor "shared": the policy
 * over the two transports, POSIX shared memory for host tensors
 * (share_shm.c) and CUDA IPC for CUDA tensors (share_ipc.c).
 *
 * A Tensor is shared when its elements lie in memory of either transport
 * that this process holds (a lookup by address, so another framework's view
 * of a shared tensor is recognised too); a shared Tensor pickles as its
 * transport's handle, any other through pickle.c.  What share() refuses,
 * and why, is written here: managed memory (CUDA IPC cannot export it) and
 * devices dlbridge cannot reach.
 */
#include "dlbridge_py.h"

int dlb__tensor_is_shared(const dlb_TensorObject *self) {
  return dlb__ipc_holds(&self->t) || dlb__shm_holds(&self->t);
}

static PyObject *tensor_get_is_shared(PyObject *op, void *closure) {
  (void)closure;
  return PyBool_FromLong(dlb__tensor_is_shared((dlb_TensorObject *)op));
}

static PyObject *py_share(PyObject *module, PyObject *obj) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  dlb_view view;
  PyObject *res = NULL;

  if (dlb__is_tensor(st, obj) && dlb__tensor_is_shared((dlb_TensorObject *)obj))
    return Py_NewRef(obj);
  if (dlb__view_get(st, obj, 0, &view) < 0) return NULL;
  if (view.t.device.device_type == kDLCUDA) {
    dlb__view_release(&view);
    return dlb__ipc_share(st, obj);
  }
  if (view.t.device.device_type == kDLCUDAManaged) {
    PyErr_SetString(PyExc_BufferError,
                    "share(): CUDA managed memory cannot be exported with CUDA "
                    "IPC; copy it to a device first (copy(device='cuda:N'))");
    goto cleanup;
  }
  if (!dlb_device_is_host_accessible(view.t.device)) {
    PyObject *d = dlb__device_text(view.t.device);
    if (d != NULL) {
      PyErr_Format(PyExc_BufferError,
                   "share(): tensors on device '%U' cannot be put in shared memory",
                   d);
      Py_DECREF(d);
    }
    goto cleanup;
  }
  /* Already in a segment of ours (a framework's view of a shared tensor):
   * a Tensor over the same memory, no copy. */
  if (dlb__shm_holds(&view.t)) {
    dlb__view_release(&view);
    return dlb__import(st, obj, NULL, 0);
  }
  /* Copied while the view is held. */
  res = dlb__shm_share(st, &view);

cleanup:
  dlb__view_release(&view);
  return res;
}

/* Tensor.__reduce_ex__: a shared tensor travels as its transport's handle,
 * any other through pickle.c (protocol 5 out of band, else in band). */
static PyObject *tensor_reduce_ex(PyObject *op, PyObject *protocol) {
  dlb_TensorObject *self = (dlb_TensorObject *)op;
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(op));
  if (st != NULL && dlb__ipc_holds(&self->t)) return dlb__ipc_reduce(st, self);
  if (st != NULL && dlb__shm_holds(&self->t)) return dlb__shm_reduce(st, self);
  return dlb__tensor_reduce_ex(op, protocol);
}

PyMethodDef dlb__share_tensor_methods[] = {
    {"__reduce_ex__", tensor_reduce_ex, METH_O,
     "Pickle support: protocol 5 sends the data out of band, a shared tensor "
     "a handle."},
    {"__deepcopy__", dlb__tensor_deepcopy, METH_O, "A copy of the data."},
    {NULL, NULL, 0, NULL},
};

PyGetSetDef dlb__share_tensor_getset[] = {
    {"is_shared", tensor_get_is_shared, NULL,
     "True when the data is in shared memory another process can map "
     "(dlbridge.share).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef share_methods[] = {
    {"share", py_share, METH_O,
     "share(obj) -> Tensor\n--\n\nThe tensor in memory another process can "
     "map: POSIX shared memory on the CPU, CUDA IPC memory on a GPU (one "
     "copy; a tensor already there is returned without one).  A shared "
     "Tensor pickles as a handle: no data is copied."},
    {NULL, NULL, 0, NULL},
};

int dlb__share_init(PyObject *module, dlb_module_state *st) {
  (void)st;
  if (dlb__share_shm_init(module) < 0 || dlb__share_ipc_init(module) < 0)
    return -1;
  return PyModule_AddFunctions(module, share_methods);
}

// _nb_peer.cpp -- the nanobind peer: functions taking three tensors (f) and
// one tensor (f1, what dlbridge's from_dlpack is compared with) of any
// framework the nanobind way (nb::ndarray<> with no constraints, so any
// dtype/shape/device is accepted and only the import itself is measured).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace nb = nanobind;

NB_MODULE(_nb_peer, m) {
  m.def("f", [](nb::ndarray<> a, nb::ndarray<> b, nb::ndarray<> c) {
    // Touch one field of each so the import cannot be elided.
    (void)a.data();
    (void)b.data();
    (void)c.data();
  });
  m.def("f1", [](nb::ndarray<> a) { (void)a.data(); });
}

// The Python module kizuna.torch._C: the backend's creator, for Backend.register_backend.
#include <torch/python.h>

#include <pybind11/chrono.h>

#include "backend.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "kizuna's torch.distributed backend (kizuna.torch registers it as \"kizuna\")";
  m.def("create_backend", &kizuna::torch_backend::KizunaBackend::Create, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        "The process group backend of this rank (torch.distributed calls it).");
  m.def("set_deterministic", &kizuna::torch_backend::SetDeterministic, pybind11::arg("on"),
        "Process groups created afterwards reduce in a fixed order (KIZUNA_DETERMINISTIC).");
  m.def(
      "zero_copy",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        auto* k = dynamic_cast<kizuna::torch_backend::KizunaBackend*>(b.get());
        TORCH_CHECK(k != nullptr, "not a kizuna backend");
        return k->zero_copy();
      },
      "Whether the backend's calls use the tensors' own memory (processes of one host).");
  m.def(
      "flight_record",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        auto* k = dynamic_cast<kizuna::torch_backend::KizunaBackend*>(b.get());
        TORCH_CHECK(k != nullptr, "not a kizuna backend");
        return k->flight_record();
      },
      "The communicator's last operations as JSON (what each was, how it ended).");
  m.attr("version") = kizuna::VersionString(kizuna::kVersion);
}

// KeptSpmm: a decided fgplugin.spmm call (fgplugin/repeated_calls.py keeps them per adjacency),
// run from Python in one step.
//
// On small graphs a training step is bound by host time. Once a call's checks and choices are
// made, all a repeated call has to do is run the spmm op on the kept arguments (the adjacency's
// CSR, plans and transpose) with this call's x, scales, diagonal and bias. Through torch.ops that
// still costs the conversion of all 16 arguments against the schema on every call, and a Python
// context manager for the below-autograd guard: about 5 of an 8 us call on a 200-node graph
// (2-core CPU, torch 2.13). Held here, the kept arguments are passed on as they are, and only the
// five that change cross from Python.
//
// A kept call runs the op either below autograd (no gradient wanted) or as spmm_wrt_x (the
// gradient for x alone, recorded by that op's C++ node); every other kind of call stays in Python
// (fgplugin/ops.py). The op's own checks run as on every call. Kept calls are made only in plain
// eager mode without autocast (fgplugin/repeated_calls.py), so nothing here casts.
#include <torch/extension.h>

#include <utility>
#include <vector>

#include "common.h"
#include "op_handles.h"

namespace fgplugin {
namespace {

using OptTensor = std::optional<at::Tensor>;

class KeptSpmm {
 public:
  KeptSpmm(at::Tensor rowptr, at::Tensor col, OptTensor values, OptTensor plan, std::vector<int64_t> plan_layout,
           OptTensor t_rowptr, OptTensor t_col, OptTensor t_values, OptTensor t_plan,
           std::vector<int64_t> t_plan_layout, int64_t width, int64_t pad, bool wrt_x)
      : rowptr_(std::move(rowptr)),
        col_(std::move(col)),
        values_(std::move(values)),
        plan_(std::move(plan)),
        plan_layout_(std::move(plan_layout)),
        t_rowptr_(std::move(t_rowptr)),
        t_col_(std::move(t_col)),
        t_values_(std::move(t_values)),
        t_plan_(std::move(t_plan)),
        t_plan_layout_(std::move(t_plan_layout)),
        width_(width),
        pad_(pad),
        wrt_x_(wrt_x) {
    TORCH_CHECK(pad >= 0, "KeptSpmm: pad must be >= 0, got ", num(pad));
  }

  // x padded by `pad` zero columns (differentiably: autograd records the pad where x needs a
  // gradient), times the kept adjacency, with this call's scales, diagonal and bias.
  at::Tensor operator()(const at::Tensor& x, const OptTensor& row_scale, const OptTensor& col_scale,
                        const OptTensor& diag, const OptTensor& bias) const {
    const at::Tensor padded = pad_ ? at::constant_pad_nd(x, {0, pad_}) : x;
    if (wrt_x_) {
      return spmm_wrt_x_op().call(rowptr_, col_, values_, padded, row_scale, col_scale, diag, plan_, plan_layout_, t_rowptr_,
                     t_col_, t_values_, t_plan_, t_plan_layout_, bias, width_);
    }
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return spmm_op().call(rowptr_, col_, values_, padded, row_scale, col_scale, diag, plan_, plan_layout_, t_rowptr_, t_col_,
                   t_values_, t_plan_, t_plan_layout_, bias, width_);
  }

  // A GCN layer's A (x W^T) + b: x times its linear map's weight ([out, F], transposed and padded
  // by `weight_pad` zero columns), then the call above. The same ATen ops as the layer's Python
  // path (fgplugin/aggregation.py's _transformed_product), so the same autograd nodes and results,
  // bit for bit; here they cost no Python dispatch (fgplugin/layer_calls.py keeps this call).
  at::Tensor transformed(const at::Tensor& x, const at::Tensor& weight, int64_t weight_pad, const OptTensor& row_scale,
                         const OptTensor& col_scale, const OptTensor& diag, const OptTensor& bias) const {
    TORCH_CHECK(weight_pad >= 0, "KeptSpmm.transformed: weight_pad must be >= 0, got ", num(weight_pad));
    const at::Tensor w = weight_pad ? at::constant_pad_nd(weight.t(), {0, weight_pad}) : weight.t();
    return (*this)(at::matmul(x, w), row_scale, col_scale, diag, bias);
  }

  int64_t width() const { return width_; }
  int64_t pad() const { return pad_; }
  bool wrt_x() const { return wrt_x_; }

 private:
  at::Tensor rowptr_, col_;
  OptTensor values_, plan_;
  std::vector<int64_t> plan_layout_;
  OptTensor t_rowptr_, t_col_, t_values_, t_plan_;
  std::vector<int64_t> t_plan_layout_;
  int64_t width_, pad_;
  bool wrt_x_;
};

}  // namespace
}  // namespace fgplugin

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using fgplugin::KeptSpmm;
  pybind11::class_<KeptSpmm>(m, "KeptSpmm", "A decided fgplugin.spmm call (fgplugin/repeated_calls.py).")
      .def(pybind11::init<at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
                          std::vector<int64_t>, std::optional<at::Tensor>, std::optional<at::Tensor>,
                          std::optional<at::Tensor>, std::optional<at::Tensor>, std::vector<int64_t>, int64_t,
                          int64_t, bool>(),
           pybind11::arg("rowptr"), pybind11::arg("col"), pybind11::arg("values"), pybind11::arg("plan"),
           pybind11::arg("plan_layout"), pybind11::arg("t_rowptr"), pybind11::arg("t_col"),
           pybind11::arg("t_values"), pybind11::arg("t_plan"), pybind11::arg("t_plan_layout"),
           pybind11::arg("width"), pybind11::arg("pad"), pybind11::arg("wrt_x"))
      // adj: the call's adjacency, which the kept arguments already are (the signature of the
      // Python kept call's, so that fgplugin.spmm calls either alike)
      .def(
          "__call__",
          [](const KeptSpmm& self, const pybind11::object& /*adj*/, const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
             const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
             const std::optional<at::Tensor>& bias) {
            pybind11::gil_scoped_release no_gil;  // as torch's own ops: a launch may wait on a full queue
            return self(x, row_scale, col_scale, diag, bias);
          },
          pybind11::arg("adj"), pybind11::arg("x"), pybind11::arg("row_scale"), pybind11::arg("col_scale"),
          pybind11::arg("diag"), pybind11::arg("bias"))
      .def(
          "transformed",
          [](const KeptSpmm& self, const at::Tensor& x, const at::Tensor& weight, int64_t weight_pad,
             const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale,
             const std::optional<at::Tensor>& diag, const std::optional<at::Tensor>& bias) {
            pybind11::gil_scoped_release no_gil;
            return self.transformed(x, weight, weight_pad, row_scale, col_scale, diag, bias);
          },
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("weight_pad"), pybind11::arg("row_scale"),
          pybind11::arg("col_scale"), pybind11::arg("diag"), pybind11::arg("bias"))
      .def_property_readonly("width", &KeptSpmm::width)
      .def_property_readonly("pad", &KeptSpmm::pad)
      .def_property_readonly("wrt_x", &KeptSpmm::wrt_x);
}

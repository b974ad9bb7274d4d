// constant_linear: a layer's linear map of a constant input (the first layer's kept aggregation
// A x, fgplugin/input_cache.py) under one autograd node, for the layer's repeated call
// (fgplugin/layer_calls.py). Autograd would record W's transpose and the addmm as two nodes, and
// the transpose as an op of its own: host time in a training step that is bound by it.
//
// The gradients are those autograd computes for addmm(b, h, W^T) (FunctionsManual.cpp's
// mm_mat2_backward, then the transpose's backward; the bias's is the output gradient summed to
// its shape, as the engine sums a broadcast input's), so a repeated call's gradients are the
// full path's, bit for bit.
#include "constant_linear.h"

#include <torch/autograd.h>

namespace fgplugin {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

// h passed to the node as a plain argument: autograd makes no edge or shape record for it
struct Constant {
  const at::Tensor& h;
};

bool one_addmm(const at::Tensor& h, const at::Tensor& weight, const OptTensor& bias) {
  return bias.has_value() && bias->defined() && h.dim() == 2 && weight.dim() == 2 &&
         h.scalar_type() == weight.scalar_type() && weight.scalar_type() == bias->scalar_type();
}

struct ConstantLinear : public torch::autograd::Function<ConstantLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const OptTensor& bias, const Constant& c) {
    const at::Tensor w = weight.t();
    // mm_mat2_backward's choice: a column-major operand (W^T of a contiguous W) gets its gradient
    // column-major, which W^T's transpose makes W's own layout
    ctx->saved_data["column_major"] = w.stride(0) == 1 && w.stride(1) == w.size(0);
    // as the addmm's node saves h: only where W needs a gradient
    ctx->save_for_backward({weight.requires_grad() ? c.h : at::Tensor()});
    if (bias.has_value() && bias->defined()) ctx->saved_data["bias_sizes"] = bias->sizes().vec();
    return bias.has_value() && bias->defined() ? at::addmm(*bias, c.h, w) : at::mm(c.h, w);
  }

  // grads of (weight, bias, the constant)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    variable_list out(3);
    if (ctx->needs_input_grad(0)) {
      out[0] = ctx->saved_data["column_major"].toBool() ? grad.t().mm(h) : h.t().mm(grad).t();
    }
    if (ctx->needs_input_grad(1)) {
      const auto bias_sizes = ctx->saved_data["bias_sizes"].toIntVector();
      out[1] = at::sum_to(grad, at::IntArrayRef(bias_sizes));
    }
    return out;
  }
};

}  // namespace

at::Tensor constant_linear(const at::Tensor& h, const at::Tensor& weight, const OptTensor& bias) {
  const bool bias_given = bias.has_value() && bias->defined();
  const auto tangent = [](const at::Tensor& t) { return t._fw_grad(/*level=*/0).defined(); };
  const bool wanted = weight.requires_grad() || (bias_given && bias->requires_grad());
  if (one_addmm(h, weight, bias) && at::GradMode::is_enabled() && wanted && !h.requires_grad() && !tangent(h) &&
      !tangent(weight) && !tangent(*bias)) {
    return ConstantLinear::apply(weight, bias, Constant{h});
  }
  if (one_addmm(h, weight, bias)) return at::addmm(*bias, h, weight.t());
  const at::Tensor out = at::matmul(h, weight.t());
  return bias_given ? out + *bias : out;
}

}  // namespace fgplugin

// spmm_wrt_x: the spmm op (same schema, same result) with an autograd node of its own, written in
// C++, for the call that needs the gradient with respect to x alone:
//
//   grad_x = diag(col_scale) (A^T + diag(diag)) diag(row_scale) g      the spmm op on A's transpose
//
// fgplugin/ops.py's run_spmm calls it in plain eager mode where that is all its backward would do
// (no other input needs a gradient, and the zero-row skipping cannot apply: the product is below
// its work floor). Those are the products of small graphs, whose training step is bound by host
// time: the general autograd of the op (every input, the zero-row skipping, functorch) is a
// Python torch.autograd.Function in fgplugin/ops.py, and its node and backward cost more host
// time per product than the kernels take there.
//
// Both products run the spmm op below autograd and autocast, after autocast's cast of a float32
// operand (as the op's autocast kernel in fgplugin/ops.py casts x, for a backward run inside an
// autocast region too); a backward that must itself be differentiable (create_graph=True) calls
// the op through the dispatcher, so its Python autograd records it. Called directly with other
// inputs that need a gradient, or none, spmm_wrt_x is the spmm op itself.
//
// The bias may need a gradient too (a layer's): it is the output gradient summed over the rows.
// An output cut to fewer columns than x's (width) gets its gradient padded back with zeros first.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.h"
#include "op_handles.h"

namespace fgplugin {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

// The op on the device kernels, below autograd and autocast.
at::Tensor spmm_below_autograd(const at::Tensor& rowptr, const at::Tensor& col, const OptTensor& values,
                               const at::Tensor& x, const OptTensor& row_scale, const OptTensor& col_scale,
                               const OptTensor& diag, const OptTensor& plan, at::IntArrayRef plan_layout,
                               const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_values,
                               const OptTensor& t_plan, at::IntArrayRef t_plan_layout,
                               const OptTensor& bias = std::nullopt, int64_t width = -1) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return spmm_op().call(rowptr, col, values, x, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col,
                        t_values, t_plan, t_plan_layout, bias, width);
}

// g with zero columns appended up to `width` columns: differentiably where the backward is
// (create_graph), else by the pad_columns op (one pass on CUDA).
at::Tensor padded_to(const at::Tensor& g, int64_t width) {
  if (g.size(1) == width) return g;
  if (at::GradMode::is_enabled()) return at::constant_pad_nd(g, {0, width - g.size(1)});
  static const auto pad = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("fgplugin::pad_columns", "")
                              .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return pad.call(g.contiguous(), width);
}

// t as the op's autocast kernel passes it: a float32 operand in the autocast dtype of its device.
at::Tensor in_autocast_dtype(const at::Tensor& t) {
  const auto device = t.device().type();
  if (t.scalar_type() == at::kFloat && at::autocast::is_autocast_enabled(device)) {
    return t.to(at::autocast::get_autocast_dtype(device));
  }
  return t;
}

OptTensor optional_of(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

at::Tensor tensor_of(const OptTensor& t) { return t.has_value() ? *t : at::Tensor(); }

// The op's arguments but x and the bias: what the node needs besides the two inputs it records.
// Passed to SpmmWrtX::apply as one argument that is not a tensor, so that autograd tracks x and
// the bias alone (the custom Function machinery makes an edge and a shape record for every tensor
// argument: for the op's 16 it cost about 2 us of host time per call on a 2-core CPU).
struct Fixed {
  const at::Tensor& rowptr;
  const at::Tensor& col;
  const OptTensor& values;
  const OptTensor& row_scale;
  const OptTensor& col_scale;
  const OptTensor& diag;
  const OptTensor& plan;
  at::IntArrayRef plan_layout;
  const OptTensor& t_rowptr;
  const OptTensor& t_col;
  const OptTensor& t_values;
  const OptTensor& t_plan;
  at::IntArrayRef t_plan_layout;
  int64_t width;
};

struct SpmmWrtX : public torch::autograd::Function<SpmmWrtX> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptTensor& bias, const Fixed& a) {
    TORCH_CHECK(a.t_rowptr.has_value() && a.t_col.has_value(),
                "fgplugin.spmm_wrt_x: the backward pass needs the transpose (t_rowptr, t_col); call "
                "fgplugin.spmm(adj, x) so that it is passed");
    // saved as variables, not as plain data: a write to the edge weights or scales before the
    // backward is then an error, as for torch's own ops
    ctx->save_for_backward({a.rowptr, a.col, tensor_of(a.values), tensor_of(a.row_scale), tensor_of(a.col_scale),
                            tensor_of(a.diag), tensor_of(a.plan), *a.t_rowptr, *a.t_col, tensor_of(a.t_values),
                            tensor_of(a.t_plan)});
    ctx->saved_data["plan_layout"] = a.plan_layout.vec();
    ctx->saved_data["t_plan_layout"] = a.t_plan_layout.vec();
    ctx->saved_data["features"] = x.size(1);
    ctx->saved_data["bias_dtype"] = bias.has_value() && bias->defined() ? static_cast<int64_t>(bias->scalar_type()) : int64_t(-1);
    return spmm_below_autograd(a.rowptr, a.col, a.values, x, a.row_scale, a.col_scale, a.diag, a.plan, a.plan_layout,
                               a.t_rowptr, a.t_col, a.t_values, a.t_plan, a.t_plan_layout, bias, a.width);
  }

  // grads of (x, bias, the fixed arguments)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& rowptr = saved[0];
    const auto& col = saved[1];
    const auto values = optional_of(saved[2]), row_scale = optional_of(saved[3]), col_scale = optional_of(saved[4]);
    const auto diag = optional_of(saved[5]), plan = optional_of(saved[6]);
    const auto t_rowptr = saved[7], t_col = saved[8];
    const auto t_values = optional_of(saved[9]), t_plan = optional_of(saved[10]);
    const auto plan_layout = ctx->saved_data["plan_layout"].toIntVector();
    const auto t_plan_layout = ctx->saved_data["t_plan_layout"].toIntVector();
    variable_list out(3);
    if (ctx->needs_input_grad(0)) {
      const at::Tensor g = padded_to(grads[0], ctx->saved_data["features"].toInt());
      // The adjoint product: the op on A's transpose, the output scaled by c and the input by r.
      out[0] = at::GradMode::is_enabled()
                   ? spmm_op().call(t_rowptr, t_col, t_values, g, col_scale, row_scale, diag, t_plan, t_plan_layout,
                                    rowptr, col, values, plan, plan_layout, std::nullopt, -1)
                   : spmm_below_autograd(t_rowptr, t_col, t_values, in_autocast_dtype(g), col_scale, row_scale, diag,
                                         t_plan, t_plan_layout, rowptr, col, values, plan, plan_layout);
    }
    // the bias's edge follows x's where a bias was given; its gradient in its own dtype (under
    // autocast the output's is 16-bit)
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    if (bias_dtype >= 0 && ctx->needs_input_grad(1)) {
      out[1] = at::sum(grads[0], {0}, false, static_cast<at::ScalarType>(bias_dtype));
    }
    return out;
  }
};

at::Tensor spmm_wrt_x(const at::Tensor& rowptr, const at::Tensor& col, const OptTensor& values, const at::Tensor& x,
                      const OptTensor& row_scale, const OptTensor& col_scale, const OptTensor& diag,
                      const OptTensor& plan, at::IntArrayRef plan_layout, const OptTensor& t_rowptr,
                      const OptTensor& t_col, const OptTensor& t_values, const OptTensor& t_plan,
                      at::IntArrayRef t_plan_layout, const OptTensor& bias, int64_t width) {
  // a gradient wanted, or a forward-mode tangent carried, by any input but x and the bias: the
  // node records those two alone (it would drop the tangents of the others silently)
  const auto differentiated = [](const OptTensor& t) {
    return t.has_value() && t->defined() && (t->requires_grad() || t->_fw_grad(/*level=*/0).defined());
  };
  if (!at::GradMode::is_enabled() || !x.requires_grad() || differentiated(values) || differentiated(row_scale) ||
      differentiated(col_scale) || differentiated(diag)) {
    // not the gradient of x alone: the op itself, through the dispatcher (its autograd covers every input)
    return spmm_op().call(rowptr, col, values, x, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col,
                          t_values, t_plan, t_plan_layout, bias, width);
  }
  return SpmmWrtX::apply(in_autocast_dtype(x), bias,
                         Fixed{rowptr, col, values, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col,
                               t_values, t_plan, t_plan_layout, width});
}

}  // namespace
}  // namespace fgplugin

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def(
      "spmm_wrt_x(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, Tensor? col_scale, "
      "Tensor? diag, Tensor? plan, int[] plan_layout, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, "
      "Tensor? t_plan, int[] t_plan_layout, Tensor? bias=None, int width=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(fgplugin, CompositeImplicitAutograd, m) { m.impl("spmm_wrt_x", &fgplugin::spmm_wrt_x); }

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
//
// transformed_wrt_x (spmm_wrt_x.h) is a GCN hidden layer's whole A (x W^T) + b under one such
// node, for its repeated call (csrc/kept_call.cpp): autograd would record the transpose of W, its
// padding and the matrix product as three nodes of their own (and views and a copy of W's
// gradient), each costing host time in a step that is bound by it.
#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "spmm_wrt_x.h"

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

// The adjacency's tensors and layouts that a backward pass needs (every argument of `a` but the
// width), saved as variables, not as plain data: a write to the edge weights or scales before the
// backward is then an error, as for torch's own ops. `extra`: the node's own, saved after them.
constexpr size_t kAdjacencySaved = 11;

void save_adjacency(AutogradContext* ctx, const SpmmFixed& a, std::initializer_list<at::Tensor> extra = {}) {
  TORCH_CHECK(a.t_rowptr.has_value() && a.t_col.has_value(),
              "fgplugin.spmm_wrt_x: the backward pass needs the transpose (t_rowptr, t_col); call "
              "fgplugin.spmm(adj, x) so that it is passed");
  std::vector<at::Tensor> saved{a.rowptr, a.col, tensor_of(a.values), tensor_of(a.row_scale), tensor_of(a.col_scale),
                                tensor_of(a.diag), tensor_of(a.plan), *a.t_rowptr, *a.t_col, tensor_of(a.t_values),
                                tensor_of(a.t_plan)};
  saved.insert(saved.end(), extra);
  ctx->save_for_backward(saved);
  ctx->saved_data["plan_layout"] = a.plan_layout.vec();
  ctx->saved_data["t_plan_layout"] = a.t_plan_layout.vec();
}

// The adjoint product: the op on A's transpose, the output scaled by c and the input by r, of the
// output gradient padded back to the `features` columns of the product's input.
at::Tensor adjoint_product(AutogradContext* ctx, const variable_list& saved, const at::Tensor& grad,
                           int64_t features) {
  const auto& rowptr = saved[0];
  const auto& col = saved[1];
  const auto values = optional_of(saved[2]), row_scale = optional_of(saved[3]), col_scale = optional_of(saved[4]);
  const auto diag = optional_of(saved[5]), plan = optional_of(saved[6]);
  const auto t_rowptr = saved[7], t_col = saved[8];
  const auto t_values = optional_of(saved[9]), t_plan = optional_of(saved[10]);
  const auto plan_layout = ctx->saved_data["plan_layout"].toIntVector();
  const auto t_plan_layout = ctx->saved_data["t_plan_layout"].toIntVector();
  const at::Tensor g = padded_to(grad, features);
  return at::GradMode::is_enabled()
             ? spmm_op().call(t_rowptr, t_col, t_values, g, col_scale, row_scale, diag, t_plan, t_plan_layout, rowptr,
                              col, values, plan, plan_layout, std::nullopt, -1)
             : spmm_below_autograd(t_rowptr, t_col, t_values, in_autocast_dtype(g), col_scale, row_scale, diag, t_plan,
                                   t_plan_layout, rowptr, col, values, plan, plan_layout);
}

// The bias's gradient (its edge follows x's where a bias was given): the output gradient summed
// over the rows, in the bias's own dtype (under autocast the output's is 16-bit).
void note_bias(AutogradContext* ctx, const OptTensor& bias) {
  ctx->saved_data["bias_dtype"] =
      bias.has_value() && bias->defined() ? static_cast<int64_t>(bias->scalar_type()) : int64_t(-1);
}

at::Tensor bias_grad(AutogradContext* ctx, const at::Tensor& grad, size_t bias_input) {
  const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
  if (bias_dtype < 0 || !ctx->needs_input_grad(bias_input)) return at::Tensor();
  return at::sum(grad, {0}, false, static_cast<at::ScalarType>(bias_dtype));
}

// Whether a tensor argument needs a gradient or carries a forward-mode tangent.
bool differentiated(const OptTensor& t) {
  return t.has_value() && t->defined() && (t->requires_grad() || t->_fw_grad(/*level=*/0).defined());
}

// Whether the adjacency's values or scales do: then a node that records x (and W and b) alone
// would drop their gradients or tangents silently.
bool adjacency_differentiated(const SpmmFixed& a) {
  return differentiated(a.values) || differentiated(a.row_scale) || differentiated(a.col_scale) ||
         differentiated(a.diag);
}

struct SpmmWrtX : public torch::autograd::Function<SpmmWrtX> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptTensor& bias, const SpmmFixed& a) {
    save_adjacency(ctx, a);
    ctx->saved_data["features"] = x.size(1);
    note_bias(ctx, bias);
    return spmm_below_autograd(a.rowptr, a.col, a.values, x, a.row_scale, a.col_scale, a.diag, a.plan, a.plan_layout,
                               a.t_rowptr, a.t_col, a.t_values, a.t_plan, a.t_plan_layout, bias, a.width);
  }

  // grads of (x, bias, the fixed arguments)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(3);
    if (ctx->needs_input_grad(0)) {
      out[0] = adjoint_product(ctx, ctx->get_saved_variables(), grads[0], ctx->saved_data["features"].toInt());
    }
    out[1] = bias_grad(ctx, grads[0], 1);
    return out;
  }
};

// The gradients of at::mm(mat1, mat2)'s two operands as autograd's MmBackward0 computes them
// (torch/csrc/autograd/FunctionsManual.cpp, mm_mat1_backward and mm_mat2_backward): an operand
// laid out column-major gets its gradient column-major too. Real dtypes only, as the layers'.
bool column_major(const at::Tensor& t) { return t.stride(0) == 1 && t.stride(1) == t.size(0); }

at::Tensor mm_grad_of_mat1(const at::Tensor& grad, bool mat1_column_major, const at::Tensor& mat2) {
  return mat1_column_major ? mat2.mm(grad.t()).t() : grad.mm(mat2.t());
}

at::Tensor mm_grad_of_mat2(const at::Tensor& grad, const at::Tensor& mat1, bool mat2_column_major) {
  return mat2_column_major ? grad.t().mm(mat1).t() : mat1.t().mm(grad);
}

// A (x W^T) + b under one node (transformed_wrt_x). The backward runs the adjoint product once and
// the two matrix products of the matmul's backward on its result; the weight's gradient is the
// padded product's cut back to W's columns and transposed (autograd's pad and transpose nodes
// did the same, with a copy).
struct TransformedWrtX : public torch::autograd::Function<TransformedWrtX> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                            const SpmmFixed& a, int64_t weight_pad) {
    // of W detached: a view of it saved for the backward is then no view made in no-grad mode,
    // whose base written in place (an optimizer step before the backward) would get autograd's
    // error about such views instead of its error about saved tensors
    const at::Tensor w = transposed_padded(weight.detach(), weight_pad);
    const at::Tensor h = at::matmul(x, w);
    // Saved as the matrix product's node saves its operands: x where W needs a gradient, W^T (as
    // multiplied: a view of W, or the padded copy) where x does; and W for a backward that must
    // itself be differentiable. The view keeps the forward's values where W's data is replaced
    // (`weight.data = ...`) before the backward, as the product's node does.
    const bool x_wants = x.requires_grad(), weight_wants = weight.requires_grad();
    save_adjacency(ctx, a, {weight_wants ? x : at::Tensor(), x_wants ? w : at::Tensor(), x_wants ? weight : at::Tensor()});
    ctx->saved_data["features"] = h.size(1);
    ctx->saved_data["weight_pad"] = weight_pad;
    ctx->saved_data["x_column_major"] = column_major(x);
    ctx->saved_data["w_column_major"] = column_major(w);
    note_bias(ctx, bias);
    return spmm_below_autograd(a.rowptr, a.col, a.values, h, a.row_scale, a.col_scale, a.diag, a.plan, a.plan_layout,
                               a.t_rowptr, a.t_col, a.t_values, a.t_plan, a.t_plan_layout, bias, a.width);
  }

  // grads of (x, weight, bias, the fixed arguments, weight_pad)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[kAdjacencySaved];
    const int64_t weight_pad = ctx->saved_data["weight_pad"].toInt();
    variable_list out(5);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const at::Tensor grad_h = adjoint_product(ctx, saved, grads[0], ctx->saved_data["features"].toInt());
      if (ctx->needs_input_grad(0)) {
        // a backward that must itself be differentiable (create_graph) transposes and pads W
        // again, so that x's gradient is differentiable in W
        const at::Tensor& weight = saved[kAdjacencySaved + 2];
        const at::Tensor w = at::GradMode::is_enabled() ? transposed_padded(weight, weight_pad) : saved[kAdjacencySaved + 1];
        out[0] = mm_grad_of_mat1(grad_h, ctx->saved_data["x_column_major"].toBool(), w);
      }
      if (ctx->needs_input_grad(1)) {
        const at::Tensor grad_w = mm_grad_of_mat2(grad_h, x, ctx->saved_data["w_column_major"].toBool());
        const int64_t out_features = grad_h.size(1) - weight_pad;
        out[1] = (weight_pad ? grad_w.narrow(1, 0, out_features) : grad_w).t();
      }
    }
    out[2] = bias_grad(ctx, grads[0], 2);
    return out;
  }
};

at::Tensor spmm_wrt_x(const at::Tensor& rowptr, const at::Tensor& col, const OptTensor& values, const at::Tensor& x,
                      const OptTensor& row_scale, const OptTensor& col_scale, const OptTensor& diag,
                      const OptTensor& plan, at::IntArrayRef plan_layout, const OptTensor& t_rowptr,
                      const OptTensor& t_col, const OptTensor& t_values, const OptTensor& t_plan,
                      at::IntArrayRef t_plan_layout, const OptTensor& bias, int64_t width) {
  const SpmmFixed a{rowptr, col, values, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col,
                    t_values, t_plan, t_plan_layout, width};
  // a gradient wanted, or a forward-mode tangent carried, by any input but x and the bias: the
  // node records those two alone (it would drop the tangents of the others silently)
  if (!at::GradMode::is_enabled() || !x.requires_grad() || adjacency_differentiated(a)) {
    // not the gradient of x alone: the op itself, through the dispatcher (its autograd covers every input)
    return spmm_op().call(rowptr, col, values, x, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col,
                          t_values, t_plan, t_plan_layout, bias, width);
  }
  return SpmmWrtX::apply(in_autocast_dtype(x), bias, a);
}

}  // namespace

at::Tensor transposed_padded(const at::Tensor& weight, int64_t pad) {
  return pad ? at::constant_pad_nd(weight.t(), {0, pad}) : weight.t();
}

at::Tensor transformed_wrt_x(const at::Tensor& x, const at::Tensor& weight, int64_t weight_pad, const OptTensor& bias,
                             const SpmmFixed& a) {
  TORCH_CHECK(weight_pad >= 0, "fgplugin transformed_wrt_x: weight_pad must be >= 0, got ", num(weight_pad));
  const auto tangent = [](const at::Tensor& t) { return t._fw_grad(/*level=*/0).defined(); };
  const bool bias_given = bias.has_value() && bias->defined();
  const bool wanted = x.requires_grad() || weight.requires_grad() || (bias_given && bias->requires_grad());
  // Under saved-tensor hooks (activation checkpointing, offloading) the ops are recorded one by
  // one: a non-reentrant checkpoint matches the tensors its recomputation saves with those the
  // forward saved, and a layer's first call (its full path) records them one by one.
  const bool hooks = !at::SavedTensorDefaultHooks::get_tls_state().stack.empty();
  if (!at::GradMode::is_enabled() || !wanted || hooks || adjacency_differentiated(a) || tangent(x) ||
      tangent(weight) || (bias_given && tangent(*bias))) {
    // the ops one by one, each recorded by its own node (spmm_wrt_x's covers every case)
    return spmm_wrt_x(a.rowptr, a.col, a.values, at::matmul(x, transposed_padded(weight, weight_pad)), a.row_scale,
                      a.col_scale, a.diag, a.plan, a.plan_layout, a.t_rowptr, a.t_col, a.t_values, a.t_plan,
                      a.t_plan_layout, bias, a.width);
  }
  return TransformedWrtX::apply(x, weight, bias, a, weight_pad);
}

}  // namespace fgplugin

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def(
      "spmm_wrt_x(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, Tensor? col_scale, "
      "Tensor? diag, Tensor? plan, int[] plan_layout, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, "
      "Tensor? t_plan, int[] t_plan_layout, Tensor? bias=None, int width=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(fgplugin, CompositeImplicitAutograd, m) { m.impl("spmm_wrt_x", &fgplugin::spmm_wrt_x); }

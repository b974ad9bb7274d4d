// Argument checks of the ops, shared by their CPU and CUDA kernels (see common.h).
#include <ATen/MemoryOverlap.h>
#include <algorithm>

#include "common.h"

namespace fgplugin {
namespace {

void check_aux(const std::optional<at::Tensor>& t, const char* name, int64_t numel,
                      at::ScalarType dtype, const at::Tensor& x) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->dim() == 1 && t->numel() == numel, "fgplugin.spmm: ", name,
              " must be a 1-D tensor with ", num(numel), " entries, got shape ", dims(t->sizes()));
  TORCH_CHECK(t->scalar_type() == dtype, "fgplugin.spmm: ", name, " must have dtype ", dtype,
              " for x of dtype ", x.scalar_type(), ", got ", t->scalar_type(),
              " (fgplugin.spmm casts it for you; call the op through it)");
  TORCH_CHECK(t->device() == x.device(), "fgplugin.spmm: ", name, " is on ", t->device(),
              " but x is on ", x.device(), "; move the adjacency with adj.to(x.device)");
}

// Checks the CSR pair (contents included) and x, whose rows the column ids index; returns the
// number of output rows.
int64_t check_csr_and_x(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x,
                               const char* op) {
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, op, ": rowptr must be 1-D with n_rows + 1 entries");
  TORCH_CHECK(rowptr.scalar_type() == at::kInt || rowptr.scalar_type() == at::kLong, op,
              ": rowptr must be int32 or int64, got ", rowptr.scalar_type());
  TORCH_CHECK(col.dim() == 1 && col.scalar_type() == rowptr.scalar_type(), op,
              ": col must be 1-D with the dtype of rowptr (", rowptr.scalar_type(), "), got ",
              col.scalar_type(), " of shape ", dims(col.sizes()));
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [num_source_nodes, F], got shape ", dims(x.sizes()));
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be floating point, got ", x.scalar_type());
  TORCH_CHECK(rowptr.device() == x.device() && col.device() == x.device(), op,
              ": the adjacency is on ", rowptr.device(), " but x is on ", x.device(),
              "; move the adjacency with adj.to(x.device)");
  const int64_t max_col = checked_max_col(rowptr, col, op);
  TORCH_CHECK(max_col < x.size(0), std::string(op) + ": the adjacency refers to source node " + num(max_col) +
                                       " but x has " + num(x.size(0)) + " rows; pass features of every source node");
  return rowptr.numel() - 1;
}

std::optional<at::Tensor> contiguous_or_none(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

}  // namespace

SpmmArgs prepare_spmm(const at::Tensor& rowptr, const at::Tensor& col,
                             const std::optional<at::Tensor>& values, const at::Tensor& x,
                             const std::optional<at::Tensor>& row_scale,
                             const std::optional<at::Tensor>& col_scale,
                             const std::optional<at::Tensor>& diag, const std::optional<at::Tensor>& bias,
                             int64_t width) {
  const int64_t n_rows = check_csr_and_x(rowptr, col, x, "fgplugin.spmm");
  const auto aux = aux_dtype_for(x.scalar_type());
  check_aux(values, "values", col.numel(), aux, x);
  check_aux(row_scale, "row_scale", n_rows, aux, x);
  check_aux(col_scale, "col_scale", x.size(0), aux, x);
  check_aux(diag, "diag", std::min(n_rows, x.size(0)), aux, x);
  TORCH_CHECK(width >= -1 && width <= x.size(1), "fgplugin.spmm: width must be -1 (all of x's columns) or 0.." +
                                                    num(x.size(1)) + " (x's columns), got " + num(width));
  const int64_t out_width = width < 0 ? x.size(1) : width;
  check_aux(bias, "bias", out_width, aux, x);
  return {rowptr.contiguous(), col.contiguous(), x.contiguous(), contiguous_or_none(values),
          contiguous_or_none(row_scale), contiguous_or_none(col_scale), contiguous_or_none(diag),
          contiguous_or_none(bias), n_rows, out_width};
}

at::Tensor with_epilogue(const at::Tensor& out, const SpmmArgs& a) {
  at::Tensor result = a.width == out.size(1) ? out : out.narrow(1, 0, a.width).contiguous();
  if (a.bias.has_value()) result.add_(*a.bias);  // fresh memory: in place keeps the 16-bit dtype
  return result;
}

SddmmArgs prepare_sddmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                               const at::Tensor& b) {
  const int64_t n_rows = check_csr_and_x(rowptr, col, b, "fgplugin.sddmm");
  TORCH_CHECK(a.dim() == 2 && a.size(0) == n_rows && a.size(1) == b.size(1) &&
                  a.scalar_type() == b.scalar_type() && a.device() == b.device(),
              "fgplugin.sddmm: a must be [n_rows=", num(n_rows), ", F=", num(b.size(1)),
              "] with the dtype and device of b, got ", dims(a.sizes()), " ", a.scalar_type());
  return {rowptr.contiguous(), col.contiguous(), a.contiguous(), b.contiguous(), n_rows};
}

void check_nonzero_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()),
              "fgplugin::nonzero_rows: x must be a 2-D floating-point tensor, got ", x.scalar_type(), " of shape ",
              dims(x.sizes()));
}

void check_pad_columns(const at::Tensor& x, int64_t width) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()),
              "fgplugin::pad_columns: x must be a 2-D floating-point tensor, got ", x.scalar_type(), " of shape ",
              dims(x.sizes()));
  TORCH_CHECK(width >= x.size(1), "fgplugin::pad_columns: width " + num(width) + " is below x's " +
                                      num(x.size(1)) + " columns");
}

void check_spmm_if(const at::Tensor& flag, const SpmmArgs& a, const at::Tensor& out) {
  TORCH_CHECK(flag.numel() == 1 && flag.scalar_type() == at::kBool && flag.device() == a.x.device(),
              "fgplugin::spmm_if: flag must be one bool on x's device (", a.x.device(), "), got ",
              flag.scalar_type(), " of shape ", dims(flag.sizes()), " on ", flag.device());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == a.n_rows && out.size(1) == a.x.size(1) &&
                  out.scalar_type() == a.x.scalar_type() && out.device() == a.x.device() && out.is_contiguous(),
              "fgplugin::spmm_if: out must be a contiguous " + dims({a.n_rows, a.x.size(1)}) +
                  " tensor of x's dtype and device, got ",
              out.scalar_type(), " of shape ", dims(out.sizes()), " on ", out.device());
  TORCH_CHECK(at::get_overlap_status(out, a.x) == at::MemOverlapStatus::No,
              "fgplugin::spmm_if: out shares memory with x, which the product reads while writing out; pass a "
              "tensor of its own");
}

}  // namespace fgplugin

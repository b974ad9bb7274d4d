// Shared declarations and argument checks of the spmm / sddmm ops (see spmm.cpp for the schema).
//
// Conventions (DESIGN.md, "TiledAdjacency"): A is CSR with rows = destination nodes and
// cols = source nodes; rowptr and col share one index dtype (int32 or int64). Edge values and the
// row/column scales are stored in the accumulation dtype of x (float for half/bfloat16/float,
// double for double), so one plan serves every feature precision.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <optional>

namespace fgplugin {

inline at::ScalarType aux_dtype_for(at::ScalarType x_dtype) {
  return x_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_aux(const std::optional<at::Tensor>& t, const char* name, int64_t numel,
                      at::ScalarType dtype, const at::Tensor& x) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->dim() == 1 && t->numel() == numel, "fgplugin.spmm: ", name,
              " must be a 1-D tensor with ", numel, " entries, got shape ", t->sizes());
  TORCH_CHECK(t->scalar_type() == dtype, "fgplugin.spmm: ", name, " must have dtype ", dtype,
              " for x of dtype ", x.scalar_type(), ", got ", t->scalar_type(),
              " (fgplugin.spmm casts it for you; call the op through it)");
  TORCH_CHECK(t->device() == x.device(), "fgplugin.spmm: ", name, " is on ", t->device(),
              " but x is on ", x.device(), "; move the adjacency with adj.to(x.device)");
}

// Checks the CSR pair and x; returns the number of output rows.
inline int64_t check_csr_and_x(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x,
                               const char* op) {
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, op, ": rowptr must be 1-D with n_rows + 1 entries");
  TORCH_CHECK(rowptr.scalar_type() == at::kInt || rowptr.scalar_type() == at::kLong, op,
              ": rowptr must be int32 or int64, got ", rowptr.scalar_type());
  TORCH_CHECK(col.dim() == 1 && col.scalar_type() == rowptr.scalar_type(), op,
              ": col must be 1-D with the dtype of rowptr (", rowptr.scalar_type(), "), got ",
              col.scalar_type(), " of shape ", col.sizes());
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [num_source_nodes, F], got shape ", x.sizes());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be floating point, got ", x.scalar_type());
  TORCH_CHECK(rowptr.device() == x.device() && col.device() == x.device(), op,
              ": the adjacency is on ", rowptr.device(), " but x is on ", x.device(),
              "; move the adjacency with adj.to(x.device)");
  return rowptr.numel() - 1;
}

inline std::optional<at::Tensor> contiguous_or_none(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

template <typename T>
const T* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// The spmm arguments after checks, made contiguous: what both device kernels consume.
struct SpmmArgs {
  at::Tensor rowptr, col, x;
  std::optional<at::Tensor> values, row_scale, col_scale, diag;
  int64_t n_rows;
};

inline SpmmArgs prepare_spmm(const at::Tensor& rowptr, const at::Tensor& col,
                             const std::optional<at::Tensor>& values, const at::Tensor& x,
                             const std::optional<at::Tensor>& row_scale,
                             const std::optional<at::Tensor>& col_scale,
                             const std::optional<at::Tensor>& diag) {
  const int64_t n_rows = check_csr_and_x(rowptr, col, x, "fgplugin.spmm");
  const auto aux = aux_dtype_for(x.scalar_type());
  check_aux(values, "values", col.numel(), aux, x);
  check_aux(row_scale, "row_scale", n_rows, aux, x);
  check_aux(col_scale, "col_scale", x.size(0), aux, x);
  check_aux(diag, "diag", std::min(n_rows, x.size(0)), aux, x);
  return {rowptr.contiguous(), col.contiguous(), x.contiguous(), contiguous_or_none(values),
          contiguous_or_none(row_scale), contiguous_or_none(col_scale), contiguous_or_none(diag), n_rows};
}

// The sddmm arguments after checks, made contiguous.
struct SddmmArgs {
  at::Tensor rowptr, col, a, b;
  int64_t n_rows;
};

inline SddmmArgs prepare_sddmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                               const at::Tensor& b) {
  const int64_t n_rows = check_csr_and_x(rowptr, col, b, "fgplugin.sddmm");
  TORCH_CHECK(a.dim() == 2 && a.size(0) == n_rows && a.size(1) == b.size(1) &&
                  a.scalar_type() == b.scalar_type() && a.device() == b.device(),
              "fgplugin.sddmm: a must be [n_rows=", n_rows, ", F=", b.size(1),
              "] with the dtype and device of b, got ", a.sizes(), " ", a.scalar_type());
  return {rowptr.contiguous(), col.contiguous(), a.contiguous(), b.contiguous(), n_rows};
}

at::Tensor spmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                    const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                    const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                    const std::optional<at::Tensor>& t_rowptr, const std::optional<at::Tensor>& t_col,
                    const std::optional<at::Tensor>& t_values, at::TensorList plan, at::TensorList t_plan);
at::Tensor sddmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b);

}  // namespace fgplugin

// The spmm op's autograd nodes written in C++ (spmm_wrt_x.cpp), for the products of small graphs,
// whose training step is bound by host time.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace fgplugin {

// The op's arguments but x and the bias: what a node needs besides the inputs it records. Passed
// to a node's apply as one argument that is not a tensor, so that autograd tracks those inputs
// alone (the custom Function machinery makes an edge and a shape record for every tensor
// argument: for the op's 16 it cost about 2 us of host time per call on a 2-core CPU).
struct SpmmFixed {
  const at::Tensor& rowptr;
  const at::Tensor& col;
  const std::optional<at::Tensor>& values;
  const std::optional<at::Tensor>& row_scale;
  const std::optional<at::Tensor>& col_scale;
  const std::optional<at::Tensor>& diag;
  const std::optional<at::Tensor>& plan;
  at::IntArrayRef plan_layout;
  const std::optional<at::Tensor>& t_rowptr;
  const std::optional<at::Tensor>& t_col;
  const std::optional<at::Tensor>& t_values;
  const std::optional<at::Tensor>& t_plan;
  at::IntArrayRef t_plan_layout;
  int64_t width;
};

// W^T ([F, out] of `weight`, [out, F]) padded by `pad` zero columns: the matrix a GCN layer's
// input is multiplied by.
at::Tensor transposed_padded(const at::Tensor& weight, int64_t pad);

// A GCN hidden layer's A (x W^T) + b: `weight` ([out, F]) transposed and padded by `weight_pad`
// zero columns, x times it, then the spmm op with `a` and the bias (whose width cuts the padding).
// The same ATen ops and results, forward and backward, bit for bit, as recording the transpose,
// the padding, at::matmul and spmm_wrt_x one by one, under a single autograd node where only x, W
// and b may need a gradient; elsewhere (no gradient wanted, the adjacency's values or scales
// differentiated, forward-mode tangents) it records them one by one.
at::Tensor transformed_wrt_x(const at::Tensor& x, const at::Tensor& weight, int64_t weight_pad,
                             const std::optional<at::Tensor>& bias, const SpmmFixed& a);

}  // namespace fgplugin

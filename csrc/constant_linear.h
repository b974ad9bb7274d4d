// h W^T + b for a constant h, under one autograd node (constant_linear.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace fgplugin {

// h W^T + b (`weight`: [out, F]) as fgplugin/aggregation.py's transform_with_bias computes it
// outside autocast: one addmm where the bias is given in the dtype of h and W, else the matrix
// product and then the bias. Where h needs no gradient, W and b alone are recorded by one node
// whose gradients are autograd's, bit for bit; elsewhere the ops are recorded one by one.
at::Tensor constant_linear(const at::Tensor& h, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace fgplugin

// The CUDA implementations of the ops (one file each: <op>_cuda.cpp; signatures in common.h),
// registered together in register_cuda.cpp. Host C++ only: each checks its arguments and
// allocates, then calls a launcher of launch.h through run_launch, which turns a launch error
// into an exception here rather than in nvcc-compiled code (see common.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "launch.h"

namespace fgplugin {

SpmmOp spmm_cuda;
SddmmOp sddmm_cuda;
NonzeroRowsOp nonzero_rows_cuda;
PadColumnsOp pad_columns_cuda;
SpmmIfOp spmm_if_cuda;

// `launch(inputs..., out)` on the current stream of `out`'s device; returns `out`.
template <typename Launch, typename... Inputs>
at::Tensor run_launch(Launch launch, const at::Tensor& out, const Inputs&... inputs) {
  const c10::cuda::CUDAGuard guard(out.device());
  C10_CUDA_CHECK(launch(inputs..., out));
  return out;
}

}  // namespace fgplugin

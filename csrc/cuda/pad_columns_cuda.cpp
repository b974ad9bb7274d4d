// CUDA implementation of the pad_columns op (schema: pad_columns.cpp): checks and allocation in
// C++, the launch in pad_columns.cu.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "launch.h"

namespace fgplugin {
namespace {

at::Tensor pad_columns_cuda(const at::Tensor& x_in, int64_t width) {
  check_pad_columns(x_in, width);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0), width}, x.options());
  C10_CUDA_CHECK(launch_pad_columns(x, out));
  return out;
}

}  // namespace
}  // namespace fgplugin

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("pad_columns", &fgplugin::pad_columns_cuda);
}

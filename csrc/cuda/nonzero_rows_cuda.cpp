// CUDA implementation of the nonzero_rows op (schema: nonzero_rows.cpp): checks and allocation in
// C++, the launch in nonzero_rows.cu.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "launch.h"

namespace fgplugin {
namespace {

at::Tensor nonzero_rows_cuda(const at::Tensor& x_in) {
  check_nonzero_rows(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kBool));
  if (x.size(1) == 0) return out.fill_(false);
  C10_CUDA_CHECK(launch_nonzero_rows(x, out));
  return out;
}

}  // namespace
}  // namespace fgplugin

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("nonzero_rows", &fgplugin::nonzero_rows_cuda);
}

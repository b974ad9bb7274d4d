// CUDA implementation of the sddmm op (schema: sddmm.cpp): checks and allocation in C++, the
// launch in sddmm.cu (see common.h for why the split).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "launch.h"

namespace fgplugin {
namespace {

at::Tensor sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a_in, const at::Tensor& b_in) {
  const c10::cuda::CUDAGuard guard(a_in.device());
  const SddmmArgs a = prepare_sddmm(rowptr, col, a_in, b_in);
  at::Tensor out = at::empty({a.col.numel()}, a.a.options().dtype(aux_dtype_for(a.a.scalar_type())));
  if (out.numel() == 0) return out;
  C10_CUDA_CHECK(launch_sddmm_csr(a, out));
  return out;
}

}  // namespace
}  // namespace fgplugin

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("sddmm", &fgplugin::sddmm_cuda);
}

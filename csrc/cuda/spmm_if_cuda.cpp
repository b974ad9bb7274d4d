// CUDA implementation of the spmm_if op (schema: spmm_if.cpp): the plain CSR kernel of
// spmm_csr.cu, whose warps leave at once unless the flag on the device is set.
#include "ops_cuda.h"

namespace fgplugin {

void spmm_if_cuda(const at::Tensor& flag, const at::Tensor& rowptr, const at::Tensor& col,
                  const std::optional<at::Tensor>& values, const at::Tensor& x,
                  const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale,
                  const std::optional<at::Tensor>& diag, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag, std::nullopt, -1);
  check_spmm_if(flag, a, out);
  if (out.numel() > 0) C10_CUDA_CHECK(launch_spmm_csr(a, out, flag.data_ptr<bool>()));
}

}  // namespace fgplugin

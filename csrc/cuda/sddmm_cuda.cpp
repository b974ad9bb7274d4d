// CUDA implementation of the sddmm op (schema: sddmm.cpp; kernel: sddmm.cu).
#include "ops_cuda.h"

namespace fgplugin {

at::Tensor sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b) {
  const SddmmArgs args = prepare_sddmm(rowptr, col, a, b);
  at::Tensor out = at::empty({args.col.numel()}, args.a.options().dtype(aux_dtype_for(args.a.scalar_type())));
  return out.numel() ? run_launch(launch_sddmm_csr, out, args) : out;
}

}  // namespace fgplugin

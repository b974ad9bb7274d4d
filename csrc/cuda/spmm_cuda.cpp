// CUDA implementation of the spmm op (schema: spmm.cpp): argument and plan checks, allocation and
// the choice of kernel, in C++; the .cu files only launch (see common.h for why the split).
//
// A kernel plan with float/half/bfloat16 x runs the block-adaptive kernels
// (block_adaptive_spmm.cu); no plan, and float64, run the simple CSR kernel (spmm_csr.cu). TF32 on
// dense tiles only when PyTorch allows TF32 matmuls (torch.backends.cuda.matmul.allow_tf32).
// The block-adaptive kernels write the output's `width` columns with the bias added in their own
// output pass; the CSR kernel writes the full product, cut and biased after it (with_epilogue).
#include <ATen/Context.h>

#include "block_adaptive_spmm.cuh"
#include "ops_cuda.h"

namespace fgplugin {

at::Tensor spmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                     const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                     const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                     const std::optional<at::Tensor>& plan, at::IntArrayRef plan_layout,
                     const std::optional<at::Tensor>& /*t_rowptr*/, const std::optional<at::Tensor>& /*t_col*/,
                     const std::optional<at::Tensor>& /*t_values*/, const std::optional<at::Tensor>& /*t_plan*/,
                     at::IntArrayRef /*t_plan_layout*/, const std::optional<at::Tensor>& bias, int64_t width) {
  const c10::cuda::CUDAGuard guard(x.device());  // for the partial buffer and the launches below
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag, bias, width);
  if (plan.has_value() && a.x.scalar_type() != at::kDouble) {
    at::Tensor out = at::empty({a.n_rows, a.width}, a.x.options());
    if (out.numel() == 0) return out;
    check_block_plan(a, *plan, plan_layout);
    const BlockPlan blocks(*plan, plan_layout);
    const int64_t n_slots = blocks.slot_row.numel();
    at::Tensor partial = at::empty({std::max<int64_t>(n_slots, 1), a.x.size(1)}, a.x.options().dtype(at::kFloat));
    C10_CUDA_CHECK(launch_block_adaptive_spmm(a, blocks, out, partial, at::globalContext().allowTF32CuBLAS()));
    return out;
  }
  at::Tensor out = at::empty({a.n_rows, a.x.size(1)}, a.x.options());
  if (out.numel() > 0) C10_CUDA_CHECK(launch_spmm_csr(a, out));
  return with_epilogue(out, a);
}

}  // namespace fgplugin

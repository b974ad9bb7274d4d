// CUDA implementations of the spmm / sddmm ops: argument and plan checks, allocation, and the
// choice of kernel, in C++; the .cu files only launch (see spmm.h for why the split).
//
// spmm with a non-empty kernel plan and float/half/bfloat16 x runs the block-adaptive kernels;
// an empty plan, and float64, run the simple CSR kernel. TF32 on dense tiles only when PyTorch
// allows TF32 matmuls (torch.backends.cuda.matmul.allow_tf32).
#include <ATen/Context.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "block_adaptive_spmm.cuh"
#include "dense_tiles.cuh"
#include "launch.h"

namespace fgplugin {
namespace {

at::Tensor spmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                     const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                     const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                     const std::optional<at::Tensor>& /*t_rowptr*/, const std::optional<at::Tensor>& /*t_col*/,
                     const std::optional<at::Tensor>& /*t_values*/, at::TensorList plan,
                     at::TensorList /*t_plan*/) {
  const c10::cuda::CUDAGuard guard(x.device());
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag);
  at::Tensor out = at::empty({a.n_rows, a.x.size(1)}, a.x.options());
  if (out.numel() == 0) return out;
  if (!plan.empty() && a.x.scalar_type() != at::kDouble) {
    check_block_plan(a, plan);
    const int64_t n_slots = BlockPlan(plan).slot_row.numel();
    at::Tensor partial = at::empty({std::max<int64_t>(n_slots, 1), a.x.size(1)}, a.x.options().dtype(at::kFloat));
    C10_CUDA_CHECK(launch_block_adaptive_spmm(a, plan, out, partial, at::globalContext().allowTF32CuBLAS()));
  } else {
    C10_CUDA_CHECK(launch_spmm_csr(a, out));
  }
  return out;
}

at::Tensor sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a_in, const at::Tensor& b_in) {
  const c10::cuda::CUDAGuard guard(a_in.device());
  const SddmmArgs a = prepare_sddmm(rowptr, col, a_in, b_in);
  at::Tensor out = at::empty({a.col.numel()}, a.a.options().dtype(aux_dtype_for(a.a.scalar_type())));
  if (out.numel() == 0) return out;
  C10_CUDA_CHECK(launch_sddmm_csr(a, out));
  return out;
}

// Which rows of x hold an entry that is not zero (NaN counts): bool [n_rows] (fgplugin/grad_rows.py).
at::Tensor nonzero_rows_cuda(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && at::isFloatingType(x_in.scalar_type()),
              "fgplugin.nonzero_rows: x must be a 2-D floating-point tensor, got ", x_in.scalar_type(), " of shape ",
              dims(x_in.sizes()));
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kBool));
  if (x.size(1) == 0) return out.fill_(false);
  C10_CUDA_CHECK(launch_nonzero_rows(x, out));
  return out;
}

// [x, 0]: x [n, c] with zero columns up to width >= c (fgplugin/ops.py, _CutColumns).
at::Tensor pad_columns_cuda(const at::Tensor& x_in, int64_t width) {
  TORCH_CHECK(x_in.dim() == 2 && at::isFloatingType(x_in.scalar_type()),
              "fgplugin.pad_columns: x must be a 2-D floating-point tensor, got ", x_in.scalar_type(), " of shape ",
              dims(x_in.sizes()));
  TORCH_CHECK(width >= x_in.size(1), "fgplugin.pad_columns: width " + num(width) + " is below x's " +
                                         num(x_in.size(1)) + " columns");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0), width}, x.options());
  C10_CUDA_CHECK(launch_pad_columns(x, out));
  return out;
}

// 90 when unit-weight dense tiles on CUDA device `device` run on the wgmma kernel, 80 when on the
// mma.sync one (tests and benchmark records ask; see dense_sm90_usable).
int64_t dense_tile_arch(int64_t device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return dense_sm90_usable(c10::cuda::getCurrentCUDAStream()) ? 90 : 80;
}

}  // namespace
}  // namespace fgplugin

// CUDA builds only (a CPU build has no such ops): dense_tile_arch has no tensor arguments, so no
// dispatch key; nonzero_rows and pad_columns run on CUDA only (on the CPU, torch's own ops are fast
// enough).
TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("dense_tile_arch(int device) -> int", &fgplugin::dense_tile_arch);
  m.def("nonzero_rows(Tensor x) -> Tensor");
  m.def("pad_columns(Tensor x, int width) -> Tensor");
}

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("spmm", &fgplugin::spmm_cuda);
  m.impl("sddmm", &fgplugin::sddmm_cuda);
  m.impl("nonzero_rows", &fgplugin::nonzero_rows_cuda);
  m.impl("pad_columns", &fgplugin::pad_columns_cuda);
}

// Launchers of the simple CSR spmm kernel (spmm_csr.cu), of sddmm (sddmm.cu), nonzero_rows
// (nonzero_rows.cu) and pad_columns (pad_columns.cu). They run on the current stream, never throw,
// and return the launch's cudaError_t; arguments are checked before (common.h).
#pragma once

#include <cuda_runtime_api.h>

#include "../common.h"

namespace fgplugin {

// Warps per block of the one-warp-per-row kernels (spmm_csr.cu, sddmm.cu).
constexpr int kWarpsPerBlock = 8;

inline unsigned blocks_for_rows(int64_t n_rows) {
  return static_cast<unsigned>((n_rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// only_if: a bool on the device; when given, the kernel's warps leave at once unless it is set
// (spmm_if), and the grid is capped so that a product left out costs little more than a launch.
cudaError_t launch_spmm_csr(const SpmmArgs& a, const at::Tensor& out, const bool* only_if = nullptr);
cudaError_t launch_sddmm_csr(const SddmmArgs& a, const at::Tensor& out);
// x: contiguous 2-D, floating point; out: bool [x.size(0)].
cudaError_t launch_nonzero_rows(const at::Tensor& x, const at::Tensor& out);
// x: contiguous 2-D, floating point [n, c]; out: contiguous [n, width >= c] of x's dtype.
cudaError_t launch_pad_columns(const at::Tensor& x, const at::Tensor& out);

}  // namespace fgplugin

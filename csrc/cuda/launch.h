// Launchers of the simple CSR kernels (spmm_cuda.cu), of nonzero_rows (nonzero_rows.cu) and of
// pad_columns (pad_columns.cu). They run on the current stream, never throw,
// and return the launch's cudaError_t; arguments are checked before (spmm.h).
#pragma once

#include <cuda_runtime_api.h>

#include "../spmm.h"

namespace fgplugin {

cudaError_t launch_spmm_csr(const SpmmArgs& a, const at::Tensor& out);
cudaError_t launch_sddmm_csr(const SddmmArgs& a, const at::Tensor& out);
// x: contiguous 2-D, floating point; out: bool [x.size(0)].
cudaError_t launch_nonzero_rows(const at::Tensor& x, const at::Tensor& out);
// x: contiguous 2-D, floating point [n, c]; out: contiguous [n, width >= c] of x's dtype.
cudaError_t launch_pad_columns(const at::Tensor& x, const at::Tensor& out);

}  // namespace fgplugin

// The sddmm op's kernel: one warp per row of A; for each non-zero e = (i, j) the lanes stride the
// feature dimension of a[i] . b[j] and the warp sums by shuffles, so each output is written once,
// no atomics (deterministic). Host code here only launches (checks in sddmm_cuda.cpp).
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>

#include "launch.h"

namespace fgplugin {
namespace {

template <typename scalar_t, typename index_t>
__global__ void sddmm_csr_warp_kernel(const index_t* __restrict__ rowptr, const index_t* __restrict__ col,
                                      const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                      at::opmath_type<scalar_t>* __restrict__ out, int64_t n_rows, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  for (int64_t e = rowptr[row]; e < static_cast<int64_t>(rowptr[row + 1]); ++e) {
    const int64_t j = col[e];
    acc_t dot = 0;
    for (int64_t f = lane; f < F; f += 32) dot += static_cast<acc_t>(a[row * F + f]) * static_cast<acc_t>(b[j * F + f]);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) out[e] = dot;
  }
}

}  // namespace

cudaError_t launch_sddmm_csr(const SddmmArgs& a, const at::Tensor& out) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.a.scalar_type(), "fgplugin_sddmm_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(a.rowptr.scalar_type(), "fgplugin_sddmm_cuda_index", [&] {
      sddmm_csr_warp_kernel<scalar_t, index_t><<<blocks_for_rows(a.n_rows), kWarpsPerBlock * 32, 0, stream>>>(
          a.rowptr.data_ptr<index_t>(), a.col.data_ptr<index_t>(), a.a.data_ptr<scalar_t>(), a.b.data_ptr<scalar_t>(),
          out.data_ptr<acc_t>(), a.n_rows, a.a.size(1));
    });
  });
  return cudaGetLastError();
}

}  // namespace fgplugin

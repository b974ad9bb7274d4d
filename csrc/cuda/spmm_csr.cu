// The simple CSR kernel of the spmm op: what a call without a kernel plan and float64 run (the
// block-adaptive kernels are in block_adaptive_spmm.cu; the op is registered and its arguments
// checked in spmm_cuda.cpp). Host code here only launches: no exceptions.
//
// Thread mapping: one warp per output row; the 32 lanes stride the feature dimension, so each
// gathered neighbour row is read coalesced. Accumulation in at::opmath_type; each output element
// is written by one thread, no atomics, so results are deterministic. Limits: a hub row is
// serialized on one warp (fine for correctness, slow for power-law graphs). With `only_if` (the
// spmm_if op) the warps leave at once unless that flag on the device is set.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>

#include "launch.h"

namespace fgplugin {
namespace {


template <typename scalar_t, typename index_t>
__global__ void spmm_csr_warp_kernel(const index_t* __restrict__ rowptr, const index_t* __restrict__ col,
                                     const at::opmath_type<scalar_t>* __restrict__ values,
                                     const scalar_t* __restrict__ x,
                                     const at::opmath_type<scalar_t>* __restrict__ row_scale,
                                     const at::opmath_type<scalar_t>* __restrict__ col_scale,
                                     const at::opmath_type<scalar_t>* __restrict__ diag,
                                     scalar_t* __restrict__ out, int64_t n_rows, int64_t n_diag, int64_t F,
                                     const bool* __restrict__ only_if) {
  using acc_t = at::opmath_type<scalar_t>;
  if (only_if != nullptr && !*only_if) return;
  const int lane = threadIdx.x % 32;
  // rows strided over the grid, which only_if's launches cap
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < n_rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    const acc_t s = row_scale ? row_scale[row] : acc_t(1);
    for (int64_t f = lane; f < F; f += 32) {
      acc_t acc = 0;
      for (int64_t e = begin; e < end; ++e) {
        const int64_t j = col[e];
        acc_t w = values ? values[e] : acc_t(1);
        if (col_scale) w *= col_scale[j];
        acc += w * static_cast<acc_t>(x[j * F + f]);
      }
      if (row < n_diag) {
        const acc_t w = diag[row] * (col_scale ? col_scale[row] : acc_t(1));
        acc += w * static_cast<acc_t>(x[row * F + f]);
      }
      out[row * F + f] = static_cast<scalar_t>(s * acc);
    }
  }
}

// Blocks of a launch with only_if: enough to fill an H100 a few times over when the product runs.
constexpr unsigned kMaxGuardedBlocks = 2048;

}  // namespace

cudaError_t launch_spmm_csr(const SpmmArgs& a, const at::Tensor& out, const bool* only_if) {
  const int64_t n_diag = a.diag ? std::min(a.n_rows, a.x.size(0)) : 0;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned blocks = only_if ? std::min(blocks_for_rows(a.n_rows), kMaxGuardedBlocks) : blocks_for_rows(a.n_rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "fgplugin_spmm_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(a.rowptr.scalar_type(), "fgplugin_spmm_cuda_index", [&] {
      spmm_csr_warp_kernel<scalar_t, index_t><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          a.rowptr.data_ptr<index_t>(), a.col.data_ptr<index_t>(), data_or_null<acc_t>(a.values),
          a.x.data_ptr<scalar_t>(), data_or_null<acc_t>(a.row_scale), data_or_null<acc_t>(a.col_scale),
          data_or_null<acc_t>(a.diag), out.data_ptr<scalar_t>(), a.n_rows, n_diag, a.x.size(1), only_if);
    });
  });
  return cudaGetLastError();
}

}  // namespace fgplugin

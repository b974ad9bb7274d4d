// The pad_columns op's kernel: out = [x, 0] with zero columns up to `width`, for the backward
// pass of a product cut back to fewer columns than the SpMM computed (fgplugin/ops.py,
// _CutColumns). Host code here only launches: no exceptions (checks in pad_columns_cuda.cpp).
//
// Why a kernel: torch's cat([g, zeros]) of products-like's [2.45M, 47] fp32 output gradient to 48
// columns took 0.77-0.85 ms on the H100 and F.pad 0.69 ms, against 0.34 ms for a plain copy of
// the same bytes (docs/results.md): their row-by-row copies use 4-byte accesses.
// Here each thread writes one 16-byte vector of the output (the rows are whole vectors: `width`
// is a multiple of the vector length) from element loads of the input row, which consecutive
// threads read consecutively.
#include <c10/cuda/CUDAStream.h>
#include <ATen/Dispatch.h>

#include <cstdint>

#include "launch.h"

namespace fgplugin {
namespace {

constexpr int kThreads = 256;

template <typename scalar_t, int VEC, typename index_t>
__global__ void pad_columns_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, index_t vectors,
                                   index_t in_cols, index_t width) {
  struct alignas(sizeof(scalar_t) * VEC) Vector {
    scalar_t v[VEC];
  };
  for (index_t q = static_cast<index_t>(blockIdx.x) * kThreads + threadIdx.x; q < vectors;
       q += static_cast<index_t>(gridDim.x) * kThreads) {
    const index_t i = q * VEC, row = i / width, c = i - row * width;
    const scalar_t* src = x + static_cast<int64_t>(row) * in_cols;
    Vector vec;
#pragma unroll
    for (int k = 0; k < VEC; ++k) vec.v[k] = c + k < in_cols ? src[c + k] : scalar_t(0);
    reinterpret_cast<Vector*>(out)[q] = vec;
  }
}

template <typename scalar_t, int VEC>
void launch(const at::Tensor& x, const at::Tensor& out, cudaStream_t stream) {
  const int64_t rows = x.size(0), in_cols = x.size(1), width = out.size(1);
  const int64_t vectors = rows * width / VEC;
  const int64_t blocks = std::min<int64_t>((vectors + kThreads - 1) / kThreads, 65535LL * 32);
  const scalar_t* src = x.const_data_ptr<scalar_t>();
  scalar_t* dst = out.data_ptr<scalar_t>();
  // 32-bit index arithmetic where it cannot overflow (the division is this kernel's cost): the last
  // grid-stride step reaches below 2^30 + blocks * kThreads < 2^31.
  if (rows * width < (int64_t{1} << 30)) {
    pad_columns_kernel<scalar_t, VEC, int32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, dst, static_cast<int32_t>(vectors), static_cast<int32_t>(in_cols), static_cast<int32_t>(width));
  } else {
    pad_columns_kernel<scalar_t, VEC, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, dst, vectors, in_cols, width);
  }
}

}  // namespace

cudaError_t launch_pad_columns(const at::Tensor& x, const at::Tensor& out) {
  if (out.numel() == 0) return cudaSuccess;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t width_bytes = out.size(1) * out.element_size();
  const bool vec = width_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fgplugin_pad_columns", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    if (vec) {
      launch<scalar_t, kVec>(x, out, stream);
    } else {
      launch<scalar_t, 1>(x, out, stream);
    }
  });
  return cudaGetLastError();
}

}  // namespace fgplugin

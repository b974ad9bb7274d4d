// The nonzero_rows op's kernel: which rows of a 2-D tensor hold any entry that is not zero (NaN
// counts), for the backward product that skips the zero rows of its output gradient
// (fgplugin/grad_rows.py). Host code here only launches: no exceptions (checks in
// nonzero_rows_cuda.cpp).
//
// Why a kernel: torch's `any(dim=1)` on a [2.45M, 48] fp32 gradient took about 0.7 ms on the H100
// (products-like, a 470 MB read: 0.7 TB/s), a third of the product it decides about. A value is
// +-0 iff its bits without the sign bit are all zero, so each thread ORs the masked 16-byte words
// of one row; consecutive threads read consecutive rows, and the row's remaining half-sectors come
// from L1.
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "launch.h"

namespace fgplugin {
namespace {

constexpr int kRowsPerBlock = 256;

// Bits of one 16-byte vector of elements of `bytes` bytes, sign bits cleared (little endian).
__host__ __device__ inline uint4 magnitude_mask(int bytes) {
  switch (bytes) {
    case 2: return {0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu};
    case 8: return {0xffffffffu, 0x7fffffffu, 0xffffffffu, 0x7fffffffu};
    default: return {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
  }
}

// Whole rows of 16-byte vectors, 16-byte aligned.
__global__ void nonzero_rows_vec_kernel(const uint4* __restrict__ x, bool* __restrict__ out, int64_t n_rows,
                                        int64_t vecs_per_row, uint4 mask) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  if (row >= n_rows) return;
  const uint4* p = x + row * vecs_per_row;
  unsigned bits = 0;
#pragma unroll 4
  for (int64_t i = 0; i < vecs_per_row; ++i) {
    const uint4 v = __ldg(p + i);
    bits |= (v.x & mask.x) | (v.y & mask.y) | (v.z & mask.z) | (v.w & mask.w);
  }
  out[row] = bits != 0;
}

// Any other shape: element by element, as unsigned words of the element's size.
template <typename word_t>
__global__ void nonzero_rows_kernel(const word_t* __restrict__ x, bool* __restrict__ out, int64_t n_rows,
                                    int64_t per_row) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  if (row >= n_rows) return;
  const word_t mask = static_cast<word_t>(~(word_t(1) << (8 * sizeof(word_t) - 1)));
  const word_t* p = x + row * per_row;
  word_t bits = 0;
  for (int64_t i = 0; i < per_row; ++i) bits |= p[i] & mask;
  out[row] = bits != 0;
}

}  // namespace

cudaError_t launch_nonzero_rows(const at::Tensor& x, const at::Tensor& out) {
  const int64_t n_rows = x.size(0), per_row = x.size(1);
  if (n_rows == 0) return cudaSuccess;
  const int bytes = static_cast<int>(x.element_size());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned blocks = static_cast<unsigned>((n_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool vec = (per_row * bytes) % 16 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  bool* o = out.data_ptr<bool>();
  if (vec) {
    nonzero_rows_vec_kernel<<<blocks, kRowsPerBlock, 0, stream>>>(static_cast<const uint4*>(x.data_ptr()), o, n_rows,
                                                                  per_row * bytes / 16, magnitude_mask(bytes));
  } else if (bytes == 2) {
    nonzero_rows_kernel<uint16_t><<<blocks, kRowsPerBlock, 0, stream>>>(
        static_cast<const uint16_t*>(x.data_ptr()), o, n_rows, per_row);
  } else if (bytes == 8) {
    nonzero_rows_kernel<uint64_t><<<blocks, kRowsPerBlock, 0, stream>>>(
        static_cast<const uint64_t*>(x.data_ptr()), o, n_rows, per_row);
  } else {
    nonzero_rows_kernel<uint32_t><<<blocks, kRowsPerBlock, 0, stream>>>(
        static_cast<const uint32_t*>(x.data_ptr()), o, n_rows, per_row);
  }
  return cudaGetLastError();
}

}  // namespace fgplugin

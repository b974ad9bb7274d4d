// What the two dense-tile kernels share: their parameters, the unit-weight tensor-core A operands
// built from a tile's fragment word (dtile_frag, block_adaptive_spmm.cuh), and the Hopper entry
// points.
//
// ba_dense_kernel (block_adaptive_spmm.cu) runs everywhere (sm_80+, mma.sync); ba_dense_sm90_kernel
// (dense_tiles_sm90.cu) runs unit-weight plans on sm_90a with warpgroup MMAs (wgmma), which reach
// the H100's tensor-core rate where mma.sync reaches about half of it.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>

namespace fgplugin {

template <typename scalar_t>
struct DenseParams {
  const int *dblock_ptr, *dwork;                  // blocks and their stages (plan)
  const int4* dstage;
  const uint32_t *dtile_bits, *dtile_frag;        // each tile's bitmap, by row and by A fragment
  const int64_t *dtile_roff, *dense_eid;          // weighted plans: where each entry's value is
  const float* values;                            // edge weights, or null
  const scalar_t* x;
  const float* cs;                                // column scales, or null
  scalar_t* out;                                  // [n_rows, out_cols]: x's first out_cols columns
  int64_t n_rows, n_cols, F, out_cols;
  bool vec;  // F is a whole number of 16-byte vectors and x, out are 16-byte aligned
};

#ifdef __CUDACC__  // device helpers: this header is also read by the host-only op glue (.cpp)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous 16- and 4-byte copies global -> shared; `valid` false fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// TF32 A operand of a unit-weight tile for m16n8k8 step ks (rows 16 mm .. 16 mm + 15 of the tile):
// value j of the lane is bit 16 mm + 4 ks + j of its fragment word, as 1.0f (0x3f800000) or 0. The
// product of the isolated bit (<= 2^15) and 0x3f800000 >> bit is exact.
__device__ __forceinline__ void unit_frag_tf32(uint32_t word, int mm, int ks, uint32_t (&a)[4]) {
  constexpr uint32_t kOne = 0x3f800000u;
  const uint32_t w = mm ? word >> 16 : word;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int b = ks * 4 + j;
    a[j] = (w & (1u << b)) * (kOne >> b);
  }
}

// 16-bit A operand of a unit-weight tile for m16n8k16 step ks, with B's rows in the k order of
// k_row<true> (block_adaptive_spmm.cu, dense_tiles_sm90.cu): bits 16 mm + 8 ks + (0..7) of the
// lane's word are entries (row g + 8 (j & 1), column t + 4 (j >> 1)) for j = 0..3 and then the same
// 8 columns further; in that k order they are the low/high halves of a[0..3]. A half is 1.0 or 0:
// (bit_lo | bit_hi << 16) * one16 sets both without a carry.
template <bool kBF16>
__device__ __forceinline__ uint4 unit_frag_16bit(uint32_t word, int mm, int ks) {
  constexpr uint32_t kOne16 = kBF16 ? 0x3f80u : 0x3c00u;
  const uint32_t w = word >> (16 * mm + 8 * ks);
  return make_uint4(((w & 1u) | ((w & 4u) << 14)) * kOne16, (((w >> 1) & 1u) | ((w & 8u) << 13)) * kOne16,
                    (((w >> 4) & 1u) | ((w & 64u) << 10)) * kOne16, (((w >> 5) & 1u) | ((w & 128u) << 9)) * kOne16);
}

__device__ __forceinline__ uint32_t to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// TF32 operand of an fp32 value for the split product: the hardware reads the top 19 bits, so the
// high part is the value truncated there and the low part (exact in fp32) is read truncated too;
// hi + lo keeps 22 of the 24 significand bits (relative error <= 2^-21 per element).
__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(v) & 0xffffe000u;
  lo = __float_as_uint(v - __uint_as_float(hi));
}

// Two floats -> packed 16-bit pair (first in the low half), round to nearest even.
template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Threads 0..31 start the copies of a stage's 32 column scales (1 without scales, 0 past n_cols)
// and store its panel mask; j0 = the stage's first column.
template <typename scalar_t>
__device__ __forceinline__ void load_stage_scales(const DenseParams<scalar_t>& p, float* cs, int* mask_slot, int64_t j0,
                                                  int mask, int tid) {
  if (tid < 32) {
    const int64_t j = j0 + tid;
    const bool ok = j < p.n_cols;
    if (p.cs != nullptr) {
      cp_async4(&cs[tid], p.cs + (ok ? j : 0), ok);
    } else {
      cs[tid] = ok ? 1.f : 0.f;
    }
    if (tid == 0) *mask_slot = mask;
  }
}
#endif  // __CUDACC__

// The Hopper dense-tile kernel for unit weights; MODE as ba_dense_kernel's (fp32: 1 = accurate
// split, 0 = TF32; 16-bit: 0). Launch only where dense_sm90_usable() says so.
template <typename scalar_t, int MODE>
cudaError_t launch_dense_sm90(const DenseParams<scalar_t>& p, int64_t n_work, cudaStream_t stream);

// Whether the current device runs ba_dense_sm90_kernel: a compute capability 9.0 GPU and an
// extension built for sm_90a (TORCH_CUDA_ARCH_LIST "9.0a"), unless FGPLUGIN_NO_WGMMA=1 (read on
// every call, so tests and A/B runs can switch). The first call per device runs a probe kernel and
// synchronizes once; under CUDA graph capture it answers false without probing.
bool dense_sm90_usable(cudaStream_t stream);

}  // namespace fgplugin

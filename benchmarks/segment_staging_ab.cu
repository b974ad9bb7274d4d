// A/B prototype for benchmarks/segment_staging_ab.py (not part of the extension): out = A x over
// unit weights, one CTA per segment of consecutive rows. Before its rows, the CTA copies the rows of
// x that the segment uses most (its "staged" columns, up to K) into shared memory; an entry's code
// is its column (>= 0: gathered from global memory as ba_sparse_kernel does) or -1 - slot (read
// from shared memory). Each row lists its staged entries first, so a batch of 4 loads is all
// shared-memory reads or all gathers except at one boundary per row (staging_ab.patch mixed them,
// and a batch waited on its slowest gather). Warp per row, whole F per warp (no re-walk per
// feature chunk). K = 0 gives the same kernel without staging, the structural baseline.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdint>

#include "../csrc/cuda/dense_tiles.cuh"  // the extension's cp.async and 16-bit packing helpers

namespace {

using fgplugin::cp_async16;
using fgplugin::cp_async_commit;
using fgplugin::cp_async_wait;
using fgplugin::pack2;

constexpr unsigned kFull = 0xffffffffu;

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int V = 4;
  static __device__ __forceinline__ void fma(float w, const uint4 q, float (&a)[4]) {
    a[0] = fmaf(w, __uint_as_float(q.x), a[0]);
    a[1] = fmaf(w, __uint_as_float(q.y), a[1]);
    a[2] = fmaf(w, __uint_as_float(q.z), a[2]);
    a[3] = fmaf(w, __uint_as_float(q.w), a[3]);
  }
  static __device__ __forceinline__ uint4 pack(const float (&a)[4]) {
    return make_uint4(__float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]), __float_as_uint(a[3]));
  }
};
template <>
struct Vec<at::BFloat16> {
  static constexpr int V = 8;
  static __device__ __forceinline__ void fma(float w, const uint4 q, float (&a)[8]) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = fmaf(w, __uint_as_float(u[i] << 16), a[2 * i]);
      a[2 * i + 1] = fmaf(w, __uint_as_float(u[i] & 0xffff0000u), a[2 * i + 1]);
    }
  }
  static __device__ __forceinline__ uint4 pack(const float (&a)[8]) {
    return make_uint4(pack2<true>(a[0], a[1]), pack2<true>(a[2], a[3]), pack2<true>(a[4], a[5]),
                      pack2<true>(a[6], a[7]));
  }
};

// F = 128; L = lanes per entry (16 bytes each), G = 32 / L entries per warp step.
template <typename T, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    segment_kernel(const int* __restrict__ seg_row_ptr, const int64_t* __restrict__ rowptr,
                   const int* __restrict__ code, const int* __restrict__ seg_stage_ptr,
                   const int* __restrict__ stage_col, const T* __restrict__ x, T* __restrict__ out, int K) {
  constexpr int F = 128;
  constexpr int V = Vec<T>::V;
  constexpr int L = F / V;
  constexpr int G = 32 / L;
  extern __shared__ uint4 staged[];  // [K][L]
  const int seg = blockIdx.x;
  const int s0 = seg_stage_ptr[seg];
  const int ns = min(seg_stage_ptr[seg + 1] - s0, K);
  for (int q = threadIdx.x; q < ns * L; q += W * 32) {
    const int64_t c = stage_col[s0 + q / L];
    cp_async16(&staged[q], x + c * F + (q % L) * V, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, grp = lane / L, sub = lane % L;
  const int r1 = seg_row_ptr[seg + 1];
  for (int row = seg_row_ptr[seg] + warp; row < r1; row += W) {
    const int64_t b = rowptr[row], e = rowptr[row + 1];
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.f;
    for (int64_t base = b; base < e; base += 32) {
      const int c = base + lane < e ? code[base + lane] : 0;
      const int n = static_cast<int>(e - base < 32 ? e - base : 32);
      const int iters = (n + G - 1) / G;
      for (int kk = 0; kk < iters; kk += 4) {
        uint4 raw[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int k = (kk + u) * G + grp;
          const int j = __shfl_sync(kFull, c, k & 31);
          ok[u] = k < n;
          raw[u] = make_uint4(0u, 0u, 0u, 0u);
          if (ok[u]) {
            raw[u] = j < 0 ? staged[(-1 - j) * L + sub]
                           : __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(j) * F) + sub);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) Vec<T>::fma(ok[u] ? 1.f : 0.f, raw[u], acc);
      }
    }
#pragma unroll
    for (int off = L; off < 32; off <<= 1) {
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += __shfl_xor_sync(kFull, acc[v], off);
    }
    if (grp == 0) reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * F)[sub] = Vec<T>::pack(acc);
  }
}

template <typename T, int W, int MINB>
void launch(const at::Tensor& seg_row_ptr, const at::Tensor& rowptr, const at::Tensor& code,
            const at::Tensor& seg_stage_ptr, const at::Tensor& stage_col, const at::Tensor& x, at::Tensor& out,
            int64_t K) {
  const int64_t smem = K * 128 * static_cast<int64_t>(sizeof(T));
  auto kernel = segment_kernel<T, W, MINB>;
  TORCH_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) ==
                  cudaSuccess,
              "smem attribute");
  const auto n_seg = static_cast<unsigned>(seg_row_ptr.numel() - 1);
  kernel<<<n_seg, W * 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      seg_row_ptr.data_ptr<int>(), rowptr.data_ptr<int64_t>(), code.data_ptr<int>(), seg_stage_ptr.data_ptr<int>(),
      stage_col.data_ptr<int>(), reinterpret_cast<const T*>(x.data_ptr()), reinterpret_cast<T*>(out.data_ptr()),
      static_cast<int>(K));
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "launch");
}

at::Tensor segment_spmm(const at::Tensor& seg_row_ptr, const at::Tensor& rowptr, const at::Tensor& code,
                        const at::Tensor& seg_stage_ptr, const at::Tensor& stage_col, const at::Tensor& x, int64_t K,
                        int64_t warps) {
  TORCH_CHECK(x.size(1) == 128 && x.is_contiguous(), "F = 128 only");
  auto out = at::empty({rowptr.numel() - 1, 128}, x.options());
  const bool bf = x.scalar_type() == at::kBFloat16;
  if (warps == 32) {
    bf ? launch<at::BFloat16, 32, 1>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K)
       : launch<float, 32, 1>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K);
  } else if (warps == 16) {
    bf ? launch<at::BFloat16, 16, 2>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K)
       : launch<float, 16, 2>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K);
  } else {
    TORCH_CHECK(warps == 8, "warps: 8, 16 or 32");
    bf ? launch<at::BFloat16, 8, 4>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K)
       : launch<float, 8, 4>(seg_row_ptr, rowptr, code, seg_stage_ptr, stage_col, x, out, K);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("segment_spmm", &segment_spmm); }

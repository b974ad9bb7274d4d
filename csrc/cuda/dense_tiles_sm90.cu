// Dense tiles of a unit-weight plan on Hopper's warpgroup MMA (wgmma, sm_90a). Same work split and
// output as ba_dense_kernel (block_adaptive_spmm.cu): one CTA per (row block of 4 row panels = 128
// rows, 64-column chunk of F); its stages (column panels of 32 with >= 1 dense tile in the block)
// serve every panel of the block; the raw dense partial (no scales) of the panels with tiles goes
// to `out`, which the remainder pass reads back.
//
// Why a second kernel: on the H100, ba_dense_kernel's mma.sync path kept the tensor pipe 45% busy
// (ncu, dense_profile.json) and mma.sync peaks at about half the rate wgmma reaches.
//
// Thread mapping. The CTA is one warpgroup (4 warps). An m64n64 wgmma covers two row panels
// (half h = panels 2h, 2h+1; warp w holds rows 16w..16w+15 of it, i.e. panel 2h + w/2, m16 half
// w % 2) and the 64 feature columns; its accumulators are 32 floats a thread, 64 for the block.
//   A (the tile, 0/1) comes from registers, built per warp from the tile's dtile_frag word: the
//     wgmma register layout of A is, warp by warp, that of mma.sync's m16n8k8 (TF32) and m16n8k16
//     (16-bit) A fragments, which is what dtile_frag holds.
//   B (X's 32 stage rows x 64 columns, times the column scales) goes to shared memory K-major
//     without swizzle: 8x16-byte core matrices, the 32 k of a column (4 or 8 per 16 bytes) in
//     consecutive core matrices (LBO 128 bytes), groups of 8 columns kSbo apart (padded by 16 bytes
//     so the threads' 16-byte stores hit distinct banks). The threads write it from registers:
//     fp32: thread = (4 columns, 4 k), X read as float4 rows and transposed in registers;
//     16-bit: thread = (2 columns, 8 k), X read as 2-element words. fp32-accurate mode stores
//     x = hi + lo (hi truncated to TF32, lo exact, read as TF32 by the tensor core: 22 of the 24
//     significand bits, as ba_dense_kernel), and runs lo then hi; TF32 mode rounds once. 16-bit
//     B rows are in k_row's k order (the order that makes the m16n8k8 bits the m16n8k16 values).
// Pipeline: X's stages (with column scales and fragment words) come through a 4-deep cp.async
// ring; B is double-buffered, and stage i + 1's B is written while stage i's wgmmas run; each stage
// ends with wgmma.wait_group 0 (the A registers are rebuilt for the next one).
//
// Limits: unit weights only (weighted plans stay on ba_dense_kernel); F < 65536 * 64.
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <atomic>
#include <mutex>
#include <type_traits>

#include "../dense_kernel.h"
#include "dense_tiles.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FGPLUGIN_WGMMA 1
#endif

namespace fgplugin {
namespace {

template <typename scalar_t, int MODE>
struct Sm90Cfg {
  static constexpr bool kFp32 = std::is_same_v<scalar_t, float>;
  static constexpr int kKPerChunk = kFp32 ? 4 : 8;           // k in one 16-byte core-matrix row
  static constexpr int kChunks = 32 / kKPerChunk;            // core matrices along the stage's 32 k
  static constexpr int kSbo = kChunks * 128 + 16;            // bytes between groups of 8 columns
  static constexpr int kTermBytes = 8 * kSbo;                // one copy of B: 64 columns x 32 k
  static constexpr int kTerms = (kFp32 && MODE == 1) ? 2 : 1;  // hi + lo, or one
  static constexpr int kKSteps = kFp32 ? 4 : 2;              // wgmma k8 (TF32) or k16 steps per stage
};

constexpr int kRing = 4;  // cp.async ring of raw stages: 3 in flight while one is converted

// Row of X that k slot s (0..7) of a 16-bit core-matrix row holds: the inverse of k_row<true>
// (block_adaptive_spmm.cu) inside each group of 8.
__device__ __forceinline__ constexpr int slot_row8(int s) { return (s >> 1) + 4 * (s & 1); }

#ifdef FGPLUGIN_WGMMA
// Shared-memory matrix descriptor: no swizzle, LBO = 128 bytes (next core matrix along k),
// SBO = sbo (next 8 columns); address and offsets in 16-byte units.
__device__ __forceinline__ uint64_t smem_desc(const void* p, int sbo) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_smem_for_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
__device__ __forceinline__ void fence_accumulators(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define FG_D32                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define FG_D32_OPS(d)                                                                                             \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),     \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),      \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),     \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d += A (64 x 8, registers) . B (8 x 64, shared memory), TF32 in, fp32 accumulate.
__device__ __forceinline__ void wgmma_tf32(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " FG_D32
               ", {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
               : FG_D32_OPS(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// d += A (64 x 16) . B (16 x 64), bf16 or fp16 in, fp32 accumulate; B K-major (not transposed).
template <bool kBF16>
__device__ __forceinline__ void wgmma_16bit(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBF16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FG_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : FG_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FG_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : FG_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  }
}
#undef FG_D32
#undef FG_D32_OPS
#endif  // FGPLUGIN_WGMMA

// A stage as copied from global memory (cp.async ring slot): X's 32 stage rows x 64 columns as
// they are stored, the 32 column scales, the fragment words of the block's 4 panels (word l of
// panel q at 32 q + l; only panels with a tile here are written) and the panel mask.
template <typename scalar_t>
struct RawStage {
  static constexpr int kXBytes = 32 * 64 * static_cast<int>(sizeof(scalar_t));
  static constexpr int kBytes = (kXBytes + 4 * (32 + 128 + 4) + 127) / 128 * 128;
  scalar_t* x;
  float* cs;
  uint32_t* words;
  int* mask;
  __device__ RawStage(unsigned char* slot)
      : x(reinterpret_cast<scalar_t*>(slot)),
        cs(reinterpret_cast<float*>(slot + kXBytes)),
        words(reinterpret_cast<uint32_t*>(slot + kXBytes + 4 * 32)),
        mask(reinterpret_cast<int*>(slot + kXBytes + 4 * (32 + 128))) {}
};

// Starts the copies of stage `meta` into a ring slot (X rows past n_cols and columns past F read
// as 0). Without 16-byte vectors the X part is copied synchronously.
template <typename scalar_t>
__device__ __forceinline__ void load_raw_stage(const DenseParams<scalar_t>& p, const RawStage<scalar_t>& S,
                                               int4 meta, int64_t f0, int tid) {
  constexpr int kEpc = 16 / sizeof(scalar_t);  // elements per 16-byte chunk
  const int64_t j0 = static_cast<int64_t>(meta.x) * 32;
  load_stage_scales(p, S.cs, S.mask, j0, meta.y, tid);
  const int q = tid >> 5, lane = tid & 31;
  if ((meta.y >> q) & 1) {
    const int64_t t = meta.z + __popc(meta.y & ((1 << q) - 1));
    cp_async4(&S.words[tid], p.dtile_frag + t * 32 + lane, true);
  }
  if (p.vec) {
    constexpr int kCpr = 64 / kEpc;  // chunks per row
#pragma unroll
    for (int c = tid; c < 32 * kCpr; c += 128) {
      const int r = c / kCpr, k = c % kCpr;
      const int64_t j = j0 + r, f = f0 + k * kEpc;
      const bool ok = j < p.n_cols && f < p.F;
      cp_async16(S.x + r * 64 + k * kEpc, ok ? p.x + j * p.F + f : p.x, ok);
    }
  } else {
    for (int c = tid; c < 32 * 64; c += 128) {
      const int r = c / 64, k = c % 64;
      const int64_t j = j0 + r, f = f0 + k;
      S.x[r * 64 + k] = (j < p.n_cols && f < p.F) ? p.x[j * p.F + f] : scalar_t(0);
    }
  }
}

// Writes this thread's share of B (x times its column scale) from a ring slot into B's buffers.
// fp32: thread = 16 kb + c4 takes k rows 4 kb.. and columns 4 c4..; 16-bit: thread = 32 kb + c2
// takes rows 8 kb.. and columns 2 c2.. (conflict-free shared loads and 16-byte stores).
template <typename scalar_t, int MODE>
__device__ __forceinline__ void store_stage_b(unsigned char* buf, const RawStage<scalar_t>& S, int tid) {
  using Cfg = Sm90Cfg<scalar_t, MODE>;
  if constexpr (Cfg::kFp32) {
    const int kb = tid >> 4, c0 = 4 * (tid & 15);
    float4 xr[4];
    float cs[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      xr[q] = *reinterpret_cast<const float4*>(S.x + (4 * kb + q) * 64 + c0);
      cs[q] = S.cs[4 * kb + q];
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = c0 + c;
      const int off = (col >> 3) * Cfg::kSbo + kb * 128 + (col & 7) * 16;
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float xv = c == 0 ? xr[q].x : c == 1 ? xr[q].y : c == 2 ? xr[q].z : xr[q].w;
        const float v = xv * cs[q];
        if constexpr (MODE == 1) {
          split_tf32(v, hi[q], lo[q]);
        } else {
          hi[q] = to_tf32(v);
        }
      }
      *reinterpret_cast<uint4*>(buf + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      if constexpr (MODE == 1)
        *reinterpret_cast<uint4*>(buf + Cfg::kTermBytes + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  } else {
    constexpr bool kBF = std::is_same_v<scalar_t, at::BFloat16>;
    const int kb = tid >> 5, c0 = 2 * (tid & 31);
    float x2[8][2], cs[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const scalar_t* src = S.x + (8 * kb + q) * 64 + c0;
      x2[q][0] = static_cast<float>(src[0]);
      x2[q][1] = static_cast<float>(src[1]);
      cs[q] = S.cs[8 * kb + q];
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = c0 + c;
      const int off = (col >> 3) * Cfg::kSbo + kb * 128 + (col & 7) * 16;
      uint32_t w[4];
#pragma unroll
      for (int s = 0; s < 8; s += 2) {
        const int q0 = slot_row8(s), q1 = slot_row8(s + 1);
        w[s / 2] = pack2<kBF>(x2[q0][c] * cs[q0], x2[q1][c] * cs[q1]);
      }
      *reinterpret_cast<uint4*>(buf + off) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

template <typename scalar_t, int MODE>
__global__ void __launch_bounds__(128) ba_dense_sm90_kernel(const DenseParams<scalar_t> p) {
#ifdef FGPLUGIN_WGMMA
  using Cfg = Sm90Cfg<scalar_t, MODE>;
  using Raw = RawStage<scalar_t>;
  constexpr bool kFp32 = Cfg::kFp32;
  constexpr bool kBF = std::is_same_v<scalar_t, at::BFloat16>;
  constexpr int kKSteps = Cfg::kKSteps;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* bbuf = smem + kRing * Raw::kBytes;  // B, double-buffered

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t block = p.dwork[blockIdx.x];
  const int64_t f0 = static_cast<int64_t>(blockIdx.y) * 64;
  const int st_begin = p.dblock_ptr[block];
  const int ns = p.dblock_ptr[block + 1] - st_begin;
  const int4* stages = p.dstage + st_begin;
  const int mm = warp & 1;  // this warp's m16 half of its panel in each m64 half of the block

  float acc[2][32];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[h][i] = 0.f;

  // Stage metadata is read one iteration ahead, so its latency hides behind a stage's work.
#pragma unroll
  for (int s = 0; s < kRing - 1; ++s) {
    if (s < ns) load_raw_stage(p, Raw(smem + s * Raw::kBytes), __ldg(stages + s), f0, tid);
    cp_async_commit();
  }
  int4 next_meta = kRing - 1 < ns ? __ldg(stages + kRing - 1) : make_int4(0, 0, 0, 0);
  // Ring slot of stage s -> B[s & 1] (x times column scale); the stage's panel mask, and in
  // `words` the fragment word of this warp's panel in each half (2h + warp / 2), 0 without a tile.
  auto convert = [&](int s, uint32_t (&words)[2]) {
    const Raw S(smem + (s % kRing) * Raw::kBytes);
    const int mask = *S.mask;
    store_stage_b<scalar_t, MODE>(bbuf + (s & 1) * Cfg::kTerms * Cfg::kTermBytes, S, tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = 2 * h + (warp >> 1);
      words[h] = ((mask >> q) & 1) ? S.words[q * 32 + lane] : 0u;
    }
    return mask;
  };
  // Stage s has landed: wait for it, then start the copies of stage s + kRing - 1 into the slot
  // that stage s - 1 used (converted one iteration before, behind a barrier since).
  auto land_and_refill = [&](int s) {
    cp_async_wait<kRing - 2>();
    __syncthreads();  // stage s visible to every thread
    if (s + kRing - 1 < ns) load_raw_stage(p, Raw(smem + ((s + kRing - 1) % kRing) * Raw::kBytes), next_meta, f0, tid);
    cp_async_commit();
    if (s + kRing < ns) next_meta = __ldg(stages + s + kRing);
  };

  uint32_t words[2] = {0u, 0u};
  int mask = 0, used_panels = 0;
  if (ns > 0) {
    land_and_refill(0);
    mask = convert(0, words);
    fence_smem_for_async();
    __syncthreads();  // B[0] complete
  }
  for (int i = 0; i < ns; ++i) {
    used_panels |= mask;
    // All A operands of the stage before the first MMA: registers written between wgmmas make the
    // compiler insert a warpgroup.arrive before each one.
    uint32_t a[2][kKSteps][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        if constexpr (kFp32) {
          unit_frag_tf32(words[h], mm, ks, a[h][ks]);
        } else {
          const uint4 v = unit_frag_16bit<kBF>(words[h], mm, ks);
          a[h][ks][0] = v.x, a[h][ks][1] = v.y, a[h][ks][2] = v.z, a[h][ks][3] = v.w;
        }
      }
    const uint64_t desc = smem_desc(bbuf + (i & 1) * Cfg::kTerms * Cfg::kTermBytes, Cfg::kSbo);
    // The MMAs of one half of the block. Both halves always run (a half without tiles here adds
    // zeros): a branch between the halves' MMAs made the compiler insert a warpgroup.arrive before
    // each MMA after it.
    auto issue = [&](float (&d)[32], const uint32_t (&ah)[kKSteps][4]) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const uint64_t dk = desc + static_cast<uint64_t>(ks * (256 >> 4));  // 2 core matrices along k
        if constexpr (kFp32) {
          if constexpr (MODE == 1) wgmma_tf32(d, ah[ks], dk + static_cast<uint64_t>(Cfg::kTermBytes >> 4));
          wgmma_tf32(d, ah[ks], dk);
        } else {
          wgmma_16bit<kBF>(d, ah[ks], dk);
        }
      }
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) fence_accumulators(acc[h]);
    wgmma_fence();
    issue(acc[0], a[0]);
    issue(acc[1], a[1]);
    wgmma_commit();
    // While stage i's MMAs run: land stage i + 1 and write its B into the other buffer (last read
    // by stage i - 1's MMAs, which every warp waited for before the previous barrier).
    if (i + 1 < ns) {
      land_and_refill(i + 1);
      mask = convert(i + 1, words);
      fence_smem_for_async();
    }
    wgmma_wait_all();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      fence_accumulators(acc[h]);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)  // the MMAs read the A registers until here
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[h][ks][j])::"memory");
    }
    __syncthreads();  // B[(i + 1) & 1] complete; every warp's MMAs of stage i done
  }

  // Raw dense partial of the panels that hold tiles -> out. Accumulator 4 n + e of warp w in half h
  // is row 64 h + 16 w + g + 8 (e >> 1), column 8 n + 2 t + (e & 1).
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!((used_panels >> (2 * h + (warp >> 1))) & 1)) continue;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int64_t row = block * 128 + 64 * h + 16 * warp + g + 8 * ((e & 3) >> 1);
      const int64_t f = f0 + 8 * (e >> 2) + 2 * t4 + (e & 1);
      if (row < p.n_rows && f < p.out_cols) p.out[row * p.out_cols + f] = static_cast<scalar_t>(acc[h][e]);
    }
  }
#endif  // FGPLUGIN_WGMMA
}

// 1 when this binary holds the wgmma kernel for the running device (its sm_90a code was chosen).
__device__ int wgmma_probe_result;
__global__ void wgmma_probe_kernel() {
#ifdef FGPLUGIN_WGMMA
  wgmma_probe_result = 1;
#else
  wgmma_probe_result = 0;
#endif
}

constexpr int kMaxDevices = 64;

}  // namespace

bool dense_sm90_usable(cudaStream_t stream) {
  if (!wgmma_enabled()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  // Per device: 0 not probed yet, 1 no, 2 yes. Read without the lock on every launch once known;
  // the lock only keeps two threads from probing the same device at once.
  static std::atomic<int> state[kMaxDevices] = {};
  if (const int known = state[device].load(std::memory_order_acquire); known != 0) return known == 2;
  static std::mutex lock;
  const std::lock_guard<std::mutex> guard(lock);
  if (const int known = state[device].load(std::memory_order_acquire); known != 0) return known == 2;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return false;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  int yes = 0;
  if (major == 9 && minor == 0) {
    wgmma_probe_kernel<<<1, 1, 0, stream>>>();
    if (cudaGetLastError() != cudaSuccess ||
        cudaMemcpyFromSymbolAsync(&yes, wgmma_probe_result, sizeof(int), 0, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      yes = 0;
    }
    cudaGetLastError();  // a failed probe leaves no sticky error for the caller's launch check
  }
  state[device].store(yes == 1 ? 2 : 1, std::memory_order_release);
  return yes == 1;
}

template <typename scalar_t, int MODE>
cudaError_t launch_dense_sm90(const DenseParams<scalar_t>& p, int64_t n_work, cudaStream_t stream) {
  using Cfg = Sm90Cfg<scalar_t, MODE>;
  constexpr int kSmemBytes = kRing * RawStage<scalar_t>::kBytes + 2 * Cfg::kTerms * Cfg::kTermBytes;
  auto kernel = ba_dense_sm90_kernel<scalar_t, MODE>;
  if constexpr (kSmemBytes > 48 * 1024) {  // above the default dynamic limit: opt in (per device)
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
  }
  const int64_t chunks = (p.F + 63) / 64;  // <= 65535: checked by block_adaptive_max_features
  const dim3 grid(static_cast<unsigned>(n_work), static_cast<unsigned>(chunks));
  kernel<<<grid, 128, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_dense_sm90<float, 0>(const DenseParams<float>&, int64_t, cudaStream_t);
template cudaError_t launch_dense_sm90<float, 1>(const DenseParams<float>&, int64_t, cudaStream_t);
template cudaError_t launch_dense_sm90<at::Half, 0>(const DenseParams<at::Half>&, int64_t, cudaStream_t);
template cudaError_t launch_dense_sm90<at::BFloat16, 0>(const DenseParams<at::BFloat16>&, int64_t, cudaStream_t);

}  // namespace fgplugin

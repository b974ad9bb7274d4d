// Block-adaptive SpMM: out = diag(r) (A + diag(d)) diag(c) x over a plan built by
// fgplugin/kernel_plan.py (format in block_adaptive_spmm.cuh). Three launches on the current stream,
// no atomics, so results are bitwise deterministic:
//
// 1. ba_dense_kernel: one CTA of 4 warps per (row block of 4 row panels = 128 rows with dense
//    tiles, 64-column chunk of F). Blocks come in LPT order (most tiles first). A stage is one
//    column panel where >= 1 panel of the block has a dense tile: the CTA stages X[cp*32 : cp*32+32,
//    f0 : f0+64] in shared memory once with cp.async (3 stages, zero filled past n_cols / F) and
//    multiplies it into every panel of the block that has a tile there (2.8-3.0 tiles per stage
//    on the community-ordered suite), with the 32 column scales and the tiles' words or (weighted)
//    32x32 edge values. Warp w owns columns [16w, 16w+16) of the chunk for all 128 rows (8 m16
//    tiles), so each X element is turned into a B fragment once per stage. Col scales are applied
//    to X (fp32, and bf16/fp16 with unit weights) or to A (weighted bf16/fp16).
//      fp32 accurate: m16n8k8 TF32 with X split x = hi + lo by truncation (2 MMAs per product on
//        unit weights, whose A = 0/1 is exact; 3 with weights). The unit A fragments come from
//        dtile_frag, one word per lane, at 2 integer ops per value: the kernel was issue-bound on
//        building them from row bitmaps (ncu: ALU pipe 62%, L2 30% on reddit-like).
//      fp32 with TF32 allowed by PyTorch: 1 MMA (X rounded to TF32).
//      bf16 / fp16: m16n8k16 with B fragments by ldmatrix.trans, fp32 accumulation. With unit
//        weights the A fragments come from dtile_frag too: X's 32 rows are staged in a k order
//        (k_row) under which the m16n8k8 bits of a lane are its m16n8k16 A values, and the column
//        scales go on B, which beat building each A value from the row bitmaps and its column
//        scale (H100, bf16 dense kernel: proteins-like 0.601 against 0.669 ms, reddit-like 0.723
//        against 0.772; benchmarks/results/h100/dense16_frag.json). Warp w builds panel w's A
//        fragments once per stage into shared memory for all four warps (0.555 and 0.69 ms).
//    It writes the raw dense partial (no scales) of the block's panels with tiles into out (in x's
//    dtype). On sm_90a, unit-weight plans run ba_dense_sm90_kernel (dense_tiles_sm90.cu) instead:
//    the same work split and output on warpgroup MMAs (wgmma); this kernel serves sm_80 and
//    weighted plans (and FGPLUGIN_NO_WGMMA=1).
// 2. ba_sparse_kernel: one warp per work item (a chunk of <= `chunk` remainder entries of one row;
//    hub rows are split into several items). The warp is cut into 32/L groups of L lanes; lane
//    sub-index s covers features [s*V, s*V+V) with 16-byte vector loads (V = 4 fp32, 8 bf16/fp16;
//    V = 1 when F % V != 0 or x is misaligned), group g takes entries g, g+G, ... of the item. The
//    32 column ids and weights of a batch are loaded coalesced by the lanes and broadcast with
//    shuffles; 4 rows are gathered before their FMAs. Groups are summed by xor-shuffles in a fixed
//    order. A single-item row is finished in place: + diag term + dense partial (read back from
//    out), times the row scale. Items of split rows write fp32 partials instead. The pass is bound
//    by L2 throughput (ncu, reddit-like at 0.05: 93%, L1 hit rate 6%) and, where gathers miss the
//    L2, by DRAM (products-like with ungrouped communities: 78%, 25 GB read for a 1.25 GB x);
//    feature chunks that keep x's slice in the L2 raised its hit rate from 54% to 84% but made it
//    slower (sparse_variants.json), and staging a segment's reused rows in shared memory made it
//    1.3-1.8x slower (half the resident warps; staging_ab.json). When one group covers F (L < 32) and the items are short
//    (kGroupedMaxMeanItem), each group takes an item of its own instead (sparse_items_grouped).
// 3. ba_combine_kernel: one warp per split row sums its partials in slot order and finishes it.
//
// Host code here only launches and reports errors as cudaError_t; the plan and arguments are
// checked before, in C++ (block_adaptive_plan.cpp; see common.h for why).
//
// Limits: tile size 32 only (kernel_plan.py maps other tile sizes onto 32x32 bitmaps); x float,
// half or bfloat16 (float64 stays on the plain CSR kernel); F < 65536 * 64; non-finite values in x
// spread to every row of a dense tile whose column panel holds them (0 * inf in the MMA).
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "block_adaptive_spmm.cuh"
#include "dense_tiles.cuh"

namespace fgplugin {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kStages = 3;
// Warps per CTA of the remainder and combine passes. Rows differ in length, and a CTA keeps its
// registers until its slowest warp is done; 4-warp CTAs refill the SMs at a finer grain than 8
// (H100, community order: F=44 passes 2-7% faster, F=128 0-2%; 16 and 32 warps, meant to share
// gathered rows in L1 between more neighbouring rows, were 5-20% slower:
// benchmarks/results/h100/sparse_variants.json).
constexpr int kSparseWarps = 4;

// ------------------------------------------------------------------ small device helpers
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool kBF16>
__device__ __forceinline__ void mma_16bit(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Element conversions between x's storage and float.
template <typename scalar_t>
__device__ __forceinline__ float to_float(scalar_t v) {
  return static_cast<float>(v);
}
template <typename scalar_t>
__device__ __forceinline__ scalar_t from_float(float v) {
  return static_cast<scalar_t>(v);
}

__device__ __forceinline__ float lo16_to_float(uint32_t w, bool bf16) {
  return bf16 ? __uint_as_float(w << 16) : __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float hi16_to_float(uint32_t w, bool bf16) {
  return bf16 ? __uint_as_float(w & 0xffff0000u) : __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// V consecutive elements of x's dtype <-> V floats. V is 16 bytes' worth, or 1.
template <typename scalar_t, int V>
struct VecIO {
  static __device__ __forceinline__ void load(const scalar_t* p, float (&v)[V]) {
    if constexpr (V == 1) {
      v[0] = to_float(p[0]);
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      static_assert(V == 4, "fp32 vectors are float4");
      const float4 q = __ldg(reinterpret_cast<const float4*>(p));
      v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    } else {
      static_assert(V == 8, "16-bit vectors hold 8 elements");
      constexpr bool bf = std::is_same_v<scalar_t, at::BFloat16>;
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = lo16_to_float(w[i], bf);
        v[2 * i + 1] = hi16_to_float(w[i], bf);
      }
    }
  }
  // Plain (non-__ldg) load: for `out`, which an earlier launch wrote.
  static __device__ __forceinline__ void load_rw(const scalar_t* p, float (&v)[V]) {
    if constexpr (V == 1) {
      v[0] = to_float(p[0]);
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    } else {
      constexpr bool bf = std::is_same_v<scalar_t, at::BFloat16>;
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = lo16_to_float(w[i], bf);
        v[2 * i + 1] = hi16_to_float(w[i], bf);
      }
    }
  }
  static __device__ __forceinline__ void store(scalar_t* p, const float (&v)[V]) {
    if constexpr (V == 1) {
      p[0] = from_float<scalar_t>(v[0]);
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      constexpr bool bf = std::is_same_v<scalar_t, at::BFloat16>;
      uint4 q;
      q.x = pack2<bf>(v[0], v[1]);
      q.y = pack2<bf>(v[2], v[3]);
      q.z = pack2<bf>(v[4], v[5]);
      q.w = pack2<bf>(v[6], v[7]);
      *reinterpret_cast<uint4*>(p) = q;
    }
  }
};

template <typename scalar_t>
constexpr int kVec = 16 / sizeof(scalar_t);

// ------------------------------------------------------------------ 1. dense tiles
// One CTA = one row block (kBlockPanels x 32 = 128 rows) x one FC-column chunk of F. Its stages
// (column panels with >= 1 dense tile in the block) are staged once in shared memory and serve
// every row panel of the block that has a tile there, so X is read once per stage, not per tile.
template <typename scalar_t, bool WEIGHTED>
struct DenseCfg {
  static constexpr bool kFp32 = std::is_same_v<scalar_t, float>;
  static constexpr int FC = 64;                   // feature columns per CTA
  static constexpr int WN = FC / 4;               // columns per warp (all 128 rows)
  static constexpr int NT = WN / 8;               // n8 tiles per warp
  static constexpr int XSTRIDE = FC + 8;          // smem row stride in elements (bank-conflict pad)
  static constexpr int EPC = 16 / sizeof(scalar_t);  // elements per 16-byte chunk
  static constexpr int ASTRIDE = 36;              // weighted A values: 32 + 4 pad (floats)
  using smem_t = std::conditional_t<kFp32, float, uint16_t>;
  // Per stage: X (32 x FC), column scales, the tiles' words (unit weights: fp32 fragment words or
  // 16-bit bitmaps; unused when weighted), the panel mask, and when weighted the A values per panel.
  static constexpr int kXBytes = 32 * XSTRIDE * static_cast<int>(sizeof(smem_t));
  static constexpr int kAVFloats = WEIGHTED ? kBlockPanels * 32 * ASTRIDE : 0;
  static constexpr int kStageBytes = kXBytes + 4 * (32 + kBlockPanels * 32 + 4 + kAVFloats);
  // 16-bit unit weights: the current stage's A fragments, [panel][m16 half][k16 step][lane] x 4
  // words, built once for the CTA's 4 warps (each warp multiplies every panel).
  static constexpr bool kSharedA = !kFp32 && !WEIGHTED;
  static constexpr int kSharedABytes = kSharedA ? kBlockPanels * 2 * 2 * 32 * 16 : 0;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSharedABytes;
};

// A stage's view of the dynamic shared memory.
template <typename scalar_t, bool WEIGHTED>
struct DenseStage {
  using Cfg = DenseCfg<scalar_t, WEIGHTED>;
  typename Cfg::smem_t* x;
  float* cs;
  uint32_t* words;  // [kBlockPanels][32]
  int* mask;
  float* av;        // [kBlockPanels][32 * ASTRIDE]
  __device__ DenseStage(unsigned char* base, int s) {
    unsigned char* p = base + s * Cfg::kStageBytes;
    x = reinterpret_cast<typename Cfg::smem_t*>(p);
    cs = reinterpret_cast<float*>(p + Cfg::kXBytes);
    words = reinterpret_cast<uint32_t*>(cs + 32);
    mask = reinterpret_cast<int*>(words + kBlockPanels * 32);
    av = reinterpret_cast<float*>(mask + 4);
  }
};

// Shared-memory row of the stage's column r (0..31). With PERMUTE, column 16 s + 4 h + t goes to
// k slot 2 t + (h & 1) + 8 (h >> 1) of MMA step s: the m16n8k16 A fragment of lane (g, t) covers
// k slots 2t, 2t+1, 2t+8, 2t+9, which then hold columns t, t+4, t+8, t+12, the columns of that
// lane's bits in dtile_frag (the m16n8k8 layout). A k permutation applied to both A's columns and
// B's rows leaves the product unchanged.
template <bool PERMUTE>
__device__ __forceinline__ int k_row(int r) {
  if constexpr (!PERMUTE) {
    return r;
  } else {
    const int h = (r >> 2) & 3, t = r & 3;
    return (r & 16) + 2 * t + (h & 1) + 8 * (h >> 1);
  }
}

// MODE 0: one TF32 MMA (TF32 allowed) / native 16-bit MMA; MODE 1: fp32-accurate TF32 split.
template <typename scalar_t, bool WEIGHTED, int MODE>
__global__ void __launch_bounds__(128, 4) ba_dense_kernel(const DenseParams<scalar_t> p) {
  using Cfg = DenseCfg<scalar_t, WEIGHTED>;
  using smem_t = typename Cfg::smem_t;
  constexpr int FC = Cfg::FC, WN = Cfg::WN, NT = Cfg::NT, XS = Cfg::XSTRIDE, EPC = Cfg::EPC;
  constexpr int AS = Cfg::ASTRIDE;
  constexpr bool kFrag = !WEIGHTED;                 // A fragments straight from dtile_frag
  // 16-bit unit weights: X's rows are staged in the k order of the 16-bit MMA that makes the
  // lane's A values those of its dtile_frag word (k_row below; the shared A fragments rely on
  // it), and the column scales go on B.
  constexpr bool kPermuteK = Cfg::kSharedA;
  constexpr int MT = 2 * kBlockPanels;             // m16 tiles per block
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t block = p.dwork[blockIdx.x];
  const int64_t f0 = static_cast<int64_t>(blockIdx.y) * FC;
  const int64_t st_begin = p.dblock_ptr[block];
  const int ns = p.dblock_ptr[block + 1] - static_cast<int>(st_begin);
  const smem_t* xraw = reinterpret_cast<const smem_t*>(p.x);
  int used_panels = 0;  // union of the stage masks (the same in every thread)

  auto load_stage = [&](int s, const int4 meta) {
    const DenseStage<scalar_t, WEIGHTED> S(smem_raw, s);
    const int64_t j0 = static_cast<int64_t>(meta.x) * 32;
    const int mask = meta.y;
    used_panels |= mask;
    load_stage_scales(p, S.cs, S.mask, j0, mask, tid);
    if constexpr (!WEIGHTED) {
      const int q = tid >> 5;  // 128 threads = one word of each of the 4 panels' tiles
      if ((mask >> q) & 1) {
        const int64_t t = meta.z + __popc(mask & ((1 << q) - 1));
        cp_async4(&S.words[tid], (kFrag ? p.dtile_frag : p.dtile_bits) + t * 32 + lane, true);
      }
    }
    if (p.vec) {
      constexpr int CPR = FC / EPC;  // 16-byte chunks per row
#pragma unroll
      for (int c = tid; c < 32 * CPR; c += 128) {
        const int r = c / CPR, q = c % CPR;
        const int64_t j = j0 + r, f = f0 + q * EPC;
        const bool ok = j < p.n_cols && f < p.F;
        cp_async16(&S.x[k_row<kPermuteK>(r) * XS + q * EPC], ok ? xraw + j * p.F + f : xraw, ok);
      }
    } else {
      for (int c = tid; c < 32 * FC; c += 128) {
        const int r = c / FC, q = c % FC;
        const int64_t j = j0 + r, f = f0 + q;
        S.x[k_row<kPermuteK>(r) * XS + q] = (j < p.n_cols && f < p.F) ? xraw[j * p.F + f] : smem_t(0);
      }
    }
    if constexpr (WEIGHTED) {
      const int r = tid >> 2, c0 = (tid & 3) * 8;
      for (int q = 0; q < kBlockPanels; ++q) {
        if (!((mask >> q) & 1)) continue;
        const int64_t t = meta.z + __popc(mask & ((1 << q) - 1));
        const uint32_t word = p.dtile_bits[t * 32 + r];
        const int64_t base = p.dtile_roff[t * 32 + r];
#pragma unroll
        for (int c = c0; c < c0 + 8; ++c) {
          float v = 0.f;
          if ((word >> c) & 1u) v = p.values[p.dense_eid[base + __popc(word & ((1u << c) - 1u))]];
          S.av[q * 32 * AS + r * AS + c] = v;
        }
      }
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[m][n][q] = 0.f;

  // Stage metadata is read one iteration ahead, so its latency hides behind a stage's MMAs.
  const int4* stages = p.dstage + st_begin;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ns) load_stage(s, __ldg(stages + s));
    cp_async_commit();
  }
  int4 next_meta = kStages - 1 < ns ? __ldg(stages + kStages - 1) : make_int4(0, 0, 0, 0);

  for (int i = 0; i < ns; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage i landed for everyone; stage (i-1) % kStages is free again
    if (i + kStages - 1 < ns) load_stage((i + kStages - 1) % kStages, next_meta);
    cp_async_commit();
    if (i + kStages < ns) next_meta = __ldg(stages + i + kStages);

    const DenseStage<scalar_t, WEIGHTED> S(smem_raw, i % kStages);
    const smem_t* X = S.x;
    const int mask = *S.mask;

    if constexpr (Cfg::kFp32) {
      uint32_t fw[kBlockPanels];
      if constexpr (kFrag) {
#pragma unroll
        for (int q = 0; q < kBlockPanels; ++q) fw[q] = S.words[q * 32 + lane];
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int k0 = ks * 8 + t4, k1 = k0 + 4;
        const float c0 = S.cs[k0], c1 = S.cs[k1];
        uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int col = warp * WN + n * 8 + g;
          const float b0 = X[k0 * XS + col] * c0, b1 = X[k1 * XS + col] * c1;
          if constexpr (MODE == 1) {
            split_tf32(b0, bh[n][0], bl[n][0]);
            split_tf32(b1, bh[n][1], bl[n][1]);
          } else {
            bh[n][0] = to_tf32(b0);
            bh[n][1] = to_tf32(b1);
          }
        }
#pragma unroll
        for (int q = 0; q < kBlockPanels; ++q) {
          if (!((mask >> q) & 1)) continue;  // the same in the whole CTA
          uint32_t ahi[2][4], alo[2][4];
#pragma unroll
          for (int mm = 0; mm < 2; ++mm) {
            if constexpr (kFrag) {
              unit_frag_tf32(fw[q], mm, ks, ahi[mm]);
            } else {
              const float* AV = S.av + q * 32 * AS;
              const int ra = mm * 16 + g, rb = ra + 8;
              const float av[4] = {AV[ra * AS + k0], AV[rb * AS + k0], AV[ra * AS + k1], AV[rb * AS + k1]};
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                if constexpr (MODE == 1) {
                  split_tf32(av[j], ahi[mm][j], alo[mm][j]);
                } else {
                  ahi[mm][j] = to_tf32(av[j]);
                }
              }
            }
          }
          // Small parts first, then the high parts: 4 independent accumulators between two MMAs
          // into the same one (the kernel stalled on MMA latency with them back to back).
          if constexpr (MODE == 1) {
#pragma unroll
            for (int mm = 0; mm < 2; ++mm)
#pragma unroll
              for (int n = 0; n < NT; ++n) mma_tf32(acc[2 * q + mm][n], ahi[mm], bl[n][0], bl[n][1]);
            if constexpr (WEIGHTED) {
#pragma unroll
              for (int mm = 0; mm < 2; ++mm)
#pragma unroll
                for (int n = 0; n < NT; ++n) mma_tf32(acc[2 * q + mm][n], alo[mm], bh[n][0], bh[n][1]);
            }
          }
#pragma unroll
          for (int mm = 0; mm < 2; ++mm)
#pragma unroll
            for (int n = 0; n < NT; ++n) mma_tf32(acc[2 * q + mm][n], ahi[mm], bh[n][0], bh[n][1]);
        }
      }
    } else {
      constexpr bool kBF = std::is_same_v<scalar_t, at::BFloat16>;
      const int mi = lane >> 3, rr = lane & 7;
      uint4* shared_a = reinterpret_cast<uint4*>(smem_raw + kStages * Cfg::kStageBytes);
      if constexpr (Cfg::kSharedA) {
        // Warp w builds the A fragments of row panel w, if it has a tile in this stage, for all
        // four warps: each warp used to build every panel's, and the kernel was bound by those
        // integer ops (ncu, bf16, proteins-like: ALU pipe 62%, memory 20%; dense16_profile.json).
        if ((mask >> warp) & 1) {
          const uint32_t word = S.words[warp * 32 + lane];
#pragma unroll
          for (int mm = 0; mm < 2; ++mm)
#pragma unroll
            for (int ks = 0; ks < 2; ++ks)
              shared_a[((warp * 2 + mm) * 2 + ks) * 32 + lane] = unit_frag_16bit<kBF>(word, mm, ks);
        }
        __syncthreads();
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        // The lane's k slots 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 hold these columns of the panel:
        // themselves, or (kPermuteK) t4, t4 + 4, t4 + 8, t4 + 12, those of its dtile_frag bits.
        const int ka = ks * 16 + 2 * t4;
        const int kc[4] = {ka, ka + 1, ka + 8, ka + 9};
        const int kp[4] = {ks * 16 + t4, ks * 16 + t4 + 4, ks * 16 + t4 + 8, ks * 16 + t4 + 12};
        float cv[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) cv[q] = S.cs[kPermuteK ? kp[q] : kc[q]];
        const int krow = ks * 16 + (mi & 1) * 8 + rr;
        uint32_t b[NT / 2][4];
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          const int col = warp * WN + (2 * np + (mi >> 1)) * 8;
          ldmatrix_x4_trans(smem_addr(&X[krow * XS + col]), b[np][0], b[np][1], b[np][2], b[np][3]);
          if constexpr (kPermuteK) {
            // Column scales on B (A is 0/1 here): registers 0 and 2 hold k slots (2 t4, 2 t4 + 1),
            // 1 and 3 slots (2 t4 + 8, 2 t4 + 9) of two n8 tiles.
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const float c0 = cv[(r & 1) * 2], c1 = cv[(r & 1) * 2 + 1];
              b[np][r] = pack2<kBF>(lo16_to_float(b[np][r], kBF) * c0, hi16_to_float(b[np][r], kBF) * c1);
            }
          }
        }
#pragma unroll
        for (int q = 0; q < kBlockPanels; ++q) {
          if (!((mask >> q) & 1)) continue;
#pragma unroll
          for (int mm = 0; mm < 2; ++mm) {
            const int m = 2 * q + mm;
            uint32_t a[4];
            if constexpr (Cfg::kSharedA) {
              const uint4 v = shared_a[((q * 2 + mm) * 2 + ks) * 32 + lane];
              a[0] = v.x;
              a[1] = v.y;
              a[2] = v.z;
              a[3] = v.w;
            } else {
              float v[2][4];  // [row a/b][column kc]
              const float* AV = S.av + q * 32 * AS;
              const int ra = mm * 16 + g, rb = ra + 8;
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                v[0][c] = AV[ra * AS + kc[c]] * cv[c];
                v[1][c] = AV[rb * AS + kc[c]] * cv[c];
              }
              a[0] = pack2<kBF>(v[0][0], v[0][1]);
              a[1] = pack2<kBF>(v[1][0], v[1][1]);
              a[2] = pack2<kBF>(v[0][2], v[0][3]);
              a[3] = pack2<kBF>(v[1][2], v[1][3]);
            }
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
              mma_16bit<kBF>(acc[m][2 * np], a, b[np][0], b[np][1]);
              mma_16bit<kBF>(acc[m][2 * np + 1], a, b[np][2], b[np][3]);
            }
          }
        }
      }
    }
  }

  // Raw dense partial of the block's panels that hold tiles -> out (the sparse pass adds the rest
  // and scales; it reads back exactly these panels, see dpanel_dense).
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (!((used_panels >> (m / 2)) & 1)) continue;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t row = block * (32 * kBlockPanels) + m * 16 + g + (q >> 1) * 8;
        const int64_t f = f0 + warp * WN + n * 8 + 2 * t4 + (q & 1);
        if (row < p.n_rows && f < p.out_cols) p.out[row * p.out_cols + f] = from_float<scalar_t>(acc[m][n][q]);
      }
  }
}

// ------------------------------------------------------------------ 2. sparse remainder
template <typename scalar_t, typename index_t>
struct SparseParams {
  const index_t *rem_col, *rem_eid, *item_ptr, *item_row;  // the remainder and its work items (plan)
  const int *item_slot, *dpanel_dense;                      // (plan)
  const float* values;                                      // edge weights, or null
  const scalar_t* x;
  const float *rs, *cs, *diag;                              // row and column scales, self loops (or null)
  const float* bias;                                        // [out_cols], added after the row scale, or null
  scalar_t* out;                                            // [n_rows, out_cols]: x's first out_cols columns
  float* partial;                                           // fp32 sums of split rows' items
  int64_t n_items, n_diag, F, out_cols;
  int lanes;  // L: lanes per feature group (power of two <= 32)
  bool vec;
  bool grouped;  // one item per group of L lanes (sparse_items_grouped) instead of one per warp
};

template <typename scalar_t, int V>
__device__ __forceinline__ void store_partial(float* p, const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = v[i];
  }
}

// Column id and weight (edge value times column scale) of remainder entry ee.
template <typename scalar_t, typename index_t>
__device__ __forceinline__ void remainder_entry(const SparseParams<scalar_t, index_t>& p, int64_t ee, index_t& j,
                                                float& w) {
  j = p.rem_col[ee];
  w = p.values != nullptr ? p.values[p.rem_eid[ee]] : 1.f;
  if (p.cs != nullptr) w *= p.cs[j];
}

// acc += sum_u w_u * x[j_u, f : f + V] over four entries of a batch held one per lane (column j,
// weight w): entry u comes from lane src_lane(u) and counts where valid(u). The 4 rows are
// loaded before their FMAs, so their loads are in flight together.
template <int V, typename scalar_t, typename index_t, typename SrcLane, typename Valid>
__device__ __forceinline__ void gather4(const SparseParams<scalar_t, index_t>& p, int64_t f, index_t j, float w,
                                        SrcLane src_lane, Valid valid, float (&acc)[V]) {
  using IO = VecIO<scalar_t, V>;
  index_t jj[4];
  float ww[4];
  bool ok[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    jj[u] = __shfl_sync(kFull, j, src_lane(u));
    ww[u] = __shfl_sync(kFull, w, src_lane(u));
    ok[u] = valid(u);
  }
  float xv[4][V];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    if (ok[u]) {
      IO::load(p.x + static_cast<int64_t>(jj[u]) * p.F + f, xv[u]);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) xv[u][v] = 0.f;
    }
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float wu = ok[u] ? ww[u] : 0.f;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = fmaf(wu, xv[u][v], acc[v]);
  }
}

// An item's sum for features [f, f + V): an fp32 partial (slot >= 0; the combine pass finishes the
// row), or the finished row: + diag term + dense partial (read back from out), times the row
// scale, + bias. Output rows narrower than x's (out_cols < F) are written element by element.
template <int V, typename scalar_t, typename index_t>
__device__ __forceinline__ void finish_item(const SparseParams<scalar_t, index_t>& p, int64_t row, int slot,
                                            bool has_dense, int64_t f, float (&acc)[V]) {
  using IO = VecIO<scalar_t, V>;
  const int64_t F = p.F;
  if (slot >= 0) {
    store_partial<scalar_t, V>(p.partial + static_cast<int64_t>(slot) * F + f, acc);
    return;
  }
  if (p.diag != nullptr && row < p.n_diag) {
    const float dd = p.diag[row] * (p.cs != nullptr ? p.cs[row] : 1.f);
    float xr[V];
    IO::load(p.x + row * F + f, xr);
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = fmaf(dd, xr[v], acc[v]);
  }
  const float r = p.rs != nullptr ? p.rs[row] : 1.f;
  if (p.out_cols == F) {
    if (has_dense) {
      float dv[V];
      IO::load_rw(p.out + row * F + f, dv);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += dv[v];
    }
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = acc[v] * r + (p.bias != nullptr ? p.bias[f + v] : 0.f);
    IO::store(p.out + row * F + f, acc);
    return;
  }
  scalar_t* out = p.out + row * p.out_cols;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    if (f + v < p.out_cols) {
      const float sum = has_dense ? acc[v] + to_float(out[f + v]) : acc[v];
      out[f + v] = from_float<scalar_t>(sum * r + (p.bias != nullptr ? p.bias[f + v] : 0.f));
    }
  }
}

template <int V, typename scalar_t, typename index_t>
__device__ __forceinline__ void sparse_item(const SparseParams<scalar_t, index_t>& p, int64_t row, int64_t b,
                                            int64_t e, int slot, int lane) {
  const int L = p.lanes, G = 32 / L, grp = lane / L, sub = lane % L;
  const bool has_dense = p.dpanel_dense[row >> 5] != 0;
  for (int64_t f0 = 0; f0 < p.out_cols; f0 += static_cast<int64_t>(L) * V) {  // columns past out_cols: not needed
    const int64_t f = f0 + static_cast<int64_t>(sub) * V;
    const bool active = f < p.out_cols;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.f;
    for (int64_t base = b; base < e; base += 32) {
      const int64_t ee = base + lane;
      index_t j = 0;
      float w = 0.f;
      if (ee < e) remainder_entry(p, ee, j, w);
      const int n = static_cast<int>(e - base < 32 ? e - base : 32);
      const int iters = (n + G - 1) / G;
      for (int kk = 0; kk < iters; kk += 4) {
        gather4<V>(p, f, j, w, [=](int u) { return ((kk + u) * G + grp) & 31; },
                   [=](int u) { return active && (kk + u) * G + grp < n; }, acc);
      }
    }
    for (int off = L; off < 32; off <<= 1) {
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += __shfl_xor_sync(kFull, acc[v], off);
    }
    if (grp == 0 && active) finish_item<V>(p, row, slot, has_dense, f, acc);
  }
}

// One item per group of L lanes (L < 32: F fits in one pass of L lanes), 32 / L items per warp.
// sparse_item spreads one item's entries over the groups and sums them by shuffles; on short rows
// (products-like's rows received from other ranks: 16 entries) that left most of a warp's time to
// the item's fixed latency chain (item bounds, column ids, column scales, epilogue). Here each
// group walks its own item: the chain runs once per warp for 32 / L rows. The trip count is the
// warp's longest item; shorter ones idle in the loads they skip.
template <int V, typename scalar_t, typename index_t>
__device__ __forceinline__ void sparse_items_grouped(const SparseParams<scalar_t, index_t>& p, int64_t item0,
                                                     int lane) {
  const int L = p.lanes, grp = lane / L, sub = lane % L;
  const int64_t item = item0 + grp;
  const bool has_item = item < p.n_items;
  int64_t row = 0, b = 0;
  int len = 0, slot = -1;
  if (has_item) {
    row = p.item_row[item];
    b = p.item_ptr[item];
    len = static_cast<int>(p.item_ptr[item + 1] - b);  // <= chunk
    slot = p.item_slot[item];
  }
  int longest = len;
  for (int off = 16; off > 0; off >>= 1) longest = max(longest, __shfl_xor_sync(kFull, longest, off));
  const int64_t f = static_cast<int64_t>(sub) * V;
  const bool active = has_item && f < p.out_cols;
  float acc[V];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = 0.f;
  for (int base = 0; base < longest; base += L) {
    index_t j = 0;
    float w = 0.f;
    if (base + sub < len) remainder_entry(p, b + base + sub, j, w);
    const int n = len - base;                    // this group's entries in the batch (may be <= 0)
    const int steps = min(longest - base, L);    // the same in the whole warp
    for (int kk = 0; kk < steps; kk += 4) {
      gather4<V>(p, f, j, w, [=](int u) { return grp * L + ((kk + u) & (L - 1)); },
                 [=](int u) { return active && kk + u < n && kk + u < L; }, acc);
    }
  }
  if (active) finish_item<V>(p, row, slot, p.dpanel_dense[row >> 5] != 0, f, acc);
}

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kSparseWarps * 32) ba_sparse_kernel(const SparseParams<scalar_t, index_t> p) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kSparseWarps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (p.grouped) {
    const int64_t item0 = warp * (32 / p.lanes);
    if (item0 >= p.n_items) return;  // whole warps leave together
    if (p.vec) {
      sparse_items_grouped<kVec<scalar_t>>(p, item0, lane);
    } else {
      sparse_items_grouped<1>(p, item0, lane);
    }
    return;
  }
  const int64_t item = warp;
  if (item >= p.n_items) return;  // whole warps leave together
  const int64_t row = p.item_row[item];
  const int64_t b = p.item_ptr[item], e = p.item_ptr[item + 1];
  const int slot = p.item_slot[item];
  if (p.vec) {
    sparse_item<kVec<scalar_t>>(p, row, b, e, slot, lane);
  } else {
    sparse_item<1>(p, row, b, e, slot, lane);
  }
}

// ------------------------------------------------------------------ 3. split rows
template <typename scalar_t>
__global__ void __launch_bounds__(kSparseWarps * 32)
    ba_combine_kernel(const int64_t* __restrict__ split_row, const int* __restrict__ split_ptr,
                      const float* __restrict__ partial, const int* __restrict__ dpanel_dense,
                      const scalar_t* __restrict__ x, const float* __restrict__ rs, const float* __restrict__ cs,
                      const float* __restrict__ diag, const float* __restrict__ bias, scalar_t* __restrict__ out,
                      int64_t n_split, int64_t n_diag, int64_t F, int64_t out_cols) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kSparseWarps + threadIdx.x / 32;
  if (s >= n_split) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = split_row[s];
  const int64_t s0 = split_ptr[s], s1 = split_ptr[s + 1];
  const bool has_dense = dpanel_dense[row >> 5] != 0;
  const float dd = (diag != nullptr && row < n_diag) ? diag[row] * (cs != nullptr ? cs[row] : 1.f) : 0.f;
  const float r = rs != nullptr ? rs[row] : 1.f;
  for (int64_t f = lane; f < out_cols; f += 32) {
    float acc = 0.f;
    for (int64_t q = s0; q < s1; ++q) acc += partial[q * F + f];
    if (diag != nullptr && row < n_diag) acc = fmaf(dd, to_float(x[row * F + f]), acc);
    if (has_dense) acc += to_float(out[row * out_cols + f]);
    out[row * out_cols + f] = from_float<scalar_t>(acc * r + (bias != nullptr ? bias[f] : 0.f));
  }
}

// ------------------------------------------------------------------ host side
// Grouped remainder pass (one item per group of L lanes) when the items are short. H100, forward,
// community order, against one item per warp (benchmarks/results/h100/sparse_variants.json,
// "sparse_grouped"): items of 16-48 entries (products-like, and the own and received-row blocks of
// a 4-way split of products-like and archaea-like) ran up to 1.2x faster at bf16 and up to 1.4x on
// the own blocks; items of 180-200 entries (reddit-like, proteins-like) went 0.93-1.05x, and at
// 122 (archaea-like's whole row block) 0.97-1.05x. Hence a cut between those.
constexpr int64_t kGroupedMaxMeanItem = 96;

bool sparse_grouped(int64_t rem_nnz, int64_t n_items) {
  return n_items > 0 && rem_nnz <= kGroupedMaxMeanItem * n_items;
}

template <typename T>
const T* ptr_or_null(const PlanArray& t) {
  return t.numel() ? t.data_ptr<T>() : nullptr;
}

template <typename scalar_t, bool WEIGHTED, int MODE>
cudaError_t launch_dense(const DenseParams<scalar_t>& p, int64_t n_work, cudaStream_t stream) {
  using Cfg = DenseCfg<scalar_t, WEIGHTED>;
  auto kernel = ba_dense_kernel<scalar_t, WEIGHTED, MODE>;
  if constexpr (Cfg::kSmemBytes > 48 * 1024) {  // above the default dynamic limit: opt in (per device)
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (e != cudaSuccess) return e;
  }
  const int64_t chunks = (p.F + Cfg::FC - 1) / Cfg::FC;  // <= 65535: checked by block_adaptive_max_features
  const dim3 grid(static_cast<unsigned>(n_work), static_cast<unsigned>(chunks));
  kernel<<<grid, 128, Cfg::kSmemBytes, stream>>>(p);
  return cudaSuccess;
}

template <typename scalar_t, typename index_t>
cudaError_t run(const SpmmArgs& a, const BlockPlan& plan, const at::Tensor& out, const at::Tensor& partial,
                bool tf32) {
  const auto& [dblock_ptr, dwork, dstage, dtile_bits, dtile_roff, dense_eid, rem_col, rem_eid, item_ptr, item_row,
               item_slot, split_row, split_ptr, slot_row, dtile_frag, dpanel_dense] = plan;

  const int64_t n_rows = a.n_rows, n_cols = a.x.size(0), F = a.x.size(1);
  const int64_t n_items = item_row.numel(), n_split = split_row.numel();
  const bool weighted = a.values.has_value();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  constexpr int V = kVec<scalar_t>;
  const int64_t out_cols = a.width;  // the output's columns: x's first ones
  const bool vec = F % V == 0 && reinterpret_cast<uintptr_t>(a.x.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  const float* values = weighted ? a.values->data_ptr<float>() : nullptr;
  const float* rs = data_or_null<float>(a.row_scale);
  const float* cs = data_or_null<float>(a.col_scale);
  const float* diag = data_or_null<float>(a.diag);
  const float* bias = data_or_null<float>(a.bias);
  const int64_t n_diag = a.diag ? std::min(n_rows, n_cols) : 0;

  // 1. dense tiles
  const int64_t n_work = dwork.numel();
  if (n_work > 0) {
    DenseParams<scalar_t> dp{dblock_ptr.data_ptr<int>(),
                             dwork.data_ptr<int>(),
                             reinterpret_cast<const int4*>(dstage.data_ptr<int>()),
                             reinterpret_cast<const uint32_t*>(dtile_bits.data_ptr<int>()),
                             reinterpret_cast<const uint32_t*>(dtile_frag.data_ptr<int>()),
                             weighted ? dtile_roff.data_ptr<int64_t>() : nullptr,
                             weighted ? ptr_or_null<int64_t>(dense_eid) : nullptr,
                             values,
                             a.x.data_ptr<scalar_t>(),
                             cs,
                             out.data_ptr<scalar_t>(),
                             n_rows,
                             n_cols,
                             F,
                             out_cols,
                             vec};
    cudaError_t e;
    const bool sm90 = !weighted && dense_sm90_usable(stream);  // Hopper: the wgmma kernel
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (weighted) {
        e = tf32 ? launch_dense<float, true, 0>(dp, n_work, stream) : launch_dense<float, true, 1>(dp, n_work, stream);
      } else if (sm90) {
        e = tf32 ? launch_dense_sm90<float, 0>(dp, n_work, stream) : launch_dense_sm90<float, 1>(dp, n_work, stream);
      } else {
        e = tf32 ? launch_dense<float, false, 0>(dp, n_work, stream) : launch_dense<float, false, 1>(dp, n_work, stream);
      }
    } else {
      e = weighted ? launch_dense<scalar_t, true, 0>(dp, n_work, stream)
          : sm90   ? launch_dense_sm90<scalar_t, 0>(dp, n_work, stream)
                   : launch_dense<scalar_t, false, 0>(dp, n_work, stream);
    }
    if (e != cudaSuccess) return e;
  }

  // 2. sparse remainder (+ diag, dense partial, row scale)
  {
    const int64_t lanes_needed = vec ? (out_cols + V - 1) / V : out_cols;
    int lanes = 1;
    while (lanes < lanes_needed && lanes < 32) lanes <<= 1;
    const bool grouped = lanes < 32 && sparse_grouped(rem_col.numel(), n_items);
    const int64_t warps = grouped ? (n_items + 32 / lanes - 1) / (32 / lanes) : n_items;
    SparseParams<scalar_t, index_t> sp{ptr_or_null<index_t>(rem_col),
                                       weighted ? ptr_or_null<index_t>(rem_eid) : nullptr,
                                       item_ptr.data_ptr<index_t>(),
                                       item_row.data_ptr<index_t>(),
                                       item_slot.data_ptr<int>(),
                                       dpanel_dense.data_ptr<int>(),
                                       values,
                                       a.x.data_ptr<scalar_t>(),
                                       rs,
                                       cs,
                                       diag,
                                       bias,
                                       out.data_ptr<scalar_t>(),
                                       partial.data_ptr<float>(),
                                       n_items,
                                       n_diag,
                                       F,
                                       out_cols,
                                       lanes,
                                       vec,
                                       grouped};
    const int64_t blocks = (warps + kSparseWarps - 1) / kSparseWarps;
    ba_sparse_kernel<scalar_t, index_t><<<static_cast<unsigned>(blocks), kSparseWarps * 32, 0, stream>>>(sp);
  }

  // 3. rows split over several items
  if (n_split > 0) {
    const int64_t blocks = (n_split + kSparseWarps - 1) / kSparseWarps;
    ba_combine_kernel<scalar_t><<<static_cast<unsigned>(blocks), kSparseWarps * 32, 0, stream>>>(
        split_row.data_ptr<int64_t>(), split_ptr.data_ptr<int>(), partial.data_ptr<float>(),
        dpanel_dense.data_ptr<int>(), a.x.data_ptr<scalar_t>(), rs, cs, diag, bias, out.data_ptr<scalar_t>(), n_split,
        n_diag, F, out_cols);
  }
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t run_index(const SpmmArgs& a, const BlockPlan& plan, const at::Tensor& out, const at::Tensor& partial,
                      bool tf32) {
  if (a.rowptr.scalar_type() == at::kInt) return run<scalar_t, int32_t>(a, plan, out, partial, tf32);
  return run<scalar_t, int64_t>(a, plan, out, partial, tf32);
}

}  // namespace

int64_t block_adaptive_max_features(at::ScalarType dtype) {
  return 65535 * (dtype == at::kFloat ? DenseCfg<float, false>::FC : DenseCfg<at::Half, false>::FC);
}

cudaError_t launch_block_adaptive_spmm(const SpmmArgs& a, const BlockPlan& plan, const at::Tensor& out,
                                       const at::Tensor& partial, bool tf32) {
  switch (a.x.scalar_type()) {
    case at::kFloat:
      return run_index<float>(a, plan, out, partial, tf32);
    case at::kHalf:
      return run_index<at::Half>(a, plan, out, partial, tf32);
    default:
      return run_index<at::BFloat16>(a, plan, out, partial, tf32);
  }
}

}  // namespace fgplugin

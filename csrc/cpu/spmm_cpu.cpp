// CPU kernel of the spmm op (schema: spmm.cpp), the twin of the block-adaptive CUDA SpMM: a CSR
// row kernel with the GCN/DGL scaling fused in, rows in parallel with balanced work
// (balanced_rows.h). Each output row is written by exactly one thread and its sum does not depend
// on which one, so the result is deterministic.
//
// float32 (the training path) has register kernels: the feature columns are cut into blocks of
// W = 64, 32, 16 and one of 1..15 columns, and each block of a row is summed over the row's
// non-zeros in accumulators that the compiler keeps in vector registers, never going through
// memory per non-zero and feature. A block
// whose width is not a multiple of the vector length ends with a vector that overlaps the one
// before it (W = 10: columns 0-7 and 2-9), which computes the shared columns twice, identically.
// For W <= 16 a row's non-zeros are split over U interleaved partial sums (U = 4 for W <= 8, 2
// for W <= 16), combined in a fixed order at the end of the row. Blocks of 32 and 64 columns
// prefetch the feature row 16 non-zeros ahead. Every float32 kernel is compiled twice: for the
// build's baseline ISA (SSE2 on x86-64: torch's extension flags give no -march; 4-float vectors)
// and, on x86-64, for AVX2+FMA through the target attribute (8-float vectors), picked once at run
// time with __builtin_cpu_supports, so the build stays portable and its cache key needs no CPU
// model. On a 2-core AMD EPYC (Zen 3), one thread, F = 2 / 10 / 64 on tolokers (1.05M non-zeros)
// this takes 1.2 / 1.8 / 5.1 ms against 3.7 / 4.8 / 17 ms for a heap row of F accumulators
// (SSE2 build: 1.2 / 2.2 / 7.7 ms; docs/results.md). The other dtypes (double, half, bfloat16) keep the generic kernel: a runtime-width axpy
// per non-zero into an accumulator row. Accumulation is in at::opmath_type (float for
// half/bfloat16, the input type otherwise).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common.h"
#include "ops_cpu.h"
#include "balanced_rows.h"
#include "x86_multiversion.h"

namespace fgplugin {
namespace {

// ------------------------------------------------------------------ float32 register kernels
template <typename index_t>
struct FloatArgs {
  const index_t* rowptr;
  const index_t* col;
  const float* values;     // per non-zero, or null (unit weights)
  const float* x;          // [n_cols, F] row-major
  const float* row_scale;  // or null
  const float* col_scale;  // or null
  const float* diag;       // or null
  float* out;              // [n_rows, F] row-major
  int64_t n_rows;
  int64_t n_diag;
  int64_t F;
};

// Partial sums per row for a block of W columns: independent add chains for narrow blocks.
constexpr int chains_for(int W) { return W <= 8 ? 4 : (W <= 16 ? 2 : 1); }
// Software prefetch distance (non-zeros) of the feature rows, for blocks of 32 and 64 columns
// (tolokers / oklahoma97, F = 64, one thread: 6.6 -> 5.1 ms / 12.3 -> 9.6 ms; distance 8: 5.5 /
// 10.4 ms, 32: 5.7 / 10.2 ms). Narrower blocks are one or two cache lines per row, and there
// prefetching cost 10-40%.
constexpr int prefetch_for(int W) { return W >= 32 ? 16 : 0; }

// Eight and four floats as one value (GCC/clang vector extension): one AVX / SSE register in the
// AVX2 build, two / one SSE registers in the baseline one. Loads and stores go through memcpy
// (unaligned, no aliasing questions); the compiler turns them into single vector moves.
// (GCC's -Wpsabi note about returning a 32-byte vector without AVX concerns the calling
// convention of out-of-line calls; these helpers are always inlined.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float float8 __attribute__((vector_size(32)));
typedef float float4 __attribute__((vector_size(16)));

template <typename V>
FGPLUGIN_ALWAYS_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename V>
FGPLUGIN_ALWAYS_INLINE void store(float* p, const V& v) { std::memcpy(p, &v, sizeof(v)); }

// The accumulators of one chain for a block of W columns, as NV vectors of L floats (L = 8 in the
// AVX2 build, 4 in the baseline one, where an 8-float vector is two registers and spills): vector k
// covers columns [k L, k L + L), and when L does not divide W the last one covers the last L
// columns [W - L, W), overlapping its neighbour. An overlapped column gets the same products in
// the same order in both vectors, so both hold the same value and either may be stored. Blocks
// narrower than 4 columns use scalars (L = 1).
template <int W, int LMAX>
struct Acc {
  static constexpr int L = (LMAX >= 8 && W >= 8) ? 8 : (W >= 4 ? 4 : 1);
  static constexpr int NV = (W + L - 1) / L;
  using V = std::conditional_t<L == 8, float8, std::conditional_t<L == 4, float4, float>>;
  V v[NV];

  static constexpr int offset(int k) { return k * L + L <= W ? k * L : W - L; }

  FGPLUGIN_ALWAYS_INLINE void zero() {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) v[k] = V{};
  }
  FGPLUGIN_ALWAYS_INLINE void axpy(float w, const float* xj) {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) v[k] += w * load<V>(xj + offset(k));
  }
  FGPLUGIN_ALWAYS_INLINE void add(const Acc& o) {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) v[k] += o.v[k];
  }
  FGPLUGIN_ALWAYS_INLINE void store_scaled(float* out, float s) const {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) store<V>(out + offset(k), s * v[k]);
  }
};

// Columns [f0, f0 + W) of rows [row_begin, row_end).
template <int W, int LMAX, typename index_t>
FGPLUGIN_ALWAYS_INLINE void block_rows_impl(const FloatArgs<index_t>& a, int64_t row_begin, int64_t row_end,
                                            int64_t f0) {
  constexpr int U = chains_for(W);
  constexpr int PREFETCH = prefetch_for(W);
  const int64_t F = a.F;
  const float* x = a.x + f0;
  const index_t* col = a.col;
  const float* values = a.values;
  const float* col_scale = a.col_scale;
  const int64_t nnz = a.rowptr[a.n_rows];
  for (int64_t i = row_begin; i < row_end; ++i) {
    Acc<W, LMAX> acc[U];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) acc[u].zero();
    const int64_t e_begin = a.rowptr[i], e_end = a.rowptr[i + 1];
    int64_t e = e_begin;
    for (; e + U <= e_end; e += U) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        if (PREFETCH > 0 && e + u + PREFETCH < nnz) {
          const float* p = x + static_cast<int64_t>(col[e + u + PREFETCH]) * F;
#pragma GCC unroll 8
          for (int k = 0; k < W; k += 16) __builtin_prefetch(p + k);
        }
        const int64_t j = col[e + u];
        float w = values ? values[e + u] : 1.f;
        if (col_scale) w *= col_scale[j];
        acc[u].axpy(w, x + j * F);
      }
    }
    for (; e < e_end; ++e) {
      const int64_t j = col[e];
      float w = values ? values[e] : 1.f;
      if (col_scale) w *= col_scale[j];
      acc[0].axpy(w, x + j * F);
    }
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) acc[0].add(acc[u]);
    if (i < a.n_diag) acc[0].axpy(a.diag[i] * (col_scale ? col_scale[i] : 1.f), x + i * F);
    acc[0].store_scaled(a.out + i * F + f0, a.row_scale ? a.row_scale[i] : 1.f);
  }
}

// Baseline ISA: 4-float vectors, and 64-column blocks as two 32-column ones (16 SSE registers).
template <int W, typename index_t>
void block_rows_base(const FloatArgs<index_t>& a, int64_t row_begin, int64_t row_end, int64_t f0) {
  if constexpr (W > 32) {
    for (int s = 0; s < W; s += 32) block_rows_impl<32, 4, index_t>(a, row_begin, row_end, f0 + s);
  } else {
    block_rows_impl<W, 4, index_t>(a, row_begin, row_end, f0);
  }
}

#if FGPLUGIN_X86_MULTIVERSION
template <int W, typename index_t>
FGPLUGIN_TARGET_AVX2 void block_rows_avx2(const FloatArgs<index_t>& a, int64_t row_begin, int64_t row_end,
                                          int64_t f0) {
  block_rows_impl<W, 8, index_t>(a, row_begin, row_end, f0);
}
#endif

template <typename index_t>
using BlockFn = void (*)(const FloatArgs<index_t>&, int64_t, int64_t, int64_t);

// Kernels per block width: [0..15] = widths 0 (unused), 1..15; [16] = 16, [17] = 32, [18] = 64.
template <typename index_t>
struct BlockTable {
  BlockFn<index_t> fn[19];
};

template <typename index_t, bool avx2, int... Ws>
constexpr BlockTable<index_t> make_table(std::integer_sequence<int, Ws...>) {
#if FGPLUGIN_X86_MULTIVERSION
  if constexpr (avx2) return {{nullptr, &block_rows_avx2<Ws + 1, index_t>..., &block_rows_avx2<16, index_t>,
                               &block_rows_avx2<32, index_t>, &block_rows_avx2<64, index_t>}};
#endif
  return {{nullptr, &block_rows_base<Ws + 1, index_t>..., &block_rows_base<16, index_t>,
           &block_rows_base<32, index_t>, &block_rows_base<64, index_t>}};
}

template <typename index_t>
const BlockTable<index_t>& block_table() {
  static const BlockTable<index_t> base = make_table<index_t, false>(std::make_integer_sequence<int, 15>{});
#if FGPLUGIN_X86_MULTIVERSION
  static const BlockTable<index_t> avx2 = make_table<index_t, true>(std::make_integer_sequence<int, 15>{});
  if (cpu_has_avx2()) return avx2;
#endif
  return base;
}

template <typename index_t>
void spmm_rows_float(const FloatArgs<index_t>& a, int64_t n_rows) {
  const BlockTable<index_t>& table = block_table<index_t>();
  // The column blocks: 64-wide while they last, then 32, 16 and the remaining 1..15.
  std::vector<std::pair<BlockFn<index_t>, int64_t>> blocks;
  int64_t f0 = 0;
  for (; a.F - f0 >= 64; f0 += 64) blocks.emplace_back(table.fn[18], f0);
  if (a.F - f0 >= 32) { blocks.emplace_back(table.fn[17], f0); f0 += 32; }
  if (a.F - f0 >= 16) { blocks.emplace_back(table.fn[16], f0); f0 += 16; }
  if (a.F - f0 > 0) blocks.emplace_back(table.fn[a.F - f0], f0);
  parallel_over_balanced_rows(a.rowptr, n_rows, [&](int64_t row_begin, int64_t row_end) {
    // Rows in groups, each group through every column block, so that a row's indices stay in
    // cache between blocks.
    constexpr int64_t ROW_GROUP = 16;
    for (int64_t r0 = row_begin; r0 < row_end; r0 += ROW_GROUP) {
      const int64_t r1 = std::min(row_end, r0 + ROW_GROUP);
      for (const auto& [fn, start] : blocks) fn(a, r0, r1, start);
    }
  });
}

// ------------------------------------------------------------------ generic kernel (other dtypes)
template <typename scalar_t, typename index_t>
void spmm_rows(const index_t* rowptr, const index_t* col, const at::opmath_type<scalar_t>* values,
               const scalar_t* x, const at::opmath_type<scalar_t>* row_scale,
               const at::opmath_type<scalar_t>* col_scale, const at::opmath_type<scalar_t>* diag,
               scalar_t* out, int64_t n_rows, int64_t n_cols, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n_diag = diag ? std::min(n_rows, n_cols) : 0;
  parallel_over_balanced_rows(rowptr, n_rows, [&](int64_t row_begin, int64_t row_end) {
    std::vector<acc_t> acc(F);
    for (int64_t i = row_begin; i < row_end; ++i) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t e = rowptr[i]; e < static_cast<int64_t>(rowptr[i + 1]); ++e) {
        const int64_t j = col[e];
        acc_t w = values ? values[e] : acc_t(1);
        if (col_scale) w *= col_scale[j];
        const scalar_t* xj = x + j * F;
        for (int64_t f = 0; f < F; ++f) acc[f] += w * static_cast<acc_t>(xj[f]);
      }
      if (i < n_diag) {
        const acc_t w = diag[i] * (col_scale ? col_scale[i] : acc_t(1));
        const scalar_t* xi = x + i * F;
        for (int64_t f = 0; f < F; ++f) acc[f] += w * static_cast<acc_t>(xi[f]);
      }
      const acc_t s = row_scale ? row_scale[i] : acc_t(1);
      scalar_t* oi = out + i * F;
      for (int64_t f = 0; f < F; ++f) oi[f] = static_cast<scalar_t>(s * acc[f]);
    }
  });
}

}  // namespace

at::Tensor spmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                    const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                    const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                    const std::optional<at::Tensor>& /*plan*/, at::IntArrayRef /*plan_layout*/,
                    const std::optional<at::Tensor>& /*t_rowptr*/, const std::optional<at::Tensor>& /*t_col*/,
                    const std::optional<at::Tensor>& /*t_values*/, const std::optional<at::Tensor>& /*t_plan*/,
                    at::IntArrayRef /*t_plan_layout*/, const std::optional<at::Tensor>& bias, int64_t width) {
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag, bias, width);
  at::Tensor out = at::empty({a.n_rows, a.x.size(1)}, a.x.options());
  if (out.numel() == 0) return with_epilogue(out, a);
  if (a.x.scalar_type() == at::kFloat) {
    AT_DISPATCH_INDEX_TYPES(a.rowptr.scalar_type(), "fgplugin_spmm_cpu_index", [&] {
      const FloatArgs<index_t> args{a.rowptr.data_ptr<index_t>(), a.col.data_ptr<index_t>(),
                                    data_or_null<float>(a.values), a.x.data_ptr<float>(),
                                    data_or_null<float>(a.row_scale), data_or_null<float>(a.col_scale),
                                    data_or_null<float>(a.diag), out.data_ptr<float>(), a.n_rows,
                                    a.diag.has_value() ? std::min(a.n_rows, a.x.size(0)) : 0, a.x.size(1)};
      spmm_rows_float<index_t>(args, a.n_rows);
    });
    return with_epilogue(out, a);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "fgplugin_spmm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(a.rowptr.scalar_type(), "fgplugin_spmm_cpu_index", [&] {
      spmm_rows<scalar_t, index_t>(a.rowptr.data_ptr<index_t>(), a.col.data_ptr<index_t>(),
                                   data_or_null<acc_t>(a.values), a.x.data_ptr<scalar_t>(),
                                   data_or_null<acc_t>(a.row_scale), data_or_null<acc_t>(a.col_scale),
                                   data_or_null<acc_t>(a.diag), out.data_ptr<scalar_t>(), a.n_rows, a.x.size(0),
                                   a.x.size(1));
    });
  });
  return with_epilogue(out, a);
}

}  // namespace fgplugin

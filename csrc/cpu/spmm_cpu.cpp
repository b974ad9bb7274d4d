// CPU twin of the block-adaptive SpMM: a CSR row kernel with the GCN/DGL scaling fused in.
//
// Parallelism: rows are cut into chunks of equal work (non-zeros + rows), so a power-law hub row
// does not leave one thread with most of the graph, and the chunks run under at::parallel_for
// (OpenMP in PyTorch's builds; it follows torch.set_num_threads). Each output row is written by
// exactly one thread, so the result is deterministic. The inner loop is a contiguous axpy over
// the F features, which the compiler vectorizes. Accumulation is in at::opmath_type (float for
// half/bfloat16, the input type otherwise).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "../spmm.h"

namespace fgplugin {
namespace {

// First row r with rowptr[r] + r >= target: chunk boundaries that balance non-zeros plus rows.
template <typename index_t>
int64_t row_at_work(const index_t* rowptr, int64_t n_rows, int64_t target) {
  int64_t lo = 0, hi = n_rows;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(rowptr[mid]) + mid < target) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <typename index_t, typename F>
void parallel_over_balanced_rows(const index_t* rowptr, int64_t n_rows, F&& body) {
  const int64_t work = static_cast<int64_t>(rowptr[n_rows]) + n_rows;
  const int64_t n_chunks = std::max<int64_t>(1, std::min<int64_t>(n_rows, 8 * at::get_num_threads()));
  at::parallel_for(0, n_chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    const int64_t row_begin = row_at_work(rowptr, n_rows, work * chunk_begin / n_chunks);
    const int64_t row_end = row_at_work(rowptr, n_rows, work * chunk_end / n_chunks);
    body(row_begin, chunk_end == n_chunks ? n_rows : row_end);
  });
}

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

template <typename scalar_t, typename index_t>
void sddmm_rows(const index_t* rowptr, const index_t* col, const scalar_t* a, const scalar_t* b,
                at::opmath_type<scalar_t>* out, int64_t n_rows, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_balanced_rows(rowptr, n_rows, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t i = row_begin; i < row_end; ++i) {
      const scalar_t* ai = a + i * F;
      for (int64_t e = rowptr[i]; e < static_cast<int64_t>(rowptr[i + 1]); ++e) {
        const scalar_t* bj = b + static_cast<int64_t>(col[e]) * F;
        acc_t dot = 0;
        for (int64_t f = 0; f < F; ++f) dot += static_cast<acc_t>(ai[f]) * static_cast<acc_t>(bj[f]);
        out[e] = dot;
      }
    }
  });
}

}  // namespace

at::Tensor spmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                    const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                    const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                    const std::optional<at::Tensor>& /*t_rowptr*/, const std::optional<at::Tensor>& /*t_col*/,
                    const std::optional<at::Tensor>& /*t_values*/, at::TensorList /*plan*/,
                    at::TensorList /*t_plan*/) {
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag);
  at::Tensor out = at::empty({a.n_rows, a.x.size(1)}, a.x.options());
  if (out.numel() == 0) return out;
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
  return out;
}

at::Tensor sddmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a_in, const at::Tensor& b_in) {
  const SddmmArgs a = prepare_sddmm(rowptr, col, a_in, b_in);
  at::Tensor out = at::empty({a.col.numel()}, a.a.options().dtype(aux_dtype_for(a.a.scalar_type())));
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.a.scalar_type(), "fgplugin_sddmm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(a.rowptr.scalar_type(), "fgplugin_sddmm_cpu_index", [&] {
      sddmm_rows<scalar_t, index_t>(a.rowptr.data_ptr<index_t>(), a.col.data_ptr<index_t>(), a.a.data_ptr<scalar_t>(),
                                    a.b.data_ptr<scalar_t>(), out.data_ptr<acc_t>(), a.n_rows, a.a.size(1));
    });
  });
  return out;
}

}  // namespace fgplugin

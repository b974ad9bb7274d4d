// CPU kernel of the sddmm op (schema: sddmm.cpp): out[e] = <a[row(e)], b[col(e)]> per non-zero,
// accumulated in at::opmath_type, rows in parallel with balanced work (balanced_rows.h).
#include <ATen/Dispatch.h>

#include "../common.h"
#include "ops_cpu.h"
#include "balanced_rows.h"

namespace fgplugin {
namespace {

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

// CPU kernel of the spmm_if op (schema: spmm_if.cpp): the flag is read on the host, the product is
// the spmm op's CPU kernel.
#include "../common.h"
#include "ops_cpu.h"

namespace fgplugin {

void spmm_if_cpu(const at::Tensor& flag, const at::Tensor& rowptr, const at::Tensor& col,
                 const std::optional<at::Tensor>& values, const at::Tensor& x,
                 const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale,
                 const std::optional<at::Tensor>& diag, const at::Tensor& out) {
  const SpmmArgs a = prepare_spmm(rowptr, col, values, x, row_scale, col_scale, diag, std::nullopt, -1);
  check_spmm_if(flag, a, out);
  if (!flag.item<bool>()) return;
  out.copy_(spmm_cpu(rowptr, col, values, x, row_scale, col_scale, diag, std::nullopt, {}, std::nullopt,
                     std::nullopt, std::nullopt, std::nullopt, {}, std::nullopt, -1));
}

}  // namespace fgplugin

// CPU kernel of the pad_columns op (schema: pad_columns.cpp): a zero-filled [n, width] tensor with
// x copied into its first columns.
#include <ATen/ATen.h>

#include "../common.h"
#include "ops_cpu.h"

namespace fgplugin {

at::Tensor pad_columns_cpu(const at::Tensor& x, int64_t width) {
  check_pad_columns(x, width);
  at::Tensor out = at::zeros({x.size(0), width}, x.options().memory_format(at::MemoryFormat::Contiguous));
  out.narrow(1, 0, x.size(1)).copy_(x);
  return out;
}

}  // namespace fgplugin

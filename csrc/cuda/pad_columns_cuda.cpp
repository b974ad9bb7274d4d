// CUDA implementation of the pad_columns op (schema: pad_columns.cpp; kernel: pad_columns.cu).
#include "ops_cuda.h"

namespace fgplugin {

at::Tensor pad_columns_cuda(const at::Tensor& x, int64_t width) {
  check_pad_columns(x, width);
  return run_launch(launch_pad_columns, at::empty({x.size(0), width}, x.options()), x.contiguous());
}

}  // namespace fgplugin

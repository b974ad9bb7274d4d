// CUDA implementation of the nonzero_rows op (schema: nonzero_rows.cpp; kernel: nonzero_rows.cu).
#include "ops_cuda.h"

namespace fgplugin {

at::Tensor nonzero_rows_cuda(const at::Tensor& x) {
  check_nonzero_rows(x);
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kBool));
  if (x.size(1) == 0) return out.fill_(false);
  return run_launch(launch_nonzero_rows, out, x.contiguous());
}

}  // namespace fgplugin

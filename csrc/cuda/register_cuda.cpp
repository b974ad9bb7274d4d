// Registers the CUDA implementations of the ops (ops_cuda.h; schemas in csrc/<op>.cpp).
#include <torch/library.h>

#include "ops_cuda.h"

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("spmm", &fgplugin::spmm_cuda);
  m.impl("sddmm", &fgplugin::sddmm_cuda);
  m.impl("nonzero_rows", &fgplugin::nonzero_rows_cuda);
  m.impl("pad_columns", &fgplugin::pad_columns_cuda);
  m.impl("spmm_if", &fgplugin::spmm_if_cuda);
}

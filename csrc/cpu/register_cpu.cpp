// Registers the CPU implementations of the ops (ops_cpu.h; schemas in csrc/<op>.cpp).
#include <torch/library.h>

#include "ops_cpu.h"

TORCH_LIBRARY_IMPL(fgplugin, CPU, m) {
  m.impl("spmm", &fgplugin::spmm_cpu);
  m.impl("sddmm", &fgplugin::sddmm_cpu);
  m.impl("dropout", &fgplugin::dropout_cpu);
  m.impl("nonzero_rows", &fgplugin::nonzero_rows_cpu);
  m.impl("pad_columns", &fgplugin::pad_columns_cpu);
  m.impl("spmm_if", &fgplugin::spmm_if_cpu);
}

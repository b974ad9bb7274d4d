// The CPU kernels of the ops (one file each: <op>_cpu.cpp; signatures in common.h), registered
// together in register_cpu.cpp.
#pragma once

#include "../common.h"

namespace fgplugin {

SpmmOp spmm_cpu;
SddmmOp sddmm_cpu;
DropoutOp dropout_cpu;
NonzeroRowsOp nonzero_rows_cpu;
PadColumnsOp pad_columns_cpu;
SpmmIfOp spmm_if_cpu;

}  // namespace fgplugin

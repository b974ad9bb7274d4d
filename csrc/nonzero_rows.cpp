// Schema of the nonzero_rows op: bool [n_rows], true where a row of the 2-D floating-point x holds
// an entry that is not zero (NaN counts as non-zero). It finds the rows of an output gradient
// that the backward product needs (fgplugin/grad_rows.py). Kernels: cpu/nonzero_rows_cpu.cpp,
// cuda/nonzero_rows_cuda.cpp.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("nonzero_rows(Tensor x) -> Tensor");
}

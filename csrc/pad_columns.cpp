// Schema of the pad_columns op: [x, 0], the 2-D x [n, c] with zero columns appended up to
// width >= c, contiguous. It is the backward pass of a product cut back to fewer columns than the
// SpMM computed (fgplugin/ops.py, _CutColumns). Kernels: cpu/pad_columns_cpu.cpp,
// cuda/pad_columns_cuda.cpp.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("pad_columns(Tensor x, int width) -> Tensor");
}

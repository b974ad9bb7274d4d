// Schema of the sddmm op: out[e] = <a[row(e)], b[col(e)]> for every non-zero e of the CSR
// (rowptr, col), in the accumulation dtype of a (float, or double for double). It is the gradient
// of spmm with respect to the edge values. Kernels: cpu/sddmm_cpu.cpp, cuda/sddmm_cuda.cpp;
// autograd from Python (fgplugin/ops.py).
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor");
}

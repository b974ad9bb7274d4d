// Schema of the spmm_if op: when the one-element bool tensor `flag` holds true, writes the spmm
// op's product diag(row_scale) . (A + diag(diag)) . diag(col_scale) . x into `out` ([n_rows, F],
// x's dtype, contiguous); else leaves `out` as it is. The flag is read where the product runs, on
// the device: a CUDA graph captures the call and each replay decides. A captured backward
// product that keeps to the rows its warm-up found runs the full product this way when a
// replay's gradient has rows outside them (fgplugin/grad_rows.py). Kernels:
// cpu/spmm_if_cpu.cpp, cuda/spmm_if_cuda.cpp (the plain CSR kernel: a fallback, rarely taken).
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def(
      "spmm_if(Tensor flag, Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, "
      "Tensor? col_scale, Tensor? diag, Tensor(a!) out) -> ()");
}

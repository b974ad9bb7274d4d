// Schemas of fgplugin's ops. Kernels: cpu/spmm_cpu.cpp, cuda/spmm_cuda.cu; fake kernels and
// autograd are registered from Python (fgplugin/ops.py), as torch.library recommends.
//
// spmm:  out = diag(row_scale) . (A + diag(diag)) . diag(col_scale) . x
//        A = CSR (rowptr, col, values or unit weights), rows = destinations, cols = sources;
//        diag: per-node self-loop weights for the first min(n_rows, n_cols) nodes (None = 0).
//        Every optional is None when absent, so unit weights and unscaled rows cost no bytes.
//        t_rowptr / t_col / t_values: the CSR of A^T, used only by the backward pass (A^T . G);
//        the forward kernels ignore them. Passing them as inputs keeps the op functional, so
//        the backward is the same op on the swapped arguments and torch.compile sees one node.
//        plan / t_plan: device-specific kernel plans of A and A^T (the block-adaptive CUDA
//        kernel's tile lists, built by fgplugin/kernel_plan.py); empty = plain CSR kernel.
// sddmm: out[e] = <a[row(e)], b[col(e)]> for every non-zero e of A (gradient w.r.t. edge values).
// dropout: x with each element kept and scaled by 1 / (1 - p) with probability 1 - p, else times 0;
//        which ones is a pure function of (seed, p, element index), so the backward pass is the
//        same op on the gradient. CPU only (fgplugin/parallel_dropout.py uses torch's fused kernel on GPUs).
#include <torch/library.h>

#include "spmm.h"

TORCH_LIBRARY(fgplugin, m) {
  m.def(
      "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, "
      "Tensor? col_scale, Tensor? diag, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, Tensor[] plan, "
      "Tensor[] t_plan) -> Tensor");
  m.def("sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor");
  m.def("dropout(Tensor x, float p, int seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(fgplugin, CPU, m) {
  m.impl("spmm", &fgplugin::spmm_cpu);
  m.impl("sddmm", &fgplugin::sddmm_cpu);
  m.impl("dropout", &fgplugin::dropout_cpu);
}

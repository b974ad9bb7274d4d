// Schema of the spmm op. Kernels: cpu/spmm_cpu.cpp, cuda/spmm_cuda.cpp; its fake kernel and
// autograd are registered from Python (fgplugin/ops.py), as torch.library recommends.
//
//   out = diag(row_scale) . (A + diag(diag)) . diag(col_scale) . x
//
// A = CSR (rowptr, col, values or unit weights), rows = destinations, cols = sources; diag holds
// per-node self-loop weights for the first min(n_rows, n_cols) nodes. Every optional is None when
// absent, so unit weights and unscaled rows cost no bytes.
// plan / plan_layout: the device's kernel plan of A (the block-adaptive CUDA kernel's tile lists,
// built by fgplugin/kernel_plan.py) as one byte buffer and its host-side layout; None and [] run
// the plain CSR kernel. CPU kernels take no plan.
// t_rowptr / t_col / t_values / t_plan / t_plan_layout: the same for A^T, used only by the
// backward pass (A^T . G); the forward kernels ignore them. Passing them as inputs keeps the op
// functional, so its backward is the same op on the swapped arguments and torch.compile sees one
// node.
// bias / width: the epilogue of a layer's aggregation. The output keeps x's first `width` columns
// (-1: all; a layer pads x with zero columns to a vector width and cuts them here) and adds `bias`
// ([width], in the aux dtype) to every row. The block-adaptive CUDA kernels apply both in their
// output pass, which saves the layer a pass over its output; the other kernels cut and add after
// the product.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def(
      "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, Tensor? col_scale, "
      "Tensor? diag, Tensor? plan, int[] plan_layout, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, "
      "Tensor? t_plan, int[] t_plan_layout, Tensor? bias=None, int width=-1) -> Tensor");
}

// Schema of the dropout op: x with each element kept and scaled by 1 / (1 - p) with probability
// 1 - p, else multiplied by 0; which ones is a pure function of (seed, p, element index), so the
// backward pass is the same op on the gradient. Kernel: cpu/dropout_cpu.cpp. On CUDA,
// fgplugin.dropout (fgplugin/parallel_dropout.py) runs torch's own fused dropout, and the op
// raises a clear error.
#include <torch/library.h>

namespace {

at::Tensor dropout_elsewhere(const at::Tensor& x, double /*p*/, int64_t /*seed*/) {
  TORCH_CHECK(false, "fgplugin::dropout runs on CPU tensors only, got a tensor on ", x.device(),
              "; call fgplugin.dropout(x, p, training), which uses torch's dropout there");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("dropout(Tensor x, float p, int seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(fgplugin, CUDA, m) {
  m.impl("dropout", &dropout_elsewhere);
}

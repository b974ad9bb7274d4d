// Schemas and implementations of two small ops that control and report the dense-tile path of
// the block-adaptive CUDA kernel. They take no tensors (no dispatch key), so they are defined for
// every build: set_wgmma(enabled) chooses between Hopper's wgmma kernel and the mma.sync one for
// unit-weight dense tiles and returns the previous setting; dense_tile_arch(device) says which
// one runs on a CUDA device (90 or 80), and raises in a build without the CUDA kernels.
#include <torch/library.h>

#include <atomic>

#include "dense_kernel.h"

namespace fgplugin {
namespace {

std::atomic<bool> wgmma_on{true};
std::atomic<DenseTileArchFn> tile_arch_impl{nullptr};

bool set_wgmma(bool enabled) { return wgmma_on.exchange(enabled); }

int64_t dense_tile_arch(int64_t device) {
  const DenseTileArchFn fn = tile_arch_impl.load();
  TORCH_CHECK(fn != nullptr, "fgplugin::dense_tile_arch: this build of fgplugin has no CUDA kernels "
              "(fgplugin.extension_status() says why)");
  return fn(device);
}

}  // namespace

bool wgmma_enabled() { return wgmma_on.load(std::memory_order_relaxed); }

void set_dense_tile_arch_impl(DenseTileArchFn fn) { tile_arch_impl.store(fn); }

}  // namespace fgplugin

TORCH_LIBRARY_FRAGMENT(fgplugin, m) {
  m.def("set_wgmma(bool enabled) -> bool", &fgplugin::set_wgmma);
  m.def("dense_tile_arch(int device) -> int", &fgplugin::dense_tile_arch);
}

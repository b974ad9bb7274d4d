// Control of the block-adaptive kernel's dense-tile path, shared by dense_kernel.cpp (the ops) and
// the CUDA build (cuda/dense_kernel_cuda.cpp, cuda/dense_tiles_sm90.cu).
#pragma once

#include <cstdint>

namespace fgplugin {

// Whether unit-weight dense tiles may run on Hopper's wgmma kernel (else the mma.sync one). Set
// from Python (fgplugin.config, switch FGPLUGIN_NO_WGMMA) through the set_wgmma op.
bool wgmma_enabled();

// The CUDA build's answer to dense_tile_arch (90: wgmma, 80: mma.sync), installed when its
// library loads; a CPU-only build has none.
using DenseTileArchFn = int64_t (*)(int64_t device);
void set_dense_tile_arch_impl(DenseTileArchFn fn);

}  // namespace fgplugin

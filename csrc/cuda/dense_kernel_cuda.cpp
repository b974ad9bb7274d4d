// The CUDA build's implementation of the dense_tile_arch op (schema: dense_kernel.cpp), installed
// when the library loads: 90 when unit-weight dense tiles on the device run on the wgmma kernel,
// 80 when on the mma.sync one (dense_sm90_usable in dense_tiles_sm90.cu decides).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../dense_kernel.h"
#include "dense_tiles.cuh"

namespace fgplugin {
namespace {

int64_t dense_tile_arch_cuda(int64_t device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return dense_sm90_usable(c10::cuda::getCurrentCUDAStream()) ? 90 : 80;
}

[[maybe_unused]] const bool installed = (set_dense_tile_arch_impl(&dense_tile_arch_cuda), true);

}  // namespace
}  // namespace fgplugin

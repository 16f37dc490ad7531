// Programmatic dependent launch (griddepcontrol): from inside a kernel, and the host's launch of one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/host.cuh"

namespace flashgla::cuda {

// Programmatic dependent launch (sm_90+): a kernel lets the next one start
// (launch_dependents), and that one waits for it to finish and its writes to
// be visible (wait) before it reads them. Both return at once when the launch
// was an ordinary one.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(params), as a programmatic dependent launch where `dependent`: the
// kernel's blocks may start before the previous kernel in the stream ends, and wait_for_previous_grid before
// they read its results. `what` names the launch in an error.
template <class Params>
void launch_after_previous(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           bool dependent, const Params& params, const char* what) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = dependent ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, kernel, params), what);
}

}  // namespace flashgla::cuda

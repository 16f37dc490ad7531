// Programmatic dependent launch (griddepcontrol) from inside a GLA kernel.
#pragma once

#include <cstdint>

namespace flashgla::cuda::gla {

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

}  // namespace flashgla::cuda::gla

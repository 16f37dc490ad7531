#include "core/backend.h"
#include "cuda/common/host.cuh"

namespace flashgla::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return n;
}

namespace {

// Never launched: the size of its static shared memory records which
// compilation pass produced the machine code the device loads (the same arch
// list compiles every .cu file of the backend).
constexpr int kSm90Marker = 16, kSm90aMarker = 32;
__global__ void loaded_code_probe() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ volatile int marker[kSm90aMarker / 4];
  marker[0] = 0;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ volatile int marker[kSm90Marker / 4];
  marker[0] = 0;
#endif
}

}  // namespace

LoadedCode loaded_code() {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, loaded_code_probe) != cudaSuccess) {
    cudaGetLastError();  // no code for this device at all: the kernels' launches will say so
    return {};
  }
  LoadedCode code;
  code.sm90a = attributes.sharedSizeBytes == size_t(kSm90aMarker);
  code.sm90 = code.sm90a || attributes.sharedSizeBytes == size_t(kSm90Marker);
  return code;
}

}  // namespace flashgla::cuda

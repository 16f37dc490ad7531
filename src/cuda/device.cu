#include "core/backend.h"
#include "cuda/common.cuh"

namespace flashgla::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return n;
}

}  // namespace flashgla::cuda

// Shared by the CUDA backend: error checks, device guard, launch helpers.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "api/checks.h"

namespace flashgla::cuda {

// Throws flashgla::Error (runtime) on a failed CUDA call.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    check::fail(ErrorKind::runtime, "", std::string(what) + " failed: " + cudaGetErrorString(status));
}

// Makes the tensors' device current for the scope of a call and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) check_cuda(cudaSetDevice(index), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace flashgla::cuda

// Shared by the CUDA backend: error checks, device guard, scratch, launch helpers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "core/errors.h"
#include "flashgla/tensor.h"

namespace flashgla::cuda {

// Throws flashgla::Error (runtime) on a failed CUDA call.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    check::fail(ErrorKind::runtime, "", std::string(what) + " failed: " + cudaGetErrorString(status));
}

// Which machine code of this build the current device runs (device.cu). An
// sm_80-only build runs its compute_80 PTX on an H100, and a plain sm_90 build
// compiles the Hopper kernels without the sm_90a features they need (their
// bodies are empty there), so the compute capability alone does not say
// whether a Hopper kernel, or an instruction such as griddepcontrol, exists.
struct LoadedCode {
  bool sm90 = false;   // compiled for sm_90 or newer (griddepcontrol, bf16 reductions)
  bool sm90a = false;  // compiled for sm_90a (wgmma, setmaxnreg): the Hopper kernels are real
};
LoadedCode loaded_code();

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

// Device scratch for one call: the caller's workspace when one is given (checked
// for size and alignment), else one block from the caller's allocator (asked once,
// for exactly `needed`), else a stream-ordered allocation given back on the same
// stream, so that the call stays capturable by CUDA graphs.
class Scratch {
 public:
  // `size_query` names the function that reports `needed`; `size_argument` is the
  // argument an error names when the caller's workspace is too small.
  Scratch(void* given, size_t given_bytes, const WorkspaceAllocator& allocate, size_t needed, cudaStream_t stream,
          const char* size_query, const char* size_argument = "workspace", size_t alignment = 1)
      : stream_(stream) {
    if (needed == 0) return;
    if (given) {
      FLASHGLA_REQUIRE(given_bytes >= needed, ErrorKind::value, size_argument,
                       "needs " + std::to_string(needed) + " bytes (" + size_query + "), got " +
                           std::to_string(given_bytes));
      data_ = given;
    } else if (allocate) {
      data_ = allocate(needed);
      FLASHGLA_REQUIRE(data_ != nullptr, ErrorKind::runtime, "allocate_workspace",
                       "returned null for " + std::to_string(needed) + " bytes");
    } else {
      const cudaError_t status = cudaMallocAsync(&data_, needed, stream);
      if (status != cudaSuccess) check_cuda(status, (std::string("cudaMallocAsync (") + size_query + ")").c_str());
      owned_ = true;
    }
    FLASHGLA_REQUIRE(reinterpret_cast<uintptr_t>(data_) % alignment == 0, ErrorKind::value,
                     given ? "workspace" : "allocate_workspace",
                     "must be " + std::to_string(alignment) + "-byte aligned");
  }
  ~Scratch() {
    if (owned_) cudaFreeAsync(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  char* bytes() const { return static_cast<char*>(data_); }
  float* floats() const { return static_cast<float*>(data_); }

 private:
  void* data_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_;
};

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace flashgla::cuda

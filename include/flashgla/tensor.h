// A non-owning view of a strided tensor: the only way data crosses the API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace flashgla {

enum class DType : int8_t { f64, f32, bf16, f16, i32, i64 };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
inline bool is_floating(DType d) { return d == DType::f64 || d == DType::f32 || d == DType::bf16 || d == DType::f16; }

enum class DeviceType : int8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU
  bool operator==(const Device& o) const { return type == o.type && (type == DeviceType::cpu || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu" or "cuda:N"
};

inline constexpr int kMaxDims = 4;

// shape/stride in elements; strides may be any non-negative value (a slice of a
// fused projection is fine). ndim == -1 marks an optional argument left out.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = -1;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};

  bool defined() const { return ndim >= 0; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 64, 4, 32]"

  // A contiguous (row-major) view over `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
};

// Device scratch for one call, asked for after the call has checked its arguments and planned:
// returns at least `bytes` of device memory that stays usable on the call's stream until the work
// the call queued there has finished (stream-ordered, as a caching allocator such as torch's gives
// it); the caller owns it. The ops' `allocate_workspace` field: when `workspace` is null and the
// call needs scratch, the call asks this instead of taking it with cudaMallocAsync, so a front end
// checks and plans once per call rather than asking *_workspace_bytes first. A call asks once for its
// own scratch, and before that once for each staging buffer it needs: the materialised gate of a
// GLA call with g_gamma, the dense states of gla_forward with state pools (so up to three asks);
// every block must stay valid until the call's work has finished.
using WorkspaceAllocator = std::function<void*(size_t bytes)>;

}  // namespace flashgla

#include "api/checks.h"

#include <algorithm>
#include <vector>

#include "core/elements.h"

namespace flashgla::check {

std::string shape_of(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (auto it = dims.begin(); it != dims.end(); ++it) s += (it == dims.begin() ? "" : ", ") + std::to_string(*it);
  return s + "]";
}

void tensor(const TensorView& t, const std::string& name, int ndim, const char* dims, bool is_output) {
  FLASHGLA_REQUIRE(t.defined(), ErrorKind::value, name, std::string("is required: expected a tensor of shape ") + dims);
  // One dimension short of a [B, ...] layout is almost always the batch dimension left out (FLA-style
  // [T, H, K] inputs): say so, rather than leave the user to count.
  const bool batch_missing = t.ndim == ndim - 1 && std::string(dims).rfind("[B,", 0) == 0;
  FLASHGLA_REQUIRE(t.ndim == ndim, ErrorKind::value, name,
          "expected " + std::to_string(ndim) + " dimensions " + dims + ", got shape " + t.shape_str() +
              (batch_missing ? " (is the batch dimension B missing? add it, e.g. with unsqueeze(0))" : ""));
  for (int d = 0; d < t.ndim; ++d) {
    FLASHGLA_REQUIRE(t.shape[d] >= 0, ErrorKind::value, name, "negative size in shape " + t.shape_str());
    FLASHGLA_REQUIRE(t.stride[d] >= 0, ErrorKind::value, name,
            "negative strides are not supported (dimension " + std::to_string(d) + " has stride " +
                std::to_string(t.stride[d]) + ")");
  }
  FLASHGLA_REQUIRE(t.data != nullptr || t.numel() == 0, ErrorKind::value, name, "data pointer is null");
  if (!is_output || t.numel() == 0) return;  // nothing to write: no overlap possible
  // Non-overlap: ordered by stride, each dimension must step past the whole
  // extent of the finer ones.
  std::vector<int> order;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  int64_t extent = 1;
  for (int d : order) {
    FLASHGLA_REQUIRE(t.stride[d] >= extent, ErrorKind::value, name,
            "output strides overlap (shape " + t.shape_str() + "): each element must have its own memory");
    extent = t.stride[d] * t.shape[d];
  }
}

void shape(const TensorView& t, const std::string& name, std::initializer_list<int64_t> expected, const char* dims,
           bool is_output) {
  tensor(t, name, int(expected.size()), dims, is_output);
  int d = 0;
  for (int64_t e : expected) {
    FLASHGLA_REQUIRE(t.shape[d] == e, ErrorKind::value, name,
            std::string("expected shape ") + dims + " = " + shape_of(expected) + ", got " + t.shape_str());
    ++d;
  }
}

void dtype(const TensorView& t, const std::string& name, DType expected) {
  FLASHGLA_REQUIRE(t.dtype == expected, ErrorKind::type, name,
          std::string("expected dtype ") + dtype_name(expected) + ", got " + dtype_name(t.dtype));
}

void floating(const TensorView& t, const std::string& name) {
  FLASHGLA_REQUIRE(is_floating(t.dtype), ErrorKind::type, name,
          std::string("expected a float dtype (float64, float32, bfloat16, float16), got ") + dtype_name(t.dtype));
}

void device(const TensorView& t, const std::string& name, const Device& expected, const std::string& reference) {
  FLASHGLA_REQUIRE(t.device == expected, ErrorKind::value, name,
          "expected device " + expected.str() + " (that of " + reference + "), got " + t.device.str());
}

namespace {
void check_boundaries(const TensorView& t, const std::string& name, int64_t total) {
  int64_t prev = 0;
  const int64_t n = t.shape[0];
  for (int64_t i = 0; i < n; ++i) {
    int64_t value = load_element<int64_t>(t, i * t.stride[0]);
    if (i == 0)
      FLASHGLA_REQUIRE(value == 0, ErrorKind::value, name, "must start at 0, got " + std::to_string(value));
    FLASHGLA_REQUIRE(value >= prev, ErrorKind::value, name,
            "must be non-decreasing, got " + std::to_string(prev) + " then " + std::to_string(value) + " at index " +
                std::to_string(i));
    prev = value;
  }
  FLASHGLA_REQUIRE(prev == total, ErrorKind::value, name,
          "must end at the total number of tokens " + std::to_string(total) + ", got " + std::to_string(prev));
}
}  // namespace

int64_t cu_seqlens(const TensorView& t, const std::string& name, const Device& dev, int64_t total,
                   const TensorView& host_copy, const char* reference) {
  tensor(t, name, 1, "[N+1]");
  FLASHGLA_REQUIRE(t.dtype == DType::i32 || t.dtype == DType::i64, ErrorKind::type, name,
          std::string("expected dtype int32 or int64, got ") + dtype_name(t.dtype));
  FLASHGLA_REQUIRE(t.shape[0] >= 2, ErrorKind::value, name,
          "expected at least 2 boundaries [0, ..., T], got shape " + t.shape_str());
  device(t, name, dev, reference);
  if (host_copy.defined()) {
    const std::string host_name = name + "_host";
    tensor(host_copy, host_name, 1, "[N+1]");
    FLASHGLA_REQUIRE(host_copy.dtype == DType::i32 || host_copy.dtype == DType::i64, ErrorKind::type, host_name,
            std::string("expected dtype int32 or int64, got ") + dtype_name(host_copy.dtype));
    FLASHGLA_REQUIRE(host_copy.device.type == DeviceType::cpu, ErrorKind::value, host_name,
            "expected a CPU tensor, got " + host_copy.device.str());
    FLASHGLA_REQUIRE(host_copy.shape[0] == t.shape[0], ErrorKind::value, host_name,
            "expected the shape of " + name + " " + t.shape_str() + ", got " + host_copy.shape_str());
    check_boundaries(host_copy, host_name, total);
    // Both readable on the host (cu_seqlens on the CPU): a copy that disagrees is a caller's bug. A CUDA
    // cu_seqlens is not compared: reading it back would synchronise the stream, which the host copy exists
    // to avoid; its values are then trusted to match.
    if (t.device.type == DeviceType::cpu) {
      for (int64_t i = 0; i < t.shape[0]; ++i) {
        const int64_t a = load_element<int64_t>(t, i * t.stride[0]);
        const int64_t b = load_element<int64_t>(host_copy, i * host_copy.stride[0]);
        FLASHGLA_REQUIRE(a == b, ErrorKind::value, host_name,
                "must be a copy of " + name + ", but differs at index " + std::to_string(i) + ": " +
                    std::to_string(b) + " vs " + std::to_string(a) + " in " + name);
      }
    }
  }
  if (t.device.type == DeviceType::cpu) check_boundaries(t, name, total);
  return t.shape[0] - 1;
}

}  // namespace flashgla::check

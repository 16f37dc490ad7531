// TensorView, Error and library-level queries.
#include <string>

#include "core/backend.h"
#include "flashgla/flashgla.h"

namespace flashgla {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
  }
  return 0;
}

std::string Device::str() const { return type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(index); }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  if (!defined()) return "(absent)";
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = int(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  int64_t stride = 1;
  for (d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

Error::Error(ErrorKind kind, std::string argument, const std::string& message)
    : std::runtime_error(argument.empty() ? "flashgla: " + message : "flashgla: " + argument + ": " + message),
      kind_(kind),
      argument_(std::move(argument)) {}

const char* version() { return FLASHGLA_VERSION; }

int cuda_device_count() {
#ifdef FLASHGLA_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace flashgla

#include "testing/buffer.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/half.h"
#include "flashgla/flashgla.h"

#ifdef FLASHGLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashgla::testing {
namespace {

#ifdef FLASHGLA_WITH_CUDA
void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
#endif

double read_raw(const char* p, DType dt) {
  switch (dt) {
    case DType::f64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::bf16: { uint16_t x; std::memcpy(&x, p, 2); return bf16_to_float(x); }
    case DType::f16: { uint16_t x; std::memcpy(&x, p, 2); return f16_to_float(x); }
    case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return double(x); }
  }
  return 0;
}

void write_raw(char* p, DType dt, double v) {
  switch (dt) {
    case DType::f64: std::memcpy(p, &v, 8); break;
    case DType::f32: { float x = float(v); std::memcpy(p, &x, 4); break; }
    case DType::bf16: { uint16_t x = float_to_bf16(float(v)); std::memcpy(p, &x, 2); break; }
    case DType::f16: { uint16_t x = float_to_f16(float(v)); std::memcpy(p, &x, 2); break; }
    case DType::i32: { int32_t x = int32_t(v); std::memcpy(p, &x, 4); break; }
    case DType::i64: { int64_t x = int64_t(v); std::memcpy(p, &x, 8); break; }
  }
}

// Storage offset of the i-th element in logical order.
int64_t offset_of(const TensorView& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    off += (i % t.shape[d]) * t.stride[d];
    i /= t.shape[d];
  }
  return off;
}

}  // namespace

Buffer::Buffer(DType dtype, std::vector<int64_t> shape, Device device, int64_t row_padding) : shape_(std::move(shape)) {
  if (shape_.size() > size_t(kMaxDims)) throw std::invalid_argument("Buffer: too many dimensions");
  view_.dtype = dtype;
  view_.device = device;
  view_.ndim = int(shape_.size());
  int64_t stride = 1;
  for (int d = view_.ndim - 1; d >= 0; --d) {
    view_.shape[d] = shape_[d];
    view_.stride[d] = stride;
    stride *= (d == view_.ndim - 1) ? shape_[d] + row_padding : shape_[d];
  }
  storage_elems_ = std::max<int64_t>(stride, 1);
  const size_t bytes = size_t(storage_elems_) * dtype_size(dtype);
  if (device.type == DeviceType::cpu) {
    storage_ = std::shared_ptr<void>(std::calloc(bytes, 1), std::free);
    if (!storage_) throw std::bad_alloc();
  } else {
#ifdef FLASHGLA_WITH_CUDA
    cuda_check(cudaSetDevice(device.index), "cudaSetDevice");
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
    cuda_check(cudaMemset(p, 0, bytes), "cudaMemset");
    storage_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
#else
    throw std::runtime_error("Buffer: built without CUDA");
#endif
  }
  view_.data = storage_.get();
}

std::vector<double> Buffer::values() const {
  if (!defined()) return {};
  const size_t bytes = size_t(storage_elems_) * dtype_size(dtype());
  std::vector<char> host(bytes);
  if (device().type == DeviceType::cpu) {
    std::memcpy(host.data(), storage_.get(), bytes);
  } else {
#ifdef FLASHGLA_WITH_CUDA
    cuda_check(cudaSetDevice(device().index), "cudaSetDevice");
    cuda_check(cudaMemcpy(host.data(), storage_.get(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  }
  std::vector<double> out(static_cast<size_t>(numel()));
  const size_t es = dtype_size(dtype());
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = read_raw(host.data() + offset_of(view_, i) * es, dtype());
  return out;
}

void Buffer::set_values(const std::vector<double>& values) {
  if (int64_t(values.size()) != numel()) throw std::invalid_argument("Buffer::set_values: wrong number of values");
  const size_t es = dtype_size(dtype());
  const size_t bytes = size_t(storage_elems_) * es;
  std::vector<char> host(bytes, 0);
  if (device().type != DeviceType::cpu) {
#ifdef FLASHGLA_WITH_CUDA
    cuda_check(cudaSetDevice(device().index), "cudaSetDevice");
    cuda_check(cudaMemcpy(host.data(), storage_.get(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  } else {
    std::memcpy(host.data(), storage_.get(), bytes);
  }
  for (int64_t i = 0; i < numel(); ++i) write_raw(host.data() + offset_of(view_, i) * es, dtype(), values[size_t(i)]);
  if (device().type == DeviceType::cpu) {
    std::memcpy(storage_.get(), host.data(), bytes);
  } else {
#ifdef FLASHGLA_WITH_CUDA
    cuda_check(cudaMemcpy(storage_.get(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  }
}

void Buffer::fill_normal(std::mt19937_64& rng, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(static_cast<size_t>(numel()));
  for (auto& x : v) x = dist(rng);
  set_values(v);
}

void Buffer::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(numel()));
  for (auto& x : v) x = dist(rng);
  set_values(v);
}

void Buffer::fill(double value) { set_values(std::vector<double>(size_t(numel()), value)); }

Buffer Buffer::to(Device device, int64_t row_padding) const {
  if (!defined()) return {};
  Buffer out(dtype(), shape_, device, row_padding);
  out.set_values(values());
  return out;
}

Buffer Buffer::cast(DType dtype) const {
  if (!defined()) return {};
  Buffer out(dtype, shape_, device());
  out.set_values(values());
  return out;
}

double rel_rms_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) throw std::invalid_argument("rel_rms_error: sizes differ");
  double num = 0, den = 0, out_norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::nan("");
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
    out_norm += out[i] * out[i];
  }
  if (den == 0) return std::sqrt(out_norm);
  return std::sqrt(num / den);
}

bool has_cuda() { return cuda_available(); }

Device default_device() { return has_cuda() ? Device{DeviceType::cuda, 0} : Device{}; }

void synchronize(Device device) {
#ifdef FLASHGLA_WITH_CUDA
  if (device.type == DeviceType::cuda) {
    cuda_check(cudaSetDevice(device.index), "cudaSetDevice");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
#else
  (void)device;
#endif
}

}  // namespace flashgla::testing

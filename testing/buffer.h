// Owning tensors for tests, the CLI and benchmarks: allocate on the CPU or a
// CUDA device, fill with random data or NaN, copy between devices and dtypes,
// and compare against a reference. Not part of the library's API.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "flashgla/tensor.h"

namespace flashgla::testing {

class Buffer {
 public:
  Buffer() = default;  // an absent tensor: view().defined() is false
  // Row-major; `row_padding` extra elements after each innermost row make the
  // view non-contiguous (a slice of a wider tensor), to exercise strides.
  Buffer(DType dtype, std::vector<int64_t> shape, Device device = {}, int64_t row_padding = 0);

  const TensorView& view() const { return view_; }
  bool defined() const { return view_.defined(); }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return view_.numel(); }

  // Element values in logical (row-major) order, as doubles, from any device.
  std::vector<double> values() const;
  // Writes values in logical order (rounded to the dtype).
  void set_values(const std::vector<double>& values);

  void fill_normal(std::mt19937_64& rng, double mean = 0.0, double stddev = 1.0);
  void fill_uniform(std::mt19937_64& rng, double lo, double hi);
  void fill(double value);
  void poison() { fill(std::nan("")); }  // an element never written stays NaN

  Buffer to(Device device, int64_t row_padding = 0) const;  // same values, another device
  Buffer cast(DType dtype) const;                            // same device, another dtype

 private:
  std::shared_ptr<void> storage_;  // frees with free() or cudaFree()
  std::vector<int64_t> shape_;
  int64_t storage_elems_ = 0;
  TensorView view_{};
};

// ‖out − ref‖ / ‖ref‖ (‖out‖ when ref is all zero); NaN if out holds a NaN or Inf.
double rel_rms_error(const std::vector<double>& out, const std::vector<double>& ref);

// The device the CLI and GPU tests use by default: cuda:0 if present, else the CPU.
Device default_device();
bool has_cuda();
void synchronize(Device device);  // waits for the device's queued work (no-op on the CPU)

}  // namespace flashgla::testing

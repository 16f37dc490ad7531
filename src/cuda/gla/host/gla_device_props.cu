// The device properties the GLA planner reads (plan.h: DeviceProps), queried once per device.
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/gla/host/gla_host.cuh"

namespace flashgla::cuda {

const gla::DeviceProps& device_props(int index) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<gla::DeviceProps>> cache;  // by device index; entries never move
  const std::lock_guard<std::mutex> lock(mutex);
  if (index >= int(cache.size())) cache.resize(size_t(index) + 1);
  if (!cache[size_t(index)]) {
    const DeviceGuard guard(index);  // loaded_code() asks about the current device
    auto props = std::make_unique<gla::DeviceProps>();
    check_cuda(cudaDeviceGetAttribute(&props->multiprocessors, cudaDevAttrMultiProcessorCount, index),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&props->max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, index),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&props->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, index),
               "cudaDeviceGetAttribute");
    const LoadedCode code = loaded_code();
    props->sm90 = code.sm90, props->sm90a = code.sm90a;
    // An occupancy query of the general chunk kernel, on the device current at the call (the caller's guard).
    props->general_blocks_per_sm = [](gla::Elem input, int smem_bytes) {
      return gla::chunk_blocks_per_sm(input, smem_bytes);
    };
    cache[size_t(index)] = std::move(props);
  }
  return *cache[size_t(index)];
}

}  // namespace flashgla::cuda

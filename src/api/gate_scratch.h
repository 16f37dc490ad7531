// The fp32 [B,T,H] gate g + g_gamma staged by the entry points whose kernels do
// not read g_gamma themselves (gla.cpp: the CPU and the recurrent kernels; gla_segment.cpp: the CPU): its size
// and where its buffer comes from.
#pragma once

#include <string>
#include <vector>

#include "api/dispatch.h"
#include "core/gla_options_backend.h"
#include "core/problem.h"
#include "flashgla/tensor.h"

namespace flashgla::api {

constexpr size_t kScratchAlign = 256;

// Whether the CUDA kernels read g_gamma themselves (fp32 g_gamma[h] added where they read the scalar gate), so
// that nothing is staged: the chunked ops and the segment summaries. Elsewhere g + g_gamma is staged.
inline bool gamma_in_kernels(const Device& dev, const TensorView& g_gamma) {
  return dev.type == DeviceType::cuda && g_gamma.dtype == DType::f32;
}

inline size_t gate_bytes(const GlaProblem& p) {
  const size_t bytes = size_t(p.batch * p.seq_len * p.heads) * sizeof(float);
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

inline TensorView gate_view(void* data, const GlaProblem& p, const Device& dev) {
  return TensorView::contiguous(data, DType::f32, {p.batch, p.seq_len, p.heads}, dev);
}

class GateScratch {
 public:
  // Takes `bytes` off the front of (workspace, workspace_bytes) when a CUDA workspace is given, else asks
  // `allocate` (the op then asks it a second time for its own scratch), else allocates stream-ordered.
  GateScratch(const Device& dev, size_t bytes, void* stream, void*& workspace, size_t& workspace_bytes,
              const WorkspaceAllocator& allocate)
      : dev_(dev), stream_(stream) {
    if (dev.type == DeviceType::cpu) {
      host_.resize(bytes / sizeof(float) + 1);
      data_ = host_.data();
      return;
    }
    if (bytes == 0) return;  // an empty batch: no gate to stage (a null gate, as cudaMallocAsync(0) gives)
#ifdef FLASHGLA_WITH_CUDA
    if (workspace) {
      FLASHGLA_REQUIRE(workspace_bytes >= bytes, ErrorKind::value, "workspace",
                       "needs at least " + std::to_string(bytes) + " bytes for the g_gamma gate (see *_workspace_bytes), got " +
                           std::to_string(workspace_bytes));
      data_ = workspace;
      workspace = static_cast<char*>(workspace) + bytes, workspace_bytes -= bytes;
    } else if (allocate) {
      data_ = allocate(bytes);
      FLASHGLA_REQUIRE(data_ != nullptr, ErrorKind::runtime, "allocate_workspace",
                       "returned null for " + std::to_string(bytes) + " bytes");
    } else {
      data_ = cuda::scratch_allocate(dev.index, bytes, stream);
      owned_ = true;
    }
#else
    (void)workspace, (void)workspace_bytes, (void)allocate;
#endif
  }
  ~GateScratch() {
#ifdef FLASHGLA_WITH_CUDA
    if (owned_) cuda::scratch_free(dev_.index, data_, stream_);
#endif
  }
  GateScratch(const GateScratch&) = delete;
  GateScratch& operator=(const GateScratch&) = delete;
  char* bytes() const { return static_cast<char*>(data_); }

 private:
  Device dev_;
  void* stream_ = nullptr;
  void* data_ = nullptr;
  bool owned_ = false;
  std::vector<float> host_;
};

}  // namespace flashgla::api

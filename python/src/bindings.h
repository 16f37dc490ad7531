// Shared by the binding files of flashgla._C (module.cpp, norm_bindings.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>

#include "flashgla/tensor.h"

// (data_ptr, dtype, device_type, device_index, shape, strides) or None; defined in module.cpp.
flashgla::TensorView tensor_view_from_python(nanobind::handle spec, const char* name);

// Registers the norm and gate functions; defined in norm_bindings.cpp.
void bind_norm(nanobind::module_& m);

// Registers the per-segment state summaries; defined in segment_bindings.cpp.
void bind_segment(nanobind::module_& m);

// Registers gla_fold_states (context parallelism); defined in fold_bindings.cpp.
void bind_fold(nanobind::module_& m);

// Registers attention_with_kvcache; defined in kvcache_bindings.cpp.
void bind_kvcache(nanobind::module_& m);

inline void* as_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

// The execution fields every args struct with a workspace has: the CUDA stream
// and the caller's scratch (both passed from Python as integers).
template <class Args>
void set_execution(Args& a, uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
  a.stream = as_pointer(stream);
  a.workspace = as_pointer(workspace);
  a.workspace_bytes = workspace_bytes;
}

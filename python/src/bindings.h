// Shared by the binding files of flashgla._C: the C++ API's args structs as
// Python classes with named fields, and how an op runs.
//
// A tensor crosses as a flashgla._C.TensorView (data pointer, dtype, device,
// shape, strides) built from a torch tensor in Python; nothing here is
// compiled against torch. An optional tensor left out is None.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "flashgla/tensor.h"
#include "tools/tuning_env.h"

namespace flashgla_python {

namespace nb = nanobind;

// Registers TensorView and the dtype and device codes it takes; defined in module.cpp.
void bind_common(nb::module_& m);
// Each area's args structs and ops.
void bind_gla(nb::module_& m);        // gla_bindings.cpp
void bind_attention(nb::module_& m);  // attention_bindings.cpp
void bind_norm(nb::module_& m);       // norm_bindings.cpp

// None → a TensorView left out; a TensorView → itself; anything else a TypeError naming the field.
flashgla::TensorView tensor_or_none(nb::handle value, const char* name);

template <class Args>
using TensorField = std::pair<const char*, flashgla::TensorView Args::*>;

// Named TensorView fields of an args struct (None reads back for one left out).
template <class Args>
void tensor_fields(nb::class_<Args>& cls, std::initializer_list<TensorField<Args>> fields) {
  for (const auto& [name, member] : fields) {
    const char* field = name;
    auto tensor = member;
    cls.def_prop_rw(
        field,
        [tensor](const Args& a) -> std::optional<flashgla::TensorView> {
          if (!(a.*tensor).defined()) return std::nullopt;
          return a.*tensor;
        },
        [tensor, field](Args& a, nb::handle value) { a.*tensor = tensor_or_none(value, field); });
  }
}

// The CUDA stream (a cudaStream_t, as torch.cuda.Stream.cuda_stream gives it; 0 is the default stream).
template <class Args>
void stream_field(nb::class_<Args>& cls) {
  cls.def_prop_rw(
      "stream", [](const Args& a) { return reinterpret_cast<uintptr_t>(a.stream); },
      [](Args& a, uintptr_t stream) { a.stream = reinterpret_cast<void*>(stream); });
}

// workspace and workspace_bytes of an args struct: a caller's buffer (a pointer, as data_ptr() gives it) that
// two calls share (GlaPhase); left at 0 the op asks allocate_workspace.
template <class Args>
void workspace_fields(nb::class_<Args>& cls) {
  cls.def_prop_rw(
         "workspace", [](const Args& a) { return reinterpret_cast<uintptr_t>(a.workspace); },
         [](Args& a, uintptr_t at) { a.workspace = reinterpret_cast<void*>(at); })
      .def_rw("workspace_bytes", &Args::workspace_bytes);
}

// The args with the tuning of the FLASHGLA_* environment (tools/tuning_env.h: gla_tuning_from_env,
// attention_tuning_from_env, attention_backward_tuning_from_env), read at every call (a few getenv): the
// Python benchmarks (bench/bench_*.py) change the switches in os.environ between calls.
template <class Args, class Tuning>
Args with_tuning(const Args& args, Tuning (*from_env)()) {
  Args call = args;
  call.tuning = from_env();
  return call;
}

// Runs op(args) with the GIL released: the CPU backend can take a while, and
// other Python threads (data loaders) should not wait on it.
template <class Args>
void run_without_gil(void (*op)(const Args&), const Args& args) {
  nb::gil_scoped_release release;
  op(args);
}

// Runs op(args) for an op that may need device scratch. `allocate`, a Python
// callable bytes -> (buffer, data_ptr), or None where the op needs none (the
// CPU), becomes the op's allocate_workspace: the op asks it after checking and
// planning, once for its own scratch and once more for each staging buffer
// (the g_gamma gate, dense copies of pooled states; see WorkspaceAllocator).
// Every buffer is kept until the op returns; that is long enough because the
// allocator is stream-ordered on the op's stream (torch's caching allocator on
// the current stream). The Python args object is not changed (a copy carries
// the allocator).
template <class Args>
void run_with_workspace(void (*op)(const Args&), const Args& args, nb::handle allocate) {
  if (allocate.is_none()) return run_without_gil(op, args);
  nb::list buffers;  // released with the GIL held, after the op (also when it throws)
  Args call = args;
  call.allocate_workspace = [&buffers, allocate](size_t bytes) -> void* {
    nb::gil_scoped_acquire gil;
    nb::tuple result = nb::cast<nb::tuple>(allocate(bytes));
    if (result.size() != 2) throw nb::type_error("flashgla: allocate_workspace must return (buffer, data_ptr)");
    buffers.append(result[0]);
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(result[1]));
  };
  run_without_gil(op, call);
}

}  // namespace flashgla_python

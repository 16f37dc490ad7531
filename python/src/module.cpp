// flashgla._C: the C++ API as Python functions, for the PyTorch ops in
// python/flashgla. Nothing here computes or allocates tensors.
//
// A tensor crosses as a plain tuple (data_ptr, dtype, device_type,
// device_index, shape, strides) built from a torch tensor in Python, or None
// for an optional argument left out. Pointers, strides and the CUDA stream
// thus pass unchanged, and nothing here is compiled against torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashgla::TensorView;

int64_t as_int(PyObject* obj) {
  const long long value = PyLong_AsLongLong(obj);
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  return value;
}

void read_dims(PyObject* seq, int64_t* out, int ndim, const char* name, const char* what) {
  if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != ndim)
    throw nb::type_error((std::string("flashgla: ") + name + ": " + what + " must be a tuple of " +
                          std::to_string(ndim) + " ints")
                             .c_str());
  for (int d = 0; d < ndim; ++d) out[d] = as_int(PyTuple_GET_ITEM(seq, d));
}

// (data_ptr, dtype, device_type, device_index, shape, strides) or None.
TensorView view_of(nb::handle spec, const char* name) {
  TensorView t;
  if (spec.is_none()) return t;
  PyObject* tuple = spec.ptr();
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 6)
    throw nb::type_error((std::string("flashgla: ") + name +
                          ": expected None or (data_ptr, dtype, device_type, device_index, shape, strides)")
                             .c_str());
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(as_int(PyTuple_GET_ITEM(tuple, 0))));
  const int64_t dtype = as_int(PyTuple_GET_ITEM(tuple, 1));
  if (dtype < 0 || dtype > int64_t(flashgla::DType::i64))
    throw nb::type_error((std::string("flashgla: ") + name + ": unknown dtype code " + std::to_string(dtype)).c_str());
  t.dtype = flashgla::DType(dtype);
  const int64_t device_type = as_int(PyTuple_GET_ITEM(tuple, 2));
  if (device_type != int64_t(flashgla::DeviceType::cpu) && device_type != int64_t(flashgla::DeviceType::cuda))
    throw nb::value_error(
        (std::string("flashgla: ") + name + ": unknown device type code " + std::to_string(device_type)).c_str());
  t.device.type = flashgla::DeviceType(device_type);
  t.device.index = int(as_int(PyTuple_GET_ITEM(tuple, 3)));

  PyObject* shape = PyTuple_GET_ITEM(tuple, 4);
  if (!PyTuple_Check(shape)) throw nb::type_error((std::string("flashgla: ") + name + ": shape must be a tuple").c_str());
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  if (ndim > flashgla::kMaxDims)
    throw nb::value_error((std::string("flashgla: ") + name + ": expected at most " +
                           std::to_string(flashgla::kMaxDims) + " dimensions, got " + std::to_string(ndim))
                              .c_str());
  t.ndim = int(ndim);
  read_dims(shape, t.shape, t.ndim, name, "shape");
  read_dims(PyTuple_GET_ITEM(tuple, 5), t.stride, t.ndim, name, "strides");
  return t;
}

// The inputs GlaForwardArgs and GlaBackwardArgs share.
template <class Args>
void set_gla_inputs(Args& a, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle initial_state,
                    nb::handle cu_seqlens, nb::handle cu_seqlens_host, std::optional<double> scale,
                    flashgla::GlaAlgorithm algorithm, bool reverse) {
  a.q = view_of(q, "q");
  a.k = view_of(k, "k");
  a.v = view_of(v, "v");
  a.g = view_of(g, "g");
  a.initial_state = view_of(initial_state, "initial_state");
  a.cu_seqlens = view_of(cu_seqlens, "cu_seqlens");
  a.cu_seqlens_host = view_of(cu_seqlens_host, "cu_seqlens_host");
  a.scale = scale;
  a.algorithm = algorithm;
  a.reverse = reverse;
}

// The inputs AttentionForwardArgs and AttentionBackwardArgs share.
template <class Args>
void set_attention_inputs(Args& a, nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                          nb::handle cu_seqlens_k, bool causal, std::optional<double> scale,
                          flashgla::AttentionAlgorithm algorithm, nb::handle o, nb::handle lse) {
  a.q = view_of(q, "q");
  a.k = view_of(k, "k");
  a.v = view_of(v, "v");
  a.cu_seqlens_q = view_of(cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_k = view_of(cu_seqlens_k, "cu_seqlens_k");
  a.causal = causal;
  a.scale = scale;
  a.algorithm = algorithm;
  a.o = view_of(o, "o");
  a.lse = view_of(lse, "lse");
}

flashgla::GlaForwardArgs gla_forward_args(nb::handle q, nb::handle k, nb::handle v, nb::handle g,
                                          nb::handle initial_state, nb::handle cu_seqlens,
                                          nb::handle cu_seqlens_host, std::optional<double> scale,
                                          flashgla::GlaAlgorithm algorithm, bool reverse, nb::handle o,
                                          nb::handle final_state, nb::handle initial_state_indices,
                                          nb::handle final_state_indices, nb::handle g_gamma, bool state_v_first) {
  flashgla::GlaForwardArgs a;
  set_gla_inputs(a, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, algorithm, reverse);
  a.g_gamma = view_of(g_gamma, "g_gamma");
  a.state_v_first = state_v_first;
  a.o = view_of(o, "o");
  a.final_state = view_of(final_state, "final_state");
  a.initial_state_indices = view_of(initial_state_indices, "initial_state_indices");
  a.final_state_indices = view_of(final_state_indices, "final_state_indices");
  return a;
}

flashgla::GlaBackwardArgs gla_backward_args(nb::handle q, nb::handle k, nb::handle v, nb::handle g,
                                            nb::handle initial_state, nb::handle cu_seqlens,
                                            nb::handle cu_seqlens_host, std::optional<double> scale,
                                            flashgla::GlaAlgorithm algorithm, bool reverse, nb::handle d_o,
                                            nb::handle d_final_state, nb::handle dq, nb::handle dk, nb::handle dv,
                                            nb::handle dg, nb::handle d_initial_state, nb::handle g_gamma,
                                            nb::handle d_g_gamma, bool state_v_first) {
  flashgla::GlaBackwardArgs a;
  set_gla_inputs(a, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, algorithm, reverse);
  a.g_gamma = view_of(g_gamma, "g_gamma");
  a.d_g_gamma = view_of(d_g_gamma, "d_g_gamma");
  a.state_v_first = state_v_first;
  a.d_o = view_of(d_o, "d_o");
  a.d_final_state = view_of(d_final_state, "d_final_state");
  a.dq = view_of(dq, "dq");
  a.dk = view_of(dk, "dk");
  a.dv = view_of(dv, "dv");
  a.dg = view_of(dg, "dg");
  a.d_initial_state = view_of(d_initial_state, "d_initial_state");
  return a;
}

flashgla::AttentionForwardArgs attention_forward_args(nb::handle q, nb::handle k, nb::handle v,
                                                      nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, bool causal,
                                                      std::optional<double> scale,
                                                      flashgla::AttentionAlgorithm algorithm, nb::handle o,
                                                      nb::handle lse) {
  flashgla::AttentionForwardArgs a;
  set_attention_inputs(a, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse);
  return a;
}

flashgla::AttentionBackwardArgs attention_backward_args(nb::handle q, nb::handle k, nb::handle v,
                                                        nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                                                        bool causal, std::optional<double> scale,
                                                        flashgla::AttentionAlgorithm algorithm, nb::handle o,
                                                        nb::handle lse, nb::handle d_o, nb::handle dq, nb::handle dk,
                                                        nb::handle dv) {
  flashgla::AttentionBackwardArgs a;
  set_attention_inputs(a, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse);
  a.d_o = view_of(d_o, "d_o");
  a.dq = view_of(dq, "dq");
  a.dk = view_of(dk, "dk");
  a.dv = view_of(dv, "dv");
  return a;
}

flashgla::GlaNormalizeBackwardArgs normalize_backward_args(nb::handle o_raw, nb::handle q, nb::handle k,
                                                          nb::handle z_init, nb::handle cu_seqlens,
                                                          nb::handle cu_seqlens_host, std::optional<double> scale,
                                                          bool reverse, nb::handle d_o, nb::handle d_z_final,
                                                          nb::handle d_o_raw, nb::handle dq, nb::handle dk,
                                                          nb::handle d_z_init) {
  flashgla::GlaNormalizeBackwardArgs a;
  a.o_raw = view_of(o_raw, "o_raw"), a.q = view_of(q, "q"), a.k = view_of(k, "k");
  a.z_init = view_of(z_init, "z_init"), a.cu_seqlens = view_of(cu_seqlens, "cu_seqlens");
  a.cu_seqlens_host = view_of(cu_seqlens_host, "cu_seqlens_host");
  a.scale = scale, a.reverse = reverse;
  a.d_o = view_of(d_o, "d_o"), a.d_z_final = view_of(d_z_final, "d_z_final");
  a.d_o_raw = view_of(d_o_raw, "d_o_raw"), a.dq = view_of(dq, "dq"), a.dk = view_of(dk, "dk");
  a.d_z_init = view_of(d_z_init, "d_z_init");
  return a;
}

// Runs an op with the GIL released: the CPU backend can take a while, and
// other Python threads (data loaders) should not wait on it.
template <class Fn>
auto without_gil(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

}  // namespace

flashgla::TensorView tensor_view_from_python(nb::handle spec, const char* name) { return view_of(spec, name); }

NB_MODULE(_C, m) {
  m.doc() = "flashgla's C++ API; use the PyTorch ops in the flashgla package rather than these functions.";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashgla::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      switch (e.kind()) {
        case flashgla::ErrorKind::value: type = PyExc_ValueError; break;
        case flashgla::ErrorKind::type: type = PyExc_TypeError; break;
        case flashgla::ErrorKind::unsupported: type = PyExc_NotImplementedError; break;
        case flashgla::ErrorKind::runtime: type = PyExc_RuntimeError; break;
      }
      PyErr_SetString(type, e.what());
    }
  });

  m.attr("__version__") = flashgla::version();
  m.def("version", &flashgla::version, "The C++ library's version.");
  m.def("cuda_available", &flashgla::cuda_available, "Built with CUDA and at least one device visible.");
  m.def("cuda_device_count", &flashgla::cuda_device_count);
  m.def("reload_tuning", &flashgla::reload_tuning,
        "Read the FLASHGLA_GLA_* tuning switches from the environment again at the next call (benchmarks).");
#ifdef FLASHGLA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  // Codes of the tensor tuples (see view_of).
  nb::dict dtypes;
  for (auto d : {flashgla::DType::f64, flashgla::DType::f32, flashgla::DType::bf16, flashgla::DType::f16,
                 flashgla::DType::i32, flashgla::DType::i64})
    dtypes[flashgla::dtype_name(d)] = int(d);
  m.attr("DTYPES") = dtypes;
  m.attr("DEVICE_CPU") = int(flashgla::DeviceType::cpu);
  m.attr("DEVICE_CUDA") = int(flashgla::DeviceType::cuda);

  nb::enum_<flashgla::GlaAlgorithm>(m, "GlaAlgorithm")
      .value("chunked", flashgla::GlaAlgorithm::chunked)
      .value("recurrent", flashgla::GlaAlgorithm::recurrent);
  nb::enum_<flashgla::AttentionAlgorithm>(m, "AttentionAlgorithm")
      .value("tiled", flashgla::AttentionAlgorithm::tiled)
      .value("naive", flashgla::AttentionAlgorithm::naive);

  m.def(
      "gla_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle initial_state, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, flashgla::GlaAlgorithm algorithm, bool reverse,
         nb::handle o, nb::handle final_state, nb::handle initial_state_indices, nb::handle final_state_indices,
         nb::handle g_gamma, bool state_v_first, uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
        auto a = gla_forward_args(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, algorithm, reverse,
                                  o, final_state, initial_state_indices, final_state_indices, g_gamma, state_v_first);
        set_execution(a, stream, workspace, workspace_bytes);
        without_gil([&] { flashgla::gla_forward(a); });
      },
      "q"_a, "k"_a, "v"_a, "g"_a.none(), "initial_state"_a.none(), "cu_seqlens"_a.none(),
      "cu_seqlens_host"_a.none(), "scale"_a.none(), "algorithm"_a, "reverse"_a, "o"_a, "final_state"_a.none(),
      "initial_state_indices"_a.none() = nb::none(), "final_state_indices"_a.none() = nb::none(),
      "g_gamma"_a.none() = nb::none(), "state_v_first"_a = false, "stream"_a = 0, "workspace"_a = 0,
      "workspace_bytes"_a = 0);

  m.def(
      "gla_forward_workspace_bytes",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle initial_state, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, flashgla::GlaAlgorithm algorithm, bool reverse,
         nb::handle o, nb::handle final_state, nb::handle initial_state_indices, nb::handle final_state_indices,
         nb::handle g_gamma, bool state_v_first) {
        return flashgla::gla_forward_workspace_bytes(
            gla_forward_args(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, algorithm, reverse, o,
                             final_state, initial_state_indices, final_state_indices, g_gamma, state_v_first));
      },
      "q"_a, "k"_a, "v"_a, "g"_a.none(), "initial_state"_a.none(), "cu_seqlens"_a.none(),
      "cu_seqlens_host"_a.none(), "scale"_a.none(), "algorithm"_a, "reverse"_a, "o"_a, "final_state"_a.none(),
      "initial_state_indices"_a.none() = nb::none(), "final_state_indices"_a.none() = nb::none(),
      "g_gamma"_a.none() = nb::none(), "state_v_first"_a = false);

  m.def(
      "gla_backward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle initial_state, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, flashgla::GlaAlgorithm algorithm, bool reverse,
         nb::handle d_o, nb::handle d_final_state, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle dg,
         nb::handle d_initial_state, nb::handle g_gamma, nb::handle d_g_gamma, bool state_v_first, uintptr_t stream,
         uintptr_t workspace, size_t workspace_bytes) {
        auto a = gla_backward_args(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, algorithm, reverse,
                                   d_o, d_final_state, dq, dk, dv, dg, d_initial_state, g_gamma, d_g_gamma,
                                   state_v_first);
        set_execution(a, stream, workspace, workspace_bytes);
        without_gil([&] { flashgla::gla_backward(a); });
      },
      "q"_a, "k"_a, "v"_a, "g"_a.none(), "initial_state"_a.none(), "cu_seqlens"_a.none(),
      "cu_seqlens_host"_a.none(), "scale"_a.none(), "algorithm"_a, "reverse"_a, "d_o"_a, "d_final_state"_a.none(),
      "dq"_a, "dk"_a, "dv"_a, "dg"_a.none(), "d_initial_state"_a.none(), "g_gamma"_a.none() = nb::none(),
      "d_g_gamma"_a.none() = nb::none(), "state_v_first"_a = false, "stream"_a = 0, "workspace"_a = 0,
      "workspace_bytes"_a = 0);

  m.def(
      "gla_backward_workspace_bytes",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle initial_state, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, flashgla::GlaAlgorithm algorithm, bool reverse,
         nb::handle d_o, nb::handle d_final_state, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle dg,
         nb::handle d_initial_state, nb::handle g_gamma, nb::handle d_g_gamma, bool state_v_first) {
        return flashgla::gla_backward_workspace_bytes(gla_backward_args(q, k, v, g, initial_state, cu_seqlens,
                                                                        cu_seqlens_host, scale, algorithm, reverse,
                                                                        d_o, d_final_state, dq, dk, dv, dg,
                                                                        d_initial_state, g_gamma, d_g_gamma,
                                                                        state_v_first));
      },
      "q"_a, "k"_a, "v"_a, "g"_a.none(), "initial_state"_a.none(), "cu_seqlens"_a.none(),
      "cu_seqlens_host"_a.none(), "scale"_a.none(), "algorithm"_a, "reverse"_a, "d_o"_a, "d_final_state"_a.none(),
      "dq"_a, "dk"_a, "dv"_a, "dg"_a.none(), "d_initial_state"_a.none(), "g_gamma"_a.none() = nb::none(),
      "d_g_gamma"_a.none() = nb::none(), "state_v_first"_a = false);

  // The linear-attention normaliser (flashgla/gla_normalize.h).
  m.def(
      "gla_normalize_forward",
      [](nb::handle o_raw, nb::handle q, nb::handle k, nb::handle z_init, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, bool reverse, nb::handle o, nb::handle z_final,
         uintptr_t stream) {
        flashgla::GlaNormalizeArgs a;
        a.o_raw = view_of(o_raw, "o_raw"), a.q = view_of(q, "q"), a.k = view_of(k, "k");
        a.z_init = view_of(z_init, "z_init"), a.cu_seqlens = view_of(cu_seqlens, "cu_seqlens");
        a.cu_seqlens_host = view_of(cu_seqlens_host, "cu_seqlens_host");
        a.scale = scale, a.reverse = reverse;
        a.o = view_of(o, "o"), a.z_final = view_of(z_final, "z_final");
        a.stream = as_pointer(stream);
        without_gil([&] { flashgla::gla_normalize_forward(a); });
      },
      "o_raw"_a, "q"_a, "k"_a, "z_init"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(),
      "scale"_a.none(), "reverse"_a, "o"_a, "z_final"_a.none(), "stream"_a = 0);

  m.def(
      "gla_normalize_backward",
      [](nb::handle o_raw, nb::handle q, nb::handle k, nb::handle z_init, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, bool reverse, nb::handle d_o, nb::handle d_z_final,
         nb::handle d_o_raw, nb::handle dq, nb::handle dk, nb::handle d_z_init, uintptr_t stream, uintptr_t workspace,
         size_t workspace_bytes) {
        auto a = normalize_backward_args(o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, scale, reverse, d_o,
                                         d_z_final, d_o_raw, dq, dk, d_z_init);
        set_execution(a, stream, workspace, workspace_bytes);
        without_gil([&] { flashgla::gla_normalize_backward(a); });
      },
      "o_raw"_a, "q"_a, "k"_a, "z_init"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(),
      "scale"_a.none(), "reverse"_a, "d_o"_a, "d_z_final"_a.none(), "d_o_raw"_a, "dq"_a, "dk"_a,
      "d_z_init"_a.none(), "stream"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "gla_normalize_backward_workspace_bytes",
      [](nb::handle o_raw, nb::handle q, nb::handle k, nb::handle z_init, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, std::optional<double> scale, bool reverse, nb::handle d_o, nb::handle d_z_final,
         nb::handle d_o_raw, nb::handle dq, nb::handle dk, nb::handle d_z_init) {
        return flashgla::gla_normalize_backward_workspace_bytes(normalize_backward_args(
            o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, scale, reverse, d_o, d_z_final, d_o_raw, dq, dk,
            d_z_init));
      },
      "o_raw"_a, "q"_a, "k"_a, "z_init"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(),
      "scale"_a.none(), "reverse"_a, "d_o"_a, "d_z_final"_a.none(), "d_o_raw"_a, "dq"_a, "dk"_a,
      "d_z_init"_a.none());

  m.def(
      "gla_decode",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle state, std::optional<double> scale,
         nb::handle o, uintptr_t stream, nb::handle state_indices, nb::handle token_states) {
        flashgla::GlaDecodeArgs a;
        a.q = view_of(q, "q");
        a.k = view_of(k, "k");
        a.v = view_of(v, "v");
        a.g = view_of(g, "g");
        a.state = view_of(state, "state");
        a.state_indices = view_of(state_indices, "state_indices");
        a.scale = scale;
        a.o = view_of(o, "o");
        a.token_states = view_of(token_states, "token_states");
        a.stream = as_pointer(stream);
        without_gil([&] { flashgla::gla_decode(a); });
      },
      "q"_a, "k"_a, "v"_a, "g"_a.none(), "state"_a, "scale"_a.none(), "o"_a, "stream"_a = 0,
      "state_indices"_a.none() = nb::none(), "token_states"_a.none() = nb::none());

  m.def(
      "attention_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, bool causal,
         std::optional<double> scale, flashgla::AttentionAlgorithm algorithm, nb::handle o, nb::handle lse,
         uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
        auto a = attention_forward_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse);
        set_execution(a, stream, workspace, workspace_bytes);
        without_gil([&] { flashgla::attention_forward(a); });
      },
      "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "causal"_a, "scale"_a.none(),
      "algorithm"_a, "o"_a, "lse"_a, "stream"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "attention_forward_workspace_bytes",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, bool causal,
         std::optional<double> scale, flashgla::AttentionAlgorithm algorithm, nb::handle o, nb::handle lse) {
        return flashgla::attention_forward_workspace_bytes(
            attention_forward_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse));
      },
      "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "causal"_a, "scale"_a.none(),
      "algorithm"_a, "o"_a, "lse"_a);

  m.def(
      "attention_backward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, bool causal,
         std::optional<double> scale, flashgla::AttentionAlgorithm algorithm, nb::handle o, nb::handle lse,
         nb::handle d_o, nb::handle dq, nb::handle dk, nb::handle dv, uintptr_t stream, uintptr_t workspace,
         size_t workspace_bytes) {
        auto a = attention_backward_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse, d_o,
                                         dq, dk, dv);
        set_execution(a, stream, workspace, workspace_bytes);
        without_gil([&] { flashgla::attention_backward(a); });
      },
      "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "causal"_a, "scale"_a.none(),
      "algorithm"_a, "o"_a, "lse"_a, "d_o"_a, "dq"_a, "dk"_a, "dv"_a, "stream"_a = 0, "workspace"_a = 0,
      "workspace_bytes"_a = 0);

  m.def(
      "attention_backward_workspace_bytes",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, bool causal,
         std::optional<double> scale, flashgla::AttentionAlgorithm algorithm, nb::handle o, nb::handle lse,
         nb::handle d_o, nb::handle dq, nb::handle dk, nb::handle dv) {
        return flashgla::attention_backward_workspace_bytes(attention_backward_args(
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, algorithm, o, lse, d_o, dq, dk, dv));
      },
      "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "causal"_a, "scale"_a.none(),
      "algorithm"_a, "o"_a, "lse"_a, "d_o"_a, "dq"_a, "dk"_a, "dv"_a);

  bind_norm(m);     // gated RMSNorm and log-sigmoid gate (norm_bindings.cpp)
  bind_segment(m);  // per-segment state summaries for context parallelism (segment_bindings.cpp)
  bind_fold(m);     // context parallelism's fold of state summaries (fold_bindings.cpp)
  bind_kvcache(m);  // attention over a KV cache (kvcache_bindings.cpp)
}

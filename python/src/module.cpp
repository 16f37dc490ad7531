// flashgla._C: the C++ API for the PyTorch ops in python/flashgla/ops. Each op
// takes its args struct (flashgla._C.GlaForwardArgs, ...), a Python class with
// the C++ struct's field names, built by name in Python. Nothing here computes
// or allocates tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <exception>
#include <string>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace flashgla_python {

using namespace nb::literals;
using flashgla::TensorView;

namespace {

[[noreturn]] void fail(nb::exception_type kind, const char* name, const std::string& what) {
  const std::string message = std::string("flashgla: ") + name + ": " + what;
  if (kind == nb::exception_type::type_error) throw nb::type_error(message.c_str());
  throw nb::value_error(message.c_str());
}

void read_dims(nb::handle seq, int64_t* out, int ndim, const char* name, const char* what) {
  if (!PyTuple_Check(seq.ptr()) || PyTuple_GET_SIZE(seq.ptr()) != ndim)
    fail(nb::exception_type::type_error, name,
         std::string(what) + " must be a tuple of " + std::to_string(ndim) + " ints");
  for (int d = 0; d < ndim; ++d) {
    const long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(seq.ptr(), d));
    if (value == -1 && PyErr_Occurred()) throw nb::python_error();
    out[d] = value;
  }
}

// flashgla._C.TensorView(data, dtype, device_type, device_index, shape, strides, name): dtype and
// device_type are the codes of DTYPES and DEVICE_CPU / DEVICE_CUDA; name only names the tensor in errors.
void init_tensor_view(TensorView* t, uintptr_t data, int dtype, int device_type, int device_index, nb::handle shape,
                      nb::handle strides, const char* name) {
  new (t) TensorView();
  t->data = reinterpret_cast<void*>(data);
  if (dtype < 0 || dtype > int(flashgla::DType::i64))
    fail(nb::exception_type::type_error, name, "unknown dtype code " + std::to_string(dtype));
  t->dtype = flashgla::DType(dtype);
  if (device_type != int(flashgla::DeviceType::cpu) && device_type != int(flashgla::DeviceType::cuda))
    fail(nb::exception_type::value_error, name, "unknown device type code " + std::to_string(device_type));
  t->device.type = flashgla::DeviceType(device_type);
  t->device.index = device_index;
  if (!PyTuple_Check(shape.ptr())) fail(nb::exception_type::type_error, name, "shape must be a tuple");
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > flashgla::kMaxDims)
    fail(nb::exception_type::value_error, name,
         "expected at most " + std::to_string(flashgla::kMaxDims) + " dimensions, got " + std::to_string(ndim));
  t->ndim = int(ndim);
  read_dims(shape, t->shape, t->ndim, name, "shape");
  read_dims(strides, t->stride, t->ndim, name, "strides");
}

nb::tuple dims(const int64_t* values, int ndim) {
  nb::list out;
  for (int d = 0; d < ndim; ++d) out.append(values[d]);
  return nb::tuple(out);
}

}  // namespace

TensorView tensor_or_none(nb::handle value, const char* name) {
  if (value.is_none()) return TensorView{};
  if (!nb::isinstance<TensorView>(value))
    fail(nb::exception_type::type_error, name,
         std::string("expected a flashgla._C.TensorView or None, got ") + nb::inst_name(value).c_str());
  return nb::cast<const TensorView&>(value);
}

void bind_common(nb::module_& m) {
  nb::class_<TensorView>(m, "TensorView", "A strided tensor an op reads or writes (flashgla/tensor.h).")
      .def("__init__", &init_tensor_view, "data"_a, "dtype"_a, "device_type"_a, "device_index"_a, "shape"_a,
           "strides"_a, "name"_a = "tensor")
      .def_prop_ro("data", [](const TensorView& t) { return reinterpret_cast<uintptr_t>(t.data); })
      .def_prop_ro("dtype", [](const TensorView& t) { return std::string(flashgla::dtype_name(t.dtype)); })
      .def_prop_ro("device", [](const TensorView& t) { return t.device.str(); })
      .def_prop_ro("shape", [](const TensorView& t) { return dims(t.shape, t.ndim); })
      .def_prop_ro("strides", [](const TensorView& t) { return dims(t.stride, t.ndim); })
      .def("__repr__", [](const TensorView& t) {
        return "TensorView(" + std::string(flashgla::dtype_name(t.dtype)) + ", " + t.shape_str() + ", " +
               t.device.str() + ")";
      });

  // The codes TensorView takes.
  nb::dict dtypes;
  for (auto d : {flashgla::DType::f64, flashgla::DType::f32, flashgla::DType::bf16, flashgla::DType::f16,
                 flashgla::DType::i32, flashgla::DType::i64})
    dtypes[flashgla::dtype_name(d)] = int(d);
  m.attr("DTYPES") = dtypes;
  m.attr("DEVICE_CPU") = int(flashgla::DeviceType::cpu);
  m.attr("DEVICE_CUDA") = int(flashgla::DeviceType::cuda);
}

}  // namespace flashgla_python

namespace nb = nanobind;

NB_MODULE(_C, m) {
  namespace fp = flashgla_python;
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
#ifdef FLASHGLA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  fp::bind_common(m);
  fp::bind_gla(m);
  fp::bind_attention(m);
  fp::bind_norm(m);
}

// gla_fold_states: check every argument, dispatch.
#include <string>

#include "api/checks.h"
#include "core/gla_fold_backend.h"

namespace flashgla {

void gla_fold_states(const GlaFoldStatesArgs& a) {
  const TensorView& s = a.states;
  FLASHGLA_REQUIRE(s.defined(), ErrorKind::value, "states", "is required: expected [P, M, K, V]");
  check::tensor(s, "states", 4, "[P, M, K, V]");
  FLASHGLA_REQUIRE(s.dtype == DType::f32 || s.dtype == DType::f64, ErrorKind::type, "states",
                   std::string("expected float32 (or float64 on the CPU), got ") + dtype_name(s.dtype));
  const Device dev = s.device;
#ifndef FLASHGLA_WITH_CUDA
  FLASHGLA_REQUIRE(dev.type == DeviceType::cpu, ErrorKind::unsupported, "states",
                   "tensors are on " + dev.str() + " but this flashgla was built without CUDA");
#endif
  FLASHGLA_REQUIRE(dev.type == DeviceType::cpu || s.dtype == DType::f32, ErrorKind::unsupported, "states",
                   "float64 is supported on the CPU only");
  const int64_t P = s.shape[0], M = s.shape[1], K = s.shape[2], V = s.shape[3];
  FLASHGLA_REQUIRE(a.log_decay.defined(), ErrorKind::value, "log_decay",
                   "is required: expected " + check::shape_of({P, M, K}) + " ([P, M, K])");
  check::shape(a.log_decay, "log_decay", {P, M, K}, "[P, M, K]");
  check::dtype(a.log_decay, "log_decay", s.dtype);
  check::device(a.log_decay, "log_decay", dev, "states");
  FLASHGLA_REQUIRE(a.out.defined(), ErrorKind::value, "out",
                   "is required: expected " + check::shape_of({M, K, V}) + " ([M, K, V])");
  check::shape(a.out, "out", {M, K, V}, "[M, K, V]", /*is_output=*/true);
  check::dtype(a.out, "out", s.dtype);
  check::device(a.out, "out", dev, "states");
  if (a.initial.defined()) {
    check::shape(a.initial, "initial", {M, K, V}, "[M, K, V]");
    check::dtype(a.initial, "initial", s.dtype);
    check::device(a.initial, "initial", dev, "states");
  }
  FLASHGLA_REQUIRE(0 <= a.begin && a.begin <= a.end && a.end <= P, ErrorKind::value, "begin",
                   "expected 0 <= begin <= end <= P = " + std::to_string(P) + ", got begin = " +
                       std::to_string(a.begin) + ", end = " + std::to_string(a.end));
  if (a.out.numel() == 0) return;
  if (dev.type == DeviceType::cpu) return cpu::gla_fold_states(a);
#ifdef FLASHGLA_WITH_CUDA
  cuda::gla_fold_states(a);
#endif
}

}  // namespace flashgla

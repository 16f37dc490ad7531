// Routes a checked call to the backend of its device.
#pragma once

#include "api/checks.h"
#include "core/backend.h"

namespace flashgla {

// `lead` names the argument an error about the device names (the op's first tensor).
#ifdef FLASHGLA_WITH_CUDA
#define FLASHGLA_DISPATCH_AS(device, lead, fn, ...) \
  ((device).type == DeviceType::cpu ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))
#else
#define FLASHGLA_DISPATCH_AS(device, lead, fn, ...)                                                     \
  ((device).type == DeviceType::cpu                                                                    \
       ? cpu::fn(__VA_ARGS__)                                                                          \
       : check::fail(ErrorKind::unsupported, lead,                                                     \
                     "tensors are on " + (device).str() + " but this flashgla was built without CUDA"))
#endif
#define FLASHGLA_DISPATCH(device, fn, ...) FLASHGLA_DISPATCH_AS(device, "q", fn, __VA_ARGS__)

// The scratch a call needs: the CUDA backend's plan for `problem` (the checked call's sizes, evaluated on every
// device, so the query checks its arguments everywhere), 0 on the CPU.
#ifdef FLASHGLA_WITH_CUDA
inline constexpr bool kCudaBackend = true;
#define FLASHGLA_WORKSPACE_BYTES(device, fn, args, problem) \
  ((device).type == DeviceType::cuda ? cuda::fn(args, problem) : ((void)(problem), size_t(0)))
#else
inline constexpr bool kCudaBackend = false;
#define FLASHGLA_WORKSPACE_BYTES(device, fn, args, problem) ((void)(problem), size_t(0))
#endif

}  // namespace flashgla

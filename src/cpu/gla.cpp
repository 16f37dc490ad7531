// PLACEHOLDER: replaced by the CPU GLA backend.
#include "api/checks.h"
#include "core/backend.h"

namespace flashgla::cpu {
void gla_forward(const GlaForwardArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CPU GLA forward: not implemented yet"); }
void gla_backward(const GlaBackwardArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CPU GLA backward: not implemented yet"); }
void gla_decode(const GlaDecodeArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CPU GLA decode: not implemented yet"); }
}  // namespace flashgla::cpu

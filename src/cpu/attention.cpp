// PLACEHOLDER: replaced by the CPU attention backend.
#include "api/checks.h"
#include "core/backend.h"

namespace flashgla::cpu {
void attention_forward(const AttentionForwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CPU attention: not implemented yet"); }
void attention_backward(const AttentionBackwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CPU attention: not implemented yet"); }
}  // namespace flashgla::cpu

// The FLASHGLA_* tuning switches of the environment as the tuning structs the ops take (flashgla/tuning.h).
// For the flashgla command, the benchmarks, the tests and the Python extension; the library never calls these.
// Unset or empty leaves the library's choice; any other value must be one the switch knows, else a
// flashgla::Error (ErrorKind::value) names the variable (a typo must not silently measure or test the default).
#pragma once

#include <functional>

#include "flashgla/tuning.h"

namespace flashgla {

// A switch's value by name, nullptr when unset (std::getenv, or a test's own settings).
using SwitchLookup = std::function<const char*(const char* name)>;

// FLASHGLA_GLA_*: the variables named next to GlaTuning's fields.
GlaTuning gla_tuning_from_env();
GlaTuning gla_tuning_from(const SwitchLookup& lookup);
// FLASHGLA_ATTENTION_KERNEL (auto | portable | hopper): the forward's kernel.
AttentionTuning attention_tuning_from_env();
// FLASHGLA_ATTENTION_BACKWARD (auto | portable | hopper): the backward's kernel.
AttentionTuning attention_backward_tuning_from_env();

}  // namespace flashgla

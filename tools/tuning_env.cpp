#include "tools/tuning_env.h"

#include <cstdlib>
#include <string>

#include "tools/env.h"

namespace flashgla {
namespace {

GlaTuning::Force force(const std::string& choice, const char* off, const char* on) {
  return choice == off ? GlaTuning::Force::off : choice == on ? GlaTuning::Force::on : GlaTuning::Force::library;
}

AttentionTuning attention_kernel_from(const char* variable) {
  const std::string value = env_choice(variable, std::getenv(variable), {"auto", "portable", "hopper"});
  AttentionTuning t;
  if (value == "portable") t.kernel = AttentionTuning::Kernel::portable;
  if (value == "hopper") t.kernel = AttentionTuning::Kernel::hopper;
  return t;  // unset, empty or "auto": the library's
}

}  // namespace

GlaTuning gla_tuning_from_env() { return gla_tuning_from([](const char* name) { return std::getenv(name); }); }

GlaTuning gla_tuning_from(const SwitchLookup& lookup) {
  auto choice = [&](const char* name, std::initializer_list<const char*> allowed) {
    return env_choice(name, lookup(name), allowed);
  };
  auto count = [&](const char* name, int64_t unset, int64_t minimum) {
    return env_count(name, lookup(name), unset, minimum);
  };
  GlaTuning t;
  t.fast = choice("FLASHGLA_GLA_FAST", {"0", "1"}) != "0";
  t.hopper = force(choice("FLASHGLA_GLA_HOPPER", {"0", "1"}), "0", "1");
  t.splits = count("FLASHGLA_GLA_SPLITS", 0, 1);
  t.state_pieces = count("FLASHGLA_GLA_STATE_PIECES", 0, 1);
  t.hopper_pdl = choice("FLASHGLA_GLA_HOPPER_PDL", {"0", "1"}) != "0";
  t.bwd_scan_pairs = choice("FLASHGLA_GLA_BWD_SCAN_PAIR", {"0", "1"}) != "0";
  t.bwd_scan_pipeline = choice("FLASHGLA_GLA_BWD_SCAN_PIPELINE", {"0", "lean"}) != "0";
  t.bwd_scan_split = count("FLASHGLA_GLA_BWD_SCAN_SPLIT", -1, 0);
  t.bwd_diag_elementwise = choice("FLASHGLA_GLA_BWD_DIAG", {"factored", "elementwise"}) == "elementwise";
  t.bwd_general_layout = choice("FLASHGLA_GLA_BWD_LAYOUT", {"general"}) == "general";
  t.bwd_overlap = force(choice("FLASHGLA_GLA_BWD_OVERLAP", {"0", "1"}), "0", "1");
  t.bwd_norm_chain = force(choice("FLASHGLA_GLA_BWD_NORM", {"passes", "chain"}), "passes", "chain");
  t.segment_pieces = count("FLASHGLA_GLA_SEGMENT_PIECES", 0, 1);
  t.segment_split_kernel = force(choice("FLASHGLA_GLA_SEGMENT_KERNEL", {"split", "generic"}), "generic", "split");
  return t;
}

AttentionTuning attention_tuning_from_env() { return attention_kernel_from("FLASHGLA_ATTENTION_KERNEL"); }

AttentionTuning attention_backward_tuning_from_env() { return attention_kernel_from("FLASHGLA_ATTENTION_BACKWARD"); }

}  // namespace flashgla

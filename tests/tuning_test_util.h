// The tuning the tests pass with every call (the args' `tuning` field). A whole run is steered from outside by
// the FLASHGLA_* environment variables (e.g. FLASHGLA_ATTENTION_KERNEL=hopper in scripts/gpu_arch_check.sh),
// read through tools/tuning_env.h like the command and the benchmarks do. A test forces a path for a scope with
// a ScopedTuning (t.splits = 3), or a ScopedSetting in the variables' words (FLASHGLA_GLA_SPLITS=3); either
// overrides the environment's value.
#pragma once

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashgla/tuning.h"
#include "tools/tuning_env.h"

namespace flashgla::testing {

// Settings in force over the environment's: a value, or nullopt for "unset" (the library's choice).
inline std::map<std::string, std::optional<std::string>>& scoped_settings() {
  static std::map<std::string, std::optional<std::string>> settings;
  return settings;
}

// Changes in force (ScopedTuning), applied in order over the environment's tuning.
inline std::vector<std::function<void(GlaTuning&)>>& scoped_tuning_changes() {
  static std::vector<std::function<void(GlaTuning&)>> changes;
  return changes;
}

// A switch's value in force: the scoped setting where there is one, else the environment's (nullptr: unset).
inline const char* switch_value(const char* name) {
  const auto& settings = scoped_settings();
  const auto it = settings.find(name);
  if (it == settings.end()) return std::getenv(name);
  return it->second ? it->second->c_str() : nullptr;
}

// The GLA tuning of the next call: the environment's FLASHGLA_GLA_* with the scoped settings and changes over
// it. A bad value throws flashgla::Error naming the switch (from the call that builds the args).
inline GlaTuning test_gla_tuning() {
  GlaTuning tuning = gla_tuning_from(switch_value);
  for (const auto& change : scoped_tuning_changes()) change(tuning);
  return tuning;
}

// Changes the tuning of the calls made during the guard's lifetime:
//   const ScopedTuning split([](GlaTuning& t) { t.splits = 3; });
class ScopedTuning {
 public:
  explicit ScopedTuning(std::function<void(GlaTuning&)> change) {
    scoped_tuning_changes().push_back(std::move(change));
  }
  ~ScopedTuning() { scoped_tuning_changes().pop_back(); }
  ScopedTuning(const ScopedTuning&) = delete;
  ScopedTuning& operator=(const ScopedTuning&) = delete;
};

// Common changes: the Hopper path forced on, or off (on sm_90a it takes K > 128 by default), or left to the
// library whatever the environment says.
inline void hopper_on(GlaTuning& t) { t.hopper = GlaTuning::Force::on; }
inline void hopper_off(GlaTuning& t) { t.hopper = GlaTuning::Force::off; }
inline void hopper_library(GlaTuning& t) { t.hopper = GlaTuning::Force::library; }

inline AttentionTuning test_attention_tuning() {
  static const AttentionTuning tuning = attention_tuning_from_env();
  return tuning;
}

inline AttentionTuning test_attention_backward_tuning() {
  static const AttentionTuning tuning = attention_backward_tuning_from_env();
  return tuning;
}

// Sets a tuning switch for the calls that follow (value nullptr: unset, the library's choice), or, with
// `clear`, goes back to the environment's value.
inline void set_switch(const char* name, const char* value) {
  if (value) scoped_settings()[name] = std::string(value);
  else scoped_settings()[name] = std::nullopt;
}
inline void clear_switch(const char* name) { scoped_settings().erase(name); }

// Sets a tuning switch (or unsets it: value nullptr) for the guard's lifetime, then restores what was in force.
class ScopedSetting {
 public:
  ScopedSetting(const char* name, const char* value) : name_(name) {
    const auto& settings = scoped_settings();
    const auto it = settings.find(name);
    if (it != settings.end()) saved_ = it->second, had_ = true;
    set_switch(name, value);
  }
  ~ScopedSetting() {
    if (had_) scoped_settings()[name_] = saved_;
    else clear_switch(name_.c_str());
  }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  std::string name_;
  std::optional<std::string> saved_;
  bool had_ = false;
};

}  // namespace flashgla::testing

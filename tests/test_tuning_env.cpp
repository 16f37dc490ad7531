// tools/tuning_env: the FLASHGLA_* switches of the environment as the ops' tuning structs (the command, the
// benchmarks and the tests read them there; the library reads none).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "flashgla/error.h"
#include "tools/tuning_env.h"

namespace flashgla {
namespace {

using Force = GlaTuning::Force;

// Sets environment variables for a scope and restores them.
class Environment {
 public:
  void set(const char* name, const char* value) {
    if (const char* old = std::getenv(name)) saved_.push_back({name, old, true});
    else saved_.push_back({name, "", false});
    setenv(name, value, 1);
  }
  ~Environment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
      if (it->had) setenv(it->name, it->value.c_str(), 1);
      else unsetenv(it->name);
  }

 private:
  struct Saved {
    const char* name;
    std::string value;
    bool had;
  };
  std::vector<Saved> saved_;
};

const char* const kSwitches[] = {
    "FLASHGLA_GLA_FAST",         "FLASHGLA_GLA_HOPPER",           "FLASHGLA_GLA_SPLITS",
    "FLASHGLA_GLA_STATE_PIECES", "FLASHGLA_GLA_HOPPER_PDL",       "FLASHGLA_GLA_BWD_SCAN_PAIR",
    "FLASHGLA_GLA_BWD_SCAN_PIPELINE", "FLASHGLA_GLA_BWD_SCAN_SPLIT", "FLASHGLA_GLA_BWD_DIAG",
    "FLASHGLA_GLA_BWD_LAYOUT",   "FLASHGLA_GLA_BWD_OVERLAP",      "FLASHGLA_GLA_SEGMENT_PIECES",
    "FLASHGLA_GLA_SEGMENT_KERNEL", "FLASHGLA_GLA_BWD_NORM"};

TEST(TuningEnv, GlaTuningFromEnvironment) {
  Environment env;
  for (const char* name : kSwitches) env.set(name, "");  // empty: the library's choice
  const GlaTuning defaults = gla_tuning_from_env();
  EXPECT_TRUE(defaults.fast);
  EXPECT_EQ(defaults.hopper, Force::library);
  EXPECT_EQ(defaults.splits, 0);
  EXPECT_EQ(defaults.bwd_scan_split, -1);
  EXPECT_EQ(defaults.segment_split_kernel, Force::library);

  env.set("FLASHGLA_GLA_FAST", "0");
  env.set("FLASHGLA_GLA_HOPPER", "1");
  env.set("FLASHGLA_GLA_SPLITS", "7");
  env.set("FLASHGLA_GLA_STATE_PIECES", "2");
  env.set("FLASHGLA_GLA_HOPPER_PDL", "0");
  env.set("FLASHGLA_GLA_BWD_SCAN_PAIR", "0");
  env.set("FLASHGLA_GLA_BWD_SCAN_PIPELINE", "0");
  env.set("FLASHGLA_GLA_BWD_SCAN_SPLIT", "0");
  env.set("FLASHGLA_GLA_BWD_DIAG", "elementwise");
  env.set("FLASHGLA_GLA_BWD_LAYOUT", "general");
  env.set("FLASHGLA_GLA_BWD_OVERLAP", "1");
  env.set("FLASHGLA_GLA_BWD_NORM", "passes");
  env.set("FLASHGLA_GLA_SEGMENT_PIECES", "4");
  env.set("FLASHGLA_GLA_SEGMENT_KERNEL", "generic");
  const GlaTuning t = gla_tuning_from_env();
  EXPECT_FALSE(t.fast);
  EXPECT_EQ(t.hopper, Force::on);
  EXPECT_EQ(t.splits, 7);
  EXPECT_EQ(t.state_pieces, 2);
  EXPECT_FALSE(t.hopper_pdl);
  EXPECT_FALSE(t.bwd_scan_pairs);
  EXPECT_FALSE(t.bwd_scan_pipeline);
  EXPECT_EQ(t.bwd_scan_split, 0);
  EXPECT_TRUE(t.bwd_diag_elementwise);
  EXPECT_TRUE(t.bwd_general_layout);
  EXPECT_EQ(t.bwd_overlap, Force::on);
  EXPECT_EQ(t.bwd_norm_chain, Force::off);
  EXPECT_EQ(t.segment_pieces, 4);
  EXPECT_EQ(t.segment_split_kernel, Force::off);
}

// A default-constructed GlaTuning is what an unset environment gives: the library's choice everywhere.
TEST(TuningEnv, UnsetEnvironmentIsTheDefaultTuning) {
  const GlaTuning t = gla_tuning_from([](const char*) -> const char* { return nullptr; });
  const GlaTuning d;
  EXPECT_EQ(t.fast, d.fast);
  EXPECT_EQ(t.hopper, d.hopper);
  EXPECT_EQ(t.splits, d.splits);
  EXPECT_EQ(t.state_pieces, d.state_pieces);
  EXPECT_EQ(t.hopper_pdl, d.hopper_pdl);
  EXPECT_EQ(t.bwd_scan_pairs, d.bwd_scan_pairs);
  EXPECT_EQ(t.bwd_scan_pipeline, d.bwd_scan_pipeline);
  EXPECT_EQ(t.bwd_scan_split, d.bwd_scan_split);
  EXPECT_EQ(t.bwd_diag_elementwise, d.bwd_diag_elementwise);
  EXPECT_EQ(t.bwd_general_layout, d.bwd_general_layout);
  EXPECT_EQ(t.bwd_overlap, d.bwd_overlap);
  EXPECT_EQ(t.bwd_norm_chain, d.bwd_norm_chain);
  EXPECT_EQ(t.segment_pieces, d.segment_pieces);
  EXPECT_EQ(t.segment_split_kernel, d.segment_split_kernel);
}

// The switches can come from elsewhere than the environment (a test's own settings).
TEST(TuningEnv, GlaTuningFromALookup) {
  const std::map<std::string, std::string> settings = {
      {"FLASHGLA_GLA_SPLITS", "5"}, {"FLASHGLA_GLA_SEGMENT_KERNEL", "split"}, {"FLASHGLA_GLA_BWD_NORM", "chain"}};
  const GlaTuning t = gla_tuning_from([&](const char* name) -> const char* {
    const auto it = settings.find(name);
    return it == settings.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(t.splits, 5);
  EXPECT_EQ(t.segment_split_kernel, Force::on);
  EXPECT_EQ(t.bwd_norm_chain, Force::on);
  EXPECT_TRUE(t.fast);
}

// A typo must not silently run the default path: each bad value is an error naming its variable.
TEST(TuningEnv, BadGlaValueNamesTheVariable) {
  struct Bad {
    const char *name, *value;
  };
  for (const Bad& bad : {Bad{"FLASHGLA_GLA_FAST", "off"}, Bad{"FLASHGLA_GLA_HOPPER", "yes"},
                         Bad{"FLASHGLA_GLA_SPLITS", "0"}, Bad{"FLASHGLA_GLA_SPLITS", "2x"},
                         Bad{"FLASHGLA_GLA_STATE_PIECES", "-1"}, Bad{"FLASHGLA_GLA_HOPPER_PDL", "no"},
                         Bad{"FLASHGLA_GLA_BWD_SCAN_PIPELINE", "1"}, Bad{"FLASHGLA_GLA_BWD_SCAN_SPLIT", "-1"},
                         Bad{"FLASHGLA_GLA_BWD_DIAG", "exact"}, Bad{"FLASHGLA_GLA_BWD_OVERLAP", "2"},
                         Bad{"FLASHGLA_GLA_SEGMENT_KERNEL", "mma"}, Bad{"FLASHGLA_GLA_SEGMENT_PIECES", "many"},
                         Bad{"FLASHGLA_GLA_BWD_SCAN_PAIR", "no"}, Bad{"FLASHGLA_GLA_BWD_LAYOUT", "plain"},
                         Bad{"FLASHGLA_GLA_BWD_NORM", "lookback"}}) {
    SCOPED_TRACE(std::string(bad.name) + "=" + bad.value);
    Environment env;
    env.set(bad.name, bad.value);
    try {
      gla_tuning_from_env();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::value);
      EXPECT_EQ(e.argument(), bad.name);
      EXPECT_NE(std::string(e.what()).find(bad.value), std::string::npos) << e.what();
    }
  }
}

TEST(TuningEnv, AttentionKernels) {
  using Kernel = AttentionTuning::Kernel;
  Environment env;
  env.set("FLASHGLA_ATTENTION_KERNEL", "");
  env.set("FLASHGLA_ATTENTION_BACKWARD", "auto");
  EXPECT_EQ(attention_tuning_from_env().kernel, Kernel::library);
  EXPECT_EQ(attention_backward_tuning_from_env().kernel, Kernel::library);
  env.set("FLASHGLA_ATTENTION_KERNEL", "portable");
  env.set("FLASHGLA_ATTENTION_BACKWARD", "hopper");
  EXPECT_EQ(attention_tuning_from_env().kernel, Kernel::portable);
  EXPECT_EQ(attention_backward_tuning_from_env().kernel, Kernel::hopper);
}

// Unknown kernel names (the retired hopper-overlap variants among them) are errors naming the variable.
TEST(TuningEnv, BadAttentionValueNamesTheVariable) {
  for (const char* name : {"FLASHGLA_ATTENTION_KERNEL", "FLASHGLA_ATTENTION_BACKWARD"})
    for (const char* value : {"fastest", "hopper-overlap", "hopper-overlap-wide"}) {
      SCOPED_TRACE(std::string(name) + "=" + value);
      Environment env;
      env.set(name, value);
      try {
        if (std::string(name) == "FLASHGLA_ATTENTION_KERNEL") attention_tuning_from_env();
        else attention_backward_tuning_from_env();
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::value);
        EXPECT_EQ(e.argument(), name);
      }
    }
}

}  // namespace
}  // namespace flashgla

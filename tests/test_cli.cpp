// The flashgla command's option parsing: defaults, every kind of value, and
// a usage error (exit status 2) for each kind of bad command line.
#include <gtest/gtest.h>

#include "cli/options.h"
#include "testing/buffer.h"

using namespace flashgla;
using namespace flashgla::cli;

namespace {

CommandLine parse(std::vector<std::string> args) { return parse_command_line(args); }

}  // namespace

TEST(CliOptions, CheckDefaults) {
  const Options o = parse({"check", "--device", "cpu"}).options;
  EXPECT_EQ(o.device, Device{});
  EXPECT_EQ(o.dtype, DType::f32);  // the CPU's default
  EXPECT_EQ(o.shape.batch, 2);
  EXPECT_EQ(o.shape.seq_len, 200);
  EXPECT_EQ(o.shape.heads, 2);
  EXPECT_EQ(o.shape.kv_heads, 2);
  EXPECT_EQ(o.shape.key_dim, 32);
  EXPECT_EQ(o.shape.value_dim, 48);
  EXPECT_FALSE(o.shape.varlen());
  EXPECT_EQ(o.gate, Gate::vector);
  EXPECT_FALSE(o.initial_state);
  EXPECT_TRUE(o.causal);
  EXPECT_TRUE(o.ops.chunked && o.ops.recurrent && o.ops.decode && o.ops.attention);
}

TEST(CliOptions, DefaultDeviceIsTheGpuWhenPresent) {
  const Options o = parse({"check"}).options;
  if (flashgla::testing::has_cuda()) {
    EXPECT_EQ(o.device, (Device{DeviceType::cuda, 0}));
    EXPECT_EQ(o.dtype, DType::bf16);
  } else {
    EXPECT_EQ(o.device, Device{});
    EXPECT_EQ(o.dtype, DType::f32);
  }
}

TEST(CliOptions, ReadsEveryKindOfValue) {
  const Options o = parse({"bench", "--device=cpu", "-B", "3", "--seq-len=17", "-H", "4", "--hkv", "2", "-K", "8",
                           "--value-dim", "5", "--dtype", "bf16", "--gate", "scalar", "--h0", "--no-causal", "--ops",
                           "decode,recurrent", "--seed", "18446744073709551615", "--warmup", "0", "--repeat", "7",
                           "--pass", "fwdbwd,bwd"})
                        .options;
  EXPECT_EQ(o.shape.batch, 3);
  EXPECT_EQ(o.shape.seq_len, 17);
  EXPECT_EQ(o.shape.heads, 4);
  EXPECT_EQ(o.shape.kv_heads, 2);
  EXPECT_EQ(o.shape.key_dim, 8);
  EXPECT_EQ(o.shape.value_dim, 5);
  EXPECT_EQ(o.dtype, DType::bf16);
  EXPECT_EQ(o.gate, Gate::scalar);
  EXPECT_TRUE(o.initial_state);
  EXPECT_FALSE(o.causal);
  EXPECT_TRUE(o.ops.decode && o.ops.recurrent);
  EXPECT_FALSE(o.ops.chunked || o.ops.attention);
  EXPECT_EQ(o.seed, 18446744073709551615ull);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_EQ(o.repeat, 7);
  EXPECT_EQ(o.passes, (std::vector<Pass>{Pass::fwdbwd, Pass::bwd}));
}

TEST(CliOptions, GlaMeansBothAlgorithms) {
  const OpSet ops = parse({"check", "--device", "cpu", "--ops", "gla"}).options.ops;
  EXPECT_TRUE(ops.chunked && ops.recurrent);
  EXPECT_FALSE(ops.decode || ops.attention);
}

TEST(CliOptions, VarlenPacksIntoOneRow) {
  const Shape s = parse({"check", "--device", "cpu", "--varlen", "0,5,5,130,200"}).options.shape;
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.seq_len, 200);
  EXPECT_EQ(s.num_seqs(), 4);
  EXPECT_EQ(s.cu_seqlens, (std::vector<int64_t>{0, 5, 5, 130, 200}));
  EXPECT_EQ(parse({"check", "--device", "cpu", "--varlen", "0,7", "-B", "1", "-T", "7"}).options.shape.seq_len, 7);
}

TEST(CliOptions, HelpAndVersion) {
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_TRUE(parse({"--version"}).version);
  const CommandLine bench_help = parse({"bench", "-T", "5", "--help"});
  EXPECT_TRUE(bench_help.help);
  EXPECT_EQ(bench_help.command, Command::bench);
  for (const char* flag : {"--warmup", "--repeat", "--pass", "--varlen", "--hkv", "--seed", "-T"})
    EXPECT_NE(help_text(Command::bench).find(flag), std::string::npos) << flag;
  EXPECT_EQ(help_text(Command::check).find("--pass"), std::string::npos);
}

TEST(CliOptions, RejectsBadCommandLines) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"--version", "check"},
      {"check", "--bogus"},
      {"check", "stray"},
      {"check", "-T"},
      {"check", "-T", "0"},
      {"check", "-T", "12x"},
      {"check", "-T", "-3"},
      {"check", "-K", "99999999999"},
      {"check", "--dtype", "f8"},
      {"check", "--device", "gpu"},
      {"check", "--device", "cuda:x"},
      {"check", "--gate", "matrix"},
      {"check", "--ops", ""},
      {"check", "--ops", "gla,,decode"},
      {"check", "--ops", "softmax"},
      {"check", "--varlen", "5"},
      {"check", "--varlen", "1,5"},
      {"check", "--varlen", "0,5,3"},
      {"check", "--varlen", "0,0"},
      {"check", "--varlen", "0,5", "-B", "2"},
      {"check", "--varlen", "0,5", "-T", "6"},
      {"check", "-H", "4", "--hkv", "3"},
      {"check", "--h0=yes"},
      {"check", "--seed", "-1"},
      {"check", "--pass", "fwd"},  // bench only
      {"bench", "--pass", "both"},
      {"bench", "--repeat", "0"},
      {"bench", "--warmup", "-1"},
  };
  for (const auto& args : bad) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_THROW(parse(args), UsageError) << "flashgla " << line;
  }
}

TEST(CliOptions, MissingDeviceIsNotAUsageError) {
  if (flashgla::testing::has_cuda()) GTEST_SKIP() << "a GPU is present";
  try {
    parse({"check", "--device", "cuda:0"});
    FAIL() << "accepted a CUDA device on a machine without one";
  } catch (const UsageError&) {
    FAIL() << "a missing device is an error of the machine, not of the command line";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// Issue 14: sizes that cannot fit in memory are refused before anything is allocated (no std::bad_alloc),
// with the memory needed, this machine's memory and the largest -T that could fit.
TEST(CliOptions, SizesTooLargeForMemoryNameTheLimit) {
  const uint64_t memory = host_memory_bytes();
  if (memory == 0) GTEST_SKIP() << "this machine's memory is unknown";
  const std::vector<std::string> args = {"check", "-T", "2000000000", "-H", "64", "-K", "512", "-V", "512"};
  try {
    parse(args);
    FAIL() << "accepted sizes that need more than " << memory << " bytes";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs at least"), std::string::npos) << what;
    EXPECT_NE(what.find("more than this machine's"), std::string::npos) << what;
    const size_t at = what.find("-T above ");
    ASSERT_NE(at, std::string::npos) << what;
    const long long largest = std::stoll(what.substr(at + 9));
    // The largest -T named is the one whose lower bound just fits.
    CommandLine fits = parse({"check", "-H", "64", "-K", "512", "-V", "512"});
    const long double per_token = min_bytes_per_token(fits.options, Command::check) * 2;  // -B 2 by default
    EXPECT_LE(per_token * largest, (long double)memory) << what;
    EXPECT_GT(per_token * (largest + 1), (long double)memory) << what;
    EXPECT_NO_THROW(parse({"check", "-T", std::to_string(largest), "-H", "64", "-K", "512", "-V", "512"}));
  }
  // No -T at all can fit: say what to reduce instead.
  try {
    parse({"bench", "-B", "2147483647", "-H", "2147483647", "-T", "1"});
    FAIL() << "accepted -B 2147483647 -H 2147483647";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("even -T 1 cannot fit"), std::string::npos) << e.what();
  }
  // Beyond the integer range the message says the range, not just a lower bound.
  try {
    parse({"check", "-T", "100000000000"});
    FAIL() << "accepted -T 100000000000";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("from 1 to 2147483647"), std::string::npos) << e.what();
  }
}

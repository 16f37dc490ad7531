// The flashgla command line: what each command accepts, its defaults, and the
// help text, all generated from one table of flags per command.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashgla/tensor.h"
#include "flashgla/tuning.h"

namespace flashgla::cli {

// A bad command line. main() prints it and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Command { none, check, bench };
enum class Gate { vector, scalar, none };
enum class Pass { fwd, bwd, fwdbwd };

// Which ops a command runs (--ops).
struct OpSet {
  bool chunked = true;    // GLA forward/backward, chunked algorithm
  bool recurrent = true;  // GLA forward/backward, recurrent algorithm
  bool decode = true;     // GLA single-token decode
  bool attention = true;  // softmax attention forward/backward
};

struct Shape {
  int64_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, key_dim = 0, value_dim = 0;
  std::vector<int64_t> cu_seqlens;  // empty: B sequences of T tokens; else B == 1, T == back()

  bool varlen() const { return !cu_seqlens.empty(); }
  int64_t num_seqs() const { return varlen() ? int64_t(cu_seqlens.size()) - 1 : batch; }
  std::string str() const;  // "B=2 T=200 H=2 Hkv=2 K=32 V=48 varlen=0,5,200"
};

// The kernels' tuning: from the FLASHGLA_* environment variables, read once per command by main()
// (tools/tuning_env.h), not from the command line.
struct Tuning {
  GlaTuning gla;
  AttentionTuning attention_forward, attention_backward;
};

struct Options {
  Device device;
  DType dtype = DType::f32;
  Shape shape;
  Gate gate = Gate::vector;
  bool initial_state = false;  // --h0: initial state in, and its gradient dht into the backward
  bool causal = true;          // attention only
  OpSet ops;
  uint64_t seed = 0;
  // bench only
  int warmup = 0;
  int repeat = 0;
  std::vector<Pass> passes;
  Tuning tuning;
};

struct CommandLine {
  Command command = Command::none;
  bool help = false;     // print help_text(command) and exit 0
  bool version = false;  // print the version and exit 0
  Options options;       // resolved (defaults filled in) for check and bench
};

// `args` is argv without the program name. Throws UsageError on anything it
// does not understand, naming the flag and what it expects.
CommandLine parse_command_line(const std::vector<std::string>& args);

// The help of a command (Command::none: the top-level help).
std::string help_text(Command command);

// Physical memory of this machine (0 when unknown).
uint64_t host_memory_bytes();
// A lower bound of the host memory a command needs per token (of B*T) at `options`; resolve()
// refuses (UsageError) sizes that cannot fit in host_memory_bytes(), naming the largest -T.
long double min_bytes_per_token(const Options& options, Command command);

const char* gate_name(Gate gate);
const char* pass_name(Pass pass);
const char* short_dtype_name(DType dtype);  // "f32", "bf16", ...

}  // namespace flashgla::cli

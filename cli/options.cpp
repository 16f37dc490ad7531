#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>

#include "flashgla/flashgla.h"
#include "testing/buffer.h"

namespace flashgla::cli {
namespace {

// What the user typed; resolve() fills in what was left out.
struct RawOptions {
  std::optional<Device> device;
  std::optional<DType> dtype;
  std::optional<int64_t> batch, seq_len, heads, kv_heads, key_dim, value_dim;
  std::vector<int64_t> cu_seqlens;
  Gate gate = Gate::vector;
  bool initial_state = false;
  bool causal = true;
  OpSet ops;
  std::optional<uint64_t> seed;
  std::optional<int64_t> warmup, repeat;
  std::vector<Pass> passes{Pass::fwd, Pass::bwd};
};

// Shape defaults: check runs in well under a second on two cores; bench is
// long enough for the timings to mean something.
struct ShapeDefaults {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};
constexpr ShapeDefaults kCheckShape{2, 200, 2, 32, 48};
constexpr ShapeDefaults kBenchShape{1, 1024, 2, 64, 64};
ShapeDefaults shape_defaults(Command c) { return c == Command::bench ? kBenchShape : kCheckShape; }

struct Flag {
  std::vector<std::string> names;  // e.g. {"-T", "--seq-len"}
  std::string value;               // placeholder in the help; empty for a switch
  std::string help;                // lines after the first start with '\n'
  std::function<void(RawOptions&, const std::string& flag, const std::string& value)> apply;
};

[[noreturn]] void bad_value(const std::string& flag, const std::string& expected, const std::string& got) {
  throw UsageError(flag + " expects " + expected + ", got '" + got + "'");
}

uint64_t parse_unsigned(const std::string& flag, const std::string& text, const std::string& expected) {
  if (text.empty()) bad_value(flag, expected, text);
  uint64_t value = 0;
  for (char c : text) {
    const uint64_t digit = uint64_t(c - '0');
    if (c < '0' || c > '9' || value > (UINT64_MAX - digit) / 10) bad_value(flag, expected, text);
    value = value * 10 + digit;
  }
  return value;
}

int64_t parse_at_least(const std::string& flag, const std::string& text, int64_t min) {
  const std::string expected = "an integer from " + std::to_string(min) + " to " + std::to_string(INT32_MAX);
  const uint64_t value = parse_unsigned(flag, text, expected);
  if (value < uint64_t(min) || value > uint64_t(INT32_MAX)) bad_value(flag, expected, text);
  return int64_t(value);
}

// Splits "a,b,c"; an empty item is an error.
std::vector<std::string> split_list(const std::string& flag, const std::string& text, const std::string& expected) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(',', begin);
    items.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (items.back().empty()) bad_value(flag, expected, text);
    if (end == std::string::npos) return items;
    begin = end + 1;
  }
}

Device parse_device(const std::string& flag, const std::string& text) {
  const std::string expected = "cpu, cuda or cuda:N";
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{DeviceType::cuda, 0};
  if (text.rfind("cuda:", 0) != 0) bad_value(flag, expected, text);
  return Device{DeviceType::cuda, int(parse_at_least(flag, text.substr(5), 0))};
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64})
    if (text == short_dtype_name(d)) return d;
  bad_value(flag, "f32, bf16, f16 or f64", text);
}

Gate parse_gate(const std::string& flag, const std::string& text) {
  for (Gate g : {Gate::vector, Gate::scalar, Gate::none})
    if (text == gate_name(g)) return g;
  bad_value(flag, "vector, scalar or none", text);
}

OpSet parse_ops(const std::string& flag, const std::string& text) {
  const std::string expected = "a comma-separated list of gla, chunked, recurrent, decode, attention";
  OpSet ops{false, false, false, false};
  for (const std::string& op : split_list(flag, text, expected)) {
    if (op == "gla") ops.chunked = ops.recurrent = true;
    else if (op == "chunked") ops.chunked = true;
    else if (op == "recurrent") ops.recurrent = true;
    else if (op == "decode") ops.decode = true;
    else if (op == "attention") ops.attention = true;
    else bad_value(flag, expected, text);
  }
  return ops;
}

std::vector<Pass> parse_passes(const std::string& flag, const std::string& text) {
  const std::string expected = "a comma-separated list of fwd, bwd, fwdbwd";
  std::vector<Pass> passes;
  for (const std::string& item : split_list(flag, text, expected)) {
    if (item == "fwd") passes.push_back(Pass::fwd);
    else if (item == "bwd") passes.push_back(Pass::bwd);
    else if (item == "fwdbwd") passes.push_back(Pass::fwdbwd);
    else bad_value(flag, expected, text);
  }
  return passes;
}

std::vector<int64_t> parse_cu_seqlens(const std::string& flag, const std::string& text) {
  const std::string expected = "sequence boundaries like 0,5,5,130,200 (from 0, never decreasing, last >= 1)";
  std::vector<int64_t> bounds;
  for (const std::string& item : split_list(flag, text, expected)) {
    const uint64_t b = parse_unsigned(flag, item, expected);
    if (b > uint64_t(INT32_MAX) || (bounds.empty() && b != 0) || (!bounds.empty() && int64_t(b) < bounds.back()))
      bad_value(flag, expected, text);
    bounds.push_back(int64_t(b));
  }
  if (bounds.size() < 2 || bounds.back() < 1) bad_value(flag, expected, text);
  return bounds;
}

std::string dims_help(const char* what, Command c, int64_t ShapeDefaults::*field) {
  return std::string(what) + " (default " + std::to_string(shape_defaults(c).*field) + ")";
}

std::vector<Flag> flags_for(Command c) {
  auto count = [](std::optional<int64_t> RawOptions::*field) {
    return [field](RawOptions& o, const std::string& flag, const std::string& v) { o.*field = parse_at_least(flag, v, 1); };
  };
  std::vector<Flag> flags = {
      {{"--device"}, "DEV", "cpu, cuda or cuda:N (default: cuda:0 if a GPU is present, else cpu)",
       [](RawOptions& o, const std::string& f, const std::string& v) { o.device = parse_device(f, v); }},
      {{"--dtype"}, "DT",
       "f32, bf16, f16 or f64 of q, k, v, g and the outputs (states are\nalways f32) (default: bf16 on cuda, f32 on cpu)",
       [](RawOptions& o, const std::string& f, const std::string& v) { o.dtype = parse_dtype(f, v); }},
      {{"-B", "--batch"}, "N", dims_help("batch size B", c, &ShapeDefaults::batch), count(&RawOptions::batch)},
      {{"-T", "--seq-len"}, "N", dims_help("tokens per sequence T", c, &ShapeDefaults::seq_len),
       count(&RawOptions::seq_len)},
      {{"-H", "--heads"}, "N", dims_help("heads H (query heads for attention)", c, &ShapeDefaults::heads),
       count(&RawOptions::heads)},
      {{"-K", "--key-dim"}, "N", dims_help("key/query head dim K (attention: D)", c, &ShapeDefaults::key_dim),
       count(&RawOptions::key_dim)},
      {{"-V", "--value-dim"}, "N", dims_help("value head dim V (attention: Dv)", c, &ShapeDefaults::value_dim),
       count(&RawOptions::value_dim)},
      {{"--hkv"}, "N", "attention KV heads; must divide H (default: H, no grouping)", count(&RawOptions::kv_heads)},
      {{"--varlen"}, "LIST",
       "variable-length batch: cu_seqlens boundaries, e.g. 0,5,5,130,200\n"
       "(sets B = 1 and T = the last boundary; default: off)",
       [](RawOptions& o, const std::string& f, const std::string& v) { o.cu_seqlens = parse_cu_seqlens(f, v); }},
      {{"--gate"}, "KIND",
       "GLA gate: vector g[B,T,H,K], scalar g[B,T,H] (simple GLA) or none\n(plain linear attention) (default: vector)",
       [](RawOptions& o, const std::string& f, const std::string& v) { o.gate = parse_gate(f, v); }},
      {{"--h0"}, "", "GLA with an initial state h0 (and a final-state gradient dht in the\nbackward) (default: off)",
       [](RawOptions& o, const std::string&, const std::string&) { o.initial_state = true; }},
      {{"--causal"}, "", "causal attention (the default)",
       [](RawOptions& o, const std::string&, const std::string&) { o.causal = true; }},
      {{"--no-causal"}, "", "attention without the causal mask",
       [](RawOptions& o, const std::string&, const std::string&) { o.causal = false; }},
      {{"--ops"}, "LIST",
       "ops to run, comma-separated: gla (= chunked,recurrent), chunked,\nrecurrent, decode, attention "
       "(default: all)",
       [](RawOptions& o, const std::string& f, const std::string& v) { o.ops = parse_ops(f, v); }},
      {{"--seed"}, "N", "random seed of the inputs (default: a new one each run, printed)",
       [](RawOptions& o, const std::string& f, const std::string& v) {
         o.seed = parse_unsigned(f, v, "a non-negative integer");
       }},
  };
  if (c == Command::bench) {
    flags.push_back({{"--warmup"}, "N", "untimed calls before timing (default: 1 on cpu, 10 on cuda)",
                     [](RawOptions& o, const std::string& f, const std::string& v) { o.warmup = parse_at_least(f, v, 0); }});
    flags.push_back({{"--repeat"}, "N", "timed calls; the median is reported (default: 5 on cpu, 50 on cuda)",
                     [](RawOptions& o, const std::string& f, const std::string& v) { o.repeat = parse_at_least(f, v, 1); }});
    flags.push_back({{"--pass"}, "LIST",
                     "passes to time, comma-separated: fwd, bwd, fwdbwd (forward then\nbackward) (default: fwd,bwd)",
                     [](RawOptions& o, const std::string& f, const std::string& v) { o.passes = parse_passes(f, v); }});
  }
  flags.push_back({{"-h", "--help"}, "", "show this help", nullptr});
  return flags;
}

const Flag* find_flag(const std::vector<Flag>& flags, const std::string& name) {
  for (const Flag& f : flags)
    for (const std::string& n : f.names)
      if (n == name) return &f;
  return nullptr;
}

Shape resolve_shape(const RawOptions& raw, Command c) {
  const ShapeDefaults d = shape_defaults(c);
  Shape s;
  s.heads = raw.heads.value_or(d.heads);
  s.kv_heads = raw.kv_heads.value_or(s.heads);
  s.key_dim = raw.key_dim.value_or(d.key_dim);
  s.value_dim = raw.value_dim.value_or(d.value_dim);
  if (s.heads % s.kv_heads != 0)
    throw UsageError("--hkv " + std::to_string(s.kv_heads) + " must divide -H " + std::to_string(s.heads));
  s.cu_seqlens = raw.cu_seqlens;
  if (!s.varlen()) {
    s.batch = raw.batch.value_or(d.batch);
    s.seq_len = raw.seq_len.value_or(d.seq_len);
    return s;
  }
  s.batch = 1;
  s.seq_len = s.cu_seqlens.back();
  if (raw.batch && *raw.batch != 1) throw UsageError("--varlen packs the sequences into one row: -B must be 1");
  if (raw.seq_len && *raw.seq_len != s.seq_len)
    throw UsageError("-T " + std::to_string(*raw.seq_len) + " differs from the last --varlen boundary " +
                     std::to_string(s.seq_len));
  return s;
}

std::string gib(long double bytes) {
  char text[32];
  if (bytes >= 1024.0L * 1024 * 1024 * 1024) std::snprintf(text, sizeof text, "%.1Lf TiB", bytes / (1024.0L * 1024 * 1024 * 1024));
  else std::snprintf(text, sizeof text, "%.1Lf GiB", bytes / (1024.0L * 1024 * 1024));
  return text;
}

// Refuses, before anything is allocated, sizes whose tensors cannot fit in this machine's memory (which
// would end in std::bad_alloc, possibly after minutes of filling inputs): says how much they need and
// the largest -T that could fit. A lower bound, so nothing that could run is refused.
void check_memory(const Options& o, Command c) {
  const long double per_token = min_bytes_per_token(o, c);
  const long double tokens = (long double)o.shape.batch * (long double)o.shape.seq_len;
  const long double needed = per_token * tokens;
  const long double memory = (long double)host_memory_bytes();
  if (memory <= 0 || needed <= memory) return;
  const char* name = c == Command::bench ? "bench" : "check";
  const long double largest_t = std::floor(memory / (per_token * (long double)o.shape.batch));
  std::string advice;
  if (o.shape.varlen()) advice = "; the last --varlen boundary (the total tokens) must stay below " +
                                 std::to_string((long long)largest_t);
  else if (largest_t >= 1) advice = "; with these -B -H -K -V, -T above " + std::to_string((long long)largest_t) +
                                    " cannot fit";
  else advice = "; even -T 1 cannot fit: reduce -B, -H, -K or -V";
  throw UsageError(std::string(name) + " at " + o.shape.str() + " needs at least " + gib(needed) + " of memory (" +
                   (c == Command::bench ? "inputs, outputs and gradients" :
                                          "inputs, outputs and gradients in f64 for the reference") +
                   "), more than this machine's " + gib(memory) + advice);
}

#ifdef FLASHGLA_WITH_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

// Fails (exit 1, not a usage error) when the machine lacks the device asked for.
void require_available(const Device& device) {
  if (device.type == DeviceType::cpu) return;
  const int count = cuda_device_count();
  if (device.index < count) return;
  throw std::runtime_error("--device " + device.str() + ": " +
                           (count == 0 ? std::string(kBuiltWithCuda ? "no CUDA device is visible"
                                                                        : "this flashgla was built without CUDA")
                                       : "only " + std::to_string(count) + " CUDA device(s) visible"));
}

Options resolve(const RawOptions& raw, Command c) {
  Options o;
  o.device = raw.device.value_or(testing::default_device());
  require_available(o.device);
  const bool cuda = o.device.type == DeviceType::cuda;
  o.dtype = raw.dtype.value_or(cuda ? DType::bf16 : DType::f32);
  o.shape = resolve_shape(raw, c);
  o.gate = raw.gate;
  o.initial_state = raw.initial_state;
  o.causal = raw.causal;
  o.ops = raw.ops;
  o.seed = raw.seed ? *raw.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  o.warmup = int(raw.warmup.value_or(cuda ? 10 : 1));
  o.repeat = int(raw.repeat.value_or(cuda ? 50 : 5));
  o.passes = raw.passes;
  check_memory(o, c);
  return o;
}

std::string flag_table(Command c) {
  std::string out;
  for (const Flag& f : flags_for(c)) {
    std::string names;
    for (const std::string& n : f.names) names += (names.empty() ? "" : ", ") + n;
    if (!f.value.empty()) names += " " + f.value;
    std::string help = f.help;
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1))
      help.insert(at + 1, std::string(26, ' '));
    names.resize(std::max<size_t>(names.size() + 1, 24), ' ');
    out += "  " + names + help + "\n";
  }
  return out;
}

const char* kTopHelp =
    "usage: flashgla <command> [options]\n"
    "       flashgla --help | --version\n"
    "\n"
    "Gated linear attention (GLA) and FlashAttention kernels: checks and benchmarks.\n"
    "\n"
    "commands:\n"
    "  check   run every op on fresh random inputs and compare each output and\n"
    "          gradient with the fp64 CPU reference (relative RMS error vs tolerance)\n"
    "  bench   time the ops: median ms, tokens/s and GFLOP/s per op, algorithm and pass\n"
    "\n"
    "Run 'flashgla <command> --help' for the options of a command.\n"
    "\n"
    "options:\n"
    "  -h, --help              show this help\n"
    "  --version               print the version and whether CUDA is built in\n"
    "\n"
    "environment: the kernels' tuning switches (FLASHGLA_GLA_*, FLASHGLA_ATTENTION_KERNEL,\n"
    "FLASHGLA_ATTENTION_BACKWARD; see include/flashgla/tuning.h) are read once per command\n"
    "and passed with every call; an unknown value is an error naming the variable.\n"
    "\n"
    "exit status: 0 success; 1 a check failed or the library reported an error;\n"
    "2 a bad command line.\n";

const char* kCheckIntro =
    "usage: flashgla check [options]\n"
    "\n"
    "Runs each op on fresh random inputs (q, k, v, do ~ N(0,1); g = logsigmoid(N(0,1))/16;\n"
    "h0, dht ~ N(0,1)) and prints, for every output and gradient, its relative RMS error\n"
    "||out - ref|| / ||ref|| against a reference computed on the CPU in f64 from the same\n"
    "inputs rounded to --dtype, so the error is the algorithm's own. Outputs are filled\n"
    "with NaN before each call; a NaN or an error from the library fails the row.\n"
    "\n"
    "  gla chunked fwd/bwd    o, ht; dq, dk, dv, dg, dh0   vs the recurrent algorithm in f64\n"
    "  gla recurrent fwd/bwd  the same outputs             vs the recurrent algorithm in f64\n"
    "                         (on the CPU the recurrent algorithm is the reference: this\n"
    "                         compares it in --dtype with itself on f64 inputs)\n"
    "  gla decode             o per token, final state      vs the recurrent forward in f64,\n"
    "                         min(T, 16) tokens per sequence, one gla_decode call per token\n"
    "  attention fwd/bwd      o, lse; dq, dk, dv            vs the naive attention in f64;\n"
    "                         the backward gets the reference o (in --dtype) and lse\n"
    "\n"
    "Tolerances (the coarser of --dtype and the output's dtype; states, lse, decode and\n"
    "the attention backward, which carry f32 values, are at least f32):\n"
    "  f64 1e-10, f32 1e-5, bf16 and f16 1e-2\n"
    "\n"
    "options:\n";

const char* kCheckOutro = "\nexit status: 0 all rows pass; 1 a row failed; 2 a bad command line.\n";

const char* kBenchIntro =
    "usage: flashgla bench [options]\n"
    "\n"
    "Times each op, algorithm and pass on --device: --warmup untimed calls, then --repeat\n"
    "timed calls (CUDA events on a GPU, the wall clock on the CPU); prints the median ms,\n"
    "tokens/s (B*T per call; S per decode step of S sequences) and GFLOP/s under this\n"
    "FLOP model (N = B*T*H tokens x heads; a multiply-add counts 2):\n"
    "  gla chunked fwd        2*N*(C*K + C*V + 2*K*V), chunk C = 64 (intra-chunk scores,\n"
    "                         scores x values, the state's read and its update)\n"
    "  gla recurrent fwd      4*N*K*V (the state's update and read, per token)\n"
    "  gla decode             4*S*H*K*V per step of S sequences (fwd pass only)\n"
    "  attention fwd          2*B*H*Tq*Tk*(D + Dv), halved when causal (with varlen,\n"
    "                         the sum over sequences)\n"
    "  any bwd                2.5 x its fwd (FlashAttention's convention); fwdbwd 3.5 x\n"
    "The attention backward is timed on the o and lse of one forward call.\n"
    "\n"
    "options:\n";

const char* kBenchOutro = "\nexit status: 0 success; 1 an op failed; 2 a bad command line.\n";

}  // namespace

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? uint64_t(pages) * uint64_t(page_size) : 0;
}

// Per token (of B*T): the elements of the largest op selected, H*(q, k, v, do, o, dq, dk, dv) plus
// the gate and its gradient for GLA; attention's keys and values have Hkv heads. check keeps them in f64
// for the reference, bench in --dtype. The real peak is higher (the tested op's copies, workspaces).
long double min_bytes_per_token(const Options& o, Command c) {
  const Shape& s = o.shape;
  const long double H = s.heads, Hkv = s.kv_heads, K = s.key_dim, V = s.value_dim;
  long double elements = 0;
  if (o.ops.chunked || o.ops.recurrent || o.ops.decode)
    elements = H * (4 * K + 4 * V + (o.gate == Gate::vector ? 2 * K : o.gate == Gate::scalar ? 2 : 0));
  if (o.ops.attention) elements = std::max(elements, H * (2 * K + 2 * V) + Hkv * (2 * K + 2 * V));
  const long double element_bytes = c == Command::bench ? (long double)dtype_size(o.dtype) : 8.0L;
  return elements * element_bytes;
}

std::string Shape::str() const {
  std::string s = "B=" + std::to_string(batch) + " T=" + std::to_string(seq_len) + " H=" + std::to_string(heads) +
                  " Hkv=" + std::to_string(kv_heads) + " K=" + std::to_string(key_dim) +
                  " V=" + std::to_string(value_dim);
  if (varlen()) {
    s += " cu_seqlens=";
    for (size_t i = 0; i < cu_seqlens.size(); ++i) s += (i ? "," : "") + std::to_string(cu_seqlens[i]);
  }
  return s;
}

const char* gate_name(Gate gate) {
  switch (gate) {
    case Gate::vector: return "vector";
    case Gate::scalar: return "scalar";
    case Gate::none: return "none";
  }
  return "?";
}

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::fwd: return "fwd";
    case Pass::bwd: return "bwd";
    case Pass::fwdbwd: return "fwdbwd";
  }
  return "?";
}

const char* short_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::string help_text(Command command) {
  switch (command) {
    case Command::none: return kTopHelp;
    case Command::check: return kCheckIntro + flag_table(command) + kCheckOutro;
    case Command::bench: return kBenchIntro + flag_table(command) + kBenchOutro;
  }
  return "";
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine line;
  if (args.empty()) throw UsageError("missing command: expected check or bench (see flashgla --help)");
  const std::string& first = args[0];
  if (first == "-h" || first == "--help" || first == "help") {
    if (args.size() > 1) throw UsageError("unexpected argument '" + args[1] + "' after " + first);
    line.help = true;
    return line;
  }
  if (first == "--version") {
    if (args.size() > 1) throw UsageError("unexpected argument '" + args[1] + "' after --version");
    line.version = true;
    return line;
  }
  if (first == "check") line.command = Command::check;
  else if (first == "bench") line.command = Command::bench;
  else throw UsageError("unknown command '" + first + "': expected check or bench (see flashgla --help)");

  const std::string where = "flashgla " + first;
  const std::vector<Flag> flags = flags_for(line.command);
  RawOptions raw;
  for (size_t i = 1; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> inline_value;  // --flag=value
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* flag = find_flag(flags, name);
    if (!flag)
      throw UsageError((name.rfind("-", 0) == 0 ? "unknown option '" : "unexpected argument '") + args[i] +
                       "' (see " + where + " --help)");
    if (!flag->apply) {  // --help
      line.help = true;
      return line;
    }
    std::string value;
    if (!flag->value.empty()) {
      if (inline_value) value = *inline_value;
      else if (i + 1 < args.size()) value = args[++i];
      else throw UsageError(name + " expects a value " + flag->value + " (see " + where + " --help)");
    } else if (inline_value) {
      throw UsageError(name + " takes no value, got '" + args[i] + "'");
    }
    flag->apply(raw, name, value);
  }
  line.options = resolve(raw, line.command);
  return line;
}

}  // namespace flashgla::cli

// flashgla check: every op on fresh random inputs against the fp64 CPU reference.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "cli/inputs.h"

namespace flashgla::cli {
namespace {

const Device kCpu{};
constexpr int64_t kDecodeSteps = 16;

struct NamedOutput {
  const char* name;
  Buffer buffer;
};
using Outputs = std::vector<NamedOutput>;

Outputs named(const GlaOutputs& o) { return {{"o", o.o}, {"ht", o.ht}}; }
Outputs named(const GlaGrads& g) {
  Outputs out{{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}};
  if (g.dg.defined()) out.push_back({"dg", g.dg});
  out.push_back({"dh0", g.dh0});
  return out;
}
Outputs named(const AttentionOutputs& o) { return {{"o", o.o}, {"lse", o.lse}}; }
Outputs named(const AttentionGrads& g) { return {{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}}; }

// Relative RMS error allowed for results computed and stored at a precision.
double tolerance(DType precision) {
  switch (precision) {
    case DType::f64: return 1e-10;
    case DType::f32: return 1e-5;
    default: return 1e-2;
  }
}

DType coarser(DType a, DType b) {
  auto rank = [](DType d) { return d == DType::f64 ? 0 : d == DType::f32 ? 1 : 2; };
  return rank(a) >= rank(b) ? a : b;
}

// Each op's inputs come from their own stream, so --ops does not change them.
std::mt19937_64 rng_for(const Options& o, uint32_t op) {
  std::seed_seq seq{uint32_t(o.seed), uint32_t(o.seed >> 32), op};
  return std::mt19937_64(seq);
}

// The results, printed as they come: a row per output, or per op that threw.
// Before each case a progress line goes to stderr (large sizes take minutes,
// mostly in the fp64 reference), so stdout stays the table alone.
class Table {
 public:
  Table(int cases, std::string tested) : cases_(cases), tested_(std::move(tested)) {
    std::printf("%-22s %-6s %-12s %-10s %s\n", "op", "output", "rel_rms_err", "tolerance", "result");
    std::fflush(stdout);  // the header before the first progress line, also when stdout is a pipe
  }

  // Runs the reference, then the op under test, and compares their outputs
  // (same names, same order). `precision` is the coarsest precision the
  // op's results pass through; an output's own dtype can only coarsen it.
  void compare(const std::string& op, DType precision, const std::function<Outputs()>& reference,
               const std::function<Outputs()>& tested) {
    std::fprintf(stderr, "check %d/%d: %s (fp64 reference, then %s)\n", ++case_, cases_, op.c_str(), tested_.c_str());
    Outputs ref;
    try {
      ref = reference();
    } catch (const std::exception& e) {
      return error_row(op, std::string("reference failed: ") + e.what());
    }
    try {
      const Outputs out = tested();
      for (size_t i = 0; i < out.size(); ++i) {
        const double error = testing::rel_rms_error(out[i].buffer.values(), ref[i].buffer.values());
        row(op, out[i].name, error, tolerance(coarser(precision, out[i].buffer.dtype())));
      }
    } catch (const std::bad_alloc&) {
      error_row(op, "out of host memory (std::bad_alloc): try a smaller -T, -B, -H, -K or -V");
    } catch (const std::exception& e) {
      error_row(op, e.what());
    }
  }

  int failures() const { return failures_; }
  int rows() const { return rows_; }

 private:
  void row(const std::string& op, const char* output, double error, double tol) {
    const bool pass = error <= tol;  // false for NaN
    std::printf("%-22s %-6s %-12.3e %-10.0e %s\n", op.c_str(), output, error, tol, pass ? "PASS" : "FAIL");
    count(pass);
  }

  void error_row(const std::string& op, const std::string& message) {
    std::printf("%-22s %-6s %-12s %-10s FAIL  %s\n", op.c_str(), "-", "-", "-", message.c_str());
    count(false);
  }

  void count(bool pass) {
    ++rows_;
    failures_ += pass ? 0 : 1;
    std::fflush(stdout);
  }

  int rows_ = 0;
  int failures_ = 0;
  int case_ = 0;
  int cases_;
  std::string tested_;  // the device and dtype under test, for the progress lines
};

GlaOutputs run_gla_forward(const GlaInputs& in, GlaAlgorithm algorithm, const Tuning& tuning) {
  GlaOutputs out = make_gla_outputs(in);
  GlaForwardArgs args = gla_forward_args(in, out, algorithm, tuning);
  const Buffer workspace = attach_workspace(args);
  gla_forward(args);
  testing::synchronize(in.q.device());
  return out;
}

GlaGrads run_gla_backward(const GlaInputs& in, GlaAlgorithm algorithm, const Tuning& tuning) {
  GlaGrads out = make_gla_grads(in);
  GlaBackwardArgs args = gla_backward_args(in, out, algorithm, tuning);
  const Buffer workspace = attach_workspace(args);
  gla_backward(args);
  testing::synchronize(in.q.device());
  return out;
}

// Token by token: o for every step, and the state after the last one.
Outputs run_gla_decode(const GlaInputs& in) {
  GlaOutputs out = make_gla_outputs(in);  // o [N,S,H,V], ht [N,H,K,V]
  if (in.h0.defined()) out.ht = in.h0.to(in.h0.device());
  else out.ht.fill(0);
  for (int64_t t = 0; t < in.q.shape()[1]; ++t) {
    GlaDecodeArgs args;
    args.q = token_view(in.q, t), args.k = token_view(in.k, t), args.v = token_view(in.v, t);
    args.g = token_view(in.g, t);
    args.state = out.ht.view();
    args.o = token_view(out.o, t);
    gla_decode(args);
  }
  testing::synchronize(in.q.device());
  return {{"o", out.o}, {"state", out.ht}};
}

AttentionOutputs run_attention_forward(const AttentionInputs& in, bool causal, AttentionAlgorithm algorithm,
                                       const Tuning& tuning) {
  AttentionOutputs out = make_attention_outputs(in);
  AttentionForwardArgs args = attention_forward_args(in, out, causal, algorithm, tuning);
  const Buffer workspace = attach_workspace(args);
  attention_forward(args);
  testing::synchronize(in.q.device());
  return out;
}

AttentionGrads run_attention_backward(const AttentionInputs& in, const AttentionOutputs& fwd, bool causal,
                                      AttentionAlgorithm algorithm, const Tuning& tuning) {
  AttentionGrads out = make_attention_grads(in);
  AttentionBackwardArgs args = attention_backward_args(in, fwd, out, causal, algorithm, tuning);
  const Buffer workspace = attach_workspace(args);
  attention_backward(args);
  testing::synchronize(in.q.device());
  return out;
}

// Forward and backward of one algorithm against the recurrent algorithm in f64.
void check_gla(Table& table, const Options& o, GlaAlgorithm algorithm) {
  const bool chunked = algorithm == GlaAlgorithm::chunked;
  std::mt19937_64 rng = rng_for(o, chunked ? 1 : 2);
  const GlaInputs host = make_gla_inputs(o.shape, o.gate, o.initial_state, o.dtype, rng);
  const GlaInputs ref = host.to(kCpu, DType::f64), in = host.to(o.device, o.dtype);
  const std::string op = chunked ? "gla chunked " : "gla recurrent ";
  table.compare(op + "fwd", o.dtype, [&] { return named(run_gla_forward(ref, GlaAlgorithm::recurrent, o.tuning)); },
                [&] { return named(run_gla_forward(in, algorithm, o.tuning)); });
  table.compare(op + "bwd", o.dtype, [&] { return named(run_gla_backward(ref, GlaAlgorithm::recurrent, o.tuning)); },
                [&] { return named(run_gla_backward(in, algorithm, o.tuning)); });
}

// A few tokens of each sequence, one decode call per token, against the
// recurrent forward over the same tokens. The state is f32 between calls.
void check_decode(Table& table, const Options& o) {
  Shape steps = o.shape;
  steps.batch = o.shape.num_seqs();
  steps.seq_len = std::min(o.shape.seq_len, kDecodeSteps);
  steps.cu_seqlens.clear();
  std::mt19937_64 rng = rng_for(o, 3);
  const GlaInputs host = make_gla_inputs(steps, o.gate, o.initial_state, o.dtype, rng);
  const GlaInputs ref = host.to(kCpu, DType::f64), in = host.to(o.device, o.dtype);
  table.compare(
      "gla decode x" + std::to_string(steps.seq_len), coarser(o.dtype, DType::f32),
      [&] {
        const GlaOutputs out = run_gla_forward(ref, GlaAlgorithm::recurrent, o.tuning);
        return Outputs{{"o", out.o}, {"state", out.ht}};
      },
      [&] { return run_gla_decode(in); });
}

// Tiled attention against the naive one in f64. Both backward passes read the
// reference forward's o (rounded to --dtype) and lse, so the backward is
// checked on its own; the lse it reads is f32.
void check_attention(Table& table, const Options& o) {
  std::mt19937_64 rng = rng_for(o, 4);
  const AttentionInputs host = make_attention_inputs(o.shape, o.dtype, rng);
  const AttentionInputs ref = host.to(kCpu, DType::f64), in = host.to(o.device, o.dtype);
  AttentionOutputs ref_fwd, bwd_inputs;
  table.compare(
      "attention fwd", o.dtype,
      [&] {
        ref_fwd = run_attention_forward(ref, o.causal, AttentionAlgorithm::naive, o.tuning);
        return named(ref_fwd);
      },
      [&] { return named(run_attention_forward(in, o.causal, AttentionAlgorithm::tiled, o.tuning)); });
  table.compare(
      "attention bwd", coarser(o.dtype, DType::f32),
      [&] {
        if (!ref_fwd.o.defined()) throw std::runtime_error("needs the reference forward, which failed");
        bwd_inputs = {ref_fwd.o.cast(o.dtype), ref_fwd.lse};
        const AttentionOutputs fwd{bwd_inputs.o.cast(DType::f64), bwd_inputs.lse};
        return named(run_attention_backward(ref, fwd, o.causal, AttentionAlgorithm::naive, o.tuning));
      },
      [&] {
        const AttentionOutputs fwd{bwd_inputs.o.to(o.device), bwd_inputs.lse.to(o.device)};
        return named(run_attention_backward(in, fwd, o.causal, AttentionAlgorithm::tiled, o.tuning));
      });
}

void print_header(const Options& o) {
  std::printf("flashgla check: %s %s, %s, gate %s, h0 %s, %s, seed %llu\n", o.device.str().c_str(),
              short_dtype_name(o.dtype), o.shape.str().c_str(), gate_name(o.gate), o.initial_state ? "on" : "off",
              o.causal ? "causal" : "not causal", static_cast<unsigned long long>(o.seed));
}

}  // namespace

int run_check(const Options& o) {
  print_header(o);
  // Cases (Table::compare calls): forward and backward of each GLA algorithm and of attention, one for decode.
  const int cases = 2 * o.ops.chunked + 2 * o.ops.recurrent + o.ops.decode + 2 * o.ops.attention;
  Table table(cases, o.device.str() + " " + short_dtype_name(o.dtype));
  if (o.ops.chunked) check_gla(table, o, GlaAlgorithm::chunked);
  if (o.ops.recurrent) check_gla(table, o, GlaAlgorithm::recurrent);
  if (o.ops.decode) check_decode(table, o);
  if (o.ops.attention) check_attention(table, o);
  if (table.failures() == 0) {
    std::printf("all %d rows pass\n", table.rows());
    return 0;
  }
  std::printf("%d of %d rows FAIL (reproduce with --seed %llu)\n", table.failures(), table.rows(),
              static_cast<unsigned long long>(o.seed));
  return 1;
}

}  // namespace flashgla::cli

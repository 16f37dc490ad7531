// flashgla bench: median time, tokens/s and GFLOP/s per op, algorithm and pass.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "cli/commands.h"
#include "cli/inputs.h"

#ifdef FLASHGLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashgla::cli {
namespace {

constexpr double kChunk = 64;             // the chunked algorithm's chunk size, for the FLOP model
constexpr double kBackwardFactor = 2.5;   // FLOPs of a backward pass per FLOP of its forward

using Call = std::function<void()>;

// Times calls on one device: the wall clock on the CPU, CUDA events (on the
// default stream, which the calls use) on a GPU.
class Stopwatch {
 public:
  explicit Stopwatch(Device device) : device_(device) {
#ifdef FLASHGLA_WITH_CUDA
    if (device_.type == DeviceType::cuda) {
      cuda_check(cudaSetDevice(device_.index), "cudaSetDevice");
      cuda_check(cudaEventCreate(&start_), "cudaEventCreate");
      cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
    }
#endif
  }
  ~Stopwatch() {
#ifdef FLASHGLA_WITH_CUDA
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
#endif
  }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

  double milliseconds(const Call& call) {
#ifdef FLASHGLA_WITH_CUDA
    if (device_.type == DeviceType::cuda) {
      cuda_check(cudaEventRecord(start_, nullptr), "cudaEventRecord");
      call();
      cuda_check(cudaEventRecord(stop_, nullptr), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      return ms;
    }
#endif
    const auto begin = std::chrono::steady_clock::now();
    call();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  }

 private:
#ifdef FLASHGLA_WITH_CUDA
  static void cuda_check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
#endif
  Device device_;
};

// One op and algorithm: its calls per pass and its work per forward call.
struct Subject {
  std::string name;     // "gla chunked"
  double fwd_flops = 0;
  double tokens = 0;    // per call
  Call fwd, bwd;        // bwd empty: forward only (decode)
};

Call pass_call(const Subject& s, Pass pass) {
  switch (pass) {
    case Pass::fwd: return s.fwd;
    case Pass::bwd: return s.bwd;
    case Pass::fwdbwd: return [&s] { s.fwd(); s.bwd(); };
  }
  return s.fwd;
}

// Runs the subjects and prints a row per pass.
class Bench {
 public:
  explicit Bench(const Options& o) : options_(o), stopwatch_(o.device) {
    std::printf("%-22s %-7s %11s %12s %10s\n", "op", "pass", "ms", "tokens/s", "GFLOP/s");
  }

  void run(const Subject& s) {
    for (Pass pass : options_.passes) {
      if (!s.bwd && pass != Pass::fwd) continue;
      const double factor = pass == Pass::fwd ? 1 : pass == Pass::bwd ? kBackwardFactor : 1 + kBackwardFactor;
      const Call call = pass_call(s, pass);
      try {
        const double ms = median_ms(call);
        std::printf("%-22s %-7s %11.4g %12.0f %10.2f\n", s.name.c_str(), pass_name(pass), ms, s.tokens / ms * 1e3,
                    factor * s.fwd_flops / ms * 1e-6);
      } catch (const std::exception& e) {
        error(s.name + " " + pass_name(pass), e.what());
      }
      std::fflush(stdout);
    }
  }

  // A subject that could not be set up, or a pass that threw.
  void error(const std::string& what, const std::string& message) {
    std::printf("%-30s FAILED  %s\n", what.c_str(), message.c_str());
    ++failures_;
  }

  int failures() const { return failures_; }

 private:
  double median_ms(const Call& call) {
    for (int i = 0; i < options_.warmup; ++i) call();
    testing::synchronize(options_.device);
    std::vector<double> times;
    for (int i = 0; i < options_.repeat; ++i) times.push_back(stopwatch_.milliseconds(call));
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  }

  const Options& options_;
  Stopwatch stopwatch_;
  int failures_ = 0;
};

std::mt19937_64 rng_for(const Options& o) { return std::mt19937_64(o.seed); }

double total_tokens(const Shape& s) { return double(s.batch) * double(s.seq_len); }

double gla_fwd_flops(const Shape& s, GlaAlgorithm algorithm) {
  const double K = double(s.key_dim), V = double(s.value_dim), tokens_heads = total_tokens(s) * double(s.heads);
  if (algorithm == GlaAlgorithm::recurrent) return 4 * tokens_heads * K * V;
  return 2 * tokens_heads * (kChunk * K + kChunk * V + 2 * K * V);
}

// Query-key pairs that are computed: the causal mask keeps about half.
double attention_pairs(const Shape& s, bool causal) {
  double pairs = 0;
  if (!s.varlen()) pairs = double(s.batch) * double(s.seq_len) * double(s.seq_len);
  for (size_t i = 0; i + 1 < s.cu_seqlens.size(); ++i) {
    const double len = double(s.cu_seqlens[i + 1] - s.cu_seqlens[i]);
    pairs += len * len;
  }
  return causal ? pairs / 2 : pairs;
}

void bench_gla(Bench& bench, const Options& o, const GlaInputs& in, GlaAlgorithm algorithm) {
  const std::string name = algorithm == GlaAlgorithm::chunked ? "gla chunked" : "gla recurrent";
  const GlaOutputs out = make_gla_outputs(in);
  const GlaGrads grads = make_gla_grads(in);
  GlaForwardArgs fwd = gla_forward_args(in, out, algorithm, o.tuning);
  GlaBackwardArgs bwd = gla_backward_args(in, grads, algorithm, o.tuning);
  Buffer fwd_workspace, bwd_workspace;
  try {
    fwd_workspace = attach_workspace(fwd);
    bwd_workspace = attach_workspace(bwd);
  } catch (const std::exception& e) {
    return bench.error(name, e.what());
  }
  bench.run({name, gla_fwd_flops(o.shape, algorithm), total_tokens(o.shape), [&] { gla_forward(fwd); },
             [&] { gla_backward(bwd); }});
}

// One decode step of every sequence; the state carries over between calls.
void bench_decode(Bench& bench, const Options& o) {
  Shape one = o.shape;
  one.batch = o.shape.num_seqs();
  one.seq_len = 1;
  one.cu_seqlens.clear();
  std::mt19937_64 rng = rng_for(o);
  const GlaInputs in = make_gla_inputs(one, o.gate, /*initial_state=*/true, o.dtype, rng).to(o.device, o.dtype);
  const GlaOutputs out = make_gla_outputs(in);
  GlaDecodeArgs args;
  args.q = token_view(in.q, 0), args.k = token_view(in.k, 0), args.v = token_view(in.v, 0);
  args.g = token_view(in.g, 0);
  args.state = in.h0.view();
  args.o = token_view(out.o, 0);
  const double flops = 4 * double(one.batch * one.heads * one.key_dim * one.value_dim);
  bench.run({"gla decode", flops, double(one.batch), [&] { gla_decode(args); }, nullptr});
}

void bench_attention(Bench& bench, const Options& o) {
  const std::string name = "attention tiled";
  std::mt19937_64 rng = rng_for(o);
  const AttentionInputs in = make_attention_inputs(o.shape, o.dtype, rng).to(o.device, o.dtype);
  const AttentionOutputs out = make_attention_outputs(in);
  const AttentionGrads grads = make_attention_grads(in);
  AttentionForwardArgs fwd = attention_forward_args(in, out, o.causal, AttentionAlgorithm::tiled, o.tuning);
  AttentionBackwardArgs bwd = attention_backward_args(in, out, grads, o.causal, AttentionAlgorithm::tiled, o.tuning);
  Buffer fwd_workspace, bwd_workspace;
  try {
    fwd_workspace = attach_workspace(fwd);
    bwd_workspace = attach_workspace(bwd);
    attention_forward(fwd);  // the o and lse the backward reads
  } catch (const std::exception& e) {
    return bench.error(name, e.what());
  }
  const Shape& s = o.shape;
  const double flops = 2 * double(s.heads) * attention_pairs(s, o.causal) * double(s.key_dim + s.value_dim);
  bench.run({name, flops, total_tokens(s), [&] { attention_forward(fwd); }, [&] { attention_backward(bwd); }});
}

void print_header(const Options& o) {
  std::printf("flashgla bench: %s %s, %s, gate %s, h0 %s, %s, warmup %d, repeat %d, seed %llu\n",
              o.device.str().c_str(), short_dtype_name(o.dtype), o.shape.str().c_str(), gate_name(o.gate),
              o.initial_state ? "on" : "off", o.causal ? "causal" : "not causal", o.warmup, o.repeat,
              static_cast<unsigned long long>(o.seed));
}

}  // namespace

int run_bench(const Options& o) {
  print_header(o);
  Bench bench(o);
  if (o.ops.chunked || o.ops.recurrent) {
    std::mt19937_64 rng = rng_for(o);  // one set of inputs for both algorithms: large shapes take a while to fill
    const GlaInputs in = make_gla_inputs(o.shape, o.gate, o.initial_state, o.dtype, rng).to(o.device, o.dtype);
    if (o.ops.chunked) bench_gla(bench, o, in, GlaAlgorithm::chunked);
    if (o.ops.recurrent) bench_gla(bench, o, in, GlaAlgorithm::recurrent);
  }
  if (o.ops.decode) bench_decode(bench, o);
  if (o.ops.attention) bench_attention(bench, o);
  return bench.failures() == 0 ? 0 : 1;
}

}  // namespace flashgla::cli

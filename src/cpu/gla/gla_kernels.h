// The CPU GLA algorithms on one (sequence, head) pair, or one range of its
// tokens, held in contiguous row-major buffers of the accumulation type.
// gla.cpp gathers the strided inputs into this form, runs one of these, and
// scatters the results.
#pragma once

#include <cstdint>

#include "core/gla_chunk.h"
#include "core/problem.h"

namespace flashgla {
struct GlaForwardArgs;
}

namespace flashgla::cpu::gla {

// Inputs of one (sequence, head) pair, or of a range of its tokens that starts
// on a chunk boundary. q is already multiplied by the scale;
// g is dense [len, K] whatever the gate kind (zeros without a gate, the scalar
// broadcast over K for simple GLA); `gate` says which, so that the chunked
// algorithm can skip the exps that are all 1, or equal along each row.
template <class T>
struct HeadInputs {
  int64_t len = 0, K = 0, V = 0;
  const T* q = nullptr;  // [len, K]
  const T* k = nullptr;  // [len, K]
  const T* v = nullptr;  // [len, V]
  const T* g = nullptr;  // [len, K]
  GateKind gate = GateKind::vector;
};

// The reference: the recurrence token by token in fp64. `reverse` runs from
// the last token to the first. state [K, V]: the initial state in, the final
// state out. o: [len, V].
void recurrent_forward(const HeadInputs<double>& in, bool reverse, double* state, double* o);

// Backward of recurrent_forward through the recurrence. h0 [K, V]; d_o
// [len, V]; d_state [K, V]: the gradient of the final state in, that of the
// initial state out. dq, dk, dg: [len, K]; dv: [len, V] (dq w.r.t. the scaled q).
void recurrent_backward(const HeadInputs<double>& in, bool reverse, const double* h0, const double* d_o,
                        double* d_state, double* dq, double* dk, double* dv, double* dg);

// The reference forward with vLLM's state pools (GlaForwardArgs::ssm_state_indices).
void recurrent_forward_pooled(const GlaForwardArgs& a, const GlaProblem& p);

// The chunked algorithm (chunks of 64 tokens, 16-wide sub-chunks), forward
// only in time; same arguments as the recurrent versions, and the backward's scratch `states` of
// [ceil(len / C), K, V] for the state before each chunk. T is float or double.
// Runs the AVX2 + FMA build when the CPU has it (and FLASHGLA_CPU_ISA is not
// "baseline"), else the baseline build.
template <class T>
void chunked_forward(const HeadInputs<T>& in, T* state, T* o);

template <class T>
void chunked_backward(const HeadInputs<T>& in, const T* h0, const T* d_o, T* d_state, T* dq, T* dk, T* dv, T* dg,
                      T* states);

// The state after in's tokens, from state (in), as chunked_forward carries it; reads k, v and g only.
template <class T>
void chunked_states(const HeadInputs<T>& in, T* state);

extern template void chunked_forward<float>(const HeadInputs<float>&, float*, float*);
extern template void chunked_forward<double>(const HeadInputs<double>&, double*, double*);
extern template void chunked_states<float>(const HeadInputs<float>&, float*);
extern template void chunked_states<double>(const HeadInputs<double>&, double*);
extern template void chunked_backward<float>(const HeadInputs<float>&, const float*, const float*, float*, float*,
                                             float*, float*, float*, float*);
extern template void chunked_backward<double>(const HeadInputs<double>&, const double*, const double*, double*,
                                              double*, double*, double*, double*, double*);

// gla.cpp runs the chunked algorithm on each (sequence, head) pair one range of kRangeTokens tokens at a
// time: it gathers the range's inputs, runs the kernel on them with the state carried from the range
// before, and scatters the results. Chunk boundaries stay where they were (a range is whole chunks), so
// the results are those of one call on the whole sequence, bit for bit, while the scratch is per range
// and pair in flight (one per worker thread), not per token. The backward runs the ranges from the last
// to the first, each from the state before it: a first pass keeps one state per range.
inline constexpr int64_t kRangeTokens = int64_t(64) * kChunk;

// Elements of the accumulation type that the chunked forward (or backward) holds for one (sequence,
// head) pair of `len` tokens: gla.cpp's gathered range, its results and states, and the kernel's states
// before each chunk of a range (backward). Bounded by the range for any len, but for the backward's one
// [K, V] state per range. The kernels' per-chunk buffers ([C, max(K, V)] blocks) come on top.
int64_t chunked_scratch_elements(int64_t len, int64_t K, int64_t V, bool backward);

// The instruction set chunked_forward/backward use now: "avx2" or "baseline".
const char* chunked_instruction_set();

// The AVX2 + FMA build (gla_chunk_avx2.cpp), where the compiler supports it.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define FLASHGLA_GLA_AVX2 1
namespace avx2 {
bool supported();  // by this CPU
template <class T>
void chunked_forward(const HeadInputs<T>& in, T* state, T* o);
template <class T>
void chunked_backward(const HeadInputs<T>& in, const T* h0, const T* d_o, T* d_state, T* dq, T* dk, T* dv, T* dg,
                      T* states);
template <class T>
void chunked_states(const HeadInputs<T>& in, T* state);
}  // namespace avx2
#endif

}  // namespace flashgla::cpu::gla

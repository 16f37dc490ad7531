// The baseline build of the chunked algorithm, and the choice between it and
// the AVX2 + FMA build at run time.
#include <cstdlib>
#include <cstring>

#include "cpu/gla/gla_chunk_impl.h"

namespace flashgla::cpu::gla {
namespace {

bool use_avx2() {
#ifdef FLASHGLA_GLA_AVX2
  const char* isa = std::getenv("FLASHGLA_CPU_ISA");  // "baseline" forces the portable build (tests use it)
  return !(isa && std::strcmp(isa, "baseline") == 0) && avx2::supported();
#else
  return false;
#endif
}

}  // namespace

const char* chunked_instruction_set() { return use_avx2() ? "avx2" : "baseline"; }

template <class T>
void chunked_forward(const HeadInputs<T>& in, T* state, T* o) {
#ifdef FLASHGLA_GLA_AVX2
  if (use_avx2()) return avx2::chunked_forward(in, state, o);
#endif
  chunked_forward_impl(in, state, o);
}

template <class T>
void chunked_states(const HeadInputs<T>& in, T* state) {
#ifdef FLASHGLA_GLA_AVX2
  if (use_avx2()) return avx2::chunked_states(in, state);
#endif
  chunked_states_impl(in, state);
}

template <class T>
void chunked_backward(const HeadInputs<T>& in, const T* h0, const T* d_o, T* d_state, T* dq, T* dk, T* dv, T* dg,
                      T* states) {
#ifdef FLASHGLA_GLA_AVX2
  if (use_avx2()) return avx2::chunked_backward(in, h0, d_o, d_state, dq, dk, dv, dg, states);
#endif
  chunked_backward_impl(in, h0, d_o, d_state, dq, dk, dv, dg, states);
}

template void chunked_forward<float>(const HeadInputs<float>&, float*, float*);
template void chunked_forward<double>(const HeadInputs<double>&, double*, double*);
template void chunked_states<float>(const HeadInputs<float>&, float*);
template void chunked_states<double>(const HeadInputs<double>&, double*);
template void chunked_backward<float>(const HeadInputs<float>&, const float*, const float*, float*, float*, float*,
                                      float*, float*, float*);
template void chunked_backward<double>(const HeadInputs<double>&, const double*, const double*, double*, double*,
                                       double*, double*, double*, double*);

}  // namespace flashgla::cpu::gla

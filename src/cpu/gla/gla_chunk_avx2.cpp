// The chunked algorithm compiled for AVX2 + FMA (8 floats a vector, fused
// multiply-add), chosen at run time by gla_chunk.cpp when the CPU has them.
// The same source as the baseline build: only the instruction set differs.
//
// Everything compiled under the target pragma has internal linkage (the
// implementation header and gla_math.h), and every standard header is
// included before it, so no AVX2 code can stand in for a shared inline
// function of the baseline build.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/gla/gla_kernels.h"

#ifdef FLASHGLA_GLA_AVX2

namespace flashgla::cpu::gla::avx2 {
bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
}  // namespace flashgla::cpu::gla::avx2

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "cpu/gla/gla_chunk_impl.h"

namespace flashgla::cpu::gla::avx2 {

template <class T>
void chunked_forward(const HeadInputs<T>& in, T* state, T* o) {
  chunked_forward_impl(in, state, o);
}

template <class T>
void chunked_states(const HeadInputs<T>& in, T* state) {
  chunked_states_impl(in, state);
}

template <class T>
void chunked_backward(const HeadInputs<T>& in, const T* h0, const T* d_o, T* d_state, T* dq, T* dk, T* dv, T* dg,
                      T* states) {
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

}  // namespace flashgla::cpu::gla::avx2

#pragma GCC pop_options

#endif  // FLASHGLA_GLA_AVX2

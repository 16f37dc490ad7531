// Small dense kernels for the CPU GLA backend: an exp over arrays and a
// blocked matrix product, both written as plain loops with contiguous inner
// loops so that the compiler vectorizes them (no intrinsics, no fast-math).
// Internal linkage: each file that includes this gets its own copy, compiled
// for that file's instruction set (see gla_chunk_avx2.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashgla::cpu::gla {
namespace {

namespace detail {
inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace detail

// y[i] = exp(x[i]) (x == y allowed). The float version: x = n ln 2 + r with
// |r| ≤ ln 2 / 2 (Cody-Waite), exp r by a degree-6 polynomial fitted for
// relative error (max 1e-7 over all floats, like expf), times 2^n built from
// bits. GCC does not vectorize std::exp without -ffast-math, and the chunked
// algorithm spends much of its time here. Results below 2^-126 flush to 0
// (an absolute error under 1.2e-38); overflow gives inf; NaN stays NaN. The
// selects are done on integer bits: a float ?: keeps GCC from vectorizing.
inline void exp_array(const float* x, float* y, int64_t n) {
  using detail::bits_of;
  using detail::from_bits;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float shifted = xi * 1.44269504088896341f + kRound;
    const float nf = shifted - kRound;                               // round(x / ln 2)
    const int32_t e = int32_t(bits_of(shifted) - bits_of(kRound));  // the same as an integer (|x| < 2^21)
    const float r = (xi - nf * 0.693359375f) - nf * -2.12194440e-4f;
    float p = 1.3814612e-03f;
    p = p * r + 8.36871e-03f;
    p = p * r + 4.166839e-02f;
    p = p * r + 1.6666521e-01f;
    p = p * r + 4.9999994e-01f;
    p = 1.0f + r * (1.0f + r * p);
    const int32_t top = int32_t(e > 127);  // 2^128 as 2^127 * 2
    const float result =
        p * from_bits(uint32_t(e - top + 127) << 23) * from_bits(0x3F800000u + (uint32_t(top) << 23));
    const uint32_t normal = 0u - uint32_t(e > -127);  // 2^e is a normal float
    const uint32_t overflow = 0u - uint32_t(e > 128);
    const uint32_t nan = 0u - uint32_t(xi != xi);
    const uint32_t finite = ((bits_of(result) & normal) & ~overflow) | (0x7F800000u & overflow);
    y[i] = from_bits((finite & ~nan) | (bits_of(xi) & nan));
  }
}

// fp64 keeps the correctly rounded libm exp: the fp64 path is for accuracy.
inline void exp_array(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// C[m][n] += sum_p A(m, p) * B[p][n] for m < M, n < N, p < P, where
// A(m, p) = a[m * a_row + p * a_col] (so A may be read transposed for free),
// B and C are row-major with leading dimensions ldb and ldc.
template <class T>
void matmul_acc(int64_t M, int64_t N, int64_t P, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb,
                T* c, int64_t ldc) {
  // Tile: 64 floats (32 doubles) of one row of C, accumulated across all of P
  // before C is touched again. The widths were chosen by measurement (GCC 12,
  // SSE2 and AVX2; bench/notes_gla_cpu.md): narrower tiles were slower, and
  // tiles of several rows made GCC vectorize across rows with shuffles.
  constexpr int64_t kCols = 256 / sizeof(T);
  for (int64_t m = 0; m < M; ++m) {
    const T* arow = a + m * a_row;
    T* crow = c + m * ldc;
    int64_t n0 = 0;
    for (; n0 + kCols <= N; n0 += kCols) {
      T acc[kCols];
      for (int64_t l = 0; l < kCols; ++l) acc[l] = crow[n0 + l];
      for (int64_t p = 0; p < P; ++p) {
        const T x = arow[p * a_col];
        const T* brow = b + p * ldb + n0;
        for (int64_t l = 0; l < kCols; ++l) acc[l] += x * brow[l];
      }
      for (int64_t l = 0; l < kCols; ++l) crow[n0 + l] = acc[l];
    }
    if (n0 == N) continue;
    for (int64_t p = 0; p < P; ++p) {  // the last columns
      const T x = arow[p * a_col];
      const T* brow = b + p * ldb;
      for (int64_t n = n0; n < N; ++n) crow[n] += x * brow[n];
    }
  }
}

// dst[j][i] = src[i][j] for a rows x cols row-major src (leading dimension lds).
template <class T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t lds, T* dst, int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
}

// sum_d x[d] * y[d] * z[d], with independent partial sums so the loop vectorizes
// without reassociation flags.
template <class T>
T dot3(const T* x, const T* y, const T* z, int64_t n) {
  constexpr int64_t kLanes = 8;
  T partial[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += x[d + l] * y[d + l] * z[d + l];
  T sum = 0;
  for (; d < n; ++d) sum += x[d] * y[d] * z[d];
  for (int64_t l = 0; l < kLanes; ++l) sum += partial[l];
  return sum;
}

}  // namespace
}  // namespace flashgla::cpu::gla

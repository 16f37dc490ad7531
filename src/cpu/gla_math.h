// Small dense kernels for the CPU GLA backend: an exp over arrays and a
// blocked matrix product, both written as plain loops with contiguous inner
// loops so that the compiler vectorizes them (no intrinsics, no fast-math).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashgla::cpu::gla {

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

// y[i] = exp(x[i]) (x == y allowed). The float version is a range reduction
// plus a degree-7 Taylor polynomial (max relative error ~1e-7, like expf):
// GCC does not vectorize std::exp without -ffast-math, and the chunked
// algorithm spends much of its time here. Results below exp(-87) flush to 0
// (an absolute error under 2e-38). The selects are done on integer bits
// because float comparisons keep GCC from vectorizing the loop. NaN stays NaN.
inline void exp_array(const float* x, float* y, int64_t n) {
  using detail::bits_of;
  using detail::from_bits;
  constexpr uint32_t kMinusInf = 0xFF800000u, kPlusInf = 0x7F800000u;
  constexpr uint32_t kLow = 0xC2AE0000u;   // -87.0f
  constexpr uint32_t kHigh = 0x42B00000u;  // 88.0f
  constexpr float kRound = 12582912.0f;    // 1.5 * 2^23: adding it rounds to an integer
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits_of(x[i]);
    const uint32_t underflow = 0u - uint32_t((b > kLow) & (b <= kMinusInf));  // -inf <= x < -87
    const uint32_t overflow = 0u - uint32_t((b > kHigh) & (b <= kPlusInf));   // 88 < x <= +inf
    const float c = from_bits((b & ~(underflow | overflow)) | (kLow & underflow) | (kHigh & overflow));
    const float shifted = c * 1.44269504088896341f + kRound;
    const float nf = shifted - kRound;                      // round(c / ln 2)
    const uint32_t ni = bits_of(shifted) - bits_of(kRound);  // the same, as an integer
    const float r = (c - nf * 0.693359375f) - nf * -2.12194440e-4f;  // c - n ln 2 in two parts
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float result = p * from_bits((ni + 127u) << 23);  // p * 2^n, n in [-126, 127]
    y[i] = from_bits((bits_of(result) & ~(underflow | overflow)) | (kPlusInf & overflow));
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
  // Register tile: kRows rows of C by kCols columns (two 16-byte vectors a row),
  // accumulated across all of P before C is touched again.
  constexpr int64_t kRows = 4, kCols = 32 / sizeof(T);
  auto simple = [&](int64_t m0, int64_t m1, int64_t n0) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t p = 0; p < P; ++p) {
        const T x = a[m * a_row + p * a_col];
        const T* brow = b + p * ldb;
        T* crow = c + m * ldc;
        for (int64_t n = n0; n < N; ++n) crow[n] += x * brow[n];
      }
  };
  int64_t m0 = 0;
  for (; m0 + kRows <= M; m0 += kRows) {
    int64_t n0 = 0;
    for (; n0 + kCols <= N; n0 += kCols) {
      T acc[kRows][kCols];
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t l = 0; l < kCols; ++l) acc[r][l] = c[(m0 + r) * ldc + n0 + l];
      for (int64_t p = 0; p < P; ++p) {
        const T* brow = b + p * ldb + n0;
        for (int64_t r = 0; r < kRows; ++r) {
          const T x = a[(m0 + r) * a_row + p * a_col];
          for (int64_t l = 0; l < kCols; ++l) acc[r][l] += x * brow[l];
        }
      }
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t l = 0; l < kCols; ++l) c[(m0 + r) * ldc + n0 + l] = acc[r][l];
    }
    if (n0 < N) simple(m0, m0 + kRows, n0);
  }
  if (m0 < M) simple(m0, M, 0);
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

}  // namespace flashgla::cpu::gla

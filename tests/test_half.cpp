// bf16/fp16 conversions: exact on representable values, round to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/half.h"

using namespace flashgla;

TEST(Half, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    float f = f16_to_float(uint16_t(h));
    ASSERT_EQ(float_to_f16(f), uint16_t(h)) << "h=" << h << " f=" << f;
  }
}

TEST(Half, Bf16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7f80) == 0x7f80) continue;
    float f = bf16_to_float(uint16_t(h));
    ASSERT_EQ(float_to_bf16(f), uint16_t(h)) << "h=" << h;
  }
}

TEST(Half, RoundsToNearest) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 100.f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng);
    if (i % 3 == 0) x *= 1e-6f;  // subnormal halves too
    float h = f16_to_float(float_to_f16(x));
    float b = bf16_to_float(float_to_bf16(x));
    // Within half a unit in the last place of each format.
    float ulp_h = std::max(std::ldexp(1.f, std::ilogb(std::fabs(x)) - 10), std::ldexp(1.f, -24));
    ASSERT_LE(std::fabs(h - x), 0.5f * ulp_h * 1.0001f) << x;
    ASSERT_LE(std::fabs(b - x), std::ldexp(1.f, std::ilogb(std::fabs(x)) - 8) * 1.0001f) << x;
  }
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

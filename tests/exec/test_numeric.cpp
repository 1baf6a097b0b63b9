// fp16/bf16 conversions and the softmax merge: the math both executors share.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "treeattn/numeric.hpp"

using namespace treeattn;

TEST(Numeric, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    const float f = half_bits_to_float(uint16_t(h));
    EXPECT_EQ(float_to_half_bits(f), h) << "bits " << h;
  }
}

TEST(Numeric, HalfRoundsToNearestEven) {
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(70000.f)), INFINITY);
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(5.96e-8f)), 5.9604645e-8f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(NAN))));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int i = 0; i < 100000; ++i) {
    const float f = u(rng);
    EXPECT_LE(std::fabs(half_bits_to_float(float_to_half_bits(f)) - f), std::fabs(f) * 4.9e-4f + 1e-7f);
  }
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f)), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 1.0f / 256)), 1.0f);          // tie -> even
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
}

TEST(Numeric, Fp8E4m3RoundTripsEveryFiniteValueAndRoundsToNearestEven) {
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x7e), 448.f);
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_bits_to_float(0xb8), -1.f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(0xff)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float f = fp8_e4m3_bits_to_float(uint8_t(b));
    EXPECT_EQ(float_to_fp8_e4m3_bits(f), b == 0x80 ? 0x80 : b) << "byte " << b;
  }
  // Between neighbours lo < hi: the midpoint goes to the even byte, anything
  // above it to hi (positive bytes 0 .. 0x7e; negative ones mirror them).
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = fp8_e4m3_bits_to_float(uint8_t(b)), hi = fp8_e4m3_bits_to_float(uint8_t(b + 1));
    const float mid = (lo + hi) / 2;
    EXPECT_EQ(float_to_fp8_e4m3_bits(mid), b % 2 ? b + 1 : b) << "midpoint above byte " << b;
    EXPECT_EQ(float_to_fp8_e4m3_bits(std::nextafter(mid, 1e9f)), b + 1) << "just above the midpoint of " << b;
    EXPECT_EQ(float_to_fp8_e4m3_bits(-std::nextafter(mid, 0.f)), 0x80 | b) << "just below, negative, " << b;
  }
  EXPECT_EQ(float_to_fp8_e4m3_bits(1e9f), 0x7e);   // saturates, as vLLM quantises
  EXPECT_EQ(float_to_fp8_e4m3_bits(-500.f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3_bits(NAN), 0x7f);
}

TEST(Numeric, MergeWeightsHandleEmptyPartials) {
  const float ninf = -INFINITY;
  MergeWeights m = merge_weights(ninf, ninf);
  EXPECT_EQ(m.wa, 0.f);
  EXPECT_EQ(m.wb, 0.f);
  EXPECT_EQ(m.lse, ninf);
  m = merge_weights(ninf, 2.f);
  EXPECT_EQ(m.wa, 0.f);
  EXPECT_EQ(m.wb, 1.f);
  EXPECT_FLOAT_EQ(m.lse, 2.f);
  m = merge_weights(std::log(1.f), std::log(3.f));
  EXPECT_FLOAT_EQ(m.wa, 0.25f);
  EXPECT_FLOAT_EQ(m.wb, 0.75f);
  EXPECT_FLOAT_EQ(m.lse, std::log(4.f));
  EXPECT_EQ(SoftmaxState{}.lse(), ninf);
}

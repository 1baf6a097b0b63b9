// Numerics shared by host and device: fp16/bf16 bit conversions and the
// online-softmax state, so the CPU executor and the GPU merge do the same math.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define TA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TA_HOST_DEVICE inline
#endif

namespace treeattn {

// IEEE half <-> float, round-to-nearest-even, with subnormals, inf and NaN.
inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; ++e; } while (!(mant & 0x400));
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return uint16_t(sign);
    // value = m * 2^(e - 150); in units of the smallest subnormal 2^-24 that is m >> (126 - e)
    uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t out = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (out & 1))) ++out;
    return uint16_t(sign | out);
  }
  uint32_t e = (absx >> 23) - 127 + 15, m = absx & 0x7fffffu;
  uint32_t out = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1))) ++out;  // may carry into exp: correct
  return uint16_t(sign | out);
}

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// OCP fp8 E4M3FN <-> float: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
// no infinities, 0x7f / 0xff are NaN, the largest finite value is 448.
// Decoding is exact. Encoding rounds to nearest even and saturates to
// +-448, as vLLM's fp8 KV cache quantises (a scaled value beyond the range
// is clipped, not turned into NaN).
inline float fp8_e4m3_bits_to_float(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 7u;
  if (exp == 15 && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = exp == 0 ? std::ldexp(float(mant), -9) : std::ldexp(float(8 + mant), int(exp) - 10);
  return (b & 0x80u) ? -v : v;
}

inline uint8_t float_to_fp8_e4m3_bits(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.f) return uint8_t(sign | 0x7e);
  if (a < 0.015625f) return uint8_t(sign | uint8_t(std::nearbyint(a * 512.f)));  // subnormals, 2^-9 apart (8: 2^-6)
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): 8 .. 16 steps of 2^(e - 4)
  int q = int(std::nearbyint(std::ldexp(a, 4 - e)));
  if (q == 16) q = 8, ++e;
  const int bits = ((e + 6) << 3) | (q - 8);
  return uint8_t(sign | (bits > 0x7e ? 0x7e : bits));
}

// Online-softmax state of one row: running max m, running sum d of
// exp(s - m), in natural-log units. The empty state is (m = -inf, d = 0); it
// merges as the identity and normalises to zeros, never NaN.
struct SoftmaxState {
  float m = -std::numeric_limits<float>::infinity();
  float d = 0.f;

  TA_HOST_DEVICE bool empty() const { return d == 0.f; }
  // log-sum-exp of the scores seen; -inf when empty.
  TA_HOST_DEVICE float lse() const {
    return empty() ? -std::numeric_limits<float>::infinity() : m + logf(d);
  }
};

// Weights for merging two partials with log-sum-exps a and b (normalised
// outputs): out = wa * oa + wb * ob, lse = merged. Both -inf gives (0, 0, -inf).
struct MergeWeights {
  float wa, wb, lse;
};
TA_HOST_DEVICE MergeWeights merge_weights(float lse_a, float lse_b) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float mx = fmaxf(lse_a, lse_b);
  if (mx == ninf) return {0.f, 0.f, ninf};
  float ea = expf(lse_a - mx), eb = expf(lse_b - mx);
  float s = ea + eb;
  return {ea / s, eb / s, mx + logf(s)};
}

}  // namespace treeattn

// fp8 (OCP E4M3FN) K/V elements to the MMA's 16-bit type. Both conversions
// are exact: every e4m3 value is an fp16 value and a bf16 value. The K/V
// scales are applied elsewhere (k_scale folded into the softmax scale, v_scale
// into the output), so a tile converts with no arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace treeattn::cuda {

// Two fp8 values (low byte first) as a packed pair of T.
template <class T>
__device__ __forceinline__ uint32_t fp8x2_to(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// 16 fp8 values (one 16-byte chunk) -> 16 values of T (two 16-byte chunks).
template <class T>
__device__ __forceinline__ void fp8x16_to(const uint4& in, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = fp8x2_to<T>(uint16_t(w[i] & 0xffffu));
    o[2 * i + 1] = fp8x2_to<T>(uint16_t(w[i] >> 16));
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace treeattn::cuda

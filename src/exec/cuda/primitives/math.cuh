// Small device math: fast exp2/log2 (MUFU), quad and warp reductions.
#pragma once

#include <cstdint>

namespace treeattn::cuda {

// 2^x with the special-function unit; ex2(-inf) = +0, which the online softmax
// relies on for masked scores and the empty state.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes of a quad (the lanes holding one row of an mma
// accumulator).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// x >> n for any n: PTX clamps shift amounts past 63, so n >= 64 gives 0
// (C++'s >> leaves them undefined).
__device__ __forceinline__ uint64_t shr_u64(uint64_t x, uint32_t n) {
  uint64_t y;
  asm("shr.b64 %0, %1, %2;\n" : "=l"(y) : "l"(x), "r"(n));
  return y;
}

// OR over the 32 lanes of a warp (all active): two redux.sync on sm_80+.
__device__ __forceinline__ uint64_t warp_or(uint64_t x) {
#if __CUDA_ARCH__ >= 800
  const uint32_t lo = __reduce_or_sync(0xffffffffu, uint32_t(x)), hi = __reduce_or_sync(0xffffffffu, uint32_t(x >> 32));
  return uint64_t(hi) << 32 | lo;
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x |= __shfl_xor_sync(0xffffffffu, x, o);
  return x;
#endif
}

}  // namespace treeattn::cuda

// cp.async wrappers: 16-byte global->shared copies that bypass L1 (.cg), with
// zero-fill for rows past the end of a unit, and the commit/wait group pair.
// The PTX lives here so kernels read like algorithms.
#pragma once

#include <cstdint>

namespace treeattn::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes when `valid`, else writes 16 zero bytes to `dst` (src is not
// read then, but must still be a mapped address: pass the tensor base).
// The .L2::128B hint prefetches the rest of the 128-byte line: a token's row is
// at least 128 bytes (head_dim >= 64), so the line is always used.
// The zero fill is cp.async's ignore-src predicate, which the copy
// instruction takes as is (a src-size operand of 0 or 16 became a predicate
// again in SASS: three instructions more per copy).
__device__ __forceinline__ void cp_async_16_zfill(void* dst, const void* src, bool valid) {
  asm volatile(
      "{\n.reg .pred ignore;\nsetp.eq.u32 ignore, %2, 0;\n"
      "cp.async.cg.shared.global.L2::128B [%0], [%1], 16, ignore;\n}\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(uint32_t(valid))
      : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace treeattn::cuda

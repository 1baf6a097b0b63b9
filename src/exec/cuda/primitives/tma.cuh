// Tensor-memory-accelerator copies (sm_90: cp.async.bulk.tensor) and the
// shared-memory barriers (mbarrier) they complete on. One thread issues a
// box copy from a tensor map (a 128-byte descriptor of the global tensor,
// encoded on the host, here a __grid_constant__ kernel parameter); the copy
// lands in shared memory in the map's swizzle and adds its bytes to the
// barrier's transaction count. A barrier's phase completes when its expected
// arrivals have arrived and its transaction count is back at zero.
// The PTX lives here so kernels read like algorithms.
#pragma once

#include <cstdint>

#include "exec/cuda/primitives/cp_async.cuh"

namespace treeattn::cuda {

// True in one lane of the (converged) warp: the lane that issues its copies.
// ptxas then knows one thread issues them (a plain lane test makes it wrap
// each copy in a loop over the active lanes, as the copy's operands must be
// uniform).
__device__ __forceinline__ bool elect_one() {
  uint32_t elected = 0;
  asm volatile(
      "{\n.reg .b32 lane;\n.reg .pred one;\nelect.sync lane|one, 0xffffffff;\n@one mov.u32 %0, 1;\n}\n"
      : "+r"(elected));
  return elected != 0;
}

// Initialises the barrier at `bar` (8 bytes of shared memory) for
// `arrivals` arrivals a phase; visible to the CTA after the next barrier.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the barrier initialisations before it visible to the async proxy
// (the copies that complete on them).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also expects `bytes` more bytes of copies in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of parity `parity` has completed (the copies it
// counted are visible to this thread, the async proxy's writes included).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Copies the box at element coordinates (x, y) of the 2-D tensor map `map`
// into shared memory at `dst`; the box's bytes count against `bar`'s phase.
// `map` must be the address of a __grid_constant__ parameter (or of global
// memory): the copy reads the descriptor through it.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int32_t x, int32_t y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace treeattn::cuda

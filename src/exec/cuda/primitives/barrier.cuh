// A barrier among some warps of a CTA: named barrier `id` (1..15; 0 is
// __syncthreads') over `threads` threads (a multiple of 32), which orders
// their shared-memory accesses as __syncthreads does for the whole CTA.
#pragma once

namespace treeattn::cuda {

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace treeattn::cuda

// Turns one (dtype, head_dim, m) into a compiled kernel: included by each file
// of kernels/, which holds nothing but TREEATTN_ATTENTION_INSTANCE(...).
#pragma once

#include <type_traits>

#include "exec/cuda/attention_kernel.cuh"
#include "exec/cuda/kernels.hpp"

namespace treeattn::cuda {

// n of the compiled tile whose m is `m` (m is unique in kTileConfigs).
constexpr int tile_n_for_m(int m) {
  for (const TileConfig& t : kTileConfigs)
    if (t.m == m) return t.n;
  return -1;
}

template <int kDType, int D, int M, int N>
KernelEntry attention_entry() {
  using T = std::conditional_t<kDType == 0, __half, __nv_bfloat16>;
  using Tr = AttnTraits<T, D, M, N>;
  KernelEntry e;
  e.kernel = reinterpret_cast<const void*>(&attention_kernel<Tr>);
  e.threads = Tr::kThreads;
  e.m = M;
  e.n = N;
  e.min_stages = Tr::kMinStages;
  e.max_stages = Tr::kMaxStages;
  e.smem_base = Tr::kQOffset + Tr::kQBytes;
  e.smem_per_stage = 2 * Tr::kTileBytes;
  return e;
}

}  // namespace treeattn::cuda

// The m = 16 tile with 32-token K/V tiles (2 warps): units of at most 32
// tokens (a tree's short leaves) need half the shared memory and half the
// registers of a CTA, so twice as many of these latency-bound CTAs share an SM.
#define TREEATTN_ATTENTION_INSTANCE_SHORT(DTYPE_ID, D) \
  template ::treeattn::cuda::KernelEntry treeattn::cuda::attention_entry<DTYPE_ID, D, 16, 32>();

#define TREEATTN_ATTENTION_INSTANCE(DTYPE_ID, D, M)                                              \
  static_assert(::treeattn::cuda::tile_n_for_m(M) > 0, "m is not in kTileConfigs");            \
  template ::treeattn::cuda::KernelEntry                                                        \
  treeattn::cuda::attention_entry<DTYPE_ID, D, M, ::treeattn::cuda::tile_n_for_m(M)>();

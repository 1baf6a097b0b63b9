// Turns one (dtype, K/V storage, head_dim, m, n) into a compiled kernel:
// included by each file of kernels/, which holds nothing but
// TREEATTN_ATTENTION_INSTANCE(...).
#pragma once

#include <type_traits>

#include "exec/cuda/attention_kernel.cuh"
#include "exec/cuda/kernels.hpp"

namespace treeattn::cuda {

// AttnTraits with another register cap (__launch_bounds__' min blocks per SM).
template <class Base, int kBlocks>
struct WithMinBlocksPerSm : Base {
  static constexpr int kMinBlocksPerSm = kBlocks;
};

// The traits a compiled tile uses: AttnTraits<T, D, M, N>, except m = 16 with
// 128-token K/V tiles at d <= 128, which AttnTraits caps at 128 registers
// (4 CTAs/SM) like the other m = 16 tiles; ptxas then spills 40 bytes at
// d = 128. Its shared memory (4 KB of Q + 64 KB per K/V stage at d = 128)
// holds it to at most 3 CTAs per SM anyway, so it is capped at 3 (168
// registers) instead.
template <class T, class KV, int D, int M, int N, bool kSkip>
struct TileTraits {
  using type = AttnTraits<T, D, M, N, KV, kSkip>;
};
template <class T, class KV, int D>
  requires(D <= 128)
struct TileTraits<T, KV, D, 16, 128, false> {
  using type = WithMinBlocksPerSm<AttnTraits<T, D, 16, 128, KV>, 3>;
};

template <int kDType, bool kKvFp8, int D, int M, int N, bool kSkip>
KernelEntry attention_entry() {
  using T = std::conditional_t<kDType == 0, __half, __nv_bfloat16>;
  using KV = std::conditional_t<kKvFp8, __nv_fp8_e4m3, T>;
  using Tr = typename TileTraits<T, KV, D, M, N, kSkip>::type;
  static_assert(!kSkip || Tr::kSkipUnseen, "a skip variant that would not skip");
  KernelEntry e;
  e.kernel = reinterpret_cast<const void*>(&attention_kernel<Tr>);
  e.threads = Tr::kThreads;
  e.m = M;
  e.n = N;
  e.min_stages = Tr::kMinStages;
  e.max_stages = Tr::kMaxStages;
  e.persistent = Tr::kPersistent;
  e.skips_unseen = Tr::kSkipUnseen;
  e.smem_base = Tr::kQOffset + Tr::kQBytes + Tr::kConvBytes;
  e.smem_per_stage = 2 * Tr::kStageBytes;
  return e;
}

}  // namespace treeattn::cuda

// One compiled tile (m, n) of kTileConfigs: TREEATTN_ATTENTION_INSTANCE is
// the n = 64 tile of that m, TREEATTN_ATTENTION_INSTANCE_MN any (m, n);
// KV_FP8: 1 for fp8 K/V pools, 0 for pools of the dtype.
#define TREEATTN_ATTENTION_INSTANCE_MN(DTYPE_ID, KV_FP8, D, M, N)                               \
  static_assert(::treeattn::tile_index(M, N) >= 0, "(m, n) is not in kTileConfigs");            \
  template ::treeattn::cuda::KernelEntry treeattn::cuda::attention_entry<DTYPE_ID, KV_FP8, D, M, N>();

#define TREEATTN_ATTENTION_INSTANCE(DTYPE_ID, KV_FP8, D, M) \
  TREEATTN_ATTENTION_INSTANCE_MN(DTYPE_ID, KV_FP8, D, M, ::treeattn::kDefaultKvTile)

// The skip variant of the 128-row tile (AttnTraits::kSkipUnseen), K/V of the dtype.
#define TREEATTN_ATTENTION_SKIP_INSTANCE(DTYPE_ID, D) \
  template ::treeattn::cuda::KernelEntry                \
  treeattn::cuda::attention_entry<DTYPE_ID, false, D, 128, ::treeattn::kDefaultKvTile, true>();

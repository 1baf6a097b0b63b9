// The one place where runtime (dtype, head_dim, tile) becomes a template
// instantiation; a tile of kTileConfigs without a compiled kernel is a link
// error, not a runtime surprise.
#include <string>
#include <utility>

#include "exec/cuda/kernels.hpp"
#include "treeattn/plan.hpp"

namespace treeattn::cuda {

namespace {

template <int kDType, bool kKvFp8, int D, size_t... I>
KernelEntry pick_tile(int tile, std::index_sequence<I...>) {
  KernelEntry e;
  ((tile == int(I) ? (void)(e = attention_entry<kDType, kKvFp8, D, kTileConfigs[I].m, kTileConfigs[I].n>()) : (void)0),
   ...);
  return e;
}

template <int kDType, bool kKvFp8>
KernelEntry pick_dim(int head_dim, int tile) {
  constexpr auto tiles = std::make_index_sequence<kTileConfigs.size()>{};
  switch (head_dim) {
    case 64: return pick_tile<kDType, kKvFp8, 64>(tile, tiles);
    case 128: return pick_tile<kDType, kKvFp8, 128>(tile, tiles);
    case 256: return pick_tile<kDType, kKvFp8, 256>(tile, tiles);
    default: return {};
  }
}

}  // namespace

KernelEntry find_attention_kernel(DType dtype, DType kv_dtype, int head_dim, int tile) {
  KernelEntry e;
  const bool kv_fp8 = kv_dtype == DType::fp8_e4m3;
  if (tile >= 0 && tile < int(kTileConfigs.size()) && (kv_fp8 || kv_dtype == dtype)) {
    if (dtype == DType::fp16) e = kv_fp8 ? pick_dim<0, true>(head_dim, tile) : pick_dim<0, false>(head_dim, tile);
    if (dtype == DType::bf16) e = kv_fp8 ? pick_dim<1, true>(head_dim, tile) : pick_dim<1, false>(head_dim, tile);
  }
  if (!e.kernel)
    throw Error("cuda executor: no kernel compiled for dtype " + std::string(to_string(dtype)) + ", kv_dtype " +
                std::string(to_string(kv_dtype)) + ", head_dim " + std::to_string(head_dim) + ", tile " +
                std::to_string(tile));
  return e;
}

KernelEntry find_attention_skip_kernel(DType dtype, DType kv_dtype, int head_dim) {
  if (kv_dtype != dtype) return {};
  constexpr int kDefault = kDefaultKvTile;
  const bool fp16 = dtype == DType::fp16, bf16 = dtype == DType::bf16;
  switch (head_dim) {
    case 64: return fp16 ? attention_entry<0, false, 64, 128, kDefault, true>()
                  : bf16 ? attention_entry<1, false, 64, 128, kDefault, true>() : KernelEntry{};
    case 128: return fp16 ? attention_entry<0, false, 128, 128, kDefault, true>()
                   : bf16 ? attention_entry<1, false, 128, 128, kDefault, true>() : KernelEntry{};
    default: return {};
  }
}

}  // namespace treeattn::cuda

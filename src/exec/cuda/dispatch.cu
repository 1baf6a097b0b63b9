// The one place where runtime (dtype, head_dim, tile) becomes a template
// instantiation; a tile of kTileConfigs without a compiled kernel is a link
// error, not a runtime surprise.
#include <string>
#include <utility>

#include "exec/cuda/kernels.hpp"
#include "treeattn/plan.hpp"

namespace treeattn::cuda {

namespace {

template <int kDType, int D, size_t... I>
KernelEntry pick_tile(int tile, std::index_sequence<I...>) {
  KernelEntry e;
  ((tile == int(I) ? (void)(e = attention_entry<kDType, D, kTileConfigs[I].m, kTileConfigs[I].n>()) : (void)0), ...);
  return e;
}

template <int kDType>
KernelEntry pick_dim(int head_dim, int tile) {
  constexpr auto tiles = std::make_index_sequence<kTileConfigs.size()>{};
  switch (head_dim) {
    case 64: return pick_tile<kDType, 64>(tile, tiles);
    case 128: return pick_tile<kDType, 128>(tile, tiles);
    case 256: return pick_tile<kDType, 256>(tile, tiles);
    default: return {};
  }
}

}  // namespace

KernelEntry find_attention_kernel(DType dtype, int head_dim, int tile) {
  KernelEntry e;
  if (tile >= 0 && tile < int(kTileConfigs.size())) {
    if (dtype == DType::fp16) e = pick_dim<0>(head_dim, tile);
    if (dtype == DType::bf16) e = pick_dim<1>(head_dim, tile);
  }
  if (!e.kernel)
    throw Error("cuda executor: no kernel compiled for dtype " + std::string(to_string(dtype)) + ", head_dim " +
                std::to_string(head_dim) + ", tile " + std::to_string(tile));
  return e;
}

}  // namespace treeattn::cuda

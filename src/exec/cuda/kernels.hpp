// The compiled kernel set and its single dispatch point: (dtype, head_dim,
// tile index into kTileConfigs) -> one instantiation of the attention kernel.
// Host-only declarations; the instantiations live in kernels/*.cu, one per
// (dtype, head_dim, m, n) so they build in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "exec/cuda/attention_params.hpp"
#include "treeattn/types.hpp"

namespace treeattn::cuda {

// A launch of `grid` x `block` on `stream`; chained: with programmatic stream
// serialization (the kernel may start before the one before it in the stream
// ends, see executor.cpp). Holds its attribute, so keep it alive until the launch.
struct LaunchConfig {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool chained) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = chained ? 1 : 0;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

struct KernelEntry {
  const void* kernel = nullptr;  // __global__ function, for cudaLaunchKernel / attributes
  int threads = 0;
  int m = 0, n = 0;
  int min_stages = 0, max_stages = 0;
  bool persistent = false;   // may run a persistent launch (AttnTraits::kPersistent)
  int smem_base = 0;         // dynamic shared memory besides the K/V stages
  int smem_per_stage = 0;    // one K + one V tile
  int smem_bytes(int stages) const { return smem_base + stages * smem_per_stage; }
};

// Defined in attention_kernel.cuh; explicitly instantiated in kernels/*.cu.
// kDType is int(DType): 0 fp16, 1 bf16; kKvFp8: K/V pools of fp8_e4m3.
template <int kDType, bool kKvFp8, int D, int M, int N>
KernelEntry attention_entry();

// Throws Error for a combination that is not compiled.
KernelEntry find_attention_kernel(DType dtype, DType kv_dtype, int head_dim, int tile);

// The merge kernel over (query, qo head): launches and returns without syncing.
// chained: launched with programmatic stream serialization (sm_90+), so it
// may start before the attention launch before it in `stream` ends.
void launch_merge(DType dtype, int head_dim, const MergeParams& p, cudaStream_t stream, bool chained);
int64_t merge_ctas(const MergeParams& p);  // its grid

// Byte ranges packed one after another in src (each starting 16-byte
// aligned, src_off ascending, src_bytes in all, a multiple of 16), each
// copied to dst + dst_off[k] (16-byte aligned, with room for its bytes
// rounded up to 16: the padding is copied too).
struct CopyRanges {
  static constexpr int kMax = 12;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  size_t src_bytes = 0;
  int count = 0;
  size_t src_off[kMax] = {}, dst_off[kMax] = {};
};
// One launch on `stream`; returns without syncing.
void launch_copy_ranges(const CopyRanges& r, cudaStream_t stream);

}  // namespace treeattn::cuda

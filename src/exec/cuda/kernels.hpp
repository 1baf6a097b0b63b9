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
// ends, see executor.cpp); l2_window: the accesses it makes inside the window
// take its L2 policy (plan_l2_window). Holds its attributes, so keep it alive
// until the launch.
struct LaunchConfig {
  cudaLaunchAttribute attrs[2]{};
  cudaLaunchConfig_t cfg{};
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool chained,
               const cudaAccessPolicyWindow* l2_window = nullptr) {
    unsigned n = 0;
    if (chained) {
      attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (l2_window) {
      attrs[n].id = cudaLaunchAttributeAccessPolicyWindow;
      attrs[n++].val.accessPolicyWindow = *l2_window;
    }
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// The L2 policy that keeps a plan's device arrays (descriptors, entries, page
// ids, merge lists: `bytes` from `base`) resident while everything else
// streams through L2: accesses to them persist in the L2 set-aside for
// persisting accesses, which this raises to the window's size (at most the
// device's maximum) where it is smaller. The set-aside is a device-wide
// limit: raising it leaves that much less L2 to normal accesses of every
// kernel on the device. Returns a window of 0 bytes (no policy) where the
// device has no set-aside (MIG, MPS, before sm_80).
cudaAccessPolicyWindow plan_l2_window(const void* base, size_t bytes);

struct KernelEntry {
  const void* kernel = nullptr;  // __global__ function, for cudaLaunchKernel / attributes
  int threads = 0;
  int m = 0, n = 0;
  int min_stages = 0, max_stages = 0;
  bool persistent = false;   // may run a persistent launch (AttnTraits::kPersistent)
  bool skips_unseen = false; // skips masked K/V tiles a warpgroup's rows do not see (AttnTraits::kSkipUnseen)
  int smem_base = 0;         // dynamic shared memory besides the K/V stages
  int smem_per_stage = 0;    // one K + one V tile
  int smem_bytes(int stages) const { return smem_base + stages * smem_per_stage; }
};

// Defined in attention_instance.cuh; explicitly instantiated in kernels/*.cu.
// kDType is int(DType): 0 fp16, 1 bf16; kKvFp8: K/V pools of fp8_e4m3;
// kSkip: the 128-row tile's variant that skips masked K/V tiles none of a
// warpgroup's rows see (AttnTraits::kSkipUnseen).
template <int kDType, bool kKvFp8, int D, int M, int N, bool kSkip = false>
KernelEntry attention_entry();

// Throws Error for a combination that is not compiled.
KernelEntry find_attention_kernel(DType dtype, DType kv_dtype, int head_dim, int tile);
// The skip variant of the 128-row tile where one is compiled (K/V of the
// dtype), else an entry without a kernel: the plain tile then runs.
KernelEntry find_attention_skip_kernel(DType dtype, DType kv_dtype, int head_dim);

// The merge kernel over (query, qo head): launches and returns without syncing.
// chained: launched with programmatic stream serialization (sm_90+), so it
// may start before the attention launch before it in `stream` ends.
void launch_merge(DType dtype, int head_dim, const MergeParams& p, cudaStream_t stream, bool chained,
                  const cudaAccessPolicyWindow* l2_window = nullptr);
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

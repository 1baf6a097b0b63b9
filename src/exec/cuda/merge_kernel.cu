// The merge kernel: one warp per (query, qo head) of the queries that have
// partial slots; it folds the query's normalised fp32 partials with
// merge_weights (numeric.hpp), in slot-list order, exactly as the CPU executor
// does, and writes the output in the input dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "exec/cuda/kernels.hpp"
#include "exec/cuda/primitives/mma.cuh"
#include "treeattn/numeric.hpp"

namespace treeattn::cuda {

namespace {

constexpr int kMergeWarps = 4;

template <class T, int D>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const __grid_constant__ MergeParams p) {
  constexpr int kPerLane = D / 32;  // 2, 4 or 8 floats
  constexpr int kVec = kPerLane >= 4 ? 4 : kPerLane;
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
  if (item >= int64_t(p.num_merge_queries) * p.num_qo_heads) return;
  const int H = p.num_qo_heads;
  const int q = p.merge_queries[item / H], h = int(item % H);

  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  float lse = -INFINITY;
  for (int k = p.query_slot_offset[q]; k < p.query_slot_offset[q + 1]; ++k) {
    const int slot = p.query_slots[k];
    const MergeWeights mw = merge_weights(lse, p.partial_lse[int64_t(slot) * H + h]);
    const float* po = p.partial_o + (int64_t(slot) * H + h) * D;
#pragma unroll
    for (int v = 0; v < kPerLane / kVec; ++v) {
      // lane-contiguous vectors: lane l reads floats [(v*32 + l) * kVec, +kVec)
      const float* src = po + (v * 32 + lane) * kVec;
      float x[kVec];
      if constexpr (kVec == 4) {
        const float4 f = *reinterpret_cast<const float4*>(src);
        x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
      } else {
        const float2 f = *reinterpret_cast<const float2*>(src);
        x[0] = f.x, x[1] = f.y;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[v * kVec + i] = mw.wa * acc[v * kVec + i] + mw.wb * x[i];
    }
    lse = mw.lse;
  }
  T* out = static_cast<T*>(p.out) + (int64_t(q) * H + h) * D;
#pragma unroll
  for (int v = 0; v < kPerLane / kVec; ++v) {
    T* dst = out + (v * 32 + lane) * kVec;
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(Mma<T>::pack(acc[v * 4], acc[v * 4 + 1]), Mma<T>::pack(acc[v * 4 + 2], acc[v * 4 + 3]));
    } else {
      *reinterpret_cast<uint32_t*>(dst) = Mma<T>::pack(acc[0], acc[1]);
    }
  }
}

template <class T, int D>
void launch(const MergeParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.num_merge_queries) * p.num_qo_heads;
  const int blocks = int((items + kMergeWarps - 1) / kMergeWarps);
  merge_kernel<T, D><<<blocks, kMergeWarps * 32, 0, stream>>>(p);
}

template <class T>
void launch_dim(int head_dim, const MergeParams& p, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch<T, 64>(p, stream);
    case 128: return launch<T, 128>(p, stream);
    case 256: return launch<T, 256>(p, stream);
    default: throw Error("cuda merge: unsupported head_dim " + std::to_string(head_dim));
  }
}

}  // namespace

void launch_merge(DType dtype, int head_dim, const MergeParams& p, cudaStream_t stream) {
  if (p.num_merge_queries == 0) return;
  if (dtype == DType::fp16) return launch_dim<__half>(head_dim, p, stream);
  if (dtype == DType::bf16) return launch_dim<__nv_bfloat16>(head_dim, p, stream);
  throw Error("cuda merge: unsupported dtype " + std::string(to_string(dtype)));
}

}  // namespace treeattn::cuda

// The merge kernel: one warp per (query, qo head) of the queries that have
// partial slots; it folds the query's normalised fp32 partials with
// merge_weights (numeric.hpp), in slot-list order, exactly as the CPU executor
// does, and writes the output in the input dtype. Loads are issued in
// parallel (slot ids one per lane, then the lse and partials of a batch of
// slots together): the kernel is latency-bound otherwise, one dependent load
// chain per slot. A merge of few (query, qo head) pairs of more than one
// batch of slots each (a long prompt split for a few queries) gets a CTA per
// pair instead: its warps fold a quarter of the slots each, in one batch of
// loads instead of one batch after another, and warp 0 folds the quarters in
// order (the same fold up to rounding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "exec/cuda/kernels.hpp"
#include "exec/cuda/primitives/cta_trace.cuh"
#include "exec/cuda/primitives/mma.cuh"
#include "treeattn/cuda_executor.hpp"
#include "treeattn/numeric.hpp"

namespace treeattn::cuda {

namespace {

constexpr int kMergeWarps = 4;

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// kBatch: slots whose partials are loaded before they are folded. Registers
// decide how many merge warps an SM holds: a tree's leaves give one merge per
// (query, qo head), thousands of warps of a few slots each; with 8-slot
// batches (85 registers at d = 128) 6 CTAs fit per SM and such a merge runs
// in several waves after the attention CTAs leave. Plans whose queries have
// at most 4 slots run 2-slot batches at 16 CTAs per SM (32 registers, 36
// bytes spilled at d = 128), for fewer waves (docs/cuda.md, "Merge").
constexpr int kSmallMergeSlots = 4;
template <int D, int kBatch>
constexpr int merge_min_blocks() { return kBatch <= 2 && D <= 128 ? 16 : 1; }
// Queries of more slots than one 8-slot batch, when their (query, qo head)
// pairs fit one wave of CTAs (6 per SM, the 8-slot variant's occupancy): one
// CTA per pair, whose 4 warps load a quarter of the slots each (few pairs of
// many slots, a long prompt split for few queries: latency-bound on dependent
// batches). With thousands of pairs the merge is not latency-bound and 4x
// the CTAs cost more (docs/cuda.md, "Merge").
constexpr int kSplitMergeSlots = 8, kSplitMergeCtasPerSm = 6;
bool splits_slots(const MergeParams& p) {
  return p.max_slots > kSplitMergeSlots &&
         int64_t(p.num_merges) * p.num_qo_heads <= int64_t(kSplitMergeCtasPerSm) * p.num_sms;
}

template <class T, int D, int kBatch, bool kSplit>
__global__ void __launch_bounds__(kMergeWarps * 32, (merge_min_blocks<D, kBatch>())) merge_kernel(const __grid_constant__ MergeParams p) {
  constexpr int kPerLane = D / 32;  // 2, 4 or 8 floats
  constexpr int kVec = kPerLane >= 4 ? 4 : kPerLane;
  CtaTrace trace;
  trace.mark(kTraceStart);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int H = p.num_qo_heads;
  const int64_t item = kSplit ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * kMergeWarps + warp;
  const int32_t num_merges = p.num_merges_dev ? *p.num_merges_dev : p.num_merges;
  const bool active = item < int64_t(num_merges) * H;  // kSplit: the same for the whole CTA
  // A step plan without merges: its attention CTAs did not count themselves
  // (AttnParams::num_merges_dev), so there is nothing to wait for or reset.
  if (p.num_merges_dev && num_merges == 0) return;
  // The CTAs that hold a merge: at least one, since a launch has merges
  // (launch_merge launches none without; a step plan without them left
  // above), and the last of them past the wait resets the counters. A step
  // executor's grid is sized for its capacity: the CTAs past these have
  // nothing to merge, nor to wait for, and leave at once instead of each
  // waiting for every attention CTA and counting itself.
  const int64_t needed = kSplit ? int64_t(num_merges) * H : (int64_t(num_merges) * H + kMergeWarps - 1) / kMergeWarps;
  const unsigned participants = needed < int64_t(gridDim.x) ? unsigned(needed) : gridDim.x;
  if (blockIdx.x >= participants) return;
  // Plan data first (descriptor, the first 32 slot ids), so that in a chained
  // run these loads overlap the wait below.
  MergeDesc md{};
  if (active) md = p.merges[item / H];
  const int h = int(item % H), first = md.first, query = md.query;
  // This warp's slots [lo, lo + count) of the query's list.
  const int quarter = (md.count + kMergeWarps - 1) / kMergeWarps;
  const int lo = kSplit ? min(md.count, warp * quarter) : 0;
  const int count = kSplit ? min(md.count, lo + quarter) - lo : md.count;
  static_assert(MergeDesc::kInline == 4, "select chain below");
  const int my_idx = lo + lane;
  int my_slot = lane >= count ? 0 : my_idx == 0 ? md.slot[0] : my_idx == 1 ? md.slot[1] : my_idx == 2 ? md.slot[2]
                                  : my_idx == 3 ? md.slot[3] : p.query_slots[first + my_idx];
  if (p.ctas_done) {
    // A chained merge may start while attention CTAs still run: every one of
    // them is resident by then (each launch of the chain started only once
    // all CTAs of the one before had), so this wait cannot starve them.
    if (threadIdx.x == 0) {
      while (ld_acquire(p.ctas_done) < p.attention_ctas) __nanosleep(256);
      if (atomicAdd(p.merge_ctas_past, 1u) == participants - 1) {  // every participating CTA is past the wait
        *p.ctas_done = 0;
        *p.merge_ctas_past = 0;
      }
    }
    __syncthreads();
  }
  trace.mark(kTraceFirstTile);
  trace.mark(kTraceLoopDone);
  if (!active) return;  // only warps of the last CTA: warp 0 is active in every CTA

  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  float lse = -INFINITY;
  // Lane j holds slot j of each group of 32 (id and lse, loaded in parallel);
  // partials are loaded kBatch slots at a time, then folded in slot order.
  for (int base = 0; base < count; base += 32) {
    const int n = min(32, count - base);
    if (base > 0) my_slot = lane < n ? p.query_slots[first + lo + base + lane] : 0;
    for (int j0 = 0; j0 < n; j0 += kBatch) {
      float x[kBatch][kPerLane];
      float ls[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + b;
        const int slot = __shfl_sync(0xffffffffu, my_slot, j & 31);
        // Every lane loads the slot's lse (one broadcast transaction) in the
        // same round trip as the partials, instead of a load + shuffle chain.
        // .cg loads (L2): in a chained run the partials were stored while
        // this kernel was already resident.
        ls[b] = j < n ? __ldcg(p.partial_lse + int64_t(slot) * H + h) : -INFINITY;
        const float* po = p.partial_o + (int64_t(slot) * H + h) * D;
#pragma unroll
        for (int v = 0; v < kPerLane / kVec; ++v) {
          // lane-contiguous vectors: lane l holds floats [(v*32 + l) * kVec, +kVec)
          const float* src = po + (v * 32 + lane) * kVec;
          if (j < n) {
            if constexpr (kVec == 4) {
              const float4 f = __ldcg(reinterpret_cast<const float4*>(src));
              x[b][v * 4] = f.x, x[b][v * 4 + 1] = f.y, x[b][v * 4 + 2] = f.z, x[b][v * 4 + 3] = f.w;
            } else {
              const float2 f = __ldcg(reinterpret_cast<const float2*>(src));
              x[b][0] = f.x, x[b][1] = f.y;
            }
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) x[b][v * kVec + i] = 0.f;
          }
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b >= n) break;
        const MergeWeights mw = merge_weights(lse, ls[b]);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[i] = mw.wa * acc[i] + mw.wb * x[b][i];
        lse = mw.lse;
      }
    }
  }
  if constexpr (kSplit) {
    // The quarters, folded in order by warp 0 (an empty quarter has lse -inf: weight 0).
    __shared__ float part_o[kMergeWarps][D];
    __shared__ float part_lse[kMergeWarps];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) part_o[warp][(i / kVec * 32 + lane) * kVec + i % kVec] = acc[i];
    if (lane == 0) part_lse[warp] = lse;
    __syncthreads();
    if (warp != 0) return;
    lse = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
    for (int w = 0; w < kMergeWarps; ++w) {
      const MergeWeights mw = merge_weights(lse, part_lse[w]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] = mw.wa * acc[i] + mw.wb * part_o[w][(i / kVec * 32 + lane) * kVec + i % kVec];
      lse = mw.lse;
    }
  }
  if (p.lse_out && lane == 0) p.lse_out[int64_t(query) * H + h] = lse;
  T* out = static_cast<T*>(p.out) + int64_t(query) * p.o_stride + h * D;
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
  if (threadIdx.x == 0) {
    trace.mark(kTraceStored);
    trace.mark(kTraceDone);
    trace.store(p.trace ? p.trace + int64_t(blockIdx.x) * kTracePoints : nullptr);
  }
}

template <class T, int D>
void launch(const MergeParams& p, cudaStream_t stream, bool chained, const cudaAccessPolicyWindow* l2_window) {
  const LaunchConfig lc(dim3(unsigned(merge_ctas(p))), dim3(kMergeWarps * 32), 0, stream, chained, l2_window);
  const auto kernel = p.max_slots <= kSmallMergeSlots ? merge_kernel<T, D, 2, false>
                      : splits_slots(p)                ? merge_kernel<T, D, 8, true>
                                                       : merge_kernel<T, D, 8, false>;
  check_cuda(cudaLaunchKernelEx(&lc.cfg, kernel, p), "cuda executor: merge launch");
}

template <class T>
void launch_dim(int head_dim, const MergeParams& p, cudaStream_t stream, bool chained,
                const cudaAccessPolicyWindow* l2_window) {
  switch (head_dim) {
    case 64: return launch<T, 64>(p, stream, chained, l2_window);
    case 128: return launch<T, 128>(p, stream, chained, l2_window);
    case 256: return launch<T, 256>(p, stream, chained, l2_window);
    default: throw Error("cuda merge: unsupported head_dim " + std::to_string(head_dim));
  }
}

}  // namespace

int64_t merge_ctas(const MergeParams& p) {
  const int64_t merges = int64_t(p.num_merges) * p.num_qo_heads;
  return splits_slots(p) ? merges : (merges + kMergeWarps - 1) / kMergeWarps;
}

void launch_merge(DType dtype, int head_dim, const MergeParams& p, cudaStream_t stream, bool chained,
                  const cudaAccessPolicyWindow* l2_window) {
  if (p.num_merges == 0) return;
  if (dtype == DType::fp16) return launch_dim<__half>(head_dim, p, stream, chained, l2_window);
  if (dtype == DType::bf16) return launch_dim<__nv_bfloat16>(head_dim, p, stream, chained, l2_window);
  throw Error("cuda merge: unsupported dtype " + std::string(to_string(dtype)));
}

}  // namespace treeattn::cuda

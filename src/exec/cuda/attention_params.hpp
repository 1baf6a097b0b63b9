// The parameter blocks of the CUDA kernels (one struct per kernel, passed by
// value as __grid_constant__). Every pointer into the plan points into the one
// device buffer that CudaExecutor uploads at plan time (CudaStepExecutor: into
// its fixed-capacity buffer, re-filled by every set_plan), so a run needs
// nothing from the host beyond these structs and can be captured in a CUDA graph.
// Plain C++: included by host code and kernels alike.
#pragma once

#include <cstdint>

namespace treeattn::cuda {

// Phase boundaries a traced CTA stamps (primitives/cta_trace.cuh). Merge
// CTAs: kFirstTile and kLoopDone both mark the end of the chained wait.
enum TracePoint : int { kTraceStart, kTraceFirstTile, kTraceLoopDone, kTraceStored, kTraceDone, kTracePoints };

// Division by a divisor fixed for a launch (the page size, the group size)
// without a divide instruction sequence, which the kernel would otherwise run
// per position of every K/V tile and per row: for 1 <= d <= 65536 and every
// 0 <= n < 2^31, n / d = (n * magic) >> shift with shift = 31 + ceil(log2 d)
// and magic = ceil(2^shift / d) < 2^32 (the rounding error n * (magic -
// 2^shift / d) / 2^shift stays below 1 / d, which cannot carry the quotient
// past an integer). Token positions in a node's page list are below
// kMaxPathTokens + a page; rows below 2^8.
struct Divisor {
  uint32_t magic = 1u << 31;
  int32_t shift = 31;  // d = 1

  static constexpr Divisor of(int32_t d) {
    int32_t log2_ceil = 0;
    while ((int64_t(1) << log2_ceil) < d) ++log2_ceil;
    Divisor r;
    r.shift = 31 + log2_ceil;
    r.magic = uint32_t(((uint64_t(1) << r.shift) + uint64_t(d) - 1) / uint64_t(d));
    return r;
  }
  constexpr uint32_t divide(uint32_t n) const { return uint32_t((uint64_t(n) * magic) >> shift); }
};

// A segment as the kernel reads it: unit positions [pos, end) are tokens
// [begin, begin + end - pos) of a node whose pages start at page_ids[pbase].
struct alignas(16) SegDesc {
  int32_t pbase, begin, pos, end;
};

// A unit as the kernel reads it (48 bytes, three vector loads per CTA),
// derived from the Plan at plan time (CudaExecutor) so that the CTA prologue
// is short: its first segment is inline, so a one-segment unit needs no other
// load before its page lookups.
struct alignas(16) UnitDesc {
  int32_t seg_off, nseg;   // segment records segs[seg_off .. seg_off + nseg)
  int32_t ent_off, nent;   // plan entries entry_*[ent_off .. ent_off + nent)
  uint64_t any_missing;    // OR over entries of the segments they do not see (0: unmasked)
  int32_t len;             // tokens of the unit (sum of its segments)
  int32_t pad;
  SegDesc seg0;            // = segs[seg_off] when nseg > 0
};

struct AttnParams {
  // Tensors of the run (AttentionArgs), element type of the instantiation.
  const void* q;    // [num_queries, num_qo_heads, head_dim], queries q_stride elements apart
  const void* k;    // [num_pages, page_size, num_kv_heads, head_dim], token rows kv_token_bytes apart,
  const void* v;    //   a page rows_per_page rows (token (page, slot) is row page * rows_per_page + slot)
  void* out;        // [num_queries, num_qo_heads, head_dim], queries o_stride elements apart
  float* lse_out;   // optional [num_queries, num_qo_heads] natural-log lse of directly written rows
  int64_t q_stride, o_stride;
  uint32_t kv_token_bytes;
  int32_t rows_per_page;
  float* partial_o;    // [num_slots, num_qo_heads, head_dim], normalised
  float* partial_lse;  // [num_slots, num_qo_heads], natural log

  // One descriptor per unit of this launch, longest unit first: item i is
  // units[i / Hkv] for kv head i % Hkv.
  const UnitDesc* units;
  int32_t num_items;  // units of this launch x num_kv_heads
  // Step executors (fixed grids): the plan's launch l has units [counts[2 l],
  // counts[2 l] + counts[2 l + 1]), in device memory (uploaded with the plan),
  // the launches' units one after another. This launch runs those of plan
  // launches launch_index .. launch_last (more than its own where a captured
  // run left the ones after it out: CudaStepExecutor::set_graph_launches),
  // which override units / num_items; a CTA computes items blockIdx.x,
  // + gridDim.x, ... (grid_stride) unless the launch is persistent. nullptr:
  // units / num_items as given, one item per CTA unless persistent.
  const int32_t* counts;
  int32_t launch_index, launch_last;
  bool grid_stride;
  // Persistent launches (more items than CTAs fit on the GPU at once): the
  // grid is one wave; CTA b computes item b, then claims items gridDim.x +
  // atomicAdd(&work[0], 1) until they run out; work[1] counts CTAs done, and
  // the last one resets both. nullptr: one item per CTA (grid = num_items).
  unsigned int* work;
  const SegDesc* segs;  // segment records, indexed by UnitDesc::seg_off
  // Plan entry arrays (plan.hpp), as uploaded.
  const int32_t* entry_query;
  const uint64_t* entry_mask;
  const int32_t* entry_slot;
  const int32_t* page_ids;  // the tree's page table: pages of every node, concatenated

  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t group;      // num_qo_heads / num_kv_heads
  int32_t page_size;
  Divisor page_divisor;   // of page_size
  Divisor group_divisor;  // of group
  float scale_log2;   // softmax scale * k_scale * log2(e): scores are kept in log2 units
  float v_scale;      // the output's factor: V = stored V x v_scale (1 unless the pools are fp8)
  int32_t stages;     // K/V pipeline depth of this launch (AttnTraits::kMinStages..kMaxStages)
  // Chained runs (executor.cpp): every CTA adds 1 after its last store, the
  // merge waits for the run's total. nullptr: not chained.
  unsigned int* ctas_done;
  // Step executors: the plan's merge count (uploaded with it). A CTA counts
  // itself only if it is non-zero: a plan without merges has nothing waiting
  // (its merge launch leaves at once). nullptr: count whenever chained.
  const int32_t* num_merges_dev;
  // Traced runs (CudaExecutorOptions::trace): kTracePoints stamps per CTA,
  // this launch's first CTA at trace[trace_first_cta]. nullptr: not traced.
  unsigned long long* trace;
  int64_t trace_first_cta;
};

// A query with partials to merge: its slots are query_slots[first .. first +
// count); the first kInline of them are also inline (most queries have few).
struct alignas(16) MergeDesc {
  static constexpr int kInline = 4;
  int32_t query, first, count, pad;
  int32_t slot[kInline];
};

struct MergeParams {
  void* out;          // queries o_stride elements apart
  int64_t o_stride;
  float* lse_out;     // optional [num_queries, num_qo_heads]
  // Step executors: the number of merges is *num_merges_dev (uploaded with
  // the plan); the grid covers the capacity. nullptr: num_merges.
  const int32_t* num_merges_dev;
  const float* partial_o;
  const float* partial_lse;
  const MergeDesc* merges;  // queries that have slots
  const int32_t* query_slots;
  int32_t num_merges;
  int32_t num_qo_heads;
  int32_t max_slots;        // most slots of one query (picks the merge's batch size)
  int32_t num_sms;          // of the device (with max_slots, picks whether a query's slots are split over warps)
  // Chained runs: wait until ctas_done reaches attention_ctas (every
  // attention CTA of the run has stored its partials); the last merge CTA
  // past the wait resets both counters for the next run. nullptr: not chained.
  unsigned int* ctas_done;
  unsigned int* merge_ctas_past;
  uint32_t attention_ctas;
  unsigned long long* trace;  // traced runs: kTracePoints stamps per merge CTA
};

}  // namespace treeattn::cuda

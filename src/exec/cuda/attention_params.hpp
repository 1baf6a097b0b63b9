// The parameter blocks of the CUDA kernels (one struct per kernel, passed by
// value as __grid_constant__). Every pointer into the plan points into the one
// device buffer that CudaExecutor uploads at plan time, so a run needs nothing
// from the host beyond these structs and can be captured in a CUDA graph.
// Plain C++: included by host code and kernels alike.
#pragma once

#include <cstdint>

namespace treeattn::cuda {

struct AttnParams {
  // Tensors of the run (AttentionArgs), element type of the instantiation.
  const void* q;    // [num_queries, num_qo_heads, head_dim]
  const void* k;    // [num_pages, page_size, num_kv_heads, head_dim]
  const void* v;
  void* out;        // [num_queries, num_qo_heads, head_dim]
  float* partial_o;    // [num_slots, num_qo_heads, head_dim], normalised
  float* partial_lse;  // [num_slots, num_qo_heads], natural log

  // This launch's units, longest first; CTA i computes unit unit_order[i / Hkv]
  // for kv head i % Hkv.
  const int32_t* unit_order;

  // Plan arrays (plan.hpp), as uploaded.
  const int32_t* unit_segment_offset;
  const int32_t* segments;  // (node, begin, end) triples
  const int32_t* unit_query_offset;
  const int32_t* entry_query;
  const uint64_t* entry_mask;
  const int32_t* entry_slot;
  const uint8_t* unit_masked;

  // The tree's page table (CSR): pages of node v are
  // page_ids[node_page_offset[v] .. node_page_offset[v + 1]).
  const int32_t* node_page_offset;
  const int32_t* page_ids;

  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t group;      // num_qo_heads / num_kv_heads
  int32_t page_size;
  float scale_log2;   // softmax scale * log2(e): scores are kept in log2 units
};

struct MergeParams {
  void* out;
  const float* partial_o;
  const float* partial_lse;
  const int32_t* merge_queries;  // queries that have slots
  const int32_t* query_slot_offset;
  const int32_t* query_slots;
  int32_t num_merge_queries;
  int32_t num_qo_heads;
};

}  // namespace treeattn::cuda

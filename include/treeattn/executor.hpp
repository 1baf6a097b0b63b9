// Executors on the host: the CPU executor of any Plan (fp32 math, partials and
// merge exactly as the GPU does them) and the fp64 dense per-query reference.
#pragma once

#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {

// Capacities of a CudaStepExecutor: it sizes every device buffer by them
// once, at construction. A plan beyond any of them is refused with an Error
// naming the capacity and the value. Declared here, not with the executor in
// cuda_executor.hpp, so that TreeAttentionConfig (every build) can give them.
struct StepCapacity {
  int32_t max_queries = 256;
  int32_t max_units = 2048;       // work units of a plan
  int32_t max_segments = 8192;    // segments of all units
  int32_t max_entries = 8192;     // (unit, query) entries
  int32_t max_slots = 8192;       // partial slots
  int64_t max_page_refs = 65536;  // pages of all the tree's nodes (the plan's page table)
};

// Pointers to one batch's tensors (host or device memory, per executor):
//   q, out: [num_queries, num_qo_heads, head_dim], of layout.dtype
//   k, v:   [num_pages, page_size, num_kv_heads, head_dim] ("NHD"), of
//           layout.kv_type(); an element stands for its value x k_scale
//           (v_scale): the per-tensor scales of a quantised (fp8) cache
// The last two dimensions (heads, head_dim) of each are dense; the outer ones
// may be strided (a q sliced from a fused QKV projection, pools that are views
// into a layer-major or K/V-interleaved cache). Strides are in elements; 0
// means dense. k and v share their strides.
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float scale = 0.f;        // 0: 1/sqrt(head_dim)
  float* lse = nullptr;     // optional [num_queries, num_qo_heads] fp32, natural-log log-sum-exp
                            // of each row's scores (-inf for an empty context)
  int64_t q_stride = 0;     // between queries of q (dense: num_qo_heads * head_dim)
  int64_t out_stride = 0;   // between queries of out
  int64_t kv_token_stride = 0;  // between tokens of a page (dense: num_kv_heads * head_dim)
  int64_t kv_page_stride = 0;   // between pages (dense: page_size * token stride)
  // Strides in elements; 0: dense. Each must keep the rows it steps between
  // apart: |q_stride|, |out_stride| >= num_qo_heads * head_dim (with more than
  // one query), |kv_token_stride| >= num_kv_heads * head_dim, |kv_page_stride|
  // >= (page_size - 1) * |kv_token_stride| + num_kv_heads * head_dim; else
  // run() throws naming the field and value. The CPU executor reads a
  // negative stride as a reversed view; the CUDA executor takes only positive
  // strides of whole 16-byte copies, pages of whole token strides.
  float k_scale = 1.f;          // K = stored K x k_scale
  float v_scale = 1.f;          // V = stored V x v_scale
  // TreeAttention::run: the queries (rows of q and out, and lse) the
  // caller's tensors hold; a plan of another count is refused, checked under
  // the same lock as the run, so a plan_*() from another thread between the
  // caller's own check and the run cannot make it write past `out`. -1: not
  // checked (the executors, given their workload, ignore it).
  int64_t num_queries = -1;
};

// The strides of AttentionArgs with the dense defaults filled in.
struct Strides {
  int64_t q, out, kv_token, kv_page;
};
Strides resolve_strides(const Workload& w, const AttentionArgs& a);

float effective_scale(const Workload& w, float scale);
// Throws Error naming the argument unless scale is 0 (1/sqrt(head_dim)) or
// positive and finite, and k_scale, v_scale are positive and finite. Both
// executors call it on every run.
void check_scales(const AttentionArgs& a);

// Host tensors of one batch filled with seeded uniform(-1, 1) values.
// With an fp8 KV layout, K and V hold uniform(-1, 1) / k_scale (v_scale),
// quantised, with k_scale and v_scale not 1 so that the scales are tested.
struct HostTensors {
  DType dtype;  // q, out
  std::vector<uint8_t> q, k, v, out;
  DType kv_dtype = dtype;
  float k_scale = 1.f, v_scale = 1.f;
  AttentionArgs args(float scale = 0.f);
  // Fills out with NaN: an element an executor forgets to write shows up.
  void poison_out();
};
HostTensors make_random_inputs(const Workload& w, uint64_t seed);

// Element i of a buffer of type t as float.
float load_element(const void* data, DType t, int64_t i);
void store_element(void* data, DType t, int64_t i, float value);

// Throws Error naming the field unless a's tensors are non-null (out only
// where `writes`; k and v may be null with a pool of no pages) and its
// strides keep the rows they step between apart (AttentionArgs' comment) and
// addressable; run_cpu and reference_attention call it on every run. Returns
// the strides it checked (resolve_strides).
Strides check_tensors(const Workload& w, const AttentionArgs& a, bool writes);

// Runs a validated plan on host tensors; threads = 0: hardware concurrency.
void run_cpu(const Workload& w, const Plan& p, const AttentionArgs& a, int threads = 0);

// fp64 dense attention of every query over its materialised path:
// result [num_queries, num_qo_heads, head_dim].
std::vector<double> reference_attention(const Workload& w, const AttentionArgs& a);

// ||out - ref|| / ||ref|| over all elements; NaN/inf in out gives +inf.
double relative_error(const Workload& w, const void* out, const std::vector<double>& ref);

}  // namespace treeattn

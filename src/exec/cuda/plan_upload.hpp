// What both CUDA executors derive from a (workload, plan) on the host before
// they upload it: the kernels' unit descriptors and segment records, the merge
// descriptors, the device's limits, a launch's pipeline depth, and the
// per-run tensor arguments checked and turned into kernel parameters.
// Internal to src/exec/cuda (CudaExecutor, CudaStepExecutor).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "exec/cuda/attention_params.hpp"
#include "exec/cuda/kernels.hpp"
#include "treeattn/executor.hpp"

namespace treeattn::cuda {

struct DeviceLimits {
  int device = 0, num_sms = 0, major = 0;
  int smem_optin = 0, smem_per_sm = 0, smem_reserved = 0;
  static DeviceLimits current();  // of the current CUDA device
};

// The kernels' view of the plan's units: desc[u] for unit u (its segments at
// segs[desc[u].seg_off ..]); page-table offsets of every node's first page
// come from node_page_offset (the tree's pages, concatenated). desc has room
// for p.num_units(), segs for p.segments.size().
void build_unit_descs(const Workload& w, const Plan& p, const int32_t* node_page_offset, UnitDesc* desc,
                      SegDesc* segs);
// One descriptor per query that has partial slots, in query order, into
// merges (room for num_queries); returns their number.
int32_t build_merge_descs(const Plan& p, int32_t num_queries, MergeDesc* merges);

struct Launch {
  KernelEntry kernel;
  int32_t first_unit = 0;  // into the uploaded unit descriptors
  int32_t num_units = 0;
  int32_t max_len = 0;     // tokens of its longest unit
  int stages = 0;
  int smem = 0;
  int64_t grid = 0;         // CTAs: its items (units x kv heads), or one wave of them when persistent
  bool persistent = false;  // CTAs claim items (AttnParams::work)
  size_t work_offset = 0;   // persistent: its two claim counters in the workspace
  int64_t first_cta = 0;    // of its CTAs among the run's (trace buffer)
};

// Sets the launch's kernel attributes (most shared memory any plan may use,
// all of an SM's L1 as shared memory): process-wide, once per kernel is enough.
void set_kernel_attributes(const KernelEntry& k, const DeviceLimits& dl);
// Pipeline depth of a launch of `ctas` CTAs whose longest unit has max_len
// tokens: see executor.cpp. concurrent: other launches run beside it.
void choose_stages(Launch& l, int64_t ctas, const DeviceLimits& dl, bool concurrent);
// CTAs of this launch's kernel one wave of the GPU holds.
int64_t wave_ctas(const Launch& l, const DeviceLimits& dl);

// The geometry a run's tensors are checked against.
struct TensorShape {
  DType dtype;     // q, out
  DType kv_dtype;  // the K/V pools
  HeadConfig heads;
  int page_size;
  int64_t num_pages;
};
// Checks a run's pointers, scale and strides (alignment for 16-byte copies,
// pool rows addressable in 32 bits) and writes them into the kernels'
// parameters; throws Error naming the argument.
void set_run_tensors(const TensorShape& t, const AttentionArgs& args, AttnParams& a, MergeParams& mg);

}  // namespace treeattn::cuda

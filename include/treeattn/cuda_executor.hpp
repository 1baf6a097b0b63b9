// The CUDA executor (FlashInfer's plan/run split): construct it once per
// (workload, plan) -- that packs the tree's page table and the plan arrays into
// one pinned buffer, uploads it in one copy and sizes the partial workspace --
// then run() as often as needed: it only launches (no allocation, no host
// synchronisation), so it can be captured in a CUDA graph.
// Available when the library is built with CUDA (TREEATTN_HAVE_CUDA).
#pragma once

#if !defined(TREEATTN_HAVE_CUDA)
#error "treeattn/cuda_executor.hpp needs a CUDA build of treeattn (TREEATTN_HAVE_CUDA)"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "treeattn/executor.hpp"

namespace treeattn {

// Throws Error("<what>: <cudaGetErrorString> (<code>)") when `status` is not cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

// Owning device allocation (cudaMalloc / cudaFree); movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// One batch's tensors in device memory (test and benchmark helper).
struct DeviceTensors {
  DType dtype = DType::fp16;  // q, out
  DeviceBuffer q, k, v, out;
  float k_scale = 1.f, v_scale = 1.f;  // of a quantised (fp8) K/V pool

  static DeviceTensors upload(const HostTensors& h);  // synchronous copies
  // Copies out back into h.out (synchronous).
  void download_out(HostTensors& h) const;
  // Fills out with NaN (0xFFFF in 16-bit types), asynchronously on `stream`.
  void poison_out(cudaStream_t stream = nullptr) const;
  AttentionArgs args(float scale = 0.f) const;
};

struct CudaExecutorOptions {
  // A launch of the m = 16 n = 64 tile whose units all have at most 32 tokens
  // runs the m = 16 n = 32 tile instead (8 instead of 4 CTAs per SM). false:
  // every unit runs exactly its plan's tile (what `calibrate --pat-tiles`
  // times).
  bool short_m16 = true;
  // How a run's launches (one per tile config, then the merge) are ordered.
  // false (default): all in the caller's stream, longest CTAs first, chained
  // by programmatic dependent launch on sm_90+: each launch may fill the SMs
  // the one before leaves free, and the merge loads its descriptors while the
  // last one drains (no events, no launch gap). true: PAT's multi-stream
  // forward, one internal stream per tile config, forked from and joined
  // back into the caller's stream with events.
  bool stream_per_tile_config = false;
  // A launch of decode tiles (m <= 32, d <= 128) with more (unit, kv head)
  // items than CTAs fit on the GPU at once, and units longer than one K/V
  // tile, runs one wave of CTAs, each computing items until none are left
  // and fetching the next item's descriptor while it finishes one. false:
  // one CTA per item, scheduled by the hardware.
  bool persistent = true;
  // Masked units of the 128-row tile run its skip variant (a launch of its
  // own; fp16 / bf16 K/V at head_dim 64 and 128), whose warpgroups skip the
  // masked K/V tiles none of their rows see instead of computing them as -inf
  // scores. false: every unit runs the plain loop.
  bool skip_unseen = true;
  // Record when each CTA of a run starts, has its first K/V tile, leaves its
  // KV loop, has issued its output stores and is done (ns stamps of the GPU's
  // global timer), for trace_report(). Needs a library built with
  // -DTREEATTN_CTA_TRACE=ON (the constructor throws otherwise); costs a few
  // registers per thread, so keep it out of timings that get reported.
  bool trace = false;
  // Keep the plan's device arrays (unit descriptors, entries, page ids, merge
  // lists) in the L2 set-aside for persisting accesses, so that each run
  // finds them there even after other kernels (a model's weight GEMMs
  // between attention layers) streamed through L2: the first round trips of
  // every CTA (descriptor, then entries and page ids) become L2 hits. Raises
  // the device's persisting L2 limit (cudaLimitPersistingL2CacheSize) to the
  // plan's size where it is lower: a device-wide setting.
  bool l2_persistent_plan = false;
};

class CudaExecutor {
 public:
  // Validates the plan against the workload and uploads it; synchronous
  // (plan time, not run time). Uses the current CUDA device.
  CudaExecutor(const Workload& w, const Plan& p, const CudaExecutorOptions& o = {});
  ~CudaExecutor();
  CudaExecutor(CudaExecutor&&) noexcept;
  CudaExecutor& operator=(CudaExecutor&&) noexcept;

  // Computes attention for device tensors `a` (the workload's shapes and
  // dtype) on `stream`: the attention launches (one per tile config used;
  // see CudaExecutorOptions::stream_per_tile_config), then the merge.
  // Asynchronous. Not re-entrant: one run in flight per executor.
  void run(const AttentionArgs& a, cudaStream_t stream) const;

  size_t plan_bytes() const;       // the uploaded plan + page-table buffer
  size_t workspace_bytes() const;  // fp32 partials and lse
  int num_launches() const;        // attention launches per run (+1 merge when slots exist)
  // One line per launch: tile, CTAs, pipeline stages, shared memory.
  std::string describe() const;
  // The last run's CTA timeline (CudaExecutorOptions::trace), one line per
  // launch: when its CTAs started and ended (µs from the run's first CTA),
  // then p50/p90 of each phase: to first tile (descriptor, page-table and Q
  // loads, first K/V tile), kv loop, stores (epilogue), count (the fence and
  // the chained counter), life; for the merge, wait (for the attention CTAs)
  // and merge. Synchronous: call once the run's stream is idle.
  std::string trace_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CudaStepOptions {
  // Tiles the executor launches, one launch each, in this order (indices
  // into kTileConfigs; empty: the n = 64 tiles that fit head_dim, largest m
  // first). A plan's unit runs on the listed tile of the smallest m that
  // holds its rows: every unit computes the same result on any tile whose m
  // is large enough (n only sets the K/V tile length).
  std::vector<int> tiles;
  // CudaExecutorOptions::l2_persistent_plan: the window is the whole plan
  // buffer (its capacity), so that graphs captured once keep it.
  bool l2_persistent_plan = false;
  // Eager run() calls (the stream is not capturing) launch only the tiles
  // the plan in force uses, and the merge only where it has merges. A
  // captured run() launches the graph's launches (every grid unless
  // set_graph_launches() chose fewer) and the merge, so that its graph stays
  // valid for any later plan within capacity. Off: eager runs launch every
  // grid too.
  bool skip_unused_launches = true;
  // With the 128-row tile among the tiles: its skip variant
  // (CudaExecutorOptions::skip_unseen) gets a launch right after it, which
  // runs the plan's masked units of that tile. A captured run leaves it out
  // unless set_graph_launches() names it (the masked units then run the
  // plain loop). false: no such launch.
  bool skip_unseen = true;
};

// The executor of a serving engine's decode loop: made once with the engine's
// limits, it allocates every device buffer it will ever use (plan arrays,
// page table, partials, counters, two pinned staging buffers); set_plan() per
// decode step packs a validated plan into pinned memory and enqueues its copy
// on the stream -- no allocation, no synchronisation (it waits only if the
// copy of the plan two calls back has not run yet); run() per layer only
// launches, with grids fixed at construction that read the plan's sizes from
// device memory. So a CUDA graph captured over run() calls stays valid when
// set_plan() is called between replays with another plan within capacity.
// set_plan() and run() must use the same stream (or streams ordered so that a
// plan's copy comes after the previous plan's runs).
// Whether CudaStepExecutor::set_plan validates the plan: always, unless the
// caller made it from a validated plan by a change that keeps it valid and
// says so with `trusted`; `extension` says more: the plan is the last one
// set, changed only in its segments' token ranges (units, entries, masks,
// slots and merge lists as they were: TreeAttention's plan extension), so
// set_plan uploads only what such a change touches (units, segments, the
// page table).
enum class PlanCheck { validate, trusted, extension };

// A workload's page table held flat, as an engine passes it: node v's page
// ids at ids[node_offsets[v] .. node_offsets[v + 1]), nodes in order. Given
// to set_plan, it is copied in one piece instead of node by node.
struct PageTableView {
  std::span<const int32_t> ids;
  std::span<const int32_t> node_offsets;  // nodes + 1 entries, from 0 to ids.size()
  // The workload's nodes' pages were copied from this table (as
  // TreeAttention builds them): set_plan checks its shape, not its ids.
  bool source_of_workload = false;
};

class CudaStepExecutor {
 public:
  // layout: the dtype of q and out, that of the K/V pools, the page size and
  // the pool's pages (num_pages > 0).
  CudaStepExecutor(const HeadConfig& heads, const KvLayout& layout, const StepCapacity& cap = {},
                   const CudaStepOptions& o = {});
  ~CudaStepExecutor();
  CudaStepExecutor(CudaStepExecutor&&) noexcept;
  CudaStepExecutor& operator=(CudaStepExecutor&&) noexcept;

  // Validates w (against the construction's heads, dtypes, page size and
  // pool) and p (only where `check` is PlanCheck::validate), then uploads p
  // asynchronously on `stream`. Capacities are checked either way, and under
  // PlanCheck::extension that p has the last plan's numbers of queries,
  // units, segments, entries and slots.
  // `pages`, optional: w's page table, flat. Its shape (each node's page
  // count) is checked; its ids are compared with w's under
  // PlanCheck::validate unless the table says it is the source of w's pages
  // (otherwise the caller vouches for them with the plan).
  // `index`, optional: w's tree index, for validate_plan (which otherwise
  // builds one).
  void set_plan(const Workload& w, const Plan& p, cudaStream_t stream, PlanCheck check = PlanCheck::validate,
                const PageTableView* pages = nullptr, const TreeIndex* index = nullptr);
  // Attention of the last plan set, for device tensors `a`: the fixed
  // launches, then the merge (eager: only those the plan uses, see
  // CudaStepOptions::skip_unused_launches). Throws if no plan was set.
  void run(const AttentionArgs& a, cudaStream_t stream) const;

  const StepCapacity& capacity() const;
  size_t device_bytes() const;  // plan buffer + workspace
  int num_launches() const;     // attention launches per run (the merge launch besides)
  // Kernels an eager run() of the plan in force launches, the merge counted
  // (CudaStepOptions::skip_unused_launches); a captured one launches
  // popcount(graph_launches() | 1) + 1.
  int num_eager_launches() const;

  // The attention launches a captured run() records, as a mask over the
  // launches of describe() (bit i: launch i). Default: all but the skip
  // variant's (CudaStepOptions::skip_unseen), which a plan without masked
  // 128-row units leaves empty; plan_launches() names it where the plan in
  // force uses it. A recorded launch also runs the units of the launches
  // after it that the mask leaves out (they need no more rows), and launch 0
  // (the largest tile) is recorded whatever the mask: in order where the
  // mask holds it, else last, as the fallback of plans that need it. So a
  // graph captured under any mask runs any later plan correctly; units of a
  // left-out launch take a larger tile, or the plain loop for the skip
  // variant's (the same result up to rounding, possibly slower). A recorded
  // launch that the plan leaves empty costs 2-3 us of a replay where it
  // comes first, less as the last one (it then holds no SM while the others
  // run). An engine that keeps one graph per plan_launches() value replays
  // no empty launch but that last one. Throws on a bit past the last
  // launch, and where a left-out launch would run on one of fewer rows
  // (possible only with CudaStepOptions::tiles out of the default order).
  // Changes no graph already captured.
  void set_graph_launches(uint32_t launches);
  uint32_t graph_launches() const;
  // The launches the plan in force uses, as a mask like graph_launches()'s
  // (0 when no plan was set): the graph_launches() under which a captured
  // run of this plan launches no other tile but a last, empty launch 0.
  uint32_t plan_launches() const;
  std::string describe() const; // one line per launch: tile, CTAs, stages, shared memory

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace treeattn

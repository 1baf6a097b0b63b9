// GPU timing of plans: what `treeattn bench` and `treeattn demo` report.
// Times CudaExecutor::run with CUDA events (warm-up, median of >= 50 runs, L2
// flushed before each run), on device-generated random inputs; measures the
// HBM bandwidth in the same process with a large device-to-device copy and the
// tensor-core rate with a kernel of back-to-back wgmma; checks
// the output of sampled queries against the fp64 reference.
// Declared in every build; without CUDA, gpu_available() is false and the
// timing functions return nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {

struct BenchOptions {
  int warmup = 5;
  int iters = 50;               // timed runs; the median is reported
  bool flush_l2 = true;         // read a buffer of 2x the L2 size before each run (a write would leave dirty lines)
  bool graph = true;            // also time the run replayed as a CUDA graph
  int verify_queries = 8;       // sampled queries checked against fp64 (0: no check)
  uint64_t seed = 1;            // inputs
  bool exact_tiles = false;     // run every unit with its plan's tile (CudaExecutorOptions::short_m16 = false)
  bool streams = false;         // CudaExecutorOptions::stream_per_tile_config (PAT's multi-stream forward)
  bool persistent = true;       // CudaExecutorOptions::persistent
  bool trace = false;           // CudaExecutorOptions::trace: GpuTiming::trace of the last timed run
  bool l2_persistent_plan = false;  // CudaExecutorOptions::l2_persistent_plan (the flush leaves the plan in L2)
  bool skip_unseen = true;      // CudaExecutorOptions / CudaStepOptions::skip_unseen (the 128-row skip variant)
  // Run the plan through CudaStepExecutor, the runtime's executor (fixed grids
  // that read the plan's sizes from its upload, so that graphs stay valid from
  // plan to plan), made with this plan's sizes as capacities, instead of
  // CudaExecutor (grids of the plan's own sizes). exact_tiles, streams and
  // persistent do not apply.
  bool step_executor = false;
  // With step_executor: its launches (CudaStepOptions::tiles, indices into
  // kTileConfigs; empty: its default, the n = 64 tiles largest m first), or,
  // with step_plan_tiles, the tiles the plan's units use (largest m first),
  // which shows what its other, empty launches cost.
  std::vector<int> step_tiles;
  bool step_plan_tiles = false;
  // With step_executor: the graph replay is captured under the plan's own
  // launches (CudaStepExecutor::set_graph_launches(plan_launches()), as an
  // engine that keeps a graph per launch set replays it) instead of every
  // launch; with step_graph_first too, launch 0 among them (first, not
  // last, where the plan does not use it).
  bool step_graph_plan_launches = false;
  bool step_graph_first = false;
};

struct GpuTiming {
  std::string device;
  double us = 0;                // median of the runs (stream launches)
  double us_min = 0;
  double us_graph = 0;          // median of graph replays (0: not measured)
  double bandwidth_gbps = 0;    // measured HBM bandwidth (copy: bytes read + written)
  int64_t kv_bytes = 0;         // KV bytes the plan loads
  int64_t unique_kv_bytes = 0;
  int64_t io_bytes = 0;         // q read + out written
  int64_t partial_bytes = 0;    // partials written + read by the merge
  double floor_us = 0;          // (unique KV + q + out) / bandwidth
  int64_t flops = 0;            // PlanSummary::flops (useful attention FLOPs)
  double tensor_tflops = 0;     // measured tensor-core rate (dense, this dtype, fp32 accumulate)
  double compute_floor_us = 0;  // flops / tensor_tflops
  double roofline_us = 0;       // max(floor_us, compute_floor_us): no kernel runs faster
  // One plain kernel that only reads the unique KV bytes (contiguous, from the
  // K and V pools), timed like the runs (same flush, events, median): what
  // launch latency, ramp-up and bandwidth allow at this size. A reference,
  // not a proof: on GB-sized reads a tuned kernel is ~1% faster. 0: not
  // measured (no flush).
  double read_us = 0;
  double max_rel_err = -1;      // worst per-query relative L2 error of the sampled queries; -1: not checked
  int units = 0, slots = 0;
  // Kernels a run launches, the merge counted: an eager run (`launches`) and
  // a graph replay (`launches_graph`). They differ for the step executor,
  // whose eager runs launch only what the plan uses and whose graphs every grid
  // (or, with step_graph_plan_launches, the plan's launches and launch 0).
  int launches = 0, launches_graph = 0;
  std::string launch_info;      // CudaExecutor::describe()
  std::string trace;            // CudaExecutor::trace_report() of the last timed run (BenchOptions::trace)
  // Every timed run is held on the GPU until the host has enqueued all of it,
  // so that no time is the host's; runs whose hold ran out (after 1 s) instead.
  int host_gate_timeouts = 0;
};

// True when the library has CUDA and a device is visible.
bool gpu_available();
// Name of device 0 ("" without a GPU).
std::string gpu_device_name();
// Its streaming multiprocessors (0 without a GPU).
int gpu_sm_count();
// HBM bandwidth in GB/s from a 1 GiB device-to-device copy (median of 10),
// measured once per process.
double measure_hbm_bandwidth_gbps();
// Dense tensor-core rate in TFLOP/s for 16-bit inputs of `dtype` (fp16 or
// bf16) with fp32 accumulation: one CTA per SM, two warpgroups each issuing
// back-to-back m64n256k16 wgmma on random shared-memory operands (no global
// memory traffic), median of 10 timed launches; measured once per process
// and dtype. 0 without a GPU.
double measure_tensor_core_tflops(DType dtype);

// Device inputs of one workload, reused across its plans.
class GpuBench {
 public:
  explicit GpuBench(const Workload& w, uint64_t seed = 1);  // throws Error without a GPU
  ~GpuBench();
  GpuTiming time(const Plan& p, const BenchOptions& o = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot: nullopt without a GPU.
std::optional<GpuTiming> time_plan_on_gpu(const Workload& w, const Plan& p, const BenchOptions& o = {});

// The commit the binary reports: $TREEATTN_COMMIT, else `git rev-parse` in
// `source_dir`, else "unknown".
std::string current_commit(const std::string& source_dir);

}  // namespace treeattn

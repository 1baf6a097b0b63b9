// GPU tests of bench's roofline (bench.hpp): the tensor-core rate measured in
// the process, the compute floor it gives, that no plan runs faster than the
// roofline (which would mean a floor that is not one), and that the timed runs
// are held for the host and released by it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "treeattn/bench.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

TEST(BenchRoofline, TensorCoreRateIsMeasuredPerDtype) {
  const double fp16 = measure_tensor_core_tflops(DType::fp16), bf16 = measure_tensor_core_tflops(DType::bf16);
  // Far below any sm_90 part's dense rate and far above a kernel that did no
  // work or timed nothing (which would report thousands of TFLOP/s or more).
  for (const double r : {fp16, bf16}) {
    EXPECT_GT(r, 100.0);
    EXPECT_LT(r, 3000.0);
  }
  EXPECT_EQ(measure_tensor_core_tflops(DType::fp32), 0.0);  // no fp32 kernels
  EXPECT_EQ(measure_tensor_core_tflops(DType::fp16), fp16);  // once per process
}

// A few-shot tree of many queries at 32/32 (each query its own head group,
// so the shared prompt's FLOPs rival its bytes) and a memory-bound one at
// 32/8: every planner's time is at least the roofline, and the roofline is
// the larger floor.
TEST(BenchRoofline, NoPlanBeatsTheRoofline) {
  for (const HeadConfig heads : {HeadConfig{32, 32, 128}, HeadConfig{32, 8, 128}}) {
    WorkloadParams p;
    p.heads = heads;
    const Workload w = fewshot_workload(4000, 256, 32, p);
    GpuBench bench(w);
    BenchOptions o;
    o.graph = false;
    o.verify_queries = 2;
    for (const char* planner : {"per-query", "node", "auto"}) {
      const Plan plan = make_plan(planner, w);
      const GpuTiming t = bench.time(plan, o);
      EXPECT_EQ(t.flops, summarize(w, plan).flops);
      EXPECT_EQ(t.flops, int64_t(256) * (4000 + 32) * heads.num_qo_heads * 4 * 128);
      EXPECT_NEAR(t.compute_floor_us, double(t.flops) / (t.tensor_tflops * 1e6), 1e-9 * t.compute_floor_us);
      EXPECT_EQ(t.roofline_us, std::max(t.floor_us, t.compute_floor_us));
      EXPECT_GE(t.us, t.roofline_us) << planner << " at " << heads.num_qo_heads << "/" << heads.num_kv_heads;
    }
  }
}

// Every timed run (eager, graph replay, the read-only bound; flushed or not)
// is released by the host once enqueued, never by the hold's timeout.
TEST(BenchRoofline, TimedRunsAreReleasedByTheHost) {
  WorkloadParams p;
  p.heads = HeadConfig{32, 8, 128};
  const Workload w = fewshot_workload(1000, 16, 16, p);
  GpuBench bench(w);
  for (const bool flush : {true, false}) {
    BenchOptions o;
    o.flush_l2 = flush;
    o.verify_queries = 0;
    const GpuTiming t = bench.time(make_plan("auto", w), o);
    EXPECT_EQ(t.host_gate_timeouts, 0) << "flush " << flush;
    EXPECT_GT(t.us, 0.0);
    EXPECT_GT(t.us_graph, 0.0);
    if (flush) EXPECT_GT(t.read_us, 0.0);  // measured with the first flushed run
  }
}

// The runtime's executor timed on the same inputs (BenchOptions::
// step_executor): its output checks against fp64 like CudaExecutor's, it runs
// its fixed launch set (one per n = 64 tile that fits d = 128, and the
// merge) as a graph, eager only the launches the plan uses, and it is no
// faster than the roofline either.
TEST(BenchRoofline, TheStepExecutorIsTimedOnTheSameInputs) {
  WorkloadParams p;
  p.heads = HeadConfig{32, 8, 128};
  const Workload w = fewshot_workload(1000, 64, 16, p);
  GpuBench bench(w);
  BenchOptions o;
  o.verify_queries = 4;
  for (const char* planner : {"per-query", "node"}) {
    const Plan plan = make_plan(planner, w);
    const GpuTiming per_plan = bench.time(plan, o);
    o.step_executor = true;
    const GpuTiming step = bench.time(plan, o);
    o.step_executor = false;
    EXPECT_LT(step.max_rel_err, 2e-3) << planner;
    EXPECT_LT(per_plan.max_rel_err, 2e-3) << planner;
    std::set<int> ms;  // the step executor's launches this plan uses: one per m
    for (const uint8_t t : plan.unit_tile) ms.insert(kTileConfigs[t].m);
    EXPECT_EQ(step.launches, int(ms.size()) + (plan.num_slots > 0 ? 1 : 0)) << planner << ": " << step.launch_info;
    EXPECT_EQ(step.launches_graph, 4 + 1) << step.launch_info;
    EXPECT_EQ(per_plan.launches_graph, per_plan.launches) << per_plan.launch_info;
    EXPECT_EQ(step.launch_info.rfind("step executor: ", 0), 0u) << step.launch_info;
    EXPECT_GE(step.us, step.roofline_us) << planner;
    EXPECT_GT(step.us_graph, 0.0) << planner;
    EXPECT_EQ(step.unique_kv_bytes, per_plan.unique_kv_bytes);
  }
}

}  // namespace
}  // namespace treeattn

// The CUDA executors trust only validated plans: valid plans of every planner
// over small random trees, mutated field by field from seeded bytes (the
// mutations of the fuzz_plan_mutation target, tests/support/plan_mutation.hpp);
// every mutated plan the validator accepts runs on the GPU -- through
// CudaExecutor, and through the runtime's CudaStepExecutor -- with its output
// poisoned, and must match the fp64 reference. Run under compute-sanitizer
// memcheck by scripts/device_runtime.sh (SanitizeMutatedPlans): an accepted
// plan that reads or writes out of bounds shows up there.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/support/plan_mutation.hpp"
#include "treeattn/cuda_executor.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

// Whether a mutation left the plan and tree as they were (a bit set to its
// value, a step of 0): such plans prove nothing and are not counted.
bool unchanged(const Workload& a, const Plan& p, const Workload& b, const Plan& q) {
  auto seg_eq = [](const Segment& x, const Segment& y) { return x.node == y.node && x.begin == y.begin && x.end == y.end; };
  if (!std::equal(p.segments.begin(), p.segments.end(), q.segments.begin(), q.segments.end(), seg_eq)) return false;
  if (p.unit_segment_offset != q.unit_segment_offset || p.unit_query_offset != q.unit_query_offset ||
      p.entry_query != q.entry_query || p.entry_mask != q.entry_mask || p.entry_slot != q.entry_slot ||
      p.unit_tile != q.unit_tile || p.unit_masked != q.unit_masked || p.query_slot_offset != q.query_slot_offset ||
      p.query_slots != q.query_slots || p.num_slots != q.num_slots || a.query_nodes != b.query_nodes)
    return false;
  for (size_t v = 0; v < a.tree.nodes.size(); ++v)
    if (a.tree.nodes[v].num_tokens != b.tree.nodes[v].num_tokens || a.tree.nodes[v].pages != b.tree.nodes[v].pages)
      return false;
  return true;
}

TEST(CudaExecutor, SanitizeMutatedPlans) {
  WorkloadParams wp;
  wp.heads = {8, 2, 64};
  wp.page_size = 4;
  wp.dtype = DType::fp16;
  RandomTreeOptions ro;
  ro.max_nodes = 10;
  ro.max_tokens = 40;
  ro.empty_node_prob = 0.2;
  ro.internal_query_prob = 0.3;
  PlanOptions opt;
  opt.num_sms = 3;  // few CTAs: planners split KV, so plans have partial slots
  opt.chunk_tokens = 8;
  std::mt19937_64 rng(2026);
  // One mutation per plan (8 bytes): with several, almost every plan is rejected.
  int tried = 0, accepted = 0, tree_mutations = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Workload base = random_workload(seed, wp, ro);
    HostTensors h = make_random_inputs(base, seed);
    DeviceTensors d = DeviceTensors::upload(h);
    StepCapacity cap;
    cap.max_queries = 64;
    CudaStepExecutor step(base.heads, base.layout.dtype, base.layout.page_size, base.layout.num_pages, cap);
    for (const PlannerInfo& info : planners()) {
      const Plan valid = make_plan(info.name, base, opt);
      for (int m = 0; m < 80; ++m) {
        Workload w = base;
        Plan p = valid;
        std::vector<uint8_t> bytes(8);
        for (uint8_t& b : bytes) b = uint8_t(rng());
        test_support::Reader r{bytes.data(), bytes.size()};
        const bool tree_changed = test_support::mutate_plan(w, p, r);
        ++tried;
        try {
          if (tree_changed) w.validate();
          validate_plan(w, p);
        } catch (const Error&) {
          continue;  // rejected: the executors never see it
        }
        if (unchanged(w, p, base, valid)) continue;
        ++accepted;
        tree_mutations += tree_changed;
        const std::vector<double> ref = reference_attention(w, h.args());
        CudaExecutor ex(w, p);
        d.poison_out();
        ex.run(d.args(), nullptr);
        check_cuda(cudaDeviceSynchronize(), "mutated plan run");
        HostTensors g = h;
        d.download_out(g);
        EXPECT_LE(relative_error(w, g.out.data(), ref), 2e-3) << "seed " << seed << " planner " << info.name
                                                                << " mutation " << m;
        step.set_plan(w, p, nullptr);
        d.poison_out();
        step.run(d.args(), nullptr);
        check_cuda(cudaDeviceSynchronize(), "mutated plan step run");
        d.download_out(g);
        EXPECT_LE(relative_error(w, g.out.data(), ref), 2e-3) << "step executor: seed " << seed << " planner "
                                                                << info.name << " mutation " << m;
      }
    }
  }
  std::printf("mutated plans: %d tried, %d changed and accepted by the validator, run on the GPU (%d with a mutated tree)\n",
              tried, accepted, tree_mutations);
  EXPECT_GT(accepted, 100) << "too few accepted mutations to mean anything";
}

}  // namespace
}  // namespace treeattn

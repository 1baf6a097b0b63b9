// The CUDA executors trust only validated plans: valid plans of every planner
// over small random trees, mutated field by field from seeded bytes (the
// mutations of the fuzz_plan_mutation target, tests/support/plan_mutation.hpp);
// every mutated plan the validator accepts runs on the GPU -- through
// CudaExecutor, and through the runtime's CudaStepExecutor -- with its output
// poisoned, and must match the fp64 reference. Run under compute-sanitizer
// memcheck by scripts/device_runtime.sh (SanitizeMutatedPlans): an accepted
// plan that reads or writes out of bounds shows up there. Random single
// mutations are mostly rejected or change nothing; the fuzzer's corpus holds
// the ones that get through, so the test replays it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
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

// Inputs: the fuzz target's committed corpus, the directory named by
// $TREEATTN_MUTATION_CORPUS (a longer fuzz run's corpus), and seeded random
// single mutations; each is replayed as the fuzz target reads it (a case, a
// plan, then the mutations).
std::vector<std::vector<uint8_t>> mutation_inputs() {
  std::vector<std::vector<uint8_t>> in;
  std::vector<std::filesystem::path> dirs{std::filesystem::path(TREEATTN_SOURCE_DIR) / "fuzz/corpus/fuzz_plan_mutation"};
  if (const char* extra = std::getenv("TREEATTN_MUTATION_CORPUS")) dirs.emplace_back(extra);
  for (const auto& dir : dirs)
    if (std::filesystem::is_directory(dir))
      for (const auto& f : std::filesystem::directory_iterator(dir)) {
        std::ifstream is(f.path(), std::ios::binary);
        in.emplace_back(std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>());
      }
  std::mt19937_64 rng(2026);
  for (int i = 0; i < 4000; ++i) {
    std::vector<uint8_t> b(10);  // case, plan, one mutation
    for (uint8_t& x : b) x = uint8_t(rng());
    in.push_back(std::move(b));
  }
  return in;
}

TEST(CudaExecutor, SanitizeMutatedPlans) {
  const std::vector<test_support::MutationCase> cases = test_support::mutation_cases(DType::fp16);
  std::vector<HostTensors> inputs;
  std::vector<DeviceTensors> dev;
  std::vector<std::unique_ptr<CudaStepExecutor>> steps;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Workload& w = cases[i].w;
    inputs.push_back(make_random_inputs(w, i + 1));
    dev.push_back(DeviceTensors::upload(inputs.back()));
    StepCapacity cap;
    cap.max_queries = 64;
    steps.push_back(std::make_unique<CudaStepExecutor>(w.heads, w.layout, cap));
  }
  int tried = 0, accepted = 0, tree_mutations = 0, transformed = 0;
  std::vector<std::vector<uint8_t>> inputs_bytes = mutation_inputs();
  // Then 600 valid plans made by one to three plan-preserving transforms
  // (marked by a leading 1 byte below): the validator must accept them all.
  std::mt19937_64 rng(77);
  for (int i = 0; i < 600; ++i) {
    std::vector<uint8_t> b(1 + 2 + 3 * 13);
    for (uint8_t& x : b) x = uint8_t(rng());
    b[0] = 1;
    inputs_bytes.push_back(std::move(b));
  }
  const size_t first_transform = inputs_bytes.size() - 600;
  for (size_t in = 0; in < inputs_bytes.size(); ++in) {
    const std::vector<uint8_t>& bytes = inputs_bytes[in];
    const bool transform = in >= first_transform;
    test_support::Reader r{bytes.data() + (transform ? 1 : 0), bytes.size() - (transform ? 1 : 0)};
    const size_t ci = r.byte() % cases.size();
    const test_support::MutationCase& c = cases[ci];
    const Plan& valid = c.plans[r.byte() % c.plans.size()];
    Workload w = c.w;
    Plan p = valid;
    bool tree_changed = false;
    if (transform) {
      for (int k = 0; k < 3; ++k) test_support::transform_plan(w, p, r);
      EXPECT_NO_THROW(validate_plan(w, p)) << "a plan-preserving transform was rejected (input " << in << ")";
    } else {
      tree_changed = test_support::mutate_plan(w, p, r);
    }
    ++tried;
    try {
      if (tree_changed) w.validate();
      validate_plan(w, p);
    } catch (const Error&) {
      continue;  // rejected: the executors never see it
    }
    if (unchanged(w, p, c.w, valid)) continue;
    ++accepted;
    transformed += transform;
    tree_mutations += tree_changed;
    HostTensors& h = inputs[ci];
    DeviceTensors& d = dev[ci];
    const std::vector<double> ref = reference_attention(w, h.args());
    CudaExecutor ex(w, p);
    d.poison_out();
    ex.run(d.args(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "mutated plan run");
    HostTensors g = h;
    d.download_out(g);
    EXPECT_LE(relative_error(w, g.out.data(), ref), 2e-3) << "input " << tried;
    steps[ci]->set_plan(w, p, nullptr);
    d.poison_out();
    steps[ci]->run(d.args(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "mutated plan step run");
    d.download_out(g);
    EXPECT_LE(relative_error(w, g.out.data(), ref), 2e-3) << "step executor: input " << tried;
  }
  std::printf("mutated plans: %d tried, %d changed and accepted by the validator, run on the GPU (%d with a mutated "
              "tree, %d made by plan-preserving transforms)\n",
              tried, accepted, tree_mutations, transformed);
  EXPECT_GT(accepted, 0) << "no accepted mutation: the test checked nothing";
}

}  // namespace
}  // namespace treeattn

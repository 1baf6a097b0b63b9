// Numerical edge cases (issue 20, point 4) for every planner through the CPU
// executor against the fp64 reference: logits of order 1e4, all-equal keys,
// a one-token path, empty nodes on the path, one-token pages, a path of
// 2^20 tokens, and NaN/Inf in one query's q staying in that query's output.
// The cases are in numerics_cases.hpp; tests/gpu/numerics_edge_test.cpp runs
// the same ones through the CUDA executor.
#include <gtest/gtest.h>

#include <climits>

#include "exec/numerics_cases.hpp"

using namespace treeattn;
using namespace treeattn_numerics;

namespace {

void check_case(const Case& c) {
  HostTensors t = make_random_inputs(c.w, 11);
  if (c.edit) c.edit(c.w, t);
  const std::vector<double> ref = reference_attention(c.w, t.args());
  const std::vector<uint8_t> poisoned_out = t.out;  // NaN: unwritten outputs show
  for (const PlannerInfo& info : planners()) {
    const Plan p = make_plan(info.name, c.w);
    ASSERT_NO_THROW(validate_plan(c.w, p)) << c.name << " " << info.name;
    t.out = poisoned_out;
    run_cpu(c.w, p, t.args());
    const Compare r = compare(c.w, t.out, t.dtype, ref, c.poisoned);
    EXPECT_TRUE(r.finite) << c.name << " " << info.name << ": a non-finite output in a clean query";
    EXPECT_LE(r.rel, c.tol) << c.name << " " << info.name;
    if (c.expect_nan) EXPECT_TRUE(r.nan_in_skip) << c.name << " " << info.name << ": the NaN query's output is not NaN";
  }
}

}  // namespace

TEST(NumericsEdge, EveryCaseEveryPlannerMatchesTheReference) {
  for (const Case& c : cases(/*long_path=*/false)) {
    SCOPED_TRACE(c.name);
    check_case(c);
  }
}

TEST(NumericsEdge, PathOfTwoToTheTwentyTokens) {
  for (const Case& c : cases(/*long_path=*/true))
    if (c.name == "path_of_2^20_tokens") {
      ASSERT_GE(TreeIndex::build(c.w.tree, c.w.query_nodes).path_tokens[2], int64_t(1) << 20);
      check_case(c);
    }
}

// Where a size limit is hit, the error says which and by how much; nothing
// wraps silently. A path of 2^32 - 2 tokens (two nodes of 2^31 - 1) is over
// kMaxPathTokens: Workload::validate refuses it before anything is planned.
TEST(NumericsEdge, AbsurdSizesGiveAClearError) {
  const WorkloadParams p = params(2, 1, 64, DType::fp16, 65536);
  try {
    tree({-1, 0}, {INT_MAX, INT_MAX}, {1}, p);
    ADD_FAILURE() << "a path of 2^32 tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit of 2^30 (kMaxPathTokens)"), std::string::npos) << e.what();
  }
  // A 1,000,000-token node plans fine with every planner.
  const Workload w = tree({-1, 0, 0}, {1000000, 10, 10}, {1, 2}, params(32, 8, 128, DType::fp16, 16));
  for (const PlannerInfo& info : planners()) {
    const Plan plan = make_plan(info.name, w);
    EXPECT_NO_THROW(validate_plan(w, plan)) << info.name;
  }
}

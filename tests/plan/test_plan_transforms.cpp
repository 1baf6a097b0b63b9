// The plan-preserving transforms of tests/support/plan_mutation.hpp (used on
// the GPU by SanitizeMutatedPlans): every transformed plan of every planner
// passes the validator and the CPU executor still matches the fp64 reference;
// random single mutations that the validator accepts do too.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/support/plan_mutation.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

TEST(PlanTransforms, ValidPlansStayValidAndRight) {
  std::mt19937_64 rng(11);
  int changed = 0, mutated_accepted = 0;
  uint64_t seed = 0;
  for (const test_support::MutationCase& c : test_support::mutation_cases(DType::fp16, 8)) {
    const Workload& w = c.w;
    HostTensors h = make_random_inputs(w, ++seed);
    const std::vector<double> ref = reference_attention(w, h.args());
    for (size_t pi = 0; pi < c.plans.size(); ++pi) {
      const Plan& valid = c.plans[pi];
      const std::string& name = planners()[pi].name;
      for (int i = 0; i < 12; ++i) {
        std::vector<uint8_t> bytes(3 * 13);
        for (uint8_t& b : bytes) b = uint8_t(rng());
        test_support::Reader r{bytes.data(), bytes.size()};
        Plan p = valid;
        for (int k = 0; k < 3; ++k) changed += test_support::transform_plan(w, p, r);
        ASSERT_NO_THROW(validate_plan(w, p)) << name << " seed " << seed;
        run_cpu(w, p, h.args(), 1);
        EXPECT_LE(relative_error(w, h.out.data(), ref), 2e-3) << name << " seed " << seed;
        // A random single mutation: if accepted, it must be right as well.
        Workload wm = w;
        Plan pm = valid;
        test_support::Reader rm{bytes.data(), 8};
        const bool tree_changed = test_support::mutate_plan(wm, pm, rm);
        try {
          if (tree_changed) wm.validate();
          validate_plan(wm, pm);
        } catch (const Error&) {
          continue;
        }
        ++mutated_accepted;
        HostTensors hm = make_random_inputs(wm, seed);
        run_cpu(wm, pm, hm.args(), 1);
        EXPECT_LE(relative_error(wm, hm.out.data(), reference_attention(wm, hm.args())), 2e-3) << name;
      }
    }
  }
  EXPECT_GT(changed, 500);
  EXPECT_GT(mutated_accepted, 0);
}

}  // namespace
}  // namespace treeattn

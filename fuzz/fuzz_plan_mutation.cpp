// libFuzzer target: the plan validator against corrupted plans.
// Valid plans of every planner over small seeded random trees (built once)
// are mutated field by field (CSR offsets and counts, segment bounds and
// nodes, query ids, masks, slot ids, tile ids, merge lists, and the
// workload's page ids and token counts) as the input bytes say. Oracles:
//   - every unmutated plan validates (checked once at start-up);
//   - a mutated plan that validate_plan (and, for a mutated tree,
//     Workload::validate) accepts is run by the CPU executor (under ASan and
//     UBSan in fuzz builds: no out-of-bounds access) and must match the fp64
//     reference. An accepted plan that computes a wrong answer is a plan the
//     executors misread, which the validator must have rejected.
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.hpp"
#include "tests/support/plan_mutation.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"

namespace {

using namespace treeattn;

struct Case {
  Workload w;
  HostTensors inputs;        // out is NaN-poisoned: unwritten outputs fail the check
  std::vector<double> ref;
  std::vector<Plan> plans;   // one per planner
};

std::vector<Case>& cases() {
  static std::vector<Case> c = [] {
    std::vector<Case> out;
    for (test_support::MutationCase& m : test_support::mutation_cases(DType::fp32)) {
      Case k;
      k.w = std::move(m.w);
      k.inputs = make_random_inputs(k.w, uint64_t(out.size() + 1));
      k.ref = reference_attention(k.w, k.inputs.args());
      k.plans = std::move(m.plans);
      for (const Plan& p : k.plans) validate_plan(k.w, p);  // unmutated plans must be accepted (throws otherwise)
      out.push_back(std::move(k));
    }
    return out;
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<Case>& all = cases();
  treeattn::test_support::Reader r{data, size};
  const Case& c = all[r.byte() % all.size()];
  const size_t which = r.byte() % c.plans.size();
  Plan p = c.plans[which];
  Workload w = c.w;
  const bool tree_changed = treeattn::test_support::mutate_plan(w, p, r);
  try {
    if (tree_changed) w.validate();
    validate_plan(w, p);
  } catch (const Error&) {
    return 0;  // rejected: fine
  }
  // Accepted: it must be safe to run and right.
  HostTensors t = c.inputs;
  run_cpu(w, p, t.args(), /*threads=*/1);
  const std::vector<double> ref = tree_changed ? reference_attention(w, t.args()) : c.ref;
  const double err = relative_error(w, t.out.data(), ref);
  treeattn_fuzz::require(err <= 1e-4, "an accepted mutated plan gives a wrong result (validator gap)");
  return 0;
}

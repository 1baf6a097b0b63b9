// Planners: pure functions (workload, options) -> Plan, registered by name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {

struct PlanOptions {
  int num_sms = 132;          // SMs of the target GPU (H100 SXM: 132)
  int ctas_per_sm = 2;        // resident CTAs per SM the kernels reach
  int chunk_tokens = 128;     // node-chunk: chunk length; flatten: block length
  int min_split_tokens = 256; // never split KV into pieces shorter than this
  // Extra named knobs for individual planners (e.g. "alpha", "beta").
  std::map<std::string, double> extra;

  int target_ctas(const HeadConfig& h) const;  // CTAs (units x kv heads) that fill the GPU
  double get(const std::string& key, double fallback) const;
};

// Sets one option by name, as `treeattn --plan-opt KEY=NUMBER` and Python's
// TreeAttention(plan_options=...) do: ctas_per_sm (an integer in [1, 64]:
// planners size their unit lists by num_sms x ctas_per_sm), chunk_tokens and
// min_split_tokens (integers in [1, 2^30]), or a planner's knob
// (planner_knobs(), into `extra`) within the range its planner accepts
// (an integer where the planner takes one). Throws Error naming the key, the
// value and the range otherwise, so that a bad knob fails when it is set,
// not at the first plan.
void set_plan_option(PlanOptions& opt, const std::string& key, double value);
// Several times any GPU's SM count (H100 132, B200 148): planners size their
// unit lists by num_sms x ctas_per_sm.
inline constexpr int kMaxNumSms = 1024;
// Throws Error naming the option and the value unless num_sms is in [1,
// kMaxNumSms] and every other option (each key of `extra` too) is one
// set_plan_option accepts (a key of `extra` must be a planner's knob, not
// ctas_per_sm & co., which only the fields set): for options set on a
// PlanOptions directly, as a C++ caller of TreeAttention does.
void check_plan_options(const PlanOptions& opt);
// The knobs planners read from PlanOptions::extra, sorted.
const std::vector<std::string>& planner_knobs();

using PlannerFn = std::function<Plan(const Workload&, const PlanOptions&)>;

// Memory planners reuse from call to call: the tree's query lists, unit lists
// and the like. A caller that plans every decode step keeps one (TreeAttention
// does); once it has grown to the largest tree, auto, node and per-query plan
// without allocating. Not shared between threads.
class PlanScratch {
 public:
  PlanScratch();
  ~PlanScratch();
  PlanScratch(PlanScratch&&) noexcept;
  PlanScratch& operator=(PlanScratch&&) noexcept;
  struct Buffers;  // src/plan/planners/planners.hpp
  Buffers& buffers() { return *buffers_; }

 private:
  std::unique_ptr<Buffers> buffers_;
};

// A planner that plans into reused memory: ix is w's index, already built
// (Workload::validate keeps one in its scratch); `out` is refilled, its
// arrays keep their capacity. Same plan as the planner's PlannerFn.
using ReusingPlannerFn = void (*)(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                  PlanScratch& scratch, Plan& out);

struct PlannerInfo {
  std::string name;
  std::string description;
  PlannerFn fn;
  ReusingPlannerFn fn_reusing = nullptr;  // the planners a decode loop uses: auto, node, per-query
};

// Plans w with `info` into `out`: by fn_reusing where the planner has one,
// else by fn. ix: w's index. opt's fields (num_sms, ctas_per_sm,
// chunk_tokens, min_split_tokens) are checked first, as check_plan_options
// does, without allocating (a planner given num_sms = 0 divided by zero);
// the knobs of `extra` each planner checks as it reads them.
void plan_reusing(const PlannerInfo& info, const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                  PlanScratch& scratch, Plan& out);

// The built-in planners, in the order reports list them (src/plan/registry.cpp).
const std::vector<PlannerInfo>& planners();
const PlannerInfo& find_planner(const std::string& name);  // throws Error
// w is validated first (Workload::validate: planners trust its sizes) and
// opt's fields are checked as plan_reusing checks them, each an Error naming
// the field and value (a planner given num_sms = 0 or no kv heads divided by
// zero; one given an unchecked token count ran out of memory). A caller that
// plans every decode step validates once and calls plan_reusing.
Plan make_plan(const std::string& name, const Workload& w, const PlanOptions& opt = {});

}  // namespace treeattn

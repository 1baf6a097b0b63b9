// Planners: pure functions (workload, options) -> Plan, registered by name.
#pragma once

#include <functional>
#include <map>
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

using PlannerFn = std::function<Plan(const Workload&, const PlanOptions&)>;

struct PlannerInfo {
  std::string name;
  std::string description;
  PlannerFn fn;
};

// The built-in planners, in the order reports list them (src/plan/registry.cpp).
const std::vector<PlannerInfo>& planners();
const PlannerInfo& find_planner(const std::string& name);  // throws Error
Plan make_plan(const std::string& name, const Workload& w, const PlanOptions& opt = {});

}  // namespace treeattn

// Flags shared by every subcommand (identical names and defaults everywhere)
// and the helpers that turn them into workloads and planner lists.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::cli {

struct CommonOptions {
  std::vector<std::string> workloads;
  std::string heads = "32/8";
  int head_dim = 128;
  std::string dtype = "fp16";
  int page_size = 16;
  std::vector<std::string> planners;  // empty or "all": every registered planner
  bool json = false;
  uint64_t seed = 1;
  int num_sms = 132;
  std::string forge_table;  // cost table of the forge planner (default: data/forge_cost_h100.json)
  std::string pat_rules;    // tile rules of the pat planner (default: data/pat_tile_rules.json)
  std::vector<std::string> plan_opts;  // --plan-opt KEY=NUMBER: PlanOptions fields and planner knobs
};

// Adds --workload/-w, --heads, --head-dim, --dtype, --page-size, --planner/-p,
// --json, --seed, --sms, --forge-table, --pat-rules, --plan-opt to `cmd`.
void add_common_options(CLI::App* cmd, CommonOptions& o);

WorkloadParams workload_params(const CommonOptions& o);
// Also installs --forge-table as the forge planner's cost table and
// --pat-rules as the pat planner's tile rules.
PlanOptions plan_options(const CommonOptions& o);
// Builds every --workload (or `fallback` when none was given). A relative FILE
// that does not exist is also looked up in the repository's data/workloads/.
std::vector<Workload> load_workloads(const CommonOptions& o, const std::vector<std::string>& fallback);
std::vector<std::string> selected_planners(const CommonOptions& o);
// The error tolerance of DESIGN.md for a dtype (relative L2).
double tolerance(DType t);

std::string format_bytes(double bytes);

}  // namespace treeattn::cli

#include <nlohmann/json.hpp>

namespace treeattn::cli {
// One record of `plan --json` (and the plan part of verify/bench records).
nlohmann::json summary_json(const Workload& w, const PlanSummary& s);
}  // namespace treeattn::cli

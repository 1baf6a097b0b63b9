// Flags shared by every subcommand (identical names and defaults everywhere)
// and the helpers that turn them into workloads and planner lists.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/suite.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::cli {

struct CommonOptions {
  std::vector<std::string> workloads;
  std::string heads = "32/8";
  int head_dim = 128;
  std::string dtype = "fp16";
  std::string kv_dtype;  // empty: dtype
  int page_size = 16;
  std::vector<std::string> planners;  // --planner; "all": every registered planner
  bool json = false;
  uint64_t seed = 1;
  int num_sms = 132;
  std::string forge_table;  // cost table of the forge planner (default: data/forge_cost_h100.json)
  std::string pat_rules;    // tile rules of the pat planner (default: data/pat_tile_rules.json)
  std::string auto_cost;    // cost model of the auto planner (default: the built-in H100 table)
  std::vector<std::string> plan_opts;  // --plan-opt KEY=NUMBER: PlanOptions fields and planner knobs
};

// Adds --workload/-w, --heads, --head-dim, --dtype, --kv-dtype, --page-size, --planner/-p,
// --json, --seed, --sms, --forge-table, --pat-rules, --auto-cost, --plan-opt to `cmd`.
void add_common_options(CLI::App* cmd, CommonOptions& o);

WorkloadParams workload_params(const CommonOptions& o);
// Also installs --forge-table as the forge planner's cost table and
// --pat-rules as the pat planner's tile rules, --auto-cost as auto's cost model.
PlanOptions plan_options(const CommonOptions& o);
// Builds every --workload (or `fallback` when none was given). A relative FILE
// that does not exist is also looked up in the repository's data/workloads/.
std::vector<Workload> load_workloads(const CommonOptions& o, const std::vector<std::string>& fallback);
// The --planner names, "all" expanded; without --planner `when_none`: "auto"
// (the library's default) where one plan per workload is meant, "all" in the
// commands that exist to compare planners (demo, bench --suite).
std::vector<std::string> selected_planners(const CommonOptions& o, const std::string& when_none = "auto");
// "fp16", or "fp16, kv fp8_e4m3" when the K/V pools are of another type.
std::string dtype_label(const KvLayout& l);
// The error tolerance of DESIGN.md for a dtype (relative L2).
double tolerance(DType t);

std::string format_bytes(double bytes);
// KV bytes a plan loads over the unique-KV floor; 1 where both are 0 (a tree
// without tokens: nothing to load, nothing loaded).
inline double kv_over_floor(int64_t kv_bytes, int64_t unique_kv_bytes) {
  return unique_kv_bytes > 0 ? double(kv_bytes) / double(unique_kv_bytes) : kv_bytes == 0 ? 1.0 : INFINITY;
}
// Throws Error when `bytes` of host memory are more than the machine has
// available now (Linux: MemAvailable of /proc/meminfo; elsewhere no check):
// a run that would be killed for memory stops first with a message saying
// what needs the memory.
void require_host_memory(double bytes, const std::string& what);
// Throws Error "<what>: no CUDA device ..." saying whether this build has
// CUDA at all, unless a GPU is available.
void require_gpu(const std::string& what);
// require_host_memory for a workload's random inputs (q, out, the K/V pools)
// and its fp64 reference output.
void require_inputs_memory(const Workload& w, const std::string& what);
// require_host_memory for the CPU executor's partials of plan p: fp32 O and
// lse per (slot, qo head).
void require_partials_memory(const Workload& w, const Plan& p, const std::string& what);

// Where the CLI's data files are (suites/, forge_cost_h100.json,
// pat_tile_rules.json, workloads/): the first of
//   <dir of the executable>/../share/treeattn          (installed: cmake --install)
//   the source tree's data/, when the executable sits in a CMake build
//     directory (its CMakeCache.txt names the source tree)
//   $TREEATTN_DATA_DIR
// that holds a suites/ folder. `looked` lists every place tried and why it was
// not used, for the error message of whoever needs the data.
struct DataDir {
  std::string dir;     // empty when none was found
  std::string looked;  // "A (no such directory); B (...); $TREEATTN_DATA_DIR (unset)"
};
const DataDir& data_dir();
// data_dir().dir, or Error "<what>: no data directory found (looked in: ...)".
std::string require_data_dir(const std::string& what);
// A suite named on the command line (`what`: the option, for errors): the
// file NAME where it is a regular file, else the data directory's
// suites/NAME.suite (bench::load_suite).
bench::Suite load_named_suite(const std::string& name, const std::string& what);

// Progress of a long command on stderr. Silent for its first 2 s, so short
// runs (and their parseable stdout) look as before; then, on a terminal, one
// status line redrawn in place twice a second, and elsewhere (logs, CI) a
// plain line per step plus one every 10 s while a step runs. A background
// thread does the printing, so a single long step (the fp64 reference over a
// 200000-query tree) still shows that it is alive and for how long.
class Progress {
 public:
  explicit Progress(std::string command);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // Starts the next step; `total` 0 while the number of steps is unknown.
  void step(const std::string& what, int total = -1);
  // Erases the status line on a terminal; call before printing to stdout.
  void clear();

 private:
  void loop();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace treeattn::cli

#include <nlohmann/json.hpp>

namespace treeattn::cli {
// One record of `plan --json` (and the plan part of verify/bench records).
nlohmann::json summary_json(const Workload& w, const PlanSummary& s);
}  // namespace treeattn::cli

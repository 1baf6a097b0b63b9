// `treeattn bench --suite NAME|FILE`: runs a whole benchmark suite on the GPU
// and writes results.json, report.md and PNG plots under
// bench/results/<device>/<suite>/ (or --out).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench/suite.hpp"
#include "cli/common.hpp"
#include "treeattn/bench.hpp"

namespace treeattn::cli {

// One JSON record of a timed plan: the plan summary plus the timing keys
// (device, commit, us, kv_bytes, unique_kv_bytes, bandwidth_gbps, floor_us,
// max_rel_err, ...). Shared by `bench` and `bench --suite`.
nlohmann::json timing_record(const Workload& w, const Plan& p, const GpuTiming& t, const std::string& commit,
                             double plan_ms, const BenchOptions& b);

struct SuiteRun {
  std::string suite;         // built-in name or a suite file
  bool quick = false;        // the '+' entries at quick_heads only
  std::string out_dir;       // default: <source>/bench/results/<device>/<suite>
  std::vector<std::string> planners;  // --planner; empty: all
  bool resume = false;       // go on from out_dir's results.json (bench::completed_configs)
};

// (Re)writes report.md and the plots of DIR/results.json; returns the markdown.
std::string write_report(const std::string& dir);

// The command line that reproduces a suite run: the suite and every option
// that changes its plans or timings (those at their defaults left out; not
// --out or --resume). results.json records it; --resume requires it equal.
std::string suite_command(const SuiteRun& run, const CommonOptions& common, const BenchOptions& b);

// Returns false when a sampled query was over tolerance.
bool run_suite(const SuiteRun& run, const CommonOptions& common, const BenchOptions& b);

}  // namespace treeattn::cli

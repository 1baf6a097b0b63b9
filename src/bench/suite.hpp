// Benchmark suites: named lists of workload specs with head configs, loaded
// from plain text files (data/suites/*.suite or any user file), and the
// reports (markdown tables, geometric means) made from their JSON records.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "treeattn/types.hpp"

namespace treeattn::bench {

// File format, one item per line ('#' starts a comment):
//   heads: 32/32 32/8        head configs (qo/kv), every workload runs at each
//   quick_heads: 32/8        head configs of the --quick subset
//   head_dim: 128 | dtype: fp16 | page_size: 16
//   SPEC                     a workload spec (see `treeattn workloads`)
//   +SPEC                    a workload spec that is also in the --quick subset
struct Suite {
  std::string name;
  std::string description;  // the first comment line
  std::vector<HeadConfig> heads, quick_heads;
  int head_dim = 128;
  DType dtype = DType::fp16;
  int page_size = 16;
  struct Entry {
    std::string spec;
    bool quick = false;
  };
  std::vector<Entry> entries;
};

Suite parse_suite(std::string_view text, const std::string& name);
// A built-in name (fasttree, pat, flashforge, deft, forests, offsuite) or a path to a suite file.
Suite load_suite(const std::string& name_or_path, const std::string& data_dir);
std::vector<std::string> builtin_suites();

// Markdown report of bench records (the keys of `treeattn bench --json`):
// per-config table of µs, fraction of the unique-KV floor and speedup over
// per-query, then geometric means per planner and per head config.
std::string markdown_report(const nlohmann::json& records, const std::string& title);

// A suite run resumed (`bench --suite --resume`) goes on from the results
// document an earlier run of the same suite, commit, device and command left
// (it is rewritten after every config, so a run cut short leaves the configs
// it finished, in order). Returns how many leading configs the document holds
// in full: for config i the records of `planners`, in that order, of workload
// workload_name(i) at heads[i]. Records past those (a config cut off midway)
// are not counted. A document of another run is an Error naming the field and
// both values.
struct SuiteRunKey {
  std::string suite, commit, device, command;
};
size_t completed_configs(const nlohmann::json& doc, const SuiteRunKey& key, const std::vector<HeadConfig>& heads,
                         const std::function<std::string(size_t)>& workload_name,
                         const std::vector<std::string>& planners);

}  // namespace treeattn::bench

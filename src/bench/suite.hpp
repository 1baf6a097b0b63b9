// Benchmark suites: named lists of workload specs with head configs, loaded
// from plain text files (data/suites/*.suite or any user file), and the
// reports (markdown tables, geometric means) made from their JSON records.
#pragma once

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
// A built-in name (fasttree, pat, flashforge, deft, forests) or a path to a suite file.
Suite load_suite(const std::string& name_or_path, const std::string& data_dir);
std::vector<std::string> builtin_suites();

// Markdown report of bench records (the keys of `treeattn bench --json`):
// per-config table of µs, fraction of the unique-KV floor and speedup over
// per-query, then geometric means per planner and per head config.
std::string markdown_report(const nlohmann::json& records, const std::string& title);

}  // namespace treeattn::bench

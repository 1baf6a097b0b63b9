// Per plan, how long its masked units run masked: for the offline study
// bench/analysis/auto_cost_masked_floor.py, which builds and runs it:
//   c++ -O2 -std=c++20 -Iinclude -Isrc bench/analysis/masked_tiles_dump.cpp build/cpu/libtreeattn.a -o /tmp/x
//   /tmp/x < requests
// stdin: one request a line, tab-separated: heads (32/8), variant (a planner
// name, or auto@FILE: auto with the cost table FILE), workload spec (as
// `treeattn plan -w`). head_dim 128, page 16, fp16, 132 SMs: `treeattn plan`'s
// defaults. stdout: one JSON object a line: the plan's summary keys that
// match it to a timed record (units, segments, kv_bytes, partial_bytes) and
//   masked_tile_kt  the most tokens any unit runs in masked K/V tiles, thousands:
//                   64-token tiles of its concatenated segments that hold a
//                   position of a segment some entry of the unit does not see
//                   (the tiles whose masks the kernel applies);
//   masked_unit_kt  the tokens of the longest masked unit, thousands (auto's
//                   masked_kt feature: the whole unit, masked tiles or not).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "treeattn/cost_models.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

constexpr int64_t kTile = 64;

// Tokens of unit u in K/V tiles that apply masks.
int64_t masked_tile_tokens(const Plan& p, int32_t u) {
  uint64_t seen_by_all = ~0ull;
  for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) seen_by_all &= p.entry_mask[e];
  int64_t at = 0, masked = 0, last_tile = -1;
  for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) {
    const int64_t len = p.segments[k].size();
    if (len > 0 && !((seen_by_all >> (k - p.unit_segment_offset[u])) & 1)) {
      // Tiles [at / kTile, (at + len - 1) / kTile], each counted once.
      const int64_t first = std::max(at / kTile, last_tile + 1), last = (at + len - 1) / kTile;
      masked += std::max<int64_t>(0, last - first + 1) * kTile;
      last_tile = std::max(last_tile, last);
    }
    at += len;
  }
  return masked;
}

}  // namespace

int main() {
  // As `treeattn plan` from the repository root: the shipped forge table and pat rules.
  set_default_forge_cost_table(std::make_shared<ForgeCostTable>(load_forge_cost_table("data/forge_cost_h100.json")));
  set_default_pat_tile_rules(std::make_shared<PatTileRules>(load_pat_tile_rules("data/pat_tile_rules.json")));
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string heads, variant, spec;
    std::getline(ss, heads, '\t');
    std::getline(ss, variant, '\t');
    std::getline(ss, spec, '\t');
    WorkloadParams wp;
    const size_t slash = heads.find('/');
    wp.heads.num_qo_heads = std::stoi(heads.substr(0, slash));
    wp.heads.num_kv_heads = std::stoi(heads.substr(slash + 1));
    wp.heads.head_dim = 128;
    const Workload w = make_workload(spec, wp);
    PlanOptions opt;
    opt.num_sms = 132;
    const Plan p = variant.rfind("auto@", 0) == 0 ? plan_auto_with(w, opt, load_auto_cost_model(variant.substr(5)))
                                                  : make_plan(variant, w, opt);
    const PlanSummary s = summarize(w, p);
    int64_t most_masked = 0, longest_masked_unit = 0;
    for (int32_t u = 0; u < p.num_units(); ++u) {
      most_masked = std::max(most_masked, masked_tile_tokens(p, u));
      if (p.unit_masked[u]) {
        int64_t tokens = 0;
        for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) tokens += p.segments[k].size();
        longest_masked_unit = std::max(longest_masked_unit, tokens);
      }
    }
    std::printf("{\"units\":%lld,\"segments\":%lld,\"kv_bytes\":%lld,\"partial_bytes\":%lld,\"masked_tile_kt\":%g,"
                "\"masked_unit_kt\":%g}\n",
                (long long)s.units, (long long)s.segments, (long long)s.kv_bytes, (long long)s.partial_bytes,
                most_masked * 1e-3, longest_masked_unit * 1e-3);
    std::fflush(stdout);
  }
}

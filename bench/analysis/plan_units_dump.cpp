// Plans and their launches' simulated makespans for the offline study
// bench/analysis/auto_cost_makespan.py, which builds and runs it:
//   c++ -O2 -std=c++20 -Iinclude -Isrc bench/analysis/plan_units_dump.cpp build/cpu/libtreeattn.a -o /tmp/x
//   /tmp/x C0,C0,... RHO,RHO,... < requests
//   /tmp/x time [NODES]   the cost of the makespan on auto's plan of the planning
//                         benchmark's tree (bench/planning/bench_tree.hpp): exact
//                         list scheduling, and the O(units) LPT bound; auto's planning
// stdin: one request a line, tab-separated: heads (32/8), variant (a planner
// name, or auto@FILE: auto with the cost table FILE), plan options ("k=v k=v"
// or "-"), workload spec (as `treeattn plan -w`; relative file paths from the
// working directory). head_dim 128, page 16, fp16, seed 1, 132 SMs: `treeattn
// plan`'s defaults. stdout: one JSON object a line: the plan's summary
// (units, segments, kv_bytes, partial_bytes: to match a timed record), its
// auto_cost_features, its masked tokens (masked_tile_kt: the most tokens a
// unit runs in 64-token K/V tiles that hold a position of a segment some entry
// of the unit does not see, the tiles whose masks the kernel applies;
// masked_unit_kt: the longest masked unit; thousands; for
// auto_cost_masked_floor.py), and its attention launches as the CUDA executor makes
// them (src/exec/cuda/executor.cpp, plan_upload.cpp: units grouped by tile,
// m16n64 -> m16n32 where all such units have <= 32 tokens, longest first;
// choose_stages' pipeline depth and CTAs per SM; persistent where items >
// the wave and units longer than one K/V tile), each with, per setting (c0,
// rho), the makespan of its (unit, kv head) items list-scheduled in that
// order onto its resident slots (SMs x CTAs per SM), an item costing
// c0 + ceil(tokens / n) * n * (1 + rho * m / 128) token-equivalents, and the
// items' summed cost.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <queue>
#include <sstream>
#include <string>
#include <vector>

#include "treeattn/cost_models.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"
#include "../planning/bench_tree.hpp"
#include <chrono>

using namespace treeattn;

namespace {

constexpr int kSms = 132;
constexpr int64_t kSmemPerSm = 228 * 1024, kSmemReserved = 1024, kSmemOptin = 227 * 1024;

// Per compiled tile (kTileConfigs order; d = 128, fp16), from AttnTraits
// (attention_kernel.cuh) and the launch_info of the timed records: shared
// memory = base + stages x per_stage; the fewest stages (scratch_fits); CTAs
// per SM the registers allow (kMinBlocksPerSm caps; m32 and m64, capped at 1,
// from the records' stages and persistent grids: m32n64 2, m32n32 3, m64 3;
// m32n128 a guess).
struct TileHw {
  int base_k, stage_k, min_stages, by_regs;
};
// {16,64},{32,64},{64,64},{128,64},{16,32},{32,32},{64,32},{16,128},{32,128}
constexpr TileHw kHw[9] = {{8, 32, 1, 4}, {13, 32, 1, 2}, {21, 32, 2, 3}, {39, 32, 2, 2}, {7, 16, 1, 8},
                           {12, 16, 2, 3}, {20, 16, 2, 3}, {11, 64, 1, 3}, {15, 64, 1, 2}};

int64_t smem_bytes(int t, int s) { return int64_t(kHw[t].base_k + s * kHw[t].stage_k) * 1024; }

// choose_stages (plan_upload.cpp) and wave_ctas: (stages, smem, CTAs per SM).
void stages_of(int t, int64_t ctas, int max_len, bool concurrent, int& stages, int64_t& smem, int& per_sm_out) {
  const int n = kTileConfigs[t].n;
  int per_sm = int(std::min<int64_t>(kHw[t].by_regs, std::max<int64_t>(1, (ctas + kSms - 1) / kSms)));
  if (concurrent) per_sm = std::max(per_sm, 2);
  const int tiles = (max_len + n - 1) / n;
  const int min_stages = tiles <= 1 ? kHw[t].min_stages : std::max(kHw[t].min_stages, 2);
  const int want = std::clamp(tiles + 1, min_stages, 6);
  stages = min_stages;
  for (; per_sm >= 1; --per_sm) {
    int s = want;
    while (s >= min_stages && (smem_bytes(t, s) > kSmemOptin || per_sm * (smem_bytes(t, s) + kSmemReserved) > kSmemPerSm)) --s;
    if (s >= min_stages) {
      stages = s;
      break;
    }
  }
  smem = smem_bytes(t, stages);
  per_sm_out = int(std::min<int64_t>(kHw[t].by_regs, kSmemPerSm / (smem + kSmemReserved)));
  per_sm_out = std::max(per_sm_out, 1);
}

// List scheduling of `copies` equal items per entry (in order) onto `slots`.
double makespan(const std::vector<std::pair<double, int>>& items, int64_t slots) {
  int64_t total = 0;
  for (const auto& it : items) total += it.second;
  if (total <= slots) {
    double m = 0;
    for (const auto& it : items) m = std::max(m, it.first);
    return m;
  }
  std::priority_queue<double, std::vector<double>, std::greater<double>> free;
  for (int64_t i = 0; i < slots; ++i) free.push(0.0);
  double m = 0;
  for (const auto& [d, c] : items)
    for (int k = 0; k < c; ++k) {
      const double start = free.top();
      free.pop();
      free.push(start + d);
      m = std::max(m, start + d);
    }
  return m;
}

// Tokens of unit u in K/V tiles of kTile tokens that apply masks.
int64_t masked_tile_tokens(const Plan& p, int32_t u) {
  constexpr int64_t kTile = 64;
  uint64_t seen_by_all = ~0ull;
  for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) seen_by_all &= p.entry_mask[e];
  int64_t at = 0, masked = 0, last_tile = -1;
  for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) {
    const int64_t len = p.segments[k].size();
    if (len > 0 && !((seen_by_all >> (k - p.unit_segment_offset[u])) & 1)) {
      // Tiles at / kTile .. (at + len - 1) / kTile, each counted once.
      const int64_t first = std::max(at / kTile, last_tile + 1), last = (at + len - 1) / kTile;
      masked += std::max<int64_t>(0, last - first + 1) * kTile;
      last_tile = std::max(last_tile, last);
    }
    at += len;
  }
  return masked;
}

std::vector<double> parse_list(const char* s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::stod(x));
  return v;
}

}  // namespace

// The planning-cost estimate: what auto would add per priced plan.
int time_mode(int nodes) {
  const Workload w = bench::planning_bench_tree(nodes, 256, 42);
  PlanOptions opt;
  const int H = w.heads.num_kv_heads;
  using clk = std::chrono::steady_clock;
  const auto per_call = [&](auto&& f) {
    int reps = 0;
    const auto t0 = clk::now();
    double sink = 0;
    while (std::chrono::duration<double>(clk::now() - t0).count() < 0.5) sink += f(), ++reps;
    std::fprintf(stderr, "%s", sink == -1 ? "?" : "");
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / reps;
  };
  Plan p;
  const double plan_us = per_call([&] { p = make_plan("auto", w, opt); return double(p.num_units()); });
  // Per unit: tile (after the m16 rule, ignored here: the plan has no all-short m16n64 launch) and length.
  std::vector<int> len(size_t(p.num_units()));
  for (int u = 0; u < p.num_units(); ++u) {
    int t = 0;
    for (int k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) t += p.segments[k].size();
    len[size_t(u)] = t;
  }
  const double c0 = 256;
  std::vector<std::vector<double>> by_tile(kTileConfigs.size());
  const double exact_us = per_call([&] {
    for (auto& v : by_tile) v.clear();
    for (int u = 0; u < p.num_units(); ++u) {
      const int t = p.unit_tile[size_t(u)], n = kTileConfigs[t].n;
      by_tile[size_t(t)].push_back(c0 + double((len[size_t(u)] + n - 1) / n) * n);
    }
    double total = 0;
    for (size_t t = 0; t < by_tile.size(); ++t) {
      auto& d = by_tile[t];
      if (d.empty()) continue;
      std::sort(d.begin(), d.end(), std::greater<double>());
      std::vector<std::pair<double, int>> its;
      for (double x : d) its.emplace_back(x, H);
      total += makespan(its, int64_t(132) * 3);
    }
    return total;
  });
  const double lpt_us = per_call([&] {
    double sum[9] = {}, mx[9] = {}, mn[9], cnt[9] = {};
    std::fill(mn, mn + 9, 1e300);
    for (int u = 0; u < p.num_units(); ++u) {
      const int t = p.unit_tile[size_t(u)], n = kTileConfigs[t].n;
      const double d = c0 + double((len[size_t(u)] + n - 1) / n) * n;
      sum[t] += d, mx[t] = std::max(mx[t], d), mn[t] = std::min(mn[t], d), cnt[t] += 1;
    }
    double total = 0;
    for (int t = 0; t < 9; ++t) {
      if (cnt[t] == 0) continue;
      const double S = 132 * 3;
      total += cnt[t] * H <= S ? mx[t] : std::max(mx[t], sum[t] * H / S + mn[t] * (1 - 1 / S));
    }
    return total;
  });
  size_t launches = 0;
  for (auto& v : by_tile) launches += !v.empty();
  std::printf("planning bench tree %d nodes, 256 queries, 32/8: auto plans it in %.1f us (%d units, %zu launches, %d items);"
              " exact makespan of its launches %.2f us, LPT bound %.3f us per priced plan\n",
              nodes, plan_us, p.num_units(), launches, p.num_units() * H, exact_us, lpt_us);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "time") return time_mode(argc > 2 ? std::stoi(argv[2]) : 1000);
  const std::vector<double> c0s = argc > 1 ? parse_list(argv[1]) : std::vector<double>{64};
  const std::vector<double> rhos = argc > 2 ? parse_list(argv[2]) : std::vector<double>{0};
  // As `treeattn plan` from the repository root: the shipped forge table and pat rules.
  set_default_forge_cost_table(std::make_shared<ForgeCostTable>(load_forge_cost_table("data/forge_cost_h100.json")));
  set_default_pat_tile_rules(std::make_shared<PatTileRules>(load_pat_tile_rules("data/pat_tile_rules.json")));
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string heads, variant, opts, spec;
    std::getline(ss, heads, '\t');
    std::getline(ss, variant, '\t');
    std::getline(ss, opts, '\t');
    std::getline(ss, spec, '\t');
    std::string out = "{\"heads\":\"" + heads + "\",\"variant\":\"" + variant + "\",\"opts\":\"" + opts + "\"";
    try {
      WorkloadParams wp;
      const size_t slash = heads.find('/');
      wp.heads.num_qo_heads = std::stoi(heads.substr(0, slash));
      wp.heads.num_kv_heads = std::stoi(heads.substr(slash + 1));
      wp.heads.head_dim = 128;
      const Workload w = make_workload(spec, wp);
      PlanOptions opt;
      opt.num_sms = kSms;
      if (opts != "-") {
        std::stringstream os(opts);
        std::string kv;
        while (os >> kv) set_plan_option(opt, kv.substr(0, kv.find('=')), std::stod(kv.substr(kv.find('=') + 1)));
      }
      Plan p;
      if (variant.rfind("auto@", 0) == 0)
        p = plan_auto_with(w, opt, load_auto_cost_model(variant.substr(5)));
      else
        p = make_plan(variant, w, opt);
      const PlanSummary s = summarize(w, p);
      const AutoCostFeatures f = auto_cost_features(w, p, opt);
      const int U = p.num_units(), H = w.heads.num_kv_heads;
      out += ",\"units\":" + std::to_string(s.units) + ",\"segments\":" + std::to_string(s.segments) +
             ",\"kv_bytes\":" + std::to_string(s.kv_bytes) + ",\"partial_bytes\":" + std::to_string(s.partial_bytes) +
             ",\"unique_kv_bytes\":" + std::to_string(s.unique_kv_bytes) + ",\"slots\":" + std::to_string(p.num_slots) +
             ",\"f\":{";
      for (int i = 0; i < kAutoCostFeatures; ++i)
        out += std::string(i ? "," : "") + "\"" + kAutoCostFeatureNames[i] + "\":" + std::to_string(f[i]);
      out += "}";
      int64_t most_masked = 0, longest_masked = 0;
      for (int32_t u = 0; u < p.num_units(); ++u) {
        most_masked = std::max(most_masked, masked_tile_tokens(p, u));
        if (p.unit_masked[u]) {
          int64_t tokens = 0;
          for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) tokens += p.segments[k].size();
          longest_masked = std::max(longest_masked, tokens);
        }
      }
      out += ",\"masked_tile_kt\":" + std::to_string(most_masked * 1e-3) +
             ",\"masked_unit_kt\":" + std::to_string(longest_masked * 1e-3);
      // The executor's launches.
      std::vector<int> len(U), run_tile(p.unit_tile.begin(), p.unit_tile.end());
      for (int u = 0; u < U; ++u) {
        int t = 0;
        for (int k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) t += p.segments[k].size();
        len[u] = t;
      }
      const int t16 = tile_index(16, 64), t16s = tile_index(16, 32);
      bool any = false, all_short = true;
      for (int u = 0; u < U; ++u)
        if (run_tile[u] == t16) any = true, all_short = all_short && len[u] <= 32;
      if (any && all_short)
        for (int& t : run_tile)
          if (t == t16) t = t16s;
      struct L {
        int tile;
        std::vector<int> units;
        int max_len = 0;
      };
      std::vector<L> ls;
      for (int t = 0; t < int(kTileConfigs.size()); ++t) {
        L l{t, {}};
        for (int u = 0; u < U; ++u)
          if (run_tile[u] == t) l.units.push_back(u);
        if (l.units.empty()) continue;
        std::stable_sort(l.units.begin(), l.units.end(), [&](int a, int b) { return len[a] > len[b]; });
        l.max_len = len[l.units[0]];
        ls.push_back(std::move(l));
      }
      std::stable_sort(ls.begin(), ls.end(), [](const L& a, const L& b) { return a.max_len > b.max_len; });
      out += ",\"launches\":[";
      for (size_t i = 0; i < ls.size(); ++i) {
        const L& l = ls[i];
        const int m = kTileConfigs[l.tile].m, n = kTileConfigs[l.tile].n;
        const int64_t items = int64_t(l.units.size()) * H;
        int stages = 0, per_sm = 0;
        int64_t smem = 0;
        stages_of(l.tile, items, l.max_len, ls.size() > 1, stages, smem, per_sm);
        const int64_t slots = int64_t(per_sm) * kSms;
        const bool pers = m <= 32 && items > slots && l.max_len > n;
        int segs = 0, masked = 0;
        for (int u : l.units) segs += p.unit_num_segments(u), masked += p.unit_masked[u] != 0;
        // auto's own estimate of the resident CTAs (auto.cpp, resident_ctas).
        const int64_t est_smem = int64_t(m + 4 * n) * w.heads.head_dim * 2 + 8 * 1024;
        const int64_t per_sm_auto = std::clamp<int64_t>(228 * 1024 / est_smem, 1, 8);
        out += std::string(i ? "," : "") + "{\"per_sm_auto\":" + std::to_string(per_sm_auto) + ",\"min_len\":" +
               std::to_string(len[l.units.back()]) + ",\"ms_auto\":[";
        {
          bool first = true;
          for (double rho : rhos)
            for (double c0 : c0s) {
              std::vector<std::pair<double, int>> its;
              for (int u : l.units) its.emplace_back(c0 + double((len[u] + n - 1) / n) * n * (1 + rho * m / 128.0), H);
              char buf[64];
              std::snprintf(buf, sizeof buf, "%s%.1f", first ? "" : ",", makespan(its, per_sm_auto * kSms));
              out += buf;
              first = false;
            }
        }
        out += "],\"m\":" + std::to_string(m) + ",\"n\":" + std::to_string(n) +
               ",\"units\":" + std::to_string(l.units.size()) + ",\"items\":" + std::to_string(items) +
               ",\"segments\":" + std::to_string(segs) + ",\"masked\":" + std::to_string(masked) +
               ",\"max_len\":" + std::to_string(l.max_len) + ",\"stages\":" + std::to_string(stages) +
               ",\"smem_k\":" + std::to_string(smem / 1024) + ",\"per_sm\":" + std::to_string(per_sm) +
               ",\"persistent\":" + (pers ? "true" : "false") + ",\"ms\":[";
        std::string work = "],\"work\":[";
        bool first = true;
        for (double rho : rhos)
          for (double c0 : c0s) {
            std::vector<std::pair<double, int>> its;
            its.reserve(l.units.size());
            double sum = 0;
            for (int u : l.units) {
              const double d = c0 + double((len[u] + n - 1) / n) * n * (1 + rho * m / 128.0);
              its.emplace_back(d, H);
              sum += d * H;
            }
            char buf[64];
            std::snprintf(buf, sizeof buf, "%s%.1f", first ? "" : ",", makespan(its, slots));
            out += buf;
            std::snprintf(buf, sizeof buf, "%s%.1f", first ? "" : ",", sum);
            work += buf;
            first = false;
          }
        out += work + "]}";
      }
      out += "]}";
    } catch (const std::exception& e) {
      std::string msg = e.what();
      std::replace(msg.begin(), msg.end(), '"', '\'');
      out += ",\"error\":\"" + msg + "\"}";
    }
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
  }
}

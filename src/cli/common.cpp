// Shared flags and helpers of the subcommands.
#include "cli/common.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "treeattn/cost_models.hpp"

namespace treeattn::cli {

void add_common_options(CLI::App* cmd, CommonOptions& o) {
  cmd->add_option("-w,--workload", o.workloads,
                  "workload spec, repeatable (see `treeattn workloads`), e.g. fasttree:N=1,4,16:C=128,32,32");
  cmd->add_option("--heads", o.heads, "qo/kv heads, e.g. 32/8")->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "head dimension (64, 128, 256)")->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "element type: fp16, bf16, fp32")->capture_default_str();
  cmd->add_option("--page-size", o.page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("-p,--planner", o.planners, "planner name, repeatable, or `all` (default: all)");
  cmd->add_flag("--json", o.json, "print JSON instead of a table");
  cmd->add_option("--seed", o.seed, "seed for page shuffling, random trees and inputs")->capture_default_str();
  cmd->add_option("--sms", o.num_sms, "SM count the planners target")->capture_default_str();
  cmd->add_option("--forge-table", o.forge_table,
                  "forge's cost table (treeattn calibrate output; default: data/forge_cost_h100.json)");
  cmd->add_option("--pat-rules", o.pat_rules,
                  "pat's KV-tile rules (treeattn calibrate --pat-tiles output; default: data/pat_tile_rules.json)");
  cmd->add_option("--plan-opt", o.plan_opts,
                  "planner option KEY=NUMBER, repeatable: ctas_per_sm, chunk_tokens, min_split_tokens, or a "
                  "planner's own knob (node: split_tokens, pack_tokens, flat_tokens, flat_rows, fold_tokens; "
                  "fasttree: alpha, beta, gamma, q_tile0, q_tile1, kv_tile0, kv_tile1, kv_split_long, kv_split_short; pat: "
                  "pat_max_rows; flatten: fill)");
}

WorkloadParams workload_params(const CommonOptions& o) {
  WorkloadParams p;
  p.heads = parse_heads(o.heads, o.head_dim);
  p.page_size = o.page_size;
  p.dtype = parse_dtype(o.dtype);
  p.seed = o.seed;
  return p;
}

namespace {
// The knobs planners read from PlanOptions::extra (src/plan/planners/).
const std::set<std::string> kPlannerKnobs = {
    "split_tokens", "pack_tokens", "flat_tokens", "flat_rows", "fold_tokens",               // node
    "alpha", "beta", "gamma", "q_tile0", "q_tile1", "kv_tile0", "kv_tile1", "kv_split_long", "kv_split_short",  // fasttree
    "pat_max_rows",                                                                         // pat
    "fill"};                                                                                // flatten
}  // namespace

PlanOptions plan_options(const CommonOptions& o) {
  PlanOptions opt;
  if (o.num_sms <= 0) throw Error("sms: " + std::to_string(o.num_sms) + " must be positive");
  opt.num_sms = o.num_sms;
  for (const std::string& kv : o.plan_opts) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), text = eq == std::string::npos ? "" : kv.substr(eq + 1);
    double value = 0;
    size_t used = 0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (key.empty() || text.empty() || used != text.size() || !std::isfinite(value))
      throw Error("plan-opt: '" + kv + "' is not KEY=NUMBER");
    const auto as_int = [&](int lo) {
      if (value != std::floor(value) || value < lo || value > 1e9)
        throw Error("plan-opt: " + key + " = " + text + " must be an integer >= " + std::to_string(lo));
      return int(value);
    };
    if (key == "ctas_per_sm") opt.ctas_per_sm = as_int(1);
    else if (key == "chunk_tokens") opt.chunk_tokens = as_int(1);
    else if (key == "min_split_tokens") opt.min_split_tokens = as_int(1);
    else if (kPlannerKnobs.count(key)) opt.extra[key] = value;
    else throw Error("plan-opt: unknown key '" + key + "' (see --help)");
  }
  const std::string shipped = std::string(TREEATTN_SOURCE_DIR) + "/data/forge_cost_h100.json";
  const std::string table = !o.forge_table.empty() ? o.forge_table : std::filesystem::exists(shipped) ? shipped : "";
  if (!table.empty()) set_default_forge_cost_table(std::make_shared<ForgeCostTable>(load_forge_cost_table(table)));
  const std::string shipped_rules = std::string(TREEATTN_SOURCE_DIR) + "/data/pat_tile_rules.json";
  const std::string rules = !o.pat_rules.empty()                    ? o.pat_rules
                            : std::filesystem::exists(shipped_rules) ? shipped_rules
                                                                     : "";
  if (!rules.empty()) set_default_pat_tile_rules(std::make_shared<PatTileRules>(load_pat_tile_rules(rules)));
  return opt;
}

namespace {
// Families whose second field is a file path.
std::string resolve_file(const std::string& spec) {
  for (const char* family : {"json:", "tot:", "medusa:", "blocktable:"}) {
    const std::string f = family;
    if (spec.rfind(f, 0) != 0) continue;
    const size_t end = spec.find(':', f.size());
    const std::string file = spec.substr(f.size(), end == std::string::npos ? std::string::npos : end - f.size());
    namespace fs = std::filesystem;
    if (file.empty() || fs::exists(file) || fs::path(file).is_absolute()) return spec;
    const fs::path in_repo = fs::path(TREEATTN_SOURCE_DIR) / "data" / "workloads" / file;
    if (fs::exists(in_repo)) return f + in_repo.string() + (end == std::string::npos ? "" : spec.substr(end));
  }
  return spec;
}
}  // namespace

std::vector<Workload> load_workloads(const CommonOptions& o, const std::vector<std::string>& fallback) {
  const WorkloadParams p = workload_params(o);
  std::vector<Workload> out;
  for (const std::string& spec : o.workloads.empty() ? fallback : o.workloads)
    out.push_back(make_workload(resolve_file(spec), p));
  if (out.empty()) throw Error("workload: none given (use --workload SPEC; `treeattn workloads` lists them)");
  return out;
}

std::vector<std::string> selected_planners(const CommonOptions& o) {
  std::vector<std::string> names;
  const bool all = o.planners.empty() ||
                   std::find(o.planners.begin(), o.planners.end(), "all") != o.planners.end();
  if (all) {
    for (const PlannerInfo& p : planners()) names.push_back(p.name);
  } else {
    for (const std::string& n : o.planners) names.push_back(find_planner(n).name);
  }
  return names;
}

double tolerance(DType t) {
  switch (t) {
    case DType::fp32: return 1e-5;
    case DType::fp16: return 2e-3;
    case DType::bf16: return 1e-2;
  }
  return 0;
}

std::string format_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000 && i < 4) b /= 1000, ++i;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, unit[i]);
  return buf;
}

}  // namespace treeattn::cli

namespace treeattn::cli {
nlohmann::json summary_json(const Workload& w, const PlanSummary& s) {
  return {{"workload", w.name},
          {"num_qo_heads", w.heads.num_qo_heads},
          {"num_kv_heads", w.heads.num_kv_heads},
          {"head_dim", w.heads.head_dim},
          {"dtype", std::string(to_string(w.layout.dtype))},
          {"page_size", w.layout.page_size},
          {"queries", w.num_queries()},
          {"nodes", w.tree.nodes.size()},
          {"planner", s.planner},
          {"units", s.units},
          {"rows", s.rows},
          {"segments", s.segments},
          {"kv_bytes", s.kv_bytes},
          {"unique_kv_bytes", s.unique_kv_bytes},
          {"kv_over_floor", s.unique_kv_bytes ? double(s.kv_bytes) / s.unique_kv_bytes : 0.0},
          {"partial_bytes", s.partial_bytes},
          {"padded_rows", s.padded_rows},
          {"masked_units", s.masked_units},
          {"max_unit_tokens", s.max_unit_tokens}};
}
}  // namespace treeattn::cli

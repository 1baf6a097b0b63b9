// The planner registry: name -> pure planning function; planner options by name.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "plan/planners/planners.hpp"

namespace treeattn {

int PlanOptions::target_ctas(const HeadConfig&) const { return num_sms * ctas_per_sm; }

double PlanOptions::get(const std::string& key, double fallback) const {
  auto it = extra.find(key);
  return it == extra.end() ? fallback : it->second;
}

namespace {
// A planner's knob and the values its planner accepts: set_plan_option
// checks them when the option is set (the planners check again, for options
// set on PlanOptions::extra directly). Integers up to 1e9, as
// planning::integer_option reads them.
struct Knob {
  const char* name;
  bool integer;
  double lo, hi;
};
constexpr double kMaxKnob = 1e9;
constexpr Knob kKnobs[] = {
    // node
    {"split_tokens", true, 0, kMaxKnob},  // 0: the balanced length
    {"split_scale", true, 1, kMaxKnob},
    {"split_sm_ctas", true, 0, 64},  // 0: ctas_per_sm
    {"pack_tokens", true, 0, kMaxKnob},
    {"flat_tokens", true, 0, kMaxKnob},
    {"flat_rows", true, 0, kMaxKnob},
    {"fold_tokens", true, 0, kMaxKnob},
    {"tile_rows", true, 1, kMaxTileRows},
    {"reread_ratio", false, 0, kMaxKnob},
    {"compact_stretch", false, 0, kMaxKnob},
    // fasttree
    {"alpha", false, -kMaxKnob, kMaxKnob},
    {"beta", false, -kMaxKnob, kMaxKnob},
    {"gamma", false, -kMaxKnob, kMaxKnob},
    {"q_tile0", false, 1, kMaxTileRows},
    {"q_tile1", false, 1, kMaxTileRows},
    {"kv_tile0", false, 1, kMaxKnob},
    {"kv_tile1", false, 1, kMaxKnob},
    {"kv_split_long", true, 1, kMaxKnob},
    {"kv_split_short", true, 1, kMaxKnob},
    // pat
    {"pat_max_rows", false, 1, kMaxTileRows},
    // flatten
    {"fill", true, 0, 1},
};

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", value);
  return text;
}
}  // namespace

const std::vector<std::string>& planner_knobs() {
  static const std::vector<std::string> knobs = [] {
    std::vector<std::string> k;
    for (const Knob& knob : kKnobs) k.emplace_back(knob.name);
    std::sort(k.begin(), k.end());
    return k;
  }();
  return knobs;
}

void set_plan_option(PlanOptions& opt, const std::string& key, double value) {
  const auto number = [&] { return key + " = " + format_number(value); };
  const auto check = [&](bool integer, double lo, double hi) {
    if (!std::isfinite(value) || (integer && value != std::floor(value)) || value < lo || value > hi)
      throw Error("plan option " + number() + " must be " + (integer ? "an integer" : "a number") + " in [" +
                  format_number(lo) + ", " + format_number(hi) + "]");
  };
  if (key == "ctas_per_sm") {
    check(true, 1, 64);
    opt.ctas_per_sm = int(value);
  } else if (key == "chunk_tokens") {
    check(true, 1, 1 << 30);
    opt.chunk_tokens = int(value);
  } else if (key == "min_split_tokens") {
    check(true, 1, 1 << 30);
    opt.min_split_tokens = int(value);
  } else if (const auto* knob = std::find_if(std::begin(kKnobs), std::end(kKnobs),
                                             [&](const Knob& k) { return key == k.name; });
             knob != std::end(kKnobs)) {
    check(knob->integer, knob->lo, knob->hi);
    opt.extra[key] = value;
  } else {
    std::string known = "ctas_per_sm, chunk_tokens, min_split_tokens";
    for (const std::string& k : planner_knobs()) known += ", " + k;
    throw Error("plan option: unknown key '" + key + "' (known: " + known + ")");
  }
}

void check_plan_options(const PlanOptions& opt) {
  if (opt.num_sms < 1 || opt.num_sms > kMaxNumSms)
    throw Error("plan option num_sms = " + std::to_string(opt.num_sms) + " must be an integer in [1, " +
                std::to_string(kMaxNumSms) + "]");
  PlanOptions checked;  // set_plan_option checks each value as it sets it
  set_plan_option(checked, "ctas_per_sm", opt.ctas_per_sm);
  set_plan_option(checked, "chunk_tokens", opt.chunk_tokens);
  set_plan_option(checked, "min_split_tokens", opt.min_split_tokens);
  for (const auto& [key, value] : opt.extra) set_plan_option(checked, key, value);
}

const std::vector<PlannerInfo>& planners() {
  static const std::vector<PlannerInfo> table = {
      {"auto", "the default: node, or per-query where the GPU's calibrated cost model (data/auto_cost_h100.json, --auto-cost) predicts it faster", plan_auto,
       plan_auto_reusing},
      {"per-query", "query-centric baseline: one unit per query over its whole path, KV split to fill the GPU (FlashAttention/FlashInfer decode)", plan_per_query,
       plan_per_query_reusing},
      {"node", "KV-guided grouping (DeFT-Node): one unit per node per Q tile of the queries below it; long nodes split only when the GPU would not fill", plan_node,
       plan_node_reusing},
      {"node-chunk", "DeFT-Node-Chunk: one unit per node per Q tile of the queries below it, nodes cut into fixed chunks of chunk_tokens (128)", plan_node_chunk},
      {"flatten", "DeFT-Flatten: depth-first flattened KV cut into even blocks, a block's queries masked per segment (tree-structured queries too)", plan_flatten},
      {"fasttree", "FastTree: greedy edge concatenation by the alpha/beta/gamma padding + reduction cost model, two Q-tile phases, long-context KV split", plan_fasttree},
      {"pat", "PAT: TreeHeuristic merge rule 4*s_c > l_u, long-KV split above the mean, tile selector from a rule table, units grouped by tile", plan_pat},
      {"forge", "FlashForge: cost table C(n_q, n), KV division bounded by a binary-searched makespan, LPT assignment to the resident CTAs", plan_forge},
  };
  return table;
}

const PlannerInfo& find_planner(const std::string& name) {
  for (const PlannerInfo& p : planners())
    if (p.name == name) return p;
  std::string known;
  for (const PlannerInfo& p : planners()) known += (known.empty() ? "" : ", ") + p.name;
  throw Error("planner: unknown planner '" + name + "' (known: " + known + ")");
}

PlanScratch::PlanScratch() : buffers_(std::make_unique<Buffers>()) {}
PlanScratch::~PlanScratch() = default;
PlanScratch::PlanScratch(PlanScratch&&) noexcept = default;
PlanScratch& PlanScratch::operator=(PlanScratch&&) noexcept = default;

Plan planning::plan_once(ReusingPlannerFn fn, const Workload& w, const PlanOptions& opt) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  PlanScratch scratch;
  Plan p;
  fn(w, ix, opt, scratch, p);
  return p;
}

void plan_reusing(const PlannerInfo& info, const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                  PlanScratch& scratch, Plan& out) {
  if (info.fn_reusing)
    info.fn_reusing(w, ix, opt, scratch, out);
  else
    out = info.fn(w, opt);
}

Plan make_plan(const std::string& name, const Workload& w, const PlanOptions& opt) {
  return find_planner(name).fn(w, opt);
}

}  // namespace treeattn

// The planner registry: name -> pure planning function; planner options by name.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

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

namespace {
// The range of option `key` (an integer one where `integer`), or Error naming
// the key and the known keys; `knob` the planner's knob, null for the three
// options of PlanOptions' own. No allocation unless it throws.
void option_range(std::string_view key, bool& integer, double& lo, double& hi, const Knob*& knob) {
  knob = nullptr;
  integer = true;
  if (key == "ctas_per_sm") {
    lo = 1, hi = 64;
  } else if (key == "chunk_tokens" || key == "min_split_tokens") {
    lo = 1, hi = 1 << 30;
  } else if (const auto* k =
                 std::find_if(std::begin(kKnobs), std::end(kKnobs), [&](const Knob& x) { return key == x.name; });
             k != std::end(kKnobs)) {
    knob = k;
    integer = k->integer, lo = k->lo, hi = k->hi;
  } else {
    std::string known = "ctas_per_sm, chunk_tokens, min_split_tokens";
    for (const std::string& n : planner_knobs()) known += ", " + n;
    throw Error("plan option: unknown key '" + std::string(key) + "' (known: " + known + ")");
  }
}

// Throws Error naming the key, the value and the range unless option `key`
// accepts value; its knob (null: not a knob of `extra`). No allocation
// unless it throws.
const Knob* check_option(std::string_view key, double value) {
  bool integer = true;
  double lo = 0, hi = 0;
  const Knob* knob = nullptr;
  option_range(key, integer, lo, hi, knob);
  if (!std::isfinite(value) || (integer && value != std::floor(value)) || value < lo || value > hi)
    throw Error("plan option " + std::string(key) + " = " + format_number(value) + " must be " +
                (integer ? "an integer" : "a number") + " in [" + format_number(lo) + ", " + format_number(hi) + "]");
  return knob;
}
}  // namespace

void set_plan_option(PlanOptions& opt, const std::string& key, double value) {
  if (check_option(key, value)) {
    opt.extra[key] = value;
  } else if (key == "ctas_per_sm") {
    opt.ctas_per_sm = int(value);
  } else if (key == "chunk_tokens") {
    opt.chunk_tokens = int(value);
  } else {
    opt.min_split_tokens = int(value);
  }
}

namespace {
// The fields of PlanOptions that planners divide by or size lists by (each
// planner checks the knobs of `extra` it reads, naming itself). No allocation
// unless it throws: plan_reusing calls it every decode step.
void check_plan_fields(const PlanOptions& opt) {
  if (opt.num_sms < 1 || opt.num_sms > kMaxNumSms)
    throw Error("plan option num_sms = " + std::to_string(opt.num_sms) + " must be an integer in [1, " +
                std::to_string(kMaxNumSms) + "]");
  check_option("ctas_per_sm", opt.ctas_per_sm);
  check_option("chunk_tokens", opt.chunk_tokens);
  check_option("min_split_tokens", opt.min_split_tokens);
}
}  // namespace

void check_plan_options(const PlanOptions& opt) {
  check_plan_fields(opt);
  for (const auto& [key, value] : opt.extra) {
    if (!check_option(key, value))  // ctas_per_sm & co. are fields, not knobs: in `extra` no planner reads them
      throw Error("plan option: '" + key + "' is a field of PlanOptions, not a knob of PlanOptions::extra");
  }
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
  check_plan_fields(opt);  // planners divide by num_sms x ctas_per_sm, chunk_tokens, ...
  if (info.fn_reusing)
    info.fn_reusing(w, ix, opt, scratch, out);
  else
    out = info.fn(w, opt);
}

Plan make_plan(const std::string& name, const Workload& w, const PlanOptions& opt) {
  const PlannerInfo& planner = find_planner(name);
  check_plan_fields(opt);  // planners divide by num_sms x ctas_per_sm, chunk_tokens, ...
  w.validate();           // ... and by the group size, and size their units by its token counts
  return planner.fn(w, opt);
}

}  // namespace treeattn

// auto: the default planner. It plans node (each shared node loaded once per
// Q tile of the queries below it) and switches to per-query (one unit per
// query over its whole path) when the calibrated cost model (AutoCostModel,
// data/auto_cost_h100.json, fitted on the GPU's suite results by
// scripts/fit_auto_cost.py) predicts per-query faster by more than the
// table's margin: where little KV is shared, node's partials, merge and
// extra launch cost more than the re-read prefixes (a ToT tree early in its
// search, a GQA-16 tree whose shared nodes are short). Without any shared KV
// token the two plans are the same work, and per-query is taken without
// pricing either. Per-query is planned only when a lower bound of its
// predicted time, from its piece length and the queries' path lengths
// (coefficients are >= 0), leaves it a chance. docs/planners.md ("auto") has the
// features, the fit and how it does on the suites.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"
#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn {

namespace {

using json = nlohmann::json;

// The shipped table; data/auto_cost_h100.json holds the same text (a test
// checks that they agree). scripts/fit_auto_cost.py --out writes it.
constexpr const char* kBuiltinAutoCost = R"json({
  "format": "treeattn-auto-cost/1",
  "device": "NVIDIA H100 80GB HBM3",
  "date": "2026-11-24",
  "commit": "e3f93e4",
  "source": "suites deft, fasttree, pat (175 configs, measured at commit 6b2bea1)",
  "fit": "scripts/fit_auto_cost.py bench/results/NVIDIA_H100_80GB_HBM3/suites_6b2bea1/fasttree/results.json bench/results/NVIDIA_H100_80GB_HBM3/suites_6b2bea1/pat/results.json bench/results/NVIDIA_H100_80GB_HBM3/suites_6b2bea1/deft/results.json --out data/auto_cost_h100.json",
  "margin": 0.0,
  "shape_margins": {"smaller_tiles": 0.1, "wider_units": 0.05},
  "coefficients": {
    "const": 0.707341,
    "launches": 7.611,
    "kv_mb": 0.12194,
    "unique_kv_mb": 0.170269,
    "partial_mb": 0.554255,
    "max_unit_kt": 7.12092,
    "kctas": 6.34676,
    "ksegments": 0.209556,
    "padded_gflop": 0.0,
    "wave_kt": 2.47109
  }
})json";

constexpr const char* kFormat = "treeattn-auto-cost/1";

std::mutex g_model_mutex;
std::shared_ptr<const AutoCostModel> g_model;

// Attention GFLOP of `rows_tokens` (Q rows x KV tokens, summed) of every kv
// head: q.k and p.v, 2 * head_dim each.
double gflop(const Workload& w, int64_t rows_tokens) {
  return double(rows_tokens) * w.heads.num_kv_heads * 4.0 * w.heads.head_dim * 1e-9;
}

constexpr int kTile16 = tile_index(16, kDefaultKvTile), kTile16Short = tile_index(16, 32);

// CTAs of tile t resident on all SMs (auto_cost_features).
int64_t resident_ctas(int t, const Workload& w, const PlanOptions& opt) {
  const int64_t smem = int64_t(kTileConfigs[t].m + 4 * kTileConfigs[t].n) * w.heads.head_dim * 2 + 8 * 1024;
  return int64_t(opt.num_sms) * std::clamp<int64_t>(228 * 1024 / smem, 1, 8);
}

// auto_cost_features' sums over a plan's units and its per-tile counts,
// filled unit by unit (`copies` units alike at once).
struct FeatureTally {
  int64_t units = 0, segments = 0, tokens = 0, max_tokens = 0, padded_row_tokens = 0, max_masked_tokens = 0;
  std::array<int64_t, kTileConfigs.size()> tile_units{}, longest{};  // per tile
  bool m16_long = false;

  void add(int tile, int64_t t, int64_t segs, int64_t copies, bool masked) {
    units += copies;
    segments += segs * copies;
    tokens += t * copies;
    max_tokens = std::max(max_tokens, t);
    padded_row_tokens += int64_t(kTileConfigs[tile].m) * t * copies;
    if (masked) max_masked_tokens = std::max(max_masked_tokens, t);
    tile_units[tile] += copies;
    longest[tile] = std::max(longest[tile], t);
    m16_long = m16_long || (tile == kTile16 && t > 32);
  }

  // This tally plus o's units.
  void merge(const FeatureTally& o) {
    units += o.units;
    segments += o.segments;
    tokens += o.tokens;
    max_tokens = std::max(max_tokens, o.max_tokens);
    padded_row_tokens += o.padded_row_tokens;
    max_masked_tokens = std::max(max_masked_tokens, o.max_masked_tokens);
    for (size_t t = 0; t < tile_units.size(); ++t) {
      tile_units[t] += o.tile_units[t];
      longest[t] = std::max(longest[t], o.longest[t]);
    }
    m16_long = m16_long || o.m16_long;
  }

  // slots: the plan's partial slots; unique_kv_mb: the tree's unique KV
  // (it costs a pass over the nodes; auto computes it only where the choice
  // depends on it).
  AutoCostFeatures finish(const Workload& w, const PlanOptions& opt, int64_t slots, double unique_kv_mb) const {
    std::array<int64_t, kTileConfigs.size()> per_tile = tile_units, tile_longest = longest;
    // The CUDA executor runs a launch of m16 n64 units that all have <= 32
    // tokens with the m16 n32 tile (joining the plan's own m16 n32 units).
    if (per_tile[kTile16] > 0 && !m16_long) {
      per_tile[kTile16Short] += per_tile[kTile16];
      tile_longest[kTile16Short] = std::max(tile_longest[kTile16Short], tile_longest[kTile16]);
      per_tile[kTile16] = tile_longest[kTile16] = 0;
    }
    int launches = 0;
    double wave_tokens = 0;
    for (size_t t = 0; t < per_tile.size(); ++t) {
      if (per_tile[t] == 0) continue;
      ++launches;
      const int64_t ctas = per_tile[t] * w.heads.num_kv_heads, resident = resident_ctas(int(t), w, opt);
      wave_tokens += double((ctas + resident - 1) / resident) * double(tile_longest[t]);
    }
    const double mb = 1e-6;
    AutoCostFeatures f{};
    f[0] = 1;
    f[1] = launches;
    f[2] = double(tokens) * w.kv_bytes_per_token() * mb;
    f[3] = unique_kv_mb;
    f[4] = double(slots) * w.heads.num_qo_heads * (w.heads.head_dim + 1) * 4 * 2 * mb;
    f[5] = double(max_tokens) * 1e-3;
    f[6] = double(units) * w.heads.num_kv_heads * 1e-3;
    f[7] = double(segments) * w.heads.num_kv_heads * 1e-3;
    // Tile rows x tokens: padded rows compute too. The H100 table prices it
    // at 0 (decode is memory-bound there).
    f[8] = gflop(w, padded_row_tokens);
    f[9] = wave_tokens * 1e-3;
    f[10] = double(max_masked_tokens) * 1e-3;
    return f;
  }
};

int64_t unit_tokens(const Plan& p, int32_t u) {
  int64_t t = 0;
  for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k) t += p.segments[k].size();
  return t;
}

AutoCostFeatures features_of(const Workload& w, const Plan& p, const PlanOptions& opt, double unique_kv_mb) {
  FeatureTally tally;
  for (int32_t u = 0; u < p.num_units(); ++u) tally.add(p.unit_tile[u], unit_tokens(p, u), p.unit_num_segments(u), 1, p.unit_masked[u] != 0);
  return tally.finish(w, opt, p.num_slots, unique_kv_mb);
}

}  // namespace

AutoCostFeatures auto_cost_features(const Workload& w, const Plan& p, const PlanOptions& opt) {
  return features_of(w, p, opt, double(w.unique_kv_bytes()) * 1e-6);
}

// The rules are PlanBuilder's (settle_unit, finish); the test
// AutoPlanner.CandidatesPricedFromUnitsAsTheirPlans holds them to it.
std::optional<AutoCostFeatures> planning::unit_cost_features(const Workload& w, const ProtoUnits& units,
                                                            const PlanOptions& opt, std::vector<int32_t>& units_of_query) {
  const int G = w.heads.group_size();
  units_of_query.assign(size_t(w.num_queries()), 0);
  FeatureTally tally;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::span<const Segment> segs = units.segs(u);
    const std::span<const int32_t> queries = units.queries(u);
    const std::span<const uint64_t> masks = units.masks(u);
    int64_t tokens = 0;
    for (const Segment& s : segs) tokens += s.size();
    const uint64_t full = full_mask(std::min(int(segs.size()), kMaxSegmentsPerUnit));
    bool masked = false;
    for (size_t i = 0; i < queries.size(); ++i) {
      ++units_of_query[size_t(queries[i])];
      masked |= masks[i] != ~0ull && masks[i] != full;
    }
    tally.add(smallest_tile_for_rows(std::max(int(queries.size()) * G, 1)), tokens, int64_t(segs.size()), 1, masked);
  }
  int64_t slots = 0;
  for (const int32_t n : units_of_query) {
    if (n == 0) return std::nullopt;
    slots += n > 1 ? n : 0;
  }
  return tally.finish(w, opt, slots, 0);
}

double AutoCostModel::predict(const AutoCostFeatures& f) const {
  double t = 0;
  for (int i = 0; i < kAutoCostFeatures; ++i) t += coefficients[i] * f[i];
  return t;
}

void AutoCostModel::validate() const {
  // %g-style: std::to_string's fixed notation prints 1e308 with 309 digits.
  const auto number = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.15g", v);
    return std::string(text);
  };
  const auto in_range = [&](const char* name, double v) {
    if (!(v >= 0 && v < 1)) throw Error(std::string("auto cost model: ") + name + " = " + number(v) + " is out of range [0, 1)");
  };
  in_range("margin", margin);
  in_range("shape_margins.smaller_tiles", smaller_tiles_margin);
  in_range("shape_margins.wider_units", wider_units_margin);
  for (int i = 0; i < kAutoCostFeatures; ++i)
    if (!(coefficients[i] >= 0) || !std::isfinite(coefficients[i]))
      throw Error(std::string("auto cost model: coefficients.") + kAutoCostFeatureNames[i] + " = " +
                  number(coefficients[i]) + " is not a finite number >= 0");
}

AutoCostModel parse_auto_cost_model(std::string_view text) {
  const json j = detail::parse_json(text, "auto cost model");
  if (!j.is_object()) throw Error("auto cost model: the top level is not an object");
  detail::require_format(j, kFormat, "auto cost model");
  AutoCostModel m;
  const auto str = [&](const char* key) {
    return detail::optional_string(j, key, std::string("auto cost model: ") + key);
  };
  m.device = str("device");
  m.date = str("date");
  m.commit = str("commit");
  m.source = str("source");
  m.fit = str("fit");
  const auto margin = j.find("margin");
  if (margin == j.end()) throw Error("auto cost model: margin is missing");
  if (!margin->is_number()) throw Error("auto cost model: margin = " + detail::brief(*margin) + " is not a number");
  m.margin = margin->get<double>();
  const auto c = j.find("coefficients");
  if (c == j.end() || !c->is_object()) throw Error("auto cost model: coefficients is missing or not an object");
  for (int i = 0; i < kAutoCostFeatures; ++i) {
    const auto v = c->find(kAutoCostFeatureNames[i]);
    if (v == c->end() && i >= kAutoCostFeaturesRequired) continue;  // a table from before the feature: 0
    if (v == c->end())
      throw Error(std::string("auto cost model: coefficients.") + kAutoCostFeatureNames[i] + " is missing");
    if (!v->is_number())
      throw Error(std::string("auto cost model: coefficients.") + kAutoCostFeatureNames[i] + " = " + detail::brief(*v) +
                  " is not a number");
    m.coefficients[i] = v->get<double>();
  }
  if (const auto sm = j.find("shape_margins"); sm != j.end()) {
    if (!sm->is_object()) throw Error("auto cost model: shape_margins = " + detail::brief(*sm) + " is not an object");
    for (const auto& [key, dst] : {std::pair{"smaller_tiles", &m.smaller_tiles_margin}, std::pair{"wider_units", &m.wider_units_margin}}) {
      const auto v = sm->find(key);
      if (v == sm->end()) throw Error(std::string("auto cost model: shape_margins.") + key + " is missing");
      if (!v->is_number())
        throw Error(std::string("auto cost model: shape_margins.") + key + " = " + detail::brief(*v) + " is not a number");
      *dst = v->get<double>();
    }
  }
  for (const auto& item : c->items()) {
    const std::string& key = item.key();  // a named copy: clang 14 cannot capture a structured binding
    if (std::find_if(kAutoCostFeatureNames.begin(), kAutoCostFeatureNames.end(),
                     [&](const char* n) { return key == n; }) == kAutoCostFeatureNames.end())
      throw Error("auto cost model: coefficients." + key + " is not a feature (" + kAutoCostFeatureNames[0] + ", " +
                  kAutoCostFeatureNames[1] + ", ...: include/treeattn/cost_models.hpp)");
  }
  m.validate();
  return m;
}

AutoCostModel load_auto_cost_model(const std::string& path) {
  try {
    return parse_auto_cost_model(detail::read_text_file(path, "auto cost model"));
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::string to_json(const AutoCostModel& m) {
  // The layout of scripts/fit_auto_cost.py's output.
  const auto q = [](const std::string& x) { return json(x).dump(); };
  const auto num = [](double x) { return json(x).dump(); };
  std::string out = std::string("{\n  \"format\": \"") + kFormat + "\",\n";
  out += "  \"device\": " + q(m.device) + ",\n  \"date\": " + q(m.date) + ",\n  \"commit\": " + q(m.commit) +
         ",\n  \"source\": " + q(m.source) + ",\n  \"fit\": " + q(m.fit) + ",\n  \"margin\": " + num(m.margin) +
         ",\n  \"shape_margins\": {\"smaller_tiles\": " + num(m.smaller_tiles_margin) +
         ", \"wider_units\": " + num(m.wider_units_margin) + "},\n  \"coefficients\": {\n";
  for (int i = 0; i < kAutoCostFeatures; ++i)
    out += std::string("    \"") + kAutoCostFeatureNames[i] + "\": " + num(m.coefficients[i]) +
           (i + 1 < kAutoCostFeatures ? ",\n" : "\n");
  return out + "  }\n}\n";
}

const AutoCostModel& builtin_auto_cost_model() {
  static const AutoCostModel m = parse_auto_cost_model(kBuiltinAutoCost);
  return m;
}

std::shared_ptr<const AutoCostModel> default_auto_cost_model() {
  std::lock_guard<std::mutex> lock(g_model_mutex);
  if (!g_model) g_model = std::make_shared<const AutoCostModel>(builtin_auto_cost_model());
  return g_model;
}

void set_default_auto_cost_model(std::shared_ptr<const AutoCostModel> model) {
  if (model) model->validate();
  std::lock_guard<std::mutex> lock(g_model_mutex);
  g_model = std::move(model);
}

namespace {

// node's shape (planning::NodeShape) by the model. node's own is the largest
// Q tiles (128 rows) and compact-subtree units of 32 (else 16) rows; the
// model prices others and auto takes one where it predicts it a margin
// below the best so far (the model errs by ~6 % on single plans). Options
// flat_rows and tile_rows fix a width, and split_tokens, split_scale and
// split_sm_ctas the KV split, and keep auto from changing it.
//  1. Smaller Q tiles (64, 32, 16 rows) for node's units: more CTAs of
//     fewer rows and, at 16 rows, one launch instead of two; they pay on
//     small, latency-bound trees (a ToT tree's 10 queries, a few-shot
//     prompt with 10 branches), where a launch costs more than the shared
//     nodes read again. First estimated from the plan in hand (each unmasked
//     unit of more rows cut into tiles of the same tokens; its queries keep
//     their slots), then planned only where the estimate is half the margin
//     below the best.
//  2. Wider compact-subtree units (64, 128 rows, wgmma tiles) read a
//     subtree's shared nodes fewer times: where it holds many queries of
//     many rows (deep trees at GQA 8-16) that re-reading is most of the
//     time, while where the wider units are few they leave SMs idle, so a
//     width must also fill three quarters of the CTA slots. A width is
//     planned only where it could save at best (node's units closed by the
//     rows limit all merged away) and its compact units alone, priced
//     against node's (KV read, CTAs, segments), save.
//  3. Longer KV pieces: node's split for half the CTA slots, which halves a
//     cut node's CTAs and partial slots (a 128-row tile's partial is about
//     half the KV bytes of its piece) and lengthens the longest unit. Planned
//     only where node's plan cuts a node (a long shared prefix: tree queries,
//     few-shot prompts); under the wider-units margin.
//  4. Deeper compact subtrees: node's compact subtrees hold paths of at most
//     512 tokens (flat_tokens); auto prices paths of up to 2 and 4 times that,
//     each at node's compact width and the wider ones of step 2 (those, as
//     there, only where they fill three quarters of the CTA slots). The queries
//     of a subtree planned whole need no merge, and its units re-read the
//     subtree's shared nodes: on deep trees of many queries (1024 queries
//     under 256-128-64-token levels) the slots saved outweigh the re-reads,
//     which the model prices. A length is planned only where a subtree that
//     it holds and the shorter does not has more query rows than the largest
//     Q tile (node's plan of it then merges several tiles' partials), so
//     trees of sparse queries (the planning benchmark's random tree) are not
//     planned again. 8 times (4096 tokens), where whole random trees
//     qualify, only for a whole tree of short leaves whose estimated units
//     could pay (a prompt under many short branches). Tried first, so that
//     steps 1-3 shape the plan taken.
// The two margins are the model's (AutoCostModel::smaller_tiles_margin and
// wider_units_margin, which steps 2, 3 and 4 share), fitted by calibrate --auto
// on auto's plans under each; the defaults and what other values cost are in
// docs/planners.md, "auto".

// Q tile rows auto tries for node's units, largest first.
constexpr std::array<int64_t, 3> kSmallerTileRows = {64, 32, 16};

// Node's plan `p` priced: its auto_cost_features (without the unique KV),
// and those of p with Q tiles of at most each of kSmallerTileRows' rows,
// estimated in the same pass over its units: each unmasked unit of more rows
// splits into tiles of that many, each over the unit's tokens and segments.
struct NodeFeatures {
  AutoCostFeatures own;
  std::array<AutoCostFeatures, kSmallerTileRows.size()> smaller_tiles;
};
NodeFeatures node_features(const Workload& w, const Plan& p, const PlanOptions& opt) {
  const int64_t G = w.heads.group_size();
  constexpr size_t n = kSmallerTileRows.size();
  std::array<int64_t, n> per_tile;  // queries a tile of each size holds
  for (size_t i = 0; i < n; ++i) per_tile[i] = std::max<int64_t>(1, kSmallerTileRows[i] / G);
  const int64_t fewest = *std::min_element(per_tile.begin(), per_tile.end());
  static const std::array<int, kMaxTileRows + 1> tile_of = [] {  // the tile of r <= 128 rows
    std::array<int, kMaxTileRows + 1> t{};
    for (int r = 1; r <= kMaxTileRows; ++r) t[r] = smallest_tile_for_rows(r);
    return t;
  }();
  // Units that stay whole at every size go once into `same`, shared by all;
  // the others into `own` too.
  FeatureTally same, own;
  std::array<FeatureTally, n> tally;
  for (int32_t u = 0; u < p.num_units(); ++u) {
    const int64_t queries = p.unit_num_queries(u), t = unit_tokens(p, u), segs = p.unit_num_segments(u);
    if (p.unit_masked[u] || queries <= fewest) {
      same.add(p.unit_tile[u], t, segs, 1, p.unit_masked[u] != 0);
      continue;
    }
    own.add(p.unit_tile[u], t, segs, 1, false);
    for (size_t i = 0; i < n; ++i) {
      if (queries <= per_tile[i]) {
        tally[i].add(p.unit_tile[u], t, segs, 1, false);
        continue;
      }
      const int64_t full = queries / per_tile[i], rest = queries % per_tile[i];
      tally[i].add(tile_of[per_tile[i] * G], t, segs, full, false);
      if (rest > 0) tally[i].add(tile_of[rest * G], t, segs, 1, false);
    }
  }
  NodeFeatures f;
  own.merge(same);
  f.own = own.finish(w, opt, p.num_slots, 0);
  for (size_t i = 0; i < n; ++i) {
    tally[i].merge(same);
    f.smaller_tiles[i] = tally[i].finish(w, opt, p.num_slots, 0);
  }
  return f;
}

// The features of node's plan where the whole tree (one root holding every
// query) is one compact subtree of units of `rows` Q rows, estimated without
// planning it: the queries in the index's depth-first order (compact
// units take them so), rows / G to a unit, each over the union of its
// queries' paths (node v, whose queries are numbers [query_begin,
// + subtree_queries), lies in every unit its range meets); no slots.
// `tokens`, `segments`: memory.
AutoCostFeatures whole_tree_compact_estimate(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                             int64_t rows, std::vector<int64_t>& tokens,
                                             std::vector<int64_t>& segments) {
  const int64_t G = w.heads.group_size(), per = std::max<int64_t>(1, rows / G), Q = w.num_queries();
  const int64_t units = planning::ceil_div(Q, per);
  tokens.assign(size_t(units) + 1, 0);  // differences: unit i's sums are the prefix sums at i
  segments.assign(size_t(units) + 1, 0);
  for (size_t v = 0; v < ix.tokens.size(); ++v) {
    if (ix.subtree_queries[v] == 0 || ix.tokens[v] == 0) continue;
    const int64_t first = ix.query_begin[v] / per, last = (ix.query_begin[v] + ix.subtree_queries[v] - 1) / per;
    tokens[size_t(first)] += ix.tokens[v];
    tokens[size_t(last) + 1] -= ix.tokens[v];
    ++segments[size_t(first)];
    --segments[size_t(last) + 1];
  }
  FeatureTally tally;
  int64_t t = 0, segs = 0;
  for (int64_t i = 0; i < units; ++i) {
    t += tokens[size_t(i)];
    segs += segments[size_t(i)];
    tally.add(smallest_tile_for_rows(int(std::min(per, Q - i * per) * G)), t, segs, 1, true);
  }
  return tally.finish(w, opt, 0, 0);
}

// `node`: node_features of the plan in `out`. Returns the features of the
// plan left in `out`.
AutoCostFeatures take_cheaper_node_shape(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                         const AutoCostModel& model, PlanScratch& scratch, Plan& out,
                                         NodeFeatures node) {
  PlanScratch::Buffers& m = scratch.buffers();
  const int64_t G = w.heads.group_size(), kv = w.heads.num_kv_heads;
  planning::NodeShape shape = planning::node_shape(opt);  // of the plan in `out`
  planning::CompactUnitsSummary base = m.compact_units;  // of the plan in `out`
  bool cuts = m.node_cuts;                                // of the plan in `out`
  double best = model.predict(node.own);                 // of the plan in `out`
  Plan& other = m.other;
  // Takes node's plan of `candidate` where the model prices it (features f)
  // below (1 - margin) x best: the plan in `other`, or (`from_units`) the
  // one its units, the last node_shaped_units, make.
  const auto take = [&](const planning::NodeShape& candidate, const AutoCostFeatures& f, double margin,
                        const planning::ProtoUnits* from_units = nullptr) {
    if (model.predict(f) >= (1 - margin) * best) return false;
    if (from_units) from_units->plan(w, "node", out);
    else std::swap(out, other);
    node.own = f;
    best = model.predict(f);
    base = m.compact_units;
    cuts = m.node_cuts;
    shape = candidate;
    return true;
  };
  // A candidate shape priced from its units, its plan made only if taken
  // (into `out`), or else, where its plan would hold more than its units (a
  // query with an empty path), made in `other` and priced there.
  struct Candidate {
    AutoCostFeatures features;
    size_t units;                          // the plan's
    const planning::ProtoUnits* made_from;  // null: the plan is in `other`
  };
  const auto candidate_of = [&](const planning::NodeShape& candidate) {
    const planning::ProtoUnits& units = planning::node_shaped_units(w, ix, opt, candidate, scratch);
    if (const std::optional<AutoCostFeatures> f = planning::unit_cost_features(w, units, opt, m.candidate_units_of_query))
      return Candidate{*f, units.size(), &units};
    units.plan(w, "node", other);
    return Candidate{features_of(w, other, opt, 0), size_t(other.num_units()), nullptr};
  };
  // Whether wider compact units could pay on a plan of `units` priced `us`:
  // only units closed by the rows or segment limit can merge away, where the
  // wider units take the same cut (a fixed width takes the highest); with all
  // of those merged away it must still come in under the margin.
  const double kv_mb_per_token = double(w.kv_bytes_per_token()) * 1e-6;
  const auto widths_could_pay = [&](const planning::CompactUnitsSummary& units, double us) {
    AutoCostFeatures saved{};
    saved[2] = double(units.full_tokens) * kv_mb_per_token;
    saved[6] = double(units.full_units) * double(kv) * 1e-3;
    saved[7] = double(units.full_segments) * double(kv) * 1e-3;
    return !units.highest_cut || us - model.predict(saved) < (1 - model.wider_units_margin) * best;
  };
  // 4. Deeper compact subtrees (see above), unless the option fixes their
  // paths' length; under the wider-units margin, for the same trade. Each
  // length at node's compact width and, unless flat_rows fixes it, at the
  // wider ones of step 2 (long paths pay with more rows per unit), those only
  // where merging away every unit the rows limit closed could pay (step 2's
  // bound) and, as in step 2, where they fill three quarters of the CTA
  // slots. Tried first, so that steps 1-3 shape the plan taken.
  const int32_t root = ix.roots.empty() ? -1 : ix.roots[0];
  const bool whole_tree = ix.roots.size() == 1 && ix.subtree_queries[size_t(root)] == w.num_queries();
  const auto deeper = [&] {
    if (shape.flat_tokens <= 0 || opt.extra.count("flat_tokens") != 0) return;
    const int64_t own = shape.flat_tokens;
    int64_t shorter = -1, deeper_from = 0;  // shortest_deeper_compact_paths at `shorter`, the taken shape's
    for (const int64_t longer : {2 * own, 4 * own, 8 * own}) {
      if (shape.flat_tokens != shorter) {
        shorter = shape.flat_tokens;
        deeper_from = planning::shortest_deeper_compact_paths(w, ix, m.down, shorter, kMaxTileRows);
      }
      if (deeper_from > longer) continue;
      if (longer == 8 * own) {
        // The longest length holds whole trees of sparse queries (the
        // planning benchmark's random tree): priced only for a whole tree
        // of short leaves (node's first candidate; long leaves take its
        // byte rule, which the estimate does not follow), where its
        // estimate is half the margin below the best.
        if (!whole_tree || m.down.tokens[size_t(root)] > longer ||
            m.down.leaf[size_t(root)] > planning::kShortLeafTokens)
          continue;
        double least = std::numeric_limits<double>::infinity();
        for (const int64_t rows : {int64_t(32), int64_t(64), int64_t(128)})
          least = std::min(least, model.predict(whole_tree_compact_estimate(w, ix, opt, std::max(rows, G),
                                                                           m.estimate_tokens, m.estimate_segments)));
        if (least >= (1 - model.wider_units_margin / 2) * best) continue;
      }
      const planning::NodeShape at = shape.with_flat_tokens(longer);
      const Candidate c = candidate_of(at);
      const planning::CompactUnitsSummary units = m.compact_units;
      if (units.units == 0) continue;
      const double us = model.predict(c.features);
      if (take(at, c.features, model.wider_units_margin, c.made_from)) node = node_features(w, out, opt);
      if (opt.extra.count("flat_rows") != 0) continue;
      if (!widths_could_pay(units, us)) continue;
      for (const int64_t rows : {64, 128}) {
        if (rows <= std::max<int64_t>(32, G)) continue;
        const planning::NodeShape candidate = at.with_compact_rows(rows);
        const Candidate c = candidate_of(candidate);
        if (m.compact_units.units == 0 || !planning::fills_slots(c.units, w, opt)) continue;
        if (take(candidate, c.features, model.wider_units_margin, c.made_from)) node = node_features(w, out, opt);
      }
    }
  };
  deeper();
  // 1. Smaller Q tiles.
  if (opt.extra.count("tile_rows") == 0) {
    for (size_t i = 0; i < kSmallerTileRows.size(); ++i) {
      const int64_t rows = kSmallerTileRows[i];
      // Tiles of at most G rows all hold one query: the same plan.
      if (std::max<int64_t>(rows, G) >= std::max<int64_t>(shape.tile_rows, G)) continue;
      // The estimate is the plan's own features unless the smaller tiles
      // change node's folds or compact subtrees: half the margin is slack.
      if (model.predict(node.smaller_tiles[i]) >= (1 - model.smaller_tiles_margin / 2) * best) continue;
      const planning::NodeShape candidate = shape.with_tile_rows(rows);
      planning::plan_node_shaped(w, ix, opt, candidate, scratch, other);
      const NodeFeatures f = node_features(w, other, opt);
      if (take(candidate, f.own, model.smaller_tiles_margin)) node = f;
    }
  }

  // 2. Wider compact-subtree units.
  if (base.units > 0 && opt.extra.count("flat_rows") == 0) {
    const double node_us = best;
    const int64_t other_units = out.num_units() - base.units;
    const planning::CompactUnitsSummary own = base;
    for (const int64_t rows : {64, 128}) {
      if (rows <= std::max<int64_t>(32, G)) continue;
      if (!widths_could_pay(own, node_us)) continue;
      planning::compact_subtree_units(w, ix, m.sub, m.down, own.max_tokens, own.max_leaf_tokens, rows, opt,
                                      m.wider_covered, m.wider, m.wider_summary, m.compact);
      const planning::CompactUnitsSummary& wide = m.wider_summary;
      AutoCostFeatures delta{};  // wider less node's, compact units only
      delta[2] = double(wide.tokens - own.tokens) * kv_mb_per_token;
      delta[6] = double(wide.units - own.units) * double(kv) * 1e-3;
      delta[7] = double(wide.segments - own.segments) * double(kv) * 1e-3;
      if (model.predict(delta) >= 0 || !planning::fills_slots(size_t(other_units + wide.units), w, opt)) continue;
      const planning::NodeShape candidate = shape.with_compact_rows(rows);
      const Candidate c = candidate_of(candidate);
      // At a fixed width node may drop its compact subtrees (its rules against
      // units too few or too long): that is not a wider width.
      if (m.compact_units.units == 0 || !planning::fills_slots(c.units, w, opt)) continue;
      take(candidate, c.features, model.wider_units_margin, c.made_from);
    }
  }

  // 3. Longer KV pieces (see above), unless the options fix the split. The
  // wider-units margin: both trade fewer, longer units against the CTA slots
  // they leave idle.
  if (cuts && opt.ctas_per_sm >= 2 && opt.extra.count("split_tokens") == 0 && opt.extra.count("split_scale") == 0 &&
      opt.extra.count("split_sm_ctas") == 0) {
    const planning::NodeShape candidate = shape.with_split_ctas_per_sm(opt.ctas_per_sm / 2);
    const Candidate c = candidate_of(candidate);
    take(candidate, c.features, model.wider_units_margin, c.made_from);
  }
  return node.own;
}

// f with the plan's merge kernel counted among its launches (a plan with
// partial slots launches it after its attention launches). Only node's
// final comparison with per-query prices it: the shape steps take a
// candidate by a fraction of the plan's time, which a constant added to
// both would shrink (docs/planners.md, "Off the suites").
AutoCostFeatures with_merge_launch(AutoCostFeatures f, bool merges) {
  f[1] += merges ? 1 : 0;
  return f;
}

// auto into `out` with `model` (see the top of the file).
void plan_auto_into(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, const AutoCostModel& model,
                    PlanScratch& scratch, Plan& out) {
  bool shared = false;
  for (size_t v = 0; v < w.tree.nodes.size() && !shared; ++v)
    shared = ix.tokens[v] > 0 && ix.subtree_queries[v] > 1;
  if (!shared) {
    plan_per_query_reusing(w, ix, opt, scratch, out);
    out.planner = "auto";
    return;
  }
  plan_node_reusing(w, ix, opt, scratch, out);  // also builds the tree's paths node's other shapes reuse
  // The tree's unique KV is a feature of both plans, priced >= 0, at first
  // left out (0): a per-query bound that loses without it loses with it.
  AutoCostFeatures node = with_merge_launch(
      take_cheaper_node_shape(w, ix, opt, model, scratch, out, node_features(w, out, opt)), out.num_slots > 0);
  // Per-query's features, each at most its value: every query's path loaded
  // once (exact), cut into pieces of split_length tokens (as per_query.cpp
  // does; more where a piece would exceed 64 segments), one launch, a
  // segment per piece, its unpadded FLOPs, one launch (all its units have
  // the rows of one query) of the pieces' waves.
  int64_t visible = 0;
  for (const int32_t v : w.query_nodes) visible += ix.path_tokens[v];
  const int64_t piece = planning::split_length(visible, w, opt);
  int64_t pieces = 0, slots = 0, longest = 0;
  for (const int32_t v : w.query_nodes) {
    const int64_t n = planning::ceil_div(ix.path_tokens[v], piece);
    pieces += n;
    slots += n > 1 ? n : 0;
    // A path of at most 64 nodes is never cut by the segment limit.
    if (ix.depth[v] < kMaxSegmentsPerUnit) longest = std::max(longest, std::min(ix.path_tokens[v], piece));
  }
  AutoCostFeatures bound{};
  bound[0] = 1;
  bound[1] = 1;
  bound[2] = double(visible) * w.kv_bytes_per_token() * 1e-6;
  bound[4] = double(slots) * w.heads.num_qo_heads * (w.heads.head_dim + 1) * 4 * 2 * 1e-6;
  bound[5] = double(longest) * 1e-3;
  bound[6] = bound[7] = double(pieces) * w.heads.num_kv_heads * 1e-3;
  bound[8] = gflop(w, visible * w.heads.group_size());
  // Its tile, or the m16 n32 one the executor may run instead (more resident
  // CTAs: fewer waves).
  int tile = smallest_tile_for_rows(w.heads.group_size());
  if (tile == kTile16) tile = kTile16Short;
  const int64_t resident = resident_ctas(tile, w, opt);
  bound[9] = double((pieces * w.heads.num_kv_heads + resident - 1) / resident) * double(longest) * 1e-3;
  bound = with_merge_launch(bound, slots > 0);  // exact: per-query merges where it cuts a path
  const double keep = 1 - model.margin;
  if (model.predict(bound) >= keep * model.predict(node)) {
    out.planner = "auto";
    return;
  }
  const double unique_kv_mb = double(w.unique_kv_bytes()) * 1e-6;
  node[3] = bound[3] = unique_kv_mb;
  const double switch_below = keep * model.predict(node);
  if (model.predict(bound) >= switch_below) {
    out.planner = "auto";
    return;
  }
  Plan& other = scratch.buffers().other;
  plan_per_query_reusing(w, ix, opt, scratch, other);
  if (model.predict(with_merge_launch(features_of(w, other, opt, unique_kv_mb), other.num_slots > 0)) < switch_below)
    std::swap(out, other);
  out.planner = "auto";
}

}  // namespace

Plan plan_auto(const Workload& w, const PlanOptions& opt) { return planning::plan_once(plan_auto_reusing, w, opt); }

void plan_auto_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch,
                       Plan& out) {
  plan_auto_into(w, ix, opt, *default_auto_cost_model(), scratch, out);
}

Plan plan_auto_with(const Workload& w, const PlanOptions& opt, const AutoCostModel& model) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  PlanScratch scratch;
  Plan out;
  plan_auto_into(w, ix, opt, model, scratch, out);
  return out;
}

}  // namespace treeattn

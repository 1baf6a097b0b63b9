// pat (PAT, ASPLOS'26 §4-5): pack-forward-merge planning over the
// tree-structure block table.
//  1. TreeHeuristic: a leaf's queries are packed into its own units; for each
//     child c of an internal node u, u's KV (with what u inherited) is merged
//     into c's units when the memory-centric profit is positive (4 * s_c > l_u
//     when every group fits one CTA, pat_should_merge); u's remaining queries
//     (its own and those of the children kept apart) form u's units.
//  2. Long-KV split: units longer than the batch's mean KV length are cut into
//     equal parts no longer than the mean (never below opt.min_split_tokens).
//  3. Tile selector: m = the smallest compiled Q tile holding the rows, n from
//     the KV-length rule table (data/pat_tile_rules.json).
//  4. Units are emitted grouped by tile config, ready for one stream per config.
// The lazy plan update (cache + incremental path) is PatPlanner, below.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/planners/planners.hpp"
#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "plan/planners/tree_walk.hpp"
#include "treeattn/pat_planner.hpp"

namespace treeattn {

// ---- merge rule and tile rules ---------------------------------------------

bool pat_should_merge(int64_t S, int64_t s_c, int64_t l_u, int64_t mm) {
  using planning::ceil_div;
  const int64_t extra_loads = ceil_div(S, mm) - ceil_div(S - s_c, mm) - ceil_div(s_c, mm);
  return extra_loads * l_u + 4 * s_c > 0;
}

namespace {

using json = nlohmann::json;

// The shipped table; data/pat_tile_rules.json holds the same text (a test
// checks that they agree).
constexpr const char* kBuiltinTileRules = R"({
  "format": "treeattn-pat-tile-rules/1",
  "source": "measured",
  "device": "NVIDIA H100 80GB HBM3",
  "date": "2026-11-22",
  "commit": "cb4b54f",
  "config": "heads 32/8, head_dim 128, fp16, page 16, 264 units x 8 kv heads per launch",
  "note": "Measured by `treeattn calibrate --pat-tiles --heads 32/8 --head-dim 128 --dtype fp16`: for each Q tile m (rows = m) and KV length, the median time (us, L2 flushed) of one launch of 264 identical single-segment units x 8 kv heads with each compiled KV tile n (measurements); a rule is the fastest n over a run of adjacent measured lengths (within 2% the larger n wins), up to the longest length of the run.",
  "rules": [
    {"max_rows": 16, "max_kv": 32, "n": 32},
    {"max_rows": 16, "max_kv": 64, "n": 64},
    {"max_rows": 16, "max_kv": 96, "n": 32},
    {"max_rows": 16, "max_kv": 1024, "n": 64},
    {"max_rows": 16, "n": 128},
    {"max_rows": 32, "max_kv": 192, "n": 32},
    {"max_rows": 32, "max_kv": 1024, "n": 64},
    {"max_rows": 32, "n": 128},
    {"max_rows": 64, "max_kv": 512, "n": 32},
    {"max_rows": 64, "n": 64},
    {"max_rows": 128, "n": 64}
  ]
})";

json parse_text(std::string_view text, const std::string& what) {
  return detail::parse_json(text, what);  // depth-limited
}

int64_t int_field(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw Error(where + "." + key + " is missing");
  if (!it->is_number_integer()) throw Error(where + "." + key + " = " + it->dump() + " is not an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    throw Error(where + "." + key + " = " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return v;
}

std::string read_file(const std::string& path, const char* what) {
  return detail::read_text_file(path, what);  // size-limited
}

constexpr double kMaxMeasuredUs = 1e9;  // 1000 s

std::mutex g_rules_mutex;
std::shared_ptr<const PatTileRules> g_rules;

}  // namespace

PatTileRules parse_pat_tile_rules(std::string_view text) {
  const json j = parse_text(text, "pat tile rules");
  if (!j.is_object()) throw Error("pat tile rules: the top level is not an object");
  detail::require_format(j, "treeattn-pat-tile-rules/1", "pat tile rules");
  PatTileRules r;
  r.source = detail::optional_string(j, "source", "pat tile rules: source");
  r.note = detail::optional_string(j, "note", "pat tile rules: note");
  const auto it = j.find("rules");
  if (it == j.end() || !it->is_array() || it->empty()) throw Error("pat tile rules: rules must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = "pat tile rules: rules[" + std::to_string(i) + "]";
    if (!e.is_object()) throw Error(where + " is not an object");
    PatTileRule rule;
    rule.max_rows = static_cast<int>(int_field(e, "max_rows", where, 1, kMaxTileRows));
    rule.max_kv = e.contains("max_kv") ? int_field(e, "max_kv", where, 0, int64_t(1) << 40) : -1;
    rule.n = static_cast<int>(int_field(e, "n", where, 1, 1 << 16));
    r.rules.push_back(rule);
  }
  const auto str = [&](const char* key) {
    const auto f = j.find(key);
    if (f == j.end()) return std::string();
    if (!f->is_string()) throw Error(std::string("pat tile rules: ") + key + " = " + f->dump() + " is not a string");
    return f->get<std::string>();
  };
  r.device = str("device");
  r.date = str("date");
  r.commit = str("commit");
  r.config = str("config");
  if (const auto m = j.find("measurements"); m != j.end()) {
    if (!m->is_array()) throw Error("pat tile rules: measurements must be an array");
    for (size_t i = 0; i < m->size(); ++i) {
      const json& e = (*m)[i];
      const std::string where = "pat tile rules: measurements[" + std::to_string(i) + "]";
      if (!e.is_object()) throw Error(where + " is not an object");
      PatTileTiming t;
      t.m = static_cast<int>(int_field(e, "m", where, 1, kMaxTileRows));
      t.kv = int_field(e, "kv", where, 0, int64_t(1) << 40);
      t.n = static_cast<int>(int_field(e, "n", where, 1, 1 << 16));
      const auto us = e.find("us");
      if (us == e.end() || !us->is_number()) throw Error(where + ".us is missing or not a number");
      t.us = us->get<double>();
      // A measured kernel time: to_json writes it with two decimals into a
      // short field, so absurd values are refused rather than cut.
      if (!(t.us > 0 && t.us <= kMaxMeasuredUs))
        throw Error(where + ".us = " + detail::brief(*us) + " is out of range (0, 1e9] microseconds");
      r.measurements.push_back(t);
    }
  }
  return r;
}

PatTileRules load_pat_tile_rules(const std::string& path) {
  try {
    return parse_pat_tile_rules(read_file(path, "pat tile rules"));
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::string to_json(const PatTileRules& r, bool with_measurements) {
  // One rule / measurement per line, keys in reading order (as the shipped file).
  const auto q = [](const std::string& x) { return json(x).dump(); };
  std::string out = "{\n  \"format\": \"treeattn-pat-tile-rules/1\",\n  \"source\": " + q(r.source) + ",\n";
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"device", &r.device},
                                   {"date", &r.date}, {"commit", &r.commit}, {"config", &r.config}})
    if (!value->empty()) out += std::string("  \"") + key + "\": " + q(*value) + ",\n";
  out += "  \"note\": " + q(r.note) + ",\n  \"rules\": [";
  for (size_t i = 0; i < r.rules.size(); ++i) {
    const PatTileRule& x = r.rules[i];
    out += std::string(i ? "," : "") + "\n    {\"max_rows\": " + std::to_string(x.max_rows);
    if (x.max_kv >= 0) out += ", \"max_kv\": " + std::to_string(x.max_kv);
    out += ", \"n\": " + std::to_string(x.n) + "}";
  }
  out += "\n  ]";
  if (with_measurements && !r.measurements.empty()) {
    out += ",\n  \"measurements\": [";
    for (size_t i = 0; i < r.measurements.size(); ++i) {
      const PatTileTiming& t = r.measurements[i];
      char us[32];
      std::snprintf(us, sizeof us, "%.2f", t.us);
      out += std::string(i ? "," : "") + "\n    {\"m\": " + std::to_string(t.m) + ", \"kv\": " + std::to_string(t.kv) +
             ", \"n\": " + std::to_string(t.n) + ", \"us\": " + us + "}";
    }
    out += "\n  ]";
  }
  return out + "\n}\n";
}

std::vector<PatTileRule> derive_pat_tile_rules(const std::vector<PatTileTiming>& times, double tie) {
  if (times.empty()) throw Error("pat tile rules: no measurements to derive rules from");
  if (!(tie >= 0 && tie < 1)) throw Error("pat tile rules: tie = " + std::to_string(tie) + " is out of range [0, 1)");
  for (const PatTileTiming& t : times)
    if (!(t.us > 0) || !std::isfinite(t.us) || t.m < 1 || t.m > kMaxTileRows || t.kv < 0 || t.n < 1)
      throw Error("pat tile rules: bad measurement m=" + std::to_string(t.m) + " kv=" + std::to_string(t.kv) +
                  " n=" + std::to_string(t.n) + " us=" + std::to_string(t.us));
  // (m, kv) -> the winning n, in ascending (m, kv).
  std::map<std::pair<int, int64_t>, std::vector<const PatTileTiming*>> points;
  for (const PatTileTiming& t : times) points[{t.m, t.kv}].push_back(&t);
  std::vector<PatTileRule> rules;
  int last_m = -1;
  for (const auto& [key, cands] : points) {
    double best = INFINITY;
    for (const PatTileTiming* t : cands) best = std::min(best, t->us);
    int n = 0;
    for (const PatTileTiming* t : cands)
      if (t->us <= best * (1 + tie)) n = std::max(n, t->n);
    const auto [m, kv] = key;
    if (m == last_m && rules.back().n == n) {
      rules.back().max_kv = kv;  // the run goes on
    } else {
      if (m != last_m && !rules.empty()) rules.back().max_kv = -1;  // the previous m's last run: unbounded
      rules.push_back({m, kv, n});
    }
    last_m = m;
  }
  rules.back().max_kv = -1;
  return rules;
}

const PatTileRules& builtin_pat_tile_rules() {
  static const PatTileRules r = parse_pat_tile_rules(kBuiltinTileRules);
  return r;
}

std::shared_ptr<const PatTileRules> default_pat_tile_rules() {
  std::lock_guard<std::mutex> lock(g_rules_mutex);
  if (!g_rules) g_rules = std::make_shared<const PatTileRules>(builtin_pat_tile_rules());
  return g_rules;
}

void set_default_pat_tile_rules(std::shared_ptr<const PatTileRules> rules) {
  std::lock_guard<std::mutex> lock(g_rules_mutex);
  g_rules = std::move(rules);
}

namespace {

// The compiled config with m = kTileConfigs[base].m whose n is nearest to the
// rule's n (ties: the smaller n).
int resolve_rule(const PatTileRule& r, int base, int head_dim) {
  int best = base;
  for (int t = 0; t < num_tile_configs(); ++t) {
    if (kTileConfigs[t].m != kTileConfigs[base].m || !tile_fits_head_dim(t, head_dim)) continue;
    const int d = std::abs(kTileConfigs[t].n - r.n), bd = std::abs(kTileConfigs[best].n - r.n);
    if (d < bd || (d == bd && kTileConfigs[t].n < kTileConfigs[best].n)) best = t;
  }
  return best;
}

// pat_select_tile with every rule resolved once per base tile (a plan selects
// a tile for each of its units).
class TileSelector {
 public:
  TileSelector(const PatTileRules& rules, int head_dim) : rules_(rules.rules) {
    resolved_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (int base = 0; base < num_tile_configs(); ++base)
        resolved_[r][base] = static_cast<uint8_t>(resolve_rule(rules_[r], base, head_dim));
  }
  int operator()(int rows, int64_t kv_tokens) const {
    const int base = smallest_tile_for_rows(std::max(rows, 1));
    for (size_t r = 0; r < rules_.size(); ++r)
      if (rows <= rules_[r].max_rows && (rules_[r].max_kv < 0 || kv_tokens <= rules_[r].max_kv)) return resolved_[r][base];
    return base;
  }

 private:
  const std::vector<PatTileRule>& rules_;
  std::vector<std::array<uint8_t, kTileConfigs.size()>> resolved_;
};

}  // namespace

int pat_select_tile(const PatTileRules& rules, int rows, int64_t kv_tokens, int head_dim) {
  return TileSelector(rules, head_dim)(rows, kv_tokens);
}

std::vector<TileRun> tile_runs(const Plan& p) {
  std::vector<TileRun> runs;
  for (int32_t u = 0; u < p.num_units(); ++u) {
    if (runs.empty() || runs.back().tile != p.unit_tile[u]) runs.push_back({p.unit_tile[u], u, u});
    runs.back().end = u + 1;
  }
  return runs;
}

// ---- TreeHeuristic, long-KV split, tile selection --------------------------

namespace {

// Units of TreeHeuristic before the long-KV split: box b covers the KV chain
// ending at node[b] (going up while merged[x]) and queries[q_offset[b] .. [b+1]).
struct PatBoxes {
  std::vector<uint8_t> merged;  // merged[c]: parent(c)'s KV is merged into c's units
  std::vector<int32_t> node;
  std::vector<int32_t> q_offset{0};
  std::vector<int32_t> queries;
};

int pat_queries_per_cta(const Workload& w, const PlanOptions& opt) {
  const double rows = opt.get("pat_max_rows", 64);
  if (!(rows >= 1 && rows <= kMaxTileRows))
    throw Error("pat: pat_max_rows = " + std::to_string(rows) + " is out of range [1, " + std::to_string(kMaxTileRows) + "]");
  return planning::queries_per_unit(w, static_cast<int>(rows));
}

PatBoxes tree_heuristic(const Workload& w, const planning::DfsView& dv, int mm) {
  const TreeIndex& ix = dv.ix;
  const int32_t n = static_cast<int32_t>(w.tree.nodes.size());
  PatBoxes bx;
  bx.merged.assign(n, 0);
  std::vector<int64_t> kv(n, 0);  // l_u: u's tokens plus what u inherited
  const auto add_boxes = [&](int32_t v, const std::vector<int32_t>& qs) {
    for (size_t q0 = 0; q0 < qs.size(); q0 += mm) {
      const size_t q1 = std::min(qs.size(), q0 + size_t(mm));
      bx.node.push_back(v);
      bx.queries.insert(bx.queries.end(), qs.begin() + q0, qs.begin() + q1);
      bx.q_offset.push_back(static_cast<int32_t>(bx.queries.size()));
    }
  };
  std::vector<int32_t> rest;
  for (const int32_t u : ix.bfs_order) {
    const int32_t parent = w.tree.nodes[u].parent;
    kv[u] = (bx.merged[u] ? kv[parent] : 0) + w.tree.nodes[u].num_tokens;
    int64_t S = ix.subtree_queries[u];
    if (S == 0) continue;
    for (int32_t k = ix.child_offset[u]; k < ix.child_offset[u + 1]; ++k) {
      const int32_t c = ix.children[k];
      if (pat_should_merge(S, ix.subtree_queries[c], kv[u], mm)) {
        bx.merged[c] = 1;
        S -= ix.subtree_queries[c];
      }
    }
    if (S == 0) continue;
    rest.assign(dv.queries.begin() + dv.q_begin[u], dv.queries.begin() + dv.q_begin[u] + dv.own[u]);
    for (int32_t k = ix.child_offset[u]; k < ix.child_offset[u + 1]; ++k) {
      const int32_t c = ix.children[k];
      if (!bx.merged[c]) rest.insert(rest.end(), dv.queries.begin() + dv.q_begin[c], dv.queries.begin() + dv.q_end[c]);
    }
    add_boxes(u, rest);
  }
  return bx;
}

Plan pat_emit(const Workload& w, const PlanOptions& opt, const PatTileRules& rules, const PatBoxes& bx) {
  const int32_t nbox = static_cast<int32_t>(bx.node.size());
  const int g = w.heads.group_size();
  // KV chain of every box, root-most first.
  std::vector<int32_t> seg_offset(nbox + 1, 0);
  std::vector<Segment> segs;
  std::vector<int64_t> kv(nbox, 0);
  segs.reserve(nbox * 2);
  int64_t total = 0, counted = 0;
  for (int32_t i = 0; i < nbox; ++i) {
    const size_t first = segs.size();
    for (int32_t x = bx.node[i];; x = w.tree.nodes[x].parent) {
      if (const int32_t t = w.tree.nodes[x].num_tokens; t > 0) {
        segs.push_back({x, 0, t});
        kv[i] += t;
      }
      if (!bx.merged[x]) break;
    }
    std::reverse(segs.begin() + first, segs.end());
    seg_offset[i + 1] = static_cast<int32_t>(segs.size());
    if (kv[i] > 0) total += kv[i], ++counted;
  }
  const double mean = counted ? double(total) / double(counted) : 0.0;
  const int64_t min_piece = std::max(1, opt.min_split_tokens);
  const TileSelector select_tile(rules, w.heads.head_dim);

  // Pieces after the long-KV split, then emitted grouped by tile config.
  struct Piece {
    int32_t box, seg_begin, seg_end;
    uint8_t tile;
  };
  std::vector<Piece> pieces;
  std::vector<Segment> piece_segs;
  pieces.reserve(nbox);
  piece_segs.reserve(segs.size() + nbox);
  std::array<int32_t, kTileConfigs.size()> per_tile{};
  for (int32_t i = 0; i < nbox; ++i) {
    if (kv[i] == 0) continue;
    int64_t parts = 1;
    if (double(kv[i]) > mean)
      parts = std::min<int64_t>(static_cast<int64_t>(std::ceil(double(kv[i]) / mean)), std::max<int64_t>(1, kv[i] / min_piece));
    const int64_t part_len = planning::ceil_div(kv[i], parts);
    const int rows = (bx.q_offset[i + 1] - bx.q_offset[i]) * g;
    planning::for_each_piece(segs.data() + seg_offset[i], seg_offset[i + 1] - seg_offset[i], part_len,
                             [&](const Segment* s, int ns, int64_t tokens) {
                               const int tile = select_tile(rows, tokens);
                               const int32_t b = static_cast<int32_t>(piece_segs.size());
                               piece_segs.insert(piece_segs.end(), s, s + ns);
                               pieces.push_back({i, b, b + ns, static_cast<uint8_t>(tile)});
                               ++per_tile[tile];
                             });
  }

  PlanBuilder b(w, "pat");
  for (int t = 0; t < num_tile_configs(); ++t) {
    if (per_tile[t] == 0) continue;
    for (const Piece& p : pieces) {
      if (p.tile != t) continue;
      b.begin_unit(t);
      for (int32_t k = p.seg_begin; k < p.seg_end; ++k) b.add_segment(piece_segs[k].node, piece_segs[k].begin, piece_segs[k].end);
      for (int32_t k = bx.q_offset[p.box]; k < bx.q_offset[p.box + 1]; ++k) b.add_query(bx.queries[k]);
      b.end_unit();
    }
  }
  return b.finish();
}

}  // namespace

Plan plan_pat_with(const Workload& w, const PlanOptions& opt, const PatTileRules& rules) {
  const planning::DfsView dv(w);
  return pat_emit(w, opt, rules, tree_heuristic(w, dv, pat_queries_per_cta(w, opt)));
}

Plan plan_pat(const Workload& w, const PlanOptions& opt) { return plan_pat_with(w, opt, *default_pat_tile_rules()); }

// ---- lazy plan update ------------------------------------------------------

struct PatPlanner::Entry {
  std::vector<int64_t> key;       // structure: everything the grouping depends on
  std::vector<int32_t> leaf_len;  // token counts of the leaves, in node order
  PatBoxes boxes;
  Plan plan;
};

namespace {

// The grouping depends on the options, the head shape, the topology, the
// lengths of internal nodes and where queries attach, never on leaf lengths or
// page ids (a plan names nodes and token ranges, not pages).
void structure_key(const Workload& w, const PlanOptions& opt, std::vector<int64_t>& key, std::vector<int32_t>& leaf_len) {
  const int32_t n = static_cast<int32_t>(w.tree.nodes.size());
  key.clear();
  leaf_len.clear();
  key.reserve(size_t(2 * n + w.num_queries() + 16));
  key.insert(key.end(), {n, w.num_queries(), w.heads.num_qo_heads, w.heads.num_kv_heads, w.heads.head_dim,
                         opt.num_sms, opt.ctas_per_sm, opt.chunk_tokens, opt.min_split_tokens,
                         static_cast<int64_t>(opt.extra.size())});
  for (const auto& [k, v] : opt.extra) {
    key.push_back(static_cast<int64_t>(std::hash<std::string>{}(k)));
    int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    key.push_back(bits);
  }
  std::vector<uint8_t> has_child(n, 0);
  for (const Node& x : w.tree.nodes)
    if (x.parent >= 0 && x.parent < n) has_child[x.parent] = 1;
  for (int32_t v = 0; v < n; ++v) {
    const Node& x = w.tree.nodes[v];
    key.push_back(x.parent);
    key.push_back(has_child[v] ? x.num_tokens : -1);
    if (!has_child[v]) leaf_len.push_back(x.num_tokens);
  }
  key.insert(key.end(), w.query_nodes.begin(), w.query_nodes.end());
}

}  // namespace

PatPlanner::PatPlanner(std::shared_ptr<const PatTileRules> rules, size_t capacity)
    : rules_(rules ? std::move(rules) : default_pat_tile_rules()), capacity_(std::max<size_t>(capacity, 1)) {}

PatPlanner::~PatPlanner() = default;

void PatPlanner::clear() { entries_.clear(); }

Plan PatPlanner::plan(const Workload& w, const PlanOptions& opt) {
  std::vector<int64_t> key;
  std::vector<int32_t> leaf_len;
  structure_key(w, opt, key, leaf_len);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    Entry& e = **it;
    if (e.key != key) continue;
    if (e.leaf_len == leaf_len) {
      ++stats_.reused;
    } else {
      ++stats_.incremental;
      e.plan = pat_emit(w, opt, *rules_, e.boxes);
      e.leaf_len = std::move(leaf_len);
    }
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front()->plan;
  }
  ++stats_.rebuilt;
  auto e = std::make_unique<Entry>();
  const planning::DfsView dv(w);
  e->boxes = tree_heuristic(w, dv, pat_queries_per_cta(w, opt));
  e->plan = pat_emit(w, opt, *rules_, e->boxes);
  e->key = std::move(key);
  e->leaf_len = std::move(leaf_len);
  entries_.push_front(std::move(e));
  if (entries_.size() > capacity_) entries_.pop_back();
  return entries_.front()->plan;
}

}  // namespace treeattn

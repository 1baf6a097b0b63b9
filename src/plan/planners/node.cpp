// node (DeFT-Node, KV-guided grouping): each node's KV is loaded once per Q
// tile of the queries in its subtree, instead of once per query; queries go
// in depth-first order, so a tile's queries share as much path as possible.
// Four departures from DeFT-Node, each a byte or balance rule:
//  1. Long nodes are split along KV into equal pieces, of the even share of
//     the work per CTA slot, or the least length that fits every piece in
//     one wave when that finishes first (planning::balanced_split_length;
//     option split_tokens fixes it, split_scale multiplies it,
//     split_sm_ctas sets the CTAs per SM whose slots it fills).
//  2. Units of 1-2 rows are packed into shared 16-row units, each query
//     masked to its own node (planning::pack_short_units; pack_tokens: the
//     longest unit packed, default 128, 0: none).
//  3. A compact subtree (every query's path in it at most flat_tokens = 512
//     tokens; 0: none) is not cut into nodes: its queries go 8-32 rows to a
//     unit over the union of their paths, each masked to its own, with no
//     merge (planning::compact_subtree_units; flat_rows fixes the rows).
//     Subtrees with leaves over planning::kShortLeafTokens are taken only where the
//     partial slots they save outweigh the KV they re-read (2.5 bytes re-read
//     per byte saved at most; option reread_ratio); compact units too few to
//     fill the GPU are not taken where their longest is over 2.5 times
//     (compact_stretch) the longest unit of the plan without them.
//  4. A short shared node (with the nodes folded into it, at most
//     fold_tokens = 128 tokens; 0: none) whose queries all lie below children
//     planned as nodes opens each child's first KV piece instead of having a
//     unit of its own, where re-reading it per extra Q tile costs fewer bytes
//     than its queries' partial slots, and the plan's folds save at least
//     kMinFoldSavedBytes (fold_plan).
// The measurements behind each threshold: docs/planners.md, "node".
#include <algorithm>
#include <array>

#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"

namespace treeattn {

namespace {
constexpr int64_t kDefaultFoldTokens = 2 * kDefaultKvTile;
constexpr size_t kMaxFoldedSegments = 8;
// Folds lengthen each child's first piece by up to a KV tile: taken only
// when they save at least this many bytes of partial slots.
constexpr int64_t kMinFoldSavedBytes = int64_t(12) << 20;

// A query's partial slot: fp32 O and lse of every qo head, written by its
// unit and read back by the merge.
int64_t slot_bytes(const Workload& w) { return 2 * int64_t(w.heads.num_qo_heads) * (w.heads.head_dim + 1) * 4; }

// A tree's fold candidates (planning::FoldCandidates) into f.
void find_fold_candidates(const Workload& w, const TreeIndex& ix, const std::vector<int32_t>& query_tiles,
                          planning::FoldCandidates& f) {
  const size_t n = w.tree.nodes.size();
  // Selected without a branch: which nodes have tokens and queries is data.
  f.with_queries.resize(n);
  size_t count = 0;
  for (const int32_t v : ix.bfs_order) {
    f.with_queries[count] = v;
    count += (ix.tokens[v] != 0) & (ix.subtree_queries[v] > 0);
  }
  f.with_queries.resize(count);
  // Q tiles of a node's subtree queries (sub[v].size() = ix.subtree_queries[v]).
  const auto tiles = [&](int32_t v) { return int64_t(query_tiles[size_t(ix.subtree_queries[v])]); };
  const int64_t slot = slot_bytes(w), kv_token = w.kv_bytes_per_token();
  f.foldable.assign(n, 0);
  for (const int32_t v : f.with_queries) {
    int64_t below = 0, child_tiles = 0;
    bool children_with_tokens = true;  // every child with queries has tokens
    for (int32_t k = ix.child_offset[v]; k < ix.child_offset[v + 1]; ++k) {  // children without queries add 0
      const int32_t c = ix.children[k];
      children_with_tokens &= (ix.subtree_queries[c] == 0) | (ix.tokens[c] > 0);
      below += ix.subtree_queries[c];
      child_tiles += tiles(c);
    }
    const int64_t reread = (child_tiles - tiles(v)) * ix.tokens[v] * kv_token;
    f.foldable[v] = char(children_with_tokens & (below == ix.subtree_queries[v]) & (reread < below * slot));
  }
}

// The folds (planning::FoldPlan) into f, and the nodes planned as nodes
// (uncovered, with tokens and queries, not folded) into f.planned.
void fold_plan(const Workload& w, const TreeIndex& ix, const planning::FoldCandidates& candidates,
               const std::vector<char>& covered, int64_t max_tokens, planning::FoldPlan& f) {
  const size_t n = w.tree.nodes.size();
  f.folded.assign(n, 0);
  f.chain.resize(n);
  f.chain_tokens.resize(n);
  // The nodes that may be planned as nodes: those with tokens and queries
  // that are not covered.
  f.planned.resize(candidates.with_queries.size());
  size_t count = 0;
  for (const int32_t v : candidates.with_queries) {
    f.planned[count] = v;
    count += !covered[v];
  }
  f.planned.resize(count);
  if (max_tokens <= 0) return;
  const int64_t slot = slot_bytes(w);
  int64_t saved = 0;
  size_t folds = 0;
  for (const int32_t v : f.planned) {
    // v's prefix: the folded ancestors directly above it (parents come first
    // in BFS order, so theirs are final).
    const int32_t p = ix.parent[v];
    const bool under_fold = p >= 0 && f.folded[p];
    f.chain[v] = under_fold ? f.chain[p] + 1 : 0;
    f.chain_tokens[v] = under_fold ? f.chain_tokens[p] + ix.tokens[p] : 0;
    if (!candidates.foldable[v] || ix.tokens[v] + f.chain_tokens[v] > max_tokens ||
        size_t(f.chain[v]) >= kMaxFoldedSegments)
      continue;
    // Every child with queries must be planned as a node: none covered.
    bool covered_child = false;
    for (int32_t k = ix.child_offset[v]; k < ix.child_offset[v + 1]; ++k) {
      const int32_t c = ix.children[k];
      covered_child |= (ix.subtree_queries[c] > 0) & (covered[c] != 0);
    }
    if (covered_child) continue;
    f.folded[v] = 1;
    ++folds;
    saved += ix.subtree_queries[v] * slot;  // all below v (foldable: none of v's own)
  }
  if (folds == 0) return;
  if (saved < kMinFoldSavedBytes) {
    f.folded.assign(n, 0);
    return;
  }
  // Folded nodes have no units of their own.
  f.planned.erase(std::remove_if(f.planned.begin(), f.planned.end(), [&](int32_t v) { return f.folded[v] != 0; }),
                  f.planned.end());
}

// Tokens of v's folded ancestors that open its first piece.
int64_t prefix_tokens(const TreeIndex& ix, const planning::FoldPlan& fold, int32_t v) {
  const int32_t p = ix.parent[v];
  return p >= 0 && fold.folded[p] ? fold.chain_tokens[v] : 0;
}

// Queries per Q tile of a node's units: tile_rows (NodeShape) over the GQA
// group, at least one.
int32_t queries_per_tile(const Workload& w, int64_t tile_rows) {
  return std::max<int32_t>(1, int32_t(tile_rows) / w.heads.group_size());
}

// Pieces of a node of `tokens` tokens: ceil(tokens / piece).
int32_t piece_count(int32_t tokens, int64_t piece) {
  return tokens <= piece ? 1 : int32_t(planning::ceil_div(tokens, piece));
}

// The nodes that c's compact subtrees leave: c's folds and KV piece length.
void plan_nodes(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, int32_t per_tile,
                int64_t split_ctas_per_sm, PlanScratch::Buffers& m, planning::NodeCandidate& c) {
  c.per_tile = per_tile;
  const std::vector<int32_t>& tiles = m.query_tiles;
  fold_plan(w, ix, m.fold_candidates, c.covered,
            planning::integer_option(opt, "node", "fold_tokens", kDefaultFoldTokens, 0), c.fold);
  std::vector<std::pair<int64_t, int64_t>>& jobs = m.jobs;  // (tokens, query tiles) of each unit and node
  jobs.clear();
  for (size_t u = 0; u < c.compact.size(); ++u) jobs.emplace_back(c.compact.tokens(u), 1);
  for (const int32_t v : c.fold.planned)
    jobs.emplace_back(ix.tokens[v] + prefix_tokens(ix, c.fold, v), tiles[m.sub[v].size()]);
  const int64_t forced = planning::integer_option(opt, "node", "split_tokens", 0, 0);  // 0: the balanced length
  const int64_t scale = planning::integer_option(opt, "node", "split_scale", 1, 1);
  c.piece = forced > 0 ? forced
                      : scale * planning::balanced_split_length(jobs, w, opt, m.split,
                                                                split_ctas_per_sm);
  c.cuts = false;  // the compact units' jobs are never cut
  for (size_t j = c.compact.size(); j < jobs.size(); ++j) c.cuts |= jobs[j].first > c.piece;
}

// Appends the units of c's nodes to `units`: one per KV piece and Q tile of
// each node, a folded node's segment opening its children's first pieces.
void add_node_units(const TreeIndex& ix, const planning::SubtreeQueries& sub, const planning::NodeCandidate& c,
                    planning::ProtoUnits& units) {
  const int32_t per_tile = c.per_tile;
  const planning::FoldPlan& fold = c.fold;
  // The segments of v's folded ancestors, root-most first, into `prefix`.
  std::array<Segment, kMaxFoldedSegments> prefix;
  const auto prefix_of = [&](int32_t v) {
    const int32_t p = ix.parent[v];
    if (p < 0 || !fold.folded[p]) return size_t(0);
    const size_t k = size_t(fold.chain[v]);
    int32_t x = p;
    for (size_t i = k; i-- > 0; x = ix.parent[x]) prefix[i] = {x, 0, ix.tokens[x]};
    return k;
  };
  for (const int32_t v : fold.planned) {
    const auto queries = sub[v];
    // v cut into k pieces whose sizes differ by at most one token.
    const int32_t tokens = ix.tokens[v], k = piece_count(tokens, c.piece);
    const int32_t size = tokens / k, longer = tokens % k;  // the first `longer` pieces have one token more
    const size_t nprefix = prefix_of(v);
    for (size_t q0 = 0; q0 < queries.size(); q0 += per_tile) {
      const size_t q1 = std::min(queries.size(), q0 + per_tile);
      for (int32_t i = 0, at = 0; i < k; ++i) {
        if (i == 0)
          for (size_t j = 0; j < nprefix; ++j) units.add_segment(prefix[j]);
        const int32_t take = size + (i < longer ? 1 : 0);
        units.add_segment({v, at, at + take});
        at += take;
        units.add_queries(queries.subspan(q0, q1 - q0), ~0ull);
        units.close();
      }
    }
  }
}

int64_t longest_unit(const planning::ProtoUnits& units) {
  int64_t n = 0;
  for (size_t u = 0; u < units.size(); ++u) n = std::max(n, units.tokens(u));
  return n;
}

// The bytes a candidate's units move: KV read (all kv heads) and the partial
// slots of queries in more than one unit. Counted without building them
// (add_node_units): a node's units hold tiles x (its tokens + its prefix's)
// and put each query below it in k units, k its pieces. Packing the units
// keeps both sums (each query stays in as many units, each unit's tokens
// go whole into its pack). per_query, diff: memory.
struct UnitBytes {
  int64_t kv = 0, partials = 0;
};
UnitBytes candidate_bytes(const Workload& w, const TreeIndex& ix, const planning::SubtreeQueries& sub, const planning::NodeCandidate& c,
                          const std::vector<int32_t>& query_tiles, std::vector<int32_t>& per_query,
                          std::vector<int32_t>& diff) {
  const size_t nq = w.query_nodes.size();
  per_query.assign(nq, 0);
  int64_t tokens = 0, slots = 0;
  for (size_t u = 0; u < c.compact.size(); ++u) {
    tokens += c.compact.tokens(u);
    for (const int32_t q : c.compact.queries(u)) ++per_query[q];
  }
  // A node's k units per query, added over its range of sub.queries.
  diff.assign(nq + 1, 0);
  for (const int32_t v : c.fold.planned) {
    const int32_t k = piece_count(ix.tokens[v], c.piece);
    tokens += int64_t(query_tiles[sub[v].size()]) * (ix.tokens[v] + prefix_tokens(ix, c.fold, v));
    diff[size_t(sub.begin[v])] += k;
    diff[size_t(sub.end[v])] -= k;
  }
  int32_t below = 0;
  for (size_t i = 0; i < nq; ++i) per_query[size_t(sub.queries[i])] += below += diff[i];
  for (const int32_t n : per_query)
    if (n > 1) slots += n;
  return {tokens * w.kv_bytes_per_token(), slots * slot_bytes(w)};
}
}  // namespace

Plan plan_node(const Workload& w, const PlanOptions& opt) { return planning::plan_once(plan_node_reusing, w, opt); }

void plan_node_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch,
                       Plan& out) {
  PlanScratch::Buffers& m = scratch.buffers();
  m.sub.build(w, ix);
  m.down.build(w, ix);
  planning::plan_node_shaped(w, ix, opt, planning::node_shape(opt), scratch, out);
}

planning::NodeShape planning::node_shape(const PlanOptions& opt) {
  NodeShape shape;
  shape.compact_rows = integer_option(opt, "node", "flat_rows", 0, 0);
  shape.tile_rows = integer_option(opt, "node", "tile_rows", kMaxTileRows, 1);
  // Bounded as ctas_per_sm is (the split's list scheduling keeps a load per slot).
  shape.split_ctas_per_sm = integer_option(opt, "node", "split_sm_ctas", 0, 0);
  shape.flat_tokens = integer_option(opt, "node", "flat_tokens", planning::kDefaultFlatTokens, 0);
  for (const auto& [key, ratio] : {std::pair{"reread_ratio", &shape.reread_per_slot_byte},
                                   std::pair{"compact_stretch", &shape.compact_stretch}}) {
    *ratio = opt.get(key, *ratio);
    if (!(*ratio >= 0)) throw Error(std::string("node: ") + key + " = " + std::to_string(*ratio) + " must be >= 0");
  }
  if (shape.split_ctas_per_sm > 64)
    throw Error("node: split_sm_ctas = " + std::to_string(shape.split_ctas_per_sm) +
                " is out of range [0, 64] (0: ctas_per_sm)");
  if (shape.tile_rows > kMaxTileRows)
    throw Error("node: tile_rows = " + std::to_string(shape.tile_rows) + " exceeds the largest tile's " +
                std::to_string(kMaxTileRows) + " rows");
  return shape;
}

void planning::plan_node_shaped(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                const NodeShape& shape, PlanScratch& scratch, Plan& out) {
  node_shaped_units(w, ix, opt, shape, scratch).plan(w, "node", out);
}

const planning::ProtoUnits& planning::node_shaped_units(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                                        const NodeShape& shape, PlanScratch& scratch) {
  const int64_t flat_rows = shape.compact_rows;
  const int32_t per_tile = queries_per_tile(w, shape.tile_rows);
  PlanScratch::Buffers& m = scratch.buffers();
  m.query_tiles.resize(w.query_nodes.size() + 1);
  for (int32_t k = 0, tiles = 0, left = 0; size_t(k) < m.query_tiles.size(); ++k, --left) {  // ceil(k / per_tile)
    m.query_tiles[size_t(k)] = tiles;
    if (left == 0) ++tiles, left = per_tile;
  }
  find_fold_candidates(w, ix, m.query_tiles, m.fold_candidates);
  const int64_t pack = planning::integer_option(opt, "node", "pack_tokens", 2 * kDefaultKvTile, 0);
  const int64_t flat = shape.flat_tokens;
  // A candidate plan is made in two steps: compact_units finds the compact
  // subtrees of at most `flat_tokens` tokens per path (0: none) and leaves
  // of at most `leaf_tokens`, and their units (and says how many);
  // plan_nodes plans the nodes they leave. build adds those nodes' units to
  // the compact subtrees' and packs the short units: only for the candidate
  // taken (candidate_bytes compares them unbuilt).
  planning::NodeCandidate &a = m.candidates[0], &b = m.candidates[1];
  const auto compact_units = [&](planning::NodeCandidate& c, int64_t flat_tokens, int64_t leaf_tokens) {
    planning::compact_subtree_units(w, ix, m.sub, m.down, flat_tokens, leaf_tokens, flat_rows, opt, c.covered,
                                    c.compact, c.summary, m.compact);
    return c.compact.size();
  };
  // build's units are c's compact subtrees' and its nodes' in `raw`, or,
  // where short ones pack, those packed in `packed`: it returns which.
  const auto build = [&](const planning::NodeCandidate& c, planning::ProtoUnits& raw,
                         planning::ProtoUnits& packed) -> const planning::ProtoUnits& {
    raw = c.compact;
    add_node_units(ix, m.sub, c, raw);
    return planning::pack_short_units(raw, pack, w, opt, packed, m.pack) ? packed : raw;
  };
  size_t compact = compact_units(a, flat, planning::kShortLeafTokens);
  plan_nodes(w, ix, opt, per_tile, shape.split_ctas_per_sm, m, a);
  const planning::NodeCandidate* taken = &a;
  // Compact subtrees with long leaves put several leaves in series in one
  // unit while node streams them side by side: taken only where they save
  // enough partial slots for the KV they re-read (reread_per_slot_byte).
  // The two leaf limits pick the same subtrees where no leaf is longer than
  // the shorter limit (a token tree's one-token drafts): b is a's then.
  int64_t longest_leaf = 0;
  for (const int32_t r : ix.roots) longest_leaf = std::max(longest_leaf, m.down.leaf[size_t(r)]);
  if (flat > 0 && longest_leaf > std::min(flat, planning::kShortLeafTokens)) {
    const size_t long_compact = compact_units(b, flat, flat);
    if (long_compact > 0 && long_compact != compact) {
      plan_nodes(w, ix, opt, per_tile, shape.split_ctas_per_sm, m, b);
      const UnitBytes x = candidate_bytes(w, ix, m.sub, a, m.query_tiles, m.units_of_query, m.query_diff),
                      y = candidate_bytes(w, ix, m.sub, b, m.query_tiles, m.units_of_query, m.query_diff);
      if (double(y.kv - x.kv) <= shape.reread_per_slot_byte * double(x.partials - y.partials)) {
        taken = &b;
        compact = long_compact;
      }
    }
  }
  const planning::ProtoUnits* units = &build(*taken, m.raw, m.packed);
  // Units too few to fill the resident CTA slots run as long as the longest
  // one: where a compact subtree's unit is over compact_stretch times
  // the longest unit of the plan without compact subtrees (whose pieces run
  // side by side, then merge), that plan is taken.
  if (compact > 0 && !planning::fills_slots(units->size(), w, opt)) {
    planning::NodeCandidate& nodes_only = taken == &a ? b : a;
    compact_units(nodes_only, 0, 0);
    plan_nodes(w, ix, opt, per_tile, shape.split_ctas_per_sm, m, nodes_only);
    const planning::ProtoUnits& alternative = build(nodes_only, m.raw_alternative, m.packed_alternative);
    if (double(longest_unit(*units)) > shape.compact_stretch * double(longest_unit(alternative))) {
      units = &alternative;
      compact = 0;
      taken = &nodes_only;
    }
  }
  m.compact_units = compact > 0 ? taken->summary : planning::CompactUnitsSummary{};
  m.node_cuts = taken->cuts;
  return *units;
}

}  // namespace treeattn

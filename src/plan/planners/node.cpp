// node (DeFT-Node, KV-guided grouping): each node's KV is loaded once per Q
// tile of the queries in its subtree, instead of once per query. Queries are
// taken in depth-first order so a tile's queries share as much path as
// possible. Deviation from DeFT-Node: long nodes are split along KV into equal
// pieces (as per-query does), so one long shared prefix does not serialise on
// one SM while the others idle; the piece length is the even share of the
// work per CTA slot, or the least that fits every piece in one wave of slots
// when that finishes first (planning::balanced_split_length); the option
// split_tokens fixes it instead. Second deviation: short units of 1-2 rows
// (a tree's short leaves at GQA ratio 1 or 2) are packed into shared 16-row
// units, each query masked to its own node (planning::pack_short_units;
// option pack_tokens: the longest unit packed, default 128, 0: none). Third:
// a compact subtree (every query's path in it at most flat_tokens = 512
// tokens, default; 0: none) is not cut into nodes at all: its queries are
// grouped 8-32 rows to a unit over the union of their paths, each masked to
// its own (planning::compact_subtree_units; flat_rows fixes the rows). Its
// short shared nodes are then re-read per unit, from L2, instead of costing
// every query a partial slot and the run a merge: fasttree:N=1,256:C=256,32
// 37.5 -> 29.3 us at 32/8, 75.6 -> 63.0 at 32/32; the FastTree suite's
// 1024-query 9-level tree 284 -> 69 and 416 -> 155 us.
#include <algorithm>

#include "plan/planners/planners.hpp"

namespace treeattn {

namespace {
constexpr int64_t kDefaultFlatTokens = 512;
}  // namespace

Plan plan_node(const Workload& w, const PlanOptions& opt) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  const auto sub = planning::subtree_queries(w, ix);
  std::vector<char> covered;
  auto units = planning::compact_subtree_units(
      w, ix, sub, planning::integer_option(opt, "node", "flat_tokens", kDefaultFlatTokens, 0),
      planning::integer_option(opt, "node", "flat_rows", 0, 0), opt, covered);
  const int32_t per_tile = std::max(1, kMaxTileRows / w.heads.group_size());

  std::vector<std::pair<int64_t, int64_t>> jobs;  // (tokens, query tiles) of each node
  for (const auto& u : units) jobs.emplace_back(u.tokens(), 1);
  for (const int32_t v : ix.bfs_order)
    if (w.tree.nodes[v].num_tokens > 0 && !sub[v].empty() && !covered[v])
      jobs.emplace_back(w.tree.nodes[v].num_tokens, (int64_t(sub[v].size()) + per_tile - 1) / per_tile);
  const int64_t forced = planning::integer_option(opt, "node", "split_tokens", 0, 0);  // 0: the balanced length
  const int64_t piece = forced > 0 ? forced : planning::balanced_split_length(jobs, w, opt);

  for (const int32_t v : ix.bfs_order) {
    const Node& node = w.tree.nodes[v];
    if (node.num_tokens == 0 || sub[v].empty() || covered[v]) continue;
    const auto chunks = planning::split_evenly({v, 0, node.num_tokens}, piece);
    for (size_t q0 = 0; q0 < sub[v].size(); q0 += per_tile) {
      const size_t q1 = std::min(sub[v].size(), q0 + per_tile);
      for (const Segment& chunk : chunks) {
        planning::ProtoUnit u;
        u.segs = {chunk};
        u.queries.assign(sub[v].begin() + q0, sub[v].begin() + q1);
        u.masks.assign(u.queries.size(), ~0ull);
        units.push_back(std::move(u));
      }
    }
  }
  const int64_t pack = planning::integer_option(opt, "node", "pack_tokens", 2 * kDefaultKvTile, 0);
  PlanBuilder b(w, "node");
  planning::emit_units(b, planning::pack_short_units(std::move(units), pack, w, opt));
  return b.finish();
}

}  // namespace treeattn

// node (DeFT-Node, KV-guided grouping): each node's KV is loaded once per Q
// tile of the queries in its subtree, instead of once per query. Queries are
// taken in depth-first order so a tile's queries share as much path as
// possible. Deviation from DeFT-Node: nodes longer than the even share of the
// work per CTA slot are split along KV (as per-query does), so one long shared
// prefix does not serialise on one SM while the others idle.
#include <algorithm>

#include "plan/planners/planners.hpp"

namespace treeattn {

Plan plan_node(const Workload& w, const PlanOptions& opt) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  const auto sub = planning::subtree_queries(w, ix);
  const int32_t per_tile = std::max(1, kMaxTileRows / w.heads.group_size());

  int64_t work = 0;
  for (const int32_t v : ix.bfs_order)
    work += (int64_t(sub[v].size()) + per_tile - 1) / per_tile * w.tree.nodes[v].num_tokens;
  const int64_t piece = planning::split_length(work, w, opt);

  PlanBuilder b(w, "node");
  for (const int32_t v : ix.bfs_order) {
    const Node& node = w.tree.nodes[v];
    if (node.num_tokens == 0 || sub[v].empty()) continue;
    const auto chunks = planning::split_segments({{v, 0, node.num_tokens}}, piece);
    for (size_t q0 = 0; q0 < sub[v].size(); q0 += per_tile) {
      const size_t q1 = std::min(sub[v].size(), q0 + per_tile);
      for (const auto& chunk : chunks) {
        b.begin_unit();
        for (const Segment& s : chunk) b.add_segment(s.node, s.begin, s.end);
        for (size_t i = q0; i < q1; ++i) b.add_query(sub[v][i]);
        b.end_unit();
      }
    }
  }
  return b.finish();
}

}  // namespace treeattn

// Depth-first view of a workload and the query-group emitter (tree_walk.hpp).
#include "plan/planners/tree_walk.hpp"

namespace treeattn::planning {

DfsView::DfsView(const Workload& w) : ix(TreeIndex::build(w.tree, w.query_nodes)) {
  const int32_t n = static_cast<int32_t>(w.tree.nodes.size());
  preorder.reserve(n);
  tin.assign(n, 0);
  tout.assign(n, 0);
  // Iterative preorder; a node's end is known once its subtree is emitted.
  std::vector<int32_t> stack;
  stack.reserve(64);
  for (auto r = ix.roots.rbegin(); r != ix.roots.rend(); ++r) stack.push_back(*r);
  std::vector<int32_t> open;  // ancestors whose subtree is still being emitted
  open.reserve(64);
  const auto close_until = [&](int32_t parent) {
    while (!open.empty() && open.back() != parent) {
      tout[open.back()] = static_cast<int32_t>(preorder.size());
      open.pop_back();
    }
  };
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    close_until(w.tree.nodes[v].parent);
    tin[v] = static_cast<int32_t>(preorder.size());
    preorder.push_back(v);
    open.push_back(v);
    for (int32_t k = ix.child_offset[v + 1] - 1; k >= ix.child_offset[v]; --k) stack.push_back(ix.children[k]);
  }
  close_until(-1);

  // Counting sort of the queries by the preorder position of their node.
  own.assign(n, 0);
  for (int32_t v : w.query_nodes) ++own[v];
  std::vector<int32_t> start(n + 1, 0);  // by preorder position
  for (int32_t i = 0; i < n; ++i) start[i + 1] = start[i] + own[preorder[i]];
  q_begin.assign(n, 0);
  q_end.assign(n, 0);
  for (int32_t v = 0; v < n; ++v) {
    q_begin[v] = start[tin[v]];
    q_end[v] = start[tout[v]];
  }
  queries.assign(w.query_nodes.size(), 0);
  std::vector<int32_t> fill(start.begin(), start.end() - 1);
  for (int32_t q = 0; q < w.num_queries(); ++q) queries[fill[tin[w.query_nodes[q]]]++] = q;
}

void emit_query_groups(PlanBuilder& b, const Segment* segs, int nseg, const int32_t* queries, int64_t nq,
                       int per_unit, int tile) {
  for (int64_t q0 = 0; q0 < nq; q0 += per_unit) {
    const int64_t q1 = std::min<int64_t>(nq, q0 + per_unit);
    b.begin_unit(tile);
    for (int k = 0; k < nseg; ++k) b.add_segment(segs[k].node, segs[k].begin, segs[k].end);
    for (int64_t i = q0; i < q1; ++i) b.add_query(queries[i]);
    b.end_unit();
  }
}

}  // namespace treeattn::planning

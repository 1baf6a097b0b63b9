// per-query: the query-centric baseline every speedup is quoted against. One
// unit per query over its whole root-to-node path (what FlashAttention and
// FlashInfer decode kernels do: shared prefixes are loaded once per query);
// when queries alone would not fill the GPU, each path is split along KV into
// even chunks (flash-decoding) and the pieces are merged.
#include "plan/planners/planners.hpp"

namespace treeattn {

Plan plan_per_query(const Workload& w, const PlanOptions& opt) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  int64_t work = 0;
  for (int32_t node : w.query_nodes) work += ix.path_tokens[node];
  const int64_t piece = planning::split_length(work, w, opt);

  PlanBuilder b(w, "per-query");
  for (int32_t q = 0; q < w.num_queries(); ++q) {
    std::vector<Segment> path;
    for (int32_t v : w.path(w.query_nodes[q])) path.push_back({v, 0, w.tree.nodes[v].num_tokens});
    for (const auto& chunk : planning::split_segments(path, piece)) {
      b.begin_unit();
      for (const Segment& s : chunk) b.add_segment(s.node, s.begin, s.end);
      b.add_query(q);
      b.end_unit();
    }
  }
  return b.finish();
}

}  // namespace treeattn

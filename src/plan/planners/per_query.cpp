// per-query: the query-centric baseline every speedup is quoted against. One
// unit per query over its whole root-to-node path (what FlashAttention and
// FlashInfer decode kernels do: shared prefixes are loaded once per query);
// when queries alone would not fill the GPU, each path is split along KV into
// even chunks (flash-decoding) and the pieces are merged.
#include <algorithm>

#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"

namespace treeattn {

Plan plan_per_query(const Workload& w, const PlanOptions& opt) {
  return planning::plan_once(plan_per_query_reusing, w, opt);
}

void plan_per_query_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch,
                            Plan& out) {
  int64_t work = 0;
  for (int32_t node : w.query_nodes) work += ix.path_tokens[node];
  const int64_t piece = planning::split_length(work, w, opt);

  PlanBuilder b(w, "per-query", std::move(out));
  std::vector<int32_t>& path = scratch.buffers().path;
  std::vector<Segment>& segments = scratch.buffers().segments;
  for (int32_t q = 0; q < w.num_queries(); ++q) {
    path.clear();  // root first
    for (int32_t v = w.query_nodes[q]; v >= 0; v = w.tree.nodes[v].parent) path.push_back(v);
    std::reverse(path.begin(), path.end());
    segments.clear();
    for (int32_t v : path) segments.push_back({v, 0, w.tree.nodes[v].num_tokens});
    planning::for_each_piece(segments.data(), segments.size(), piece, [&](const Segment* segs, int n, int64_t) {
      b.begin_unit();
      for (int k = 0; k < n; ++k) b.add_segment(segs[k].node, segs[k].begin, segs[k].end);
      b.add_query(q);
      b.end_unit();
    });
  }
  out = b.finish();
}

}  // namespace treeattn

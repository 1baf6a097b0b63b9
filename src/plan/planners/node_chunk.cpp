// node-chunk (DeFT-Node-Chunk, DeFT ICLR'25 §3): KV-guided grouping where a
// node's KV is loaded once for all queries below it, and nodes longer than a
// chunk are cut into fixed chunks of opt.chunk_tokens (default 128) so one long
// prefix does not serialise on one SM. Unlike `node`, the chunk length is fixed
// and does not depend on how full the GPU is (that is DeFT's scheme).
// Deviation: a node with more queries than one Q tile holds gets one unit per
// Q tile per chunk (DeFT's Triton kernel loads all of a node's queries at once).
#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"

namespace treeattn {

Plan plan_node_chunk(const Workload& w, const PlanOptions& opt) {
  const planning::DfsView dv(w);
  const int per_unit = planning::queries_per_unit(w);
  const int64_t chunk = std::max(1, opt.chunk_tokens);
  // Every chunk of a node holds all of its queries: on a long node that is
  // chunks x queries entries, checked before they exist (a 2^30-token node
  // of 64 queries would need ~8 GB of plan).
  constexpr int64_t kMaxEntries = int64_t(1) << 26;  // the runtime's largest max_entries
  int64_t entries = 0;
  for (const int32_t v : dv.preorder) {
    entries += planning::ceil_div(int64_t(w.tree.nodes[v].num_tokens), chunk) * dv.subtree_queries(v);
    if (entries > kMaxEntries)
      throw Error("node-chunk: chunks of " + std::to_string(chunk) + " tokens x the queries below them exceed " +
                  std::to_string(kMaxEntries) + " plan entries (raise chunk_tokens)");
  }
  PlanBuilder b(w, "node-chunk");
  // Preorder: units of one subtree are adjacent, parents first.
  for (const int32_t v : dv.preorder) {
    const int32_t len = w.tree.nodes[v].num_tokens;
    const int64_t nq = dv.subtree_queries(v);
    if (len == 0 || nq == 0) continue;
    for (int64_t t0 = 0; t0 < len; t0 += chunk) {
      const Segment s{v, static_cast<int32_t>(t0), static_cast<int32_t>(std::min<int64_t>(len, t0 + chunk))};
      planning::emit_query_groups(b, &s, 1, dv.queries.data() + dv.q_begin[v], nq, per_unit);
    }
  }
  return b.finish();
}

}  // namespace treeattn

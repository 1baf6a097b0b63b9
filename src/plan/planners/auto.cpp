// auto: the default planner. A first rule, to be replaced by a cost model
// calibrated on the GPU: when no KV token is read by more than one query
// (independent sequences) the query-centric plan is the right one (nothing to
// share, and its units need no merge of shared parts); otherwise node, which
// loads each shared node once per Q tile of the queries below it.
#include "plan/planners/planners.hpp"

namespace treeattn {

Plan plan_auto(const Workload& w, const PlanOptions& opt) {
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  bool shared = false;
  for (size_t v = 0; v < w.tree.nodes.size() && !shared; ++v)
    shared = w.tree.nodes[v].num_tokens > 0 && ix.subtree_queries[v] > 1;
  Plan p = shared ? plan_node_indexed(w, ix, opt) : plan_per_query(w, opt);
  p.planner = "auto";
  return p;
}

}  // namespace treeattn

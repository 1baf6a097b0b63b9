// auto: the default planner. A first rule, to be replaced by a cost model
// calibrated on the GPU: when no KV token is read by more than one query
// (independent sequences) the query-centric plan is the right one (nothing to
// share, and its units need no merge of shared parts); otherwise node, which
// loads each shared node once per Q tile of the queries below it.
#include "plan/planners/planners.hpp"

namespace treeattn {

Plan plan_auto(const Workload& w, const PlanOptions& opt) { return planning::plan_once(plan_auto_reusing, w, opt); }

void plan_auto_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch,
                       Plan& out) {
  bool shared = false;
  for (size_t v = 0; v < w.tree.nodes.size() && !shared; ++v)
    shared = w.tree.nodes[v].num_tokens > 0 && ix.subtree_queries[v] > 1;
  if (shared)
    plan_node_reusing(w, ix, opt, scratch, out);
  else
    plan_per_query_reusing(w, ix, opt, scratch, out);
  out.planner = "auto";
}

}  // namespace treeattn

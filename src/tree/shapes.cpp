// FlashForge's tree-shape family (binary ... quinary, degenerate) at equal
// total KV, so that shapes are compared at the same work.
#include <string>

#include "tree/builder_util.hpp"

namespace treeattn {

Workload kary_workload(int arity, int depth, int64_t total_tokens, bool leftmost, const WorkloadParams& p) {
  if (arity < 1 || arity > 64) throw Error("kary: arity = " + std::to_string(arity) + " is out of range [1, 64]");
  if (depth < 0 || depth > 20) throw Error("kary: depth = " + std::to_string(depth) + " is out of range [0, 20]");
  if (total_tokens <= 0) throw Error("kary: total = " + std::to_string(total_tokens) + " must be positive");
  detail::check_page_size(p.page_size);
  const std::string name = "kary:arity=" + std::to_string(arity) + ":depth=" + std::to_string(depth) +
                           ":total=" + std::to_string(total_tokens) + (leftmost ? ":leftmost=1" : "");
  // Node count: complete tree sum arity^l, degenerate 1 + depth * arity.
  __int128 nodes = 1, level = 1;
  for (int l = 1; l <= depth; ++l) {
    level = leftmost ? arity : level * arity;
    nodes += level;
  }
  detail::check_budget(nodes, nodes * detail::pages_for(total_tokens / nodes + 1, p.page_size), name);
  const int64_t per_node = total_tokens / int64_t(nodes);
  if (per_node < 1) throw Error("kary: total = " + std::to_string(total_tokens) + " is less than one token per node");

  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, 0x6a));
  Tree tree;
  std::vector<int32_t> frontier{alloc.add_node(tree, -1, int32_t(per_node))};
  std::vector<int32_t> queries;
  for (int l = 1; l <= depth; ++l) {
    std::vector<int32_t> next;
    for (size_t i = 0; i < frontier.size(); ++i) {
      if (leftmost && i > 0) {
        queries.push_back(frontier[i]);  // a leaf of the degenerate shape
        continue;
      }
      for (int c = 0; c < arity; ++c) next.push_back(alloc.add_node(tree, frontier[i], int32_t(per_node)));
    }
    frontier = std::move(next);
  }
  queries.insert(queries.end(), frontier.begin(), frontier.end());
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}

}  // namespace treeattn

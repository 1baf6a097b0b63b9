// The planning benchmark's tree (bench/planning/planning_bench.cpp), shared
// with the plan-digest test so that the tree whose planning time is reported
// is also one whose plans are pinned.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "treeattn/tree.hpp"

namespace treeattn::bench {

// A serving-like radix tree: internal nodes form a random recursive tree
// (depth ~ ln n), then up to `queries` leaves hang under random internal
// nodes; the queries go round-robin over the leaves (several per leaf when
// there are fewer leaves than queries). Heads 32/8, d = 128, fp16, page 16.
inline Workload planning_bench_tree(int nodes, int queries, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto uniform = [&](int lo, int hi) { return lo + int(rng() % uint64_t(hi - lo + 1)); };
  Workload w;
  w.name = "bench:nodes=" + std::to_string(nodes);
  w.heads = {32, 8, 128};
  w.layout.page_size = 16;
  w.layout.dtype = DType::fp16;
  PageAllocator alloc(16, seed);
  const int leaves = std::min(queries, nodes - std::max(1, nodes / 4));
  const int internal = nodes - leaves;
  for (int v = 0; v < internal; ++v) alloc.add_node(w.tree, v == 0 ? -1 : uniform(0, v - 1), uniform(16, 512));
  std::vector<int32_t> leaf_ids;
  for (int i = 0; i < leaves; ++i) leaf_ids.push_back(alloc.add_node(w.tree, uniform(0, internal - 1), uniform(1, 256)));
  for (int q = 0; q < queries; ++q) w.query_nodes.push_back(leaf_ids[q % leaves]);
  w.layout.num_pages = alloc.finish(w.tree);
  w.validate();
  return w;
}

}  // namespace treeattn::bench

// A workload's tree as the flat arrays an engine passes to TreeAttention
// (runtime tests on the CPU and the GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "treeattn/runtime.hpp"

namespace treeattn::test_support {

struct Arrays {
  std::vector<int32_t> parents, num_tokens, page_offsets{0}, page_ids, query_nodes, first_slots;
  explicit Arrays(const Workload& w) {
    for (const Node& n : w.tree.nodes) {
      parents.push_back(n.parent);
      num_tokens.push_back(n.num_tokens);
      page_ids.insert(page_ids.end(), n.pages.begin(), n.pages.end());
      page_offsets.push_back(int32_t(page_ids.size()));
      first_slots.push_back(n.first_slot);
    }
    query_nodes = w.query_nodes;
  }
  TreeArrays view() const { return {parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots}; }
};

}  // namespace treeattn::test_support

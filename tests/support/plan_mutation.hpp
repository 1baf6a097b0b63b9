// Mutations of a (workload, plan) pair, field by field, as a byte stream
// says: CSR offsets and counts, segment bounds and nodes, query ids, masks,
// slot ids, tile ids, merge lists, and the workload's page ids, token counts
// and query nodes. Shared by the libFuzzer target fuzz_plan_mutation (bytes
// from the fuzzer) and the GPU test of mutated plans (seeded bytes): a mutated
// plan the validator accepts must run safely and correctly on every executor.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn::test_support {

// The bytes that drive the mutations; 0 once they run out.
struct Reader {
  const uint8_t* d;
  size_t n;
  uint8_t byte() { return n ? (--n, *d++) : 0; }
  uint32_t u32() { return byte() | byte() << 8 | byte() << 16 | uint32_t(byte()) << 24; }
};

// The new value of a 32-bit field, by mode: a raw value, a small step, a bit
// flip, or a boundary value (the ones off-by-one bugs live at).
inline int64_t mutate(int64_t old, uint8_t mode, uint32_t raw, int64_t size) {
  switch (mode % 4) {
    case 0: return int32_t(raw);
    case 1: return old + int8_t(raw & 0xff);
    case 2: return old ^ (int64_t(1) << (raw % 31));
    default: {
      const int64_t edge[] = {-1, 0, 1, size - 1, size, size + 1, INT_MAX, INT_MIN};
      return edge[raw % 8];
    }
  }
}

template <class T>
inline void poke(std::vector<T>& v, uint32_t index, uint8_t mode, uint32_t raw, int64_t size) {
  if (v.empty()) return;
  T& x = v[index % v.size()];
  x = T(mutate(int64_t(x), mode, raw, size));
}

// Applies up to four mutations to w and p; returns whether the tree (page
// ids, token counts, query nodes) changed, so that it must be validated too.
inline bool mutate_plan(Workload& w, Plan& p, Reader& r) {
  bool tree_changed = false;
  for (int op = 0; op < 4 && r.n >= 8; ++op) {
    const uint8_t field = r.byte(), mode = r.byte();
    const uint32_t index = r.byte() | r.byte() << 8;
    const uint32_t raw = r.u32();
    const int64_t Q = w.num_queries(), N = int64_t(w.tree.nodes.size()), U = p.num_units();
    switch (field % 17) {
      case 0: poke(p.unit_segment_offset, index, mode, raw, int64_t(p.segments.size())); break;
      case 1: if (!p.segments.empty()) { Segment& s = p.segments[index % p.segments.size()]; s.node = int32_t(mutate(s.node, mode, raw, N)); } break;
      case 2: if (!p.segments.empty()) { Segment& s = p.segments[index % p.segments.size()]; s.begin = int32_t(mutate(s.begin, mode, raw, s.end)); } break;
      case 3: if (!p.segments.empty()) { Segment& s = p.segments[index % p.segments.size()]; s.end = int32_t(mutate(s.end, mode, raw, w.tree.nodes[std::clamp<int64_t>(s.node, 0, N - 1)].num_tokens)); } break;
      case 4: poke(p.unit_query_offset, index, mode, raw, int64_t(p.entry_query.size())); break;
      case 5: poke(p.entry_query, index, mode, raw, Q); break;
      case 6: if (!p.entry_mask.empty()) p.entry_mask[index % p.entry_mask.size()] ^= uint64_t(1) << (raw % 64); break;
      case 7: poke(p.entry_slot, index, mode, raw, p.num_slots); break;
      case 8: if (!p.unit_tile.empty()) p.unit_tile[index % p.unit_tile.size()] = uint8_t(raw); break;
      case 9: if (!p.unit_masked.empty()) p.unit_masked[index % p.unit_masked.size()] ^= 1; break;
      case 10: poke(p.query_slot_offset, index, mode, raw, int64_t(p.query_slots.size())); break;
      case 11: poke(p.query_slots, index, mode, raw, p.num_slots); break;
      case 12: p.num_slots = int32_t(mutate(p.num_slots, mode, raw, p.num_slots)); break;
      case 13: {  // a page id of some node
        Node& n = w.tree.nodes[index % w.tree.nodes.size()];
        if (!n.pages.empty()) n.pages[raw % n.pages.size()] = int32_t(mutate(n.pages[raw % n.pages.size()], mode, raw >> 8, w.layout.num_pages));
        tree_changed = true;
        break;
      }
      case 14: {  // a node's token count (its pages follow only if the count stays in the last page)
        Node& n = w.tree.nodes[index % w.tree.nodes.size()];
        n.num_tokens = int32_t(mutate(n.num_tokens, mode, raw, n.num_tokens));
        tree_changed = true;
        break;
      }
      case 15: {  // drop or duplicate the last element of one array (counts that disagree)
        const bool grow = raw & 1;
        switch ((raw >> 1) % 6) {
          case 0: grow ? p.segments.push_back(p.segments.empty() ? Segment{0, 0, 0} : p.segments.back()) : (p.segments.empty() ? void() : p.segments.pop_back()); break;
          case 1: grow ? p.entry_query.push_back(0) : (p.entry_query.empty() ? void() : p.entry_query.pop_back()); break;
          case 2: grow ? p.entry_slot.push_back(-1) : (p.entry_slot.empty() ? void() : p.entry_slot.pop_back()); break;
          case 3: grow ? p.unit_tile.push_back(0) : (p.unit_tile.empty() ? void() : p.unit_tile.pop_back()); break;
          case 4: grow ? p.query_slots.push_back(0) : (p.query_slots.empty() ? void() : p.query_slots.pop_back()); break;
          default: grow ? p.unit_masked.push_back(0) : (p.unit_masked.empty() ? void() : p.unit_masked.pop_back()); break;
        }
        break;
      }
      default: {  // a query's node (tree-structured queries move)
        poke(w.query_nodes, index, mode, raw, N);
        tree_changed = true;
        break;
      }
    }
    (void)U;
  }
  return tree_changed;
}

}  // namespace treeattn::test_support

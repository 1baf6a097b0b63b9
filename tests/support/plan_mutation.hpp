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

#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::test_support {

// The trees mutations start from: `count` small seeded random trees (empty
// nodes, queries on internal nodes) with the valid plan of every planner,
// planned for few SMs so that plans split KV and have partial slots.
struct MutationCase {
  Workload w;
  std::vector<Plan> plans;  // one per planner, in planners() order
};
inline std::vector<MutationCase> mutation_cases(DType dtype, int count = 12) {
  WorkloadParams wp;
  wp.heads = {4, 2, 64};
  wp.page_size = 4;
  wp.dtype = dtype;
  RandomTreeOptions ro;
  ro.max_nodes = 10;
  ro.max_tokens = 40;
  ro.empty_node_prob = 0.2;
  ro.internal_query_prob = 0.3;
  PlanOptions opt;
  opt.num_sms = 3;
  opt.chunk_tokens = 8;
  std::vector<MutationCase> out;
  for (int seed = 1; seed <= count; ++seed) {
    MutationCase c;
    c.w = random_workload(uint64_t(seed), wp, ro);
    for (const PlannerInfo& info : planners()) c.plans.push_back(make_plan(info.name, c.w, opt));
    out.push_back(std::move(c));
  }
  return out;
}

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

// Changes that keep a plan valid, so that executors see many unusual valid
// plans (random mutations are almost always rejected or change nothing): a
// unit re-tiled to any compiled tile that holds its rows, two units swapped,
// a unit's entries reversed, the slots renumbered, a segment split in two
// (its mask bit duplicated), a query's merge list reversed. Applies one, as r
// says; returns false when the plan had nothing to change.
inline bool transform_plan(const Workload& w, Plan& p, Reader& r) {
  const int32_t U = p.num_units();
  if (U == 0) return false;
  const uint8_t kind = r.byte();
  const int32_t u = int32_t(r.u32() % uint32_t(U));
  const int g = w.heads.group_size();
  switch (kind % 6) {
    case 0: {  // re-tile
      std::vector<uint8_t> fits;
      for (int t = 0; t < int(kTileConfigs.size()); ++t)
        if (kTileConfigs[t].m >= p.unit_num_queries(u) * g && tile_fits_head_dim(t, w.heads.head_dim) &&
            t != p.unit_tile[u])
          fits.push_back(uint8_t(t));
      if (fits.empty()) return false;
      p.unit_tile[u] = fits[r.byte() % fits.size()];
      return true;
    }
    case 1: {  // swap units u and v: their segments and entries move with them
      const int32_t v = int32_t(r.u32() % uint32_t(U));
      if (u == v) return false;
      Plan q = p;
      q.segments.clear(), q.entry_query.clear(), q.entry_mask.clear(), q.entry_slot.clear();
      q.unit_segment_offset.assign(1, 0), q.unit_query_offset.assign(1, 0);
      for (int32_t k = 0; k < U; ++k) {
        const int32_t from = k == u ? v : k == v ? u : k;
        for (int32_t s = p.unit_segment_offset[from]; s < p.unit_segment_offset[from + 1]; ++s)
          q.segments.push_back(p.segments[s]);
        for (int32_t e = p.unit_query_offset[from]; e < p.unit_query_offset[from + 1]; ++e) {
          q.entry_query.push_back(p.entry_query[e]);
          q.entry_mask.push_back(p.entry_mask[e]);
          q.entry_slot.push_back(p.entry_slot[e]);
        }
        q.unit_segment_offset.push_back(int32_t(q.segments.size()));
        q.unit_query_offset.push_back(int32_t(q.entry_query.size()));
        q.unit_tile[k] = p.unit_tile[from];
        q.unit_masked[k] = p.unit_masked[from];
      }
      p = std::move(q);
      return true;
    }
    case 2: {  // reverse a unit's entries
      const int32_t b = p.unit_query_offset[u], e = p.unit_query_offset[u + 1];
      if (e - b < 2) return false;
      std::reverse(p.entry_query.begin() + b, p.entry_query.begin() + e);
      std::reverse(p.entry_mask.begin() + b, p.entry_mask.begin() + e);
      std::reverse(p.entry_slot.begin() + b, p.entry_slot.begin() + e);
      return true;
    }
    case 3: {  // renumber the slots by a rotation
      if (p.num_slots < 2) return false;
      const int32_t shift = 1 + int32_t(r.u32() % uint32_t(p.num_slots - 1));
      for (int32_t& s : p.entry_slot)
        if (s >= 0) s = (s + shift) % p.num_slots;
      for (int32_t& s : p.query_slots) s = (s + shift) % p.num_slots;
      return true;
    }
    case 4: {  // split a segment of unit u in two; each entry sees both halves or neither
      const int32_t nseg = p.unit_num_segments(u);
      if (nseg >= kMaxSegmentsPerUnit || nseg == 0) return false;
      const int32_t k = int32_t(r.u32() % uint32_t(nseg)), at = p.unit_segment_offset[u] + k;
      const Segment s = p.segments[at];
      if (s.size() < 2) return false;
      const int32_t mid = s.begin + 1 + int32_t(r.u32() % uint32_t(s.size() - 1));
      p.segments[at].end = mid;
      p.segments.insert(p.segments.begin() + at + 1, Segment{s.node, mid, s.end});
      for (int32_t v = u + 1; v <= U; ++v) ++p.unit_segment_offset[v];
      for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) {
        const uint64_t m = p.entry_mask[e], low = k == 0 ? 0 : m & ((uint64_t(1) << k) - 1);
        const uint64_t bit = (m >> k) & 1;
        const uint64_t high = k + 2 < 64 ? (m >> (k + 1)) << (k + 2) : 0;  // nseg <= 63: nothing above
        p.entry_mask[e] = low | (bit << k) | (bit << (k + 1)) | high;
      }
      return true;
    }
    default: {  // reverse one query's merge list
      const int32_t Q = w.num_queries(), q = int32_t(r.u32() % uint32_t(Q));
      const int32_t b = p.query_slot_offset[q], e = p.query_slot_offset[q + 1];
      if (e - b < 2) return false;
      std::reverse(p.query_slots.begin() + b, p.query_slots.begin() + e);
      return true;
    }
  }
}

}  // namespace treeattn::test_support

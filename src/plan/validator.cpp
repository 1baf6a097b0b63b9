// The plan validator: DESIGN.md's invariants, checked for any planner's output.
#include <algorithm>
#include <bit>
#include <string>
#include <tuple>

#include "treeattn/plan.hpp"

namespace treeattn {

namespace {
[[noreturn]] void fail(const std::string& planner, const std::string& what) {
  throw Error("plan '" + planner + "' is invalid: " + what);
}
std::string str(int64_t v) { return std::to_string(v); }

// Set bits of m. Baseline x86-64 has no POPCNT instruction, where
// std::popcount is a library call: counted in registers instead.
int bit_count(uint64_t m) {
#if defined(__x86_64__) && !defined(__POPCNT__)
  m -= (m >> 1) & 0x5555555555555555ull;
  m = (m & 0x3333333333333333ull) + ((m >> 2) & 0x3333333333333333ull);
  m = (m + (m >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return int((m * 0x0101010101010101ull) >> 56);
#else
  return std::popcount(m);
#endif
}

void check_csr(const Plan& p, const std::vector<int32_t>& off, size_t rows, size_t total,
               const char* name) {
  if (off.size() != rows + 1) fail(p.planner, std::string(name) + " has " + str(off.size()) +
                                              " entries, expected " + str(rows + 1));
  if (off.front() != 0 || size_t(off.back()) != total)
    fail(p.planner, std::string(name) + " must run from 0 to " + str(total));
  for (size_t i = 0; i + 1 < off.size(); ++i)
    if (off[i] > off[i + 1]) fail(p.planner, std::string(name) + " decreases at " + str(i));
}
}  // namespace

void validate_plan(const Workload& w, const Plan& p, ValidatePlanScratch* scratch) {
  const int32_t U = p.num_units();
  const int32_t Q = w.num_queries();
  const int32_t N = static_cast<int32_t>(w.tree.nodes.size());
  const size_t E = p.entry_query.size();

  // Shapes of the flat arrays.
  if (p.unit_masked.size() != size_t(U)) fail(p.planner, "unit_masked size differs from unit count");
  check_csr(p, p.unit_segment_offset, U, p.segments.size(), "unit_segment_offset");
  check_csr(p, p.unit_query_offset, U, E, "unit_query_offset");
  if (p.entry_mask.size() != E || p.entry_slot.size() != E)
    fail(p.planner, "entry_query, entry_mask and entry_slot differ in length");
  check_csr(p, p.query_slot_offset, Q, p.query_slots.size(), "query_slot_offset");
  if (p.num_slots != int32_t(p.query_slots.size()))
    fail(p.planner, "num_slots = " + str(p.num_slots) + " but query_slots has " + str(p.query_slots.size()));

  ValidatePlanScratch local;
  ValidatePlanScratch& sc = scratch ? *scratch : local;
  // The nodes' parents and token counts, 8 bytes a node: the path walks
  // below are chains of dependent loads, shorter from these than from Node.
  sc.node_parent.resize(size_t(N));
  sc.node_tokens.resize(size_t(N));
  for (int32_t v = 0; v < N; ++v) {
    sc.node_parent[v] = w.tree.nodes[v].parent;
    sc.node_tokens[v] = w.tree.nodes[v].num_tokens;
  }
  const int32_t* const parent = sc.node_parent.data();
  const int32_t* const tokens = sc.node_tokens.data();

  // Per-unit capacity, segments and masks; count each query's units and
  // visible (non-empty) ranges.
  sc.units_of_query.assign(Q, 0);
  sc.last_unit_of_query.assign(Q, -1);
  sc.range_offset.assign(size_t(Q) + 1, 0);
  sc.slots_of_query.assign(Q, 0);
  sc.slot_owner.assign(size_t(p.num_slots), -1);  // the query whose entry writes the slot
  sc.unit_non_empty.resize(size_t(U));
  const int g = w.heads.group_size();
  for (int32_t u = 0; u < U; ++u) {
    // Labels are built only on failure: this runs every decode step.
    const auto unit = [&] { return "unit " + str(u) + ": "; };
    if (p.unit_tile[u] >= kTileConfigs.size()) fail(p.planner, unit() + "tile " + str(p.unit_tile[u]) + " unknown");
    const int32_t nseg = p.unit_num_segments(u), nq = p.unit_num_queries(u);
    if (nseg > kMaxSegmentsPerUnit) fail(p.planner, unit() + str(nseg) + " segments exceed " + str(kMaxSegmentsPerUnit));
    if (nq == 0) fail(p.planner, unit() + "has no queries");
    if (!tile_fits_head_dim(p.unit_tile[u], w.heads.head_dim))
      fail(p.planner, unit() + "tile m=" + str(kTileConfigs[p.unit_tile[u]].m) + " n=" + str(kTileConfigs[p.unit_tile[u]].n) +
                          " does not fit shared memory at head_dim " + str(w.heads.head_dim));
    if (nq * g > kTileConfigs[p.unit_tile[u]].m)
      fail(p.planner, unit() + str(nq) + " queries x " + str(g) + " heads exceed the tile's " +
                          str(kTileConfigs[p.unit_tile[u]].m) + " rows");
    const int32_t s0 = p.unit_segment_offset[u];
    uint64_t non_empty = 0;  // bit k: segment k has tokens
    for (int32_t k = 0; k < nseg; ++k) {
      const Segment& s = p.segments[s0 + k];
      if (s.node < 0 || s.node >= N) fail(p.planner, unit() + "segment node " + str(s.node) + " out of range");
      if (s.begin < 0 || s.begin > s.end || s.end > tokens[s.node])
        fail(p.planner, unit() + "segment [" + str(s.begin) + ", " + str(s.end) + ") outside node " +
                            str(s.node) + " of " + str(w.tree.nodes[s.node].num_tokens) + " tokens");
      non_empty |= uint64_t(s.end > s.begin) << k;
    }
    sc.unit_non_empty[u] = non_empty;
    const uint64_t full = full_mask(nseg);
    bool any_partial_mask = false;
    // An unmasked unit's entries all see its non-empty segments (a mask that
    // is not full fails the unit_masked check below): counted once.
    const bool unit_masked = p.unit_masked[u] != 0;
    const int visible_all = bit_count(non_empty);
    for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) {
      const int32_t q = p.entry_query[e];
      if (q < 0 || q >= Q) fail(p.planner, unit() + "query " + str(q) + " out of range");
      if (sc.last_unit_of_query[q] == u) fail(p.planner, unit() + "query " + str(q) + " appears twice");
      sc.last_unit_of_query[q] = u;
      const uint64_t mask = p.entry_mask[e];
      if (mask & ~full) fail(p.planner, unit() + "query " + str(q) + " mask has bits beyond its " + str(nseg) + " segments");
      any_partial_mask |= mask != full;
      sc.range_offset[size_t(q) + 1] += unit_masked ? bit_count(mask & non_empty) : visible_all;
      ++sc.units_of_query[q];
      const int32_t slot = p.entry_slot[e];
      if (slot != -1) {
        if (slot < 0 || slot >= p.num_slots) fail(p.planner, unit() + "slot " + str(slot) + " out of range");
        if (sc.slot_owner[slot] != -1)
          fail(p.planner, "slot " + str(slot) + " is written twice (queries " + str(sc.slot_owner[slot]) + " and " +
                              str(q) + ")");
        sc.slot_owner[slot] = q;
        ++sc.slots_of_query[q];
      }
    }
    if (any_partial_mask != bool(p.unit_masked[u]))
      fail(p.planner, unit() + "unit_masked = " + str(p.unit_masked[u]) + " disagrees with its masks");
  }

  // Each query's visible ranges, gathered by query (CSR over range_offset).
  for (int32_t q = 0; q < Q; ++q) sc.range_offset[size_t(q) + 1] += sc.range_offset[q];
  sc.ranges.resize(size_t(sc.range_offset[Q]));
  sc.range_fill.assign(sc.range_offset.begin(), sc.range_offset.end() - 1);
  for (int32_t u = 0; u < U; ++u) {
    const Segment* segs = p.segments.data() + p.unit_segment_offset[u];
    const uint64_t non_empty = sc.unit_non_empty[u];
    for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) {
      int32_t& fill = sc.range_fill[p.entry_query[e]];
      for (uint64_t seen = p.entry_mask[e] & non_empty; seen != 0; seen &= seen - 1)
        sc.ranges[size_t(fill++)] = segs[std::countr_zero(seen)];
    }
  }

  // Coverage: a query's visible ranges tile its path exactly, each token once.
  // Most queries see each node of their path in ranges that come in token
  // order (a whole node, or a node's KV pieces in the order of their units):
  // that is checked in O(path + ranges), each path node stamped with the
  // query and the token its next range must start at; a node is complete
  // when a range ends at its end, and every path node with tokens must be.
  // Any other query's ranges are sorted by node and checked token by token,
  // which also names the first violation.
  sc.on_path_of.assign(size_t(N), -1);
  sc.next_token.resize(size_t(N));
  const auto ranges_in_order = [&](int32_t q, const Segment* r, size_t nr) {
    int32_t with_tokens = 0;  // path nodes that have tokens
    for (int32_t v = w.query_nodes[q]; v >= 0; v = parent[v]) {
      sc.on_path_of[v] = q;
      sc.next_token[v] = 0;
      with_tokens += tokens[v] > 0;
    }
    int32_t complete = 0;
    for (size_t i = 0; i < nr; ++i) {
      const int32_t v = r[i].node;
      // Ranges are non-empty and within their node (checked per unit above).
      if (sc.on_path_of[v] != q || r[i].begin != sc.next_token[v]) return false;
      sc.next_token[v] = r[i].end;
      complete += r[i].end == tokens[v];
    }
    return complete == with_tokens;
  };
  const auto by_node_then_tokens = [](const Segment& a, const Segment& b) {
    return std::tie(a.node, a.begin, a.end) < std::tie(b.node, b.begin, b.end);
  };
  for (int32_t q = 0; q < Q; ++q) {
    const auto query = [&] { return "query " + str(q) + ": "; };
    if (sc.units_of_query[q] == 0) fail(p.planner, query() + "is in no unit");
    Segment* const r = sc.ranges.data() + sc.range_offset[q];
    const size_t nr = size_t(sc.range_offset[q + 1] - sc.range_offset[q]);
    if (ranges_in_order(q, r, nr)) continue;
    std::sort(r, r + nr, by_node_then_tokens);
    sc.path.clear();
    for (int32_t v = w.query_nodes[q]; v >= 0; v = parent[v]) sc.path.push_back(v);
    std::sort(sc.path.begin(), sc.path.end());
    for (size_t i = 0; i < nr; ++i)
      if (!std::binary_search(sc.path.begin(), sc.path.end(), r[i].node))
        fail(p.planner, query() + "sees node " + str(r[i].node) + " which is not on its path");
    size_t i = 0;
    for (int32_t v : sc.path) {
      int32_t at = 0;
      for (; i < nr && r[i].node == v; ++i) {
        if (r[i].begin != at)
          fail(p.planner, query() + "node " + str(v) + " tokens " + (r[i].begin < at ? "overlap" : "missing") +
                              " at " + str(std::min(at, r[i].begin)));
        at = r[i].end;
      }
      if (at != tokens[v])
        fail(p.planner, query() + "node " + str(v) + " covered up to " + str(at) + " of " +
                            str(w.tree.nodes[v].num_tokens) + " tokens");
    }
  }

  // Merge: a query in one unit has no slot; otherwise every entry of it has a
  // slot (each written once, checked above), and its merge list holds exactly
  // those slots. Reading a listed slot marks it (owner -2), so no slot is
  // listed twice; with as many listed slots as slots, every slot is read once.
  for (int32_t q = 0; q < Q; ++q) {
    const int32_t units = sc.units_of_query[q], slots = sc.slots_of_query[q];
    const int32_t listed = p.query_slot_offset[q + 1] - p.query_slot_offset[q];
    if (units == 1 && slots != 0) fail(p.planner, "query " + str(q) + " is in one unit but has a slot");
    if (units > 1 && slots != units) fail(p.planner, "query " + str(q) + " is in several units but an entry has no slot");
    if (units > 1 && listed != units)
      fail(p.planner, "query " + str(q) + " merges " + str(listed) + " slots but is in " + str(units) + " units");
    for (int32_t k = p.query_slot_offset[q]; k < p.query_slot_offset[q + 1]; ++k) {
      const int32_t slot = p.query_slots[k];
      if (slot < 0 || slot >= p.num_slots) fail(p.planner, "query " + str(q) + ": merge slot " + str(slot) + " out of range");
      int32_t& owner = sc.slot_owner[slot];
      if (owner == -2) fail(p.planner, "slot " + str(slot) + " is read twice");
      if (owner == -1) fail(p.planner, "slot " + str(slot) + " is read but written by no entry");
      if (owner != q) fail(p.planner, "query " + str(q) + " merges slot " + str(slot) + " written for another query");
      owner = -2;
    }
  }
}

}  // namespace treeattn

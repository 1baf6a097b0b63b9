// The plan validator: DESIGN.md's invariants, checked for any planner's output.
#include <algorithm>
#include <array>
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

void validate_plan(const Workload& w, const Plan& p, ValidatePlanScratch* scratch, const TreeIndex* index) {
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
  if (!index) {
    sc.index.rebuild(w.tree, w.query_nodes);
    index = &sc.index;
  }
  const TreeIndex& ix = *index;
  if (ix.query_begin.size() != size_t(N))
    throw Error("validate_plan: the tree index has " + str(ix.query_begin.size()) + " nodes, the tree " + str(N));
  const int32_t* const tokens = ix.tokens.data();
  const int32_t* const depth = ix.depth.data();
  const int32_t* const query_begin = ix.query_begin.data();
  const int32_t* const subtree_queries = ix.subtree_queries.data();

  // Each query owns a cell per node of its path, by depth.
  sc.queries.resize(size_t(Q));
  ValidatePlanScratch::Query* const queries = sc.queries.data();
  int32_t cells = 0;
  for (int32_t q = 0; q < Q; ++q) {
    const int32_t x = w.query_nodes[q];
    queries[q] = {0, -1, 0, 0, query_begin[x], cells, 0, 0, 0};
    cells += depth[x] + 1;
  }
  sc.cells.assign(size_t(cells), 0);
  sc.slot_owner.assign(size_t(p.num_slots), -1);  // the query whose entry writes the slot

  // Per unit: capacity, segments and masks, each entry's query and slot, and
  // what each entry's query sees. A range off its path (by the index's query
  // numbers) makes a query unsure: the sorted check below decides and names
  // the error. On its path, the tokens seen add up, and its path node at
  // depth d (< 64) is marked seen whole, or seen in pieces, whose cell holds
  // the token where the next piece must start: pieces come in token order in
  // most plans (a node's KV pieces in the order of their units), and any other
  // order makes the query unsure too. Deeper nodes have only cells.
  // An unmasked unit whose segments are whole nodes at distinct depths < 64
  // (most units) is summed up once: its depths, its tokens, and the range of
  // query numbers [lo, hi) its entries' queries must lie in to have all of its
  // nodes on their path.
  const auto depth_bit = [](int32_t d) { return d < 64 ? uint64_t(1) << d : 0; };
  const int g = w.heads.group_size();
  // Rows each tile holds at this head_dim, 0 where it does not fit shared
  // memory: one comparison per unit finds a unit whose capacity is wrong.
  std::array<int64_t, kTileConfigs.size()> tile_rows{};
  for (size_t t = 0; t < kTileConfigs.size(); ++t)
    tile_rows[t] = tile_fits_head_dim(int(t), w.heads.head_dim) ? kTileConfigs[t].m : 0;
  const int32_t* const unit_segment_offset = p.unit_segment_offset.data();
  const int32_t* const unit_query_offset = p.unit_query_offset.data();
  const int32_t* const entry_query = p.entry_query.data();
  const uint64_t* const entry_mask = p.entry_mask.data();
  const int32_t* const entry_slot = p.entry_slot.data();
  int32_t* const slot_owner = sc.slot_owner.data();
  for (int32_t u = 0; u < U; ++u) {
    // Labels are built only on failure: this runs every decode step.
    const auto unit = [&] { return "unit " + str(u) + ": "; };
    const size_t tile = p.unit_tile[u];
    const int32_t nseg = unit_segment_offset[u + 1] - unit_segment_offset[u];
    const int32_t e_begin = unit_query_offset[u], e_end = unit_query_offset[u + 1], nq = e_end - e_begin;
    if (tile >= kTileConfigs.size() || nseg > kMaxSegmentsPerUnit || nq == 0 || int64_t(nq) * g > tile_rows[tile]) {
      if (tile >= kTileConfigs.size()) fail(p.planner, unit() + "tile " + str(p.unit_tile[u]) + " unknown");
      if (nseg > kMaxSegmentsPerUnit) fail(p.planner, unit() + str(nseg) + " segments exceed " + str(kMaxSegmentsPerUnit));
      if (nq == 0) fail(p.planner, unit() + "has no queries");
      if (tile_rows[tile] == 0)
        fail(p.planner, unit() + "tile m=" + str(kTileConfigs[tile].m) + " n=" + str(kTileConfigs[tile].n) +
                            " does not fit shared memory at head_dim " + str(w.heads.head_dim));
      fail(p.planner, unit() + str(nq) + " queries x " + str(g) + " heads exceed the tile's " +
                          str(kTileConfigs[tile].m) + " rows");
    }
    const Segment* const segs = p.segments.data() + unit_segment_offset[u];
    // What an entry's walk over its mask needs of each non-empty segment,
    // gathered once per unit from the index (an entry reads only this).
    struct SegmentFacts {
      int32_t query_begin, subtree_queries;  // on the path of a query of key k iff k - query_begin < subtree_queries
      int32_t begin, end, depth;
      bool whole;    // the whole node, at depth < 64
      uint64_t bit;  // depth_bit of the node's depth
    };
    std::array<SegmentFacts, kMaxSegmentsPerUnit> facts;
    uint64_t non_empty = 0;  // bit k: segment k has tokens
    // The summary, where `whole_nodes` stays true.
    bool whole_nodes = p.unit_masked[u] == 0;
    uint64_t depths = 0;
    int32_t lo = 0, hi = Q;
    int64_t unit_tokens = 0;
    for (int32_t k = 0; k < nseg; ++k) {
      const Segment& s = segs[k];
      if (s.node < 0 || s.node >= N) fail(p.planner, unit() + "segment node " + str(s.node) + " out of range");
      if (s.begin < 0 || s.begin > s.end || s.end > tokens[s.node])
        fail(p.planner, unit() + "segment [" + str(s.begin) + ", " + str(s.end) + ") outside node " +
                            str(s.node) + " of " + str(tokens[s.node]) + " tokens");
      if (s.end == s.begin) continue;
      non_empty |= uint64_t(1) << k;
      lo = std::max(lo, query_begin[s.node]);
      hi = std::min(hi, query_begin[s.node] + subtree_queries[s.node]);
      unit_tokens += s.end - s.begin;
      const uint64_t bit = depth_bit(depth[s.node]);
      const bool whole = s.begin == 0 && s.end == tokens[s.node] && bit != 0;
      facts[size_t(k)] = {query_begin[s.node], subtree_queries[s.node], s.begin, s.end, depth[s.node], whole, bit};
      whole_nodes &= whole && (depths & bit) == 0;
      depths |= bit;
    }
    const uint64_t full = full_mask(nseg);
    bool any_partial_mask = false;
    for (int32_t e = e_begin; e < e_end; ++e) {
      const int32_t q = entry_query[e];
      if (uint32_t(q) >= uint32_t(Q)) fail(p.planner, unit() + "query " + str(q) + " out of range");
      ValidatePlanScratch::Query& qs = queries[q];
      if (qs.last_unit == u) fail(p.planner, unit() + "query " + str(q) + " appears twice");
      qs.last_unit = u;
      const uint64_t mask = entry_mask[e];
      if (mask & ~full) fail(p.planner, unit() + "query " + str(q) + " mask has bits beyond its " + str(nseg) + " segments");
      any_partial_mask |= mask != full;
      ++qs.units;
      const int32_t slot = entry_slot[e];
      if (slot != -1) {
        if (uint32_t(slot) >= uint32_t(p.num_slots)) fail(p.planner, unit() + "slot " + str(slot) + " out of range");
        if (slot_owner[slot] != -1)
          fail(p.planner, "slot " + str(slot) + " is written twice (queries " + str(slot_owner[slot]) + " and " +
                              str(q) + ")");
        slot_owner[slot] = q;
        ++qs.slots;
      }
      if (whole_nodes) {  // its mask is full (else the unit_masked check below fails)
        qs.unsure |= int32_t(qs.key < lo) | int32_t(qs.key >= hi) | int32_t((qs.whole & depths) != 0);
        qs.whole |= depths;
        qs.tokens += unit_tokens;
        continue;
      }
      for (uint64_t seen = mask & non_empty; seen != 0; seen &= seen - 1) {
        const SegmentFacts& f = facts[size_t(std::countr_zero(seen))];
        if (uint32_t(qs.key - f.query_begin) >= uint32_t(f.subtree_queries)) {  // off its path
          qs.unsure = 1;
          continue;
        }
        qs.tokens += f.end - f.begin;
        if (f.whole) {
          qs.unsure |= int32_t((qs.whole & f.bit) != 0);
          qs.whole |= f.bit;
        } else {
          qs.pieces |= f.bit;
          int32_t& next = sc.cells[size_t(qs.first_cell + f.depth)];
          qs.unsure |= int32_t(next != f.begin);
          next = f.end;
        }
      }
    }
    if (any_partial_mask != bool(p.unit_masked[u]))
      fail(p.planner, unit() + "unit_masked = " + str(p.unit_masked[u]) + " disagrees with its masks");
  }

  // Coverage: a query's visible ranges tile its path exactly, each token once.
  // A query that is not unsure saw only nodes of its path, each either whole
  // once or (pieces, deep nodes) in pieces contiguous from token 0, so at most
  // all of each; with its path's tokens seen in all, it saw each path node
  // whole. Other queries' ranges are gathered, sorted by node and checked
  // token by token, which also names the first violation (or finds them
  // right: pieces out of order).
  bool any_unsure = false;
  for (int32_t q = 0; q < Q; ++q) {
    ValidatePlanScratch::Query& qs = queries[q];
    qs.unsure = qs.unsure != 0 || qs.units == 0 || (qs.whole & qs.pieces) != 0 ||
                qs.tokens != ix.path_tokens[w.query_nodes[q]];
    any_unsure |= qs.unsure != 0;
  }
  const auto unsure = [&](int32_t q) { return queries[q].unsure != 0; };
  if (any_unsure) {
    sc.range_offset.assign(size_t(Q) + 1, 0);
    const auto non_empty_of = [&](int32_t u) {
      const Segment* segs = p.segments.data() + p.unit_segment_offset[u];
      uint64_t non_empty = 0;
      for (int32_t k = 0; k < p.unit_num_segments(u); ++k) non_empty |= uint64_t(segs[k].end > segs[k].begin) << k;
      return non_empty;
    };
    for (int32_t u = 0; u < U; ++u) {
      const uint64_t non_empty = non_empty_of(u);
      for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e)
        if (unsure(p.entry_query[e]))
          sc.range_offset[size_t(p.entry_query[e]) + 1] += bit_count(p.entry_mask[e] & non_empty);
    }
    for (int32_t q = 0; q < Q; ++q) sc.range_offset[size_t(q) + 1] += sc.range_offset[q];
    sc.ranges.resize(size_t(sc.range_offset[Q]));
    sc.range_fill.assign(sc.range_offset.begin(), sc.range_offset.end() - 1);
    for (int32_t u = 0; u < U; ++u) {
      const Segment* segs = p.segments.data() + p.unit_segment_offset[u];
      const uint64_t non_empty = non_empty_of(u);
      for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) {
        if (!unsure(p.entry_query[e])) continue;
        int32_t& fill = sc.range_fill[p.entry_query[e]];
        for (uint64_t seen = p.entry_mask[e] & non_empty; seen != 0; seen &= seen - 1)
          sc.ranges[size_t(fill++)] = segs[std::countr_zero(seen)];
      }
    }
    const auto by_node_then_tokens = [](const Segment& a, const Segment& b) {
      return std::tie(a.node, a.begin, a.end) < std::tie(b.node, b.begin, b.end);
    };
    for (int32_t q = 0; q < Q; ++q) {
      if (!unsure(q)) continue;
      const auto query = [&] { return "query " + str(q) + ": "; };
      if (queries[q].units == 0) fail(p.planner, query() + "is in no unit");
      Segment* const r = sc.ranges.data() + sc.range_offset[q];
      const size_t nr = size_t(sc.range_offset[q + 1] - sc.range_offset[q]);
      std::sort(r, r + nr, by_node_then_tokens);
      sc.path.clear();
      for (int32_t v = w.query_nodes[q]; v >= 0; v = ix.parent[v]) sc.path.push_back(v);
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
          fail(p.planner, query() + "node " + str(v) + " covered up to " + str(at) + " of " + str(tokens[v]) +
                              " tokens");
      }
    }
  }

  // Merge: a query in one unit has no slot; otherwise every entry of it has a
  // slot (each written once, checked above), and its merge list holds exactly
  // those slots. Reading a listed slot marks it (owner -2), so no slot is
  // listed twice; with as many listed slots as slots, every slot is read once.
  for (int32_t q = 0; q < Q; ++q) {
    const int32_t units = sc.queries[q].units, slots = sc.queries[q].slots;
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

// Tile table lookups, the PlanBuilder (slot and merge-list derivation shared
// by every planner) and the plan summary.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn {

int num_tile_configs() { return static_cast<int>(kTileConfigs.size()); }

int smallest_tile_for_rows(int rows) {
  for (int i = 0; i < num_tile_configs(); ++i)
    if (kTileConfigs[i].n == kDefaultKvTile && kTileConfigs[i].m >= rows) return i;
  throw Error("unit rows: " + std::to_string(rows) + " exceed the largest Q tile (" +
              std::to_string(kMaxTileRows) + " rows)");
}

PlanBuilder::PlanBuilder(const Workload& w, std::string planner_name, Plan&& reuse)
    : w_(w), plan_(std::move(reuse)) {
  plan_.planner = std::move(planner_name);
  plan_.unit_segment_offset.assign(1, 0);
  plan_.segments.clear();
  plan_.unit_query_offset.assign(1, 0);
  plan_.entry_query.clear();
  plan_.entry_mask.clear();
  plan_.entry_slot.clear();
  plan_.unit_tile.clear();
  plan_.unit_masked.clear();
  plan_.query_slot_offset.assign(1, 0);
  plan_.query_slots.clear();
  plan_.num_slots = 0;
}

void PlanBuilder::begin_unit(int tile) {
  if (open_) throw Error("PlanBuilder: begin_unit inside an open unit");
  // unit_tile is 8-bit: a tile past the table would wrap to another one.
  if (tile >= num_tile_configs())
    throw Error("PlanBuilder: begin_unit: tile = " + std::to_string(tile) + " is out of range [0, " +
                std::to_string(num_tile_configs()) + ") (< 0: the smallest that holds the unit's rows)");
  open_ = true;
  pending_tile_ = tile;
}

void PlanBuilder::add_segment(int32_t node, int32_t begin, int32_t end) {
  if (!open_) throw Error("PlanBuilder: add_segment outside a unit");
  plan_.segments.push_back({node, begin, end});
}

void PlanBuilder::add_query(int32_t query, uint64_t mask) {
  if (!open_) throw Error("PlanBuilder: add_query outside a unit");
  plan_.entry_query.push_back(query);
  plan_.entry_mask.push_back(mask);
  plan_.entry_slot.push_back(-1);
}

void PlanBuilder::add_segments(std::span<const Segment> segs) {
  if (!open_) throw Error("PlanBuilder: add_segments outside a unit");
  plan_.segments.insert(plan_.segments.end(), segs.begin(), segs.end());
}

void PlanBuilder::add_queries(std::span<const int32_t> queries, std::span<const uint64_t> masks) {
  if (!open_) throw Error("PlanBuilder: add_queries outside a unit");
  if (queries.size() != masks.size())
    throw Error("PlanBuilder: " + std::to_string(queries.size()) + " queries, " + std::to_string(masks.size()) +
                " masks");
  plan_.entry_query.insert(plan_.entry_query.end(), queries.begin(), queries.end());
  plan_.entry_mask.insert(plan_.entry_mask.end(), masks.begin(), masks.end());
  plan_.entry_slot.resize(plan_.entry_query.size(), -1);
}

void PlanBuilder::end_unit() {
  if (!open_) throw Error("PlanBuilder: end_unit without begin_unit");
  open_ = false;
  close_unit(static_cast<int32_t>(plan_.segments.size()), static_cast<int32_t>(plan_.entry_query.size()),
             pending_tile_);
}

void PlanBuilder::add_units(std::span<const Segment> segs, std::span<const int32_t> seg_end,
                            std::span<const int32_t> queries, std::span<const uint64_t> masks,
                            std::span<const int32_t> query_end) {
  if (open_) throw Error("PlanBuilder: add_units inside an open unit");
  const auto ends_ok = [](std::span<const int32_t> end, size_t total) {
    int32_t at = 0;
    for (const int32_t e : end) {
      if (e < at) return false;
      at = e;
    }
    return size_t(at) == total;
  };
  if (seg_end.size() != query_end.size() || queries.size() != masks.size() || !ends_ok(seg_end, segs.size()) ||
      !ends_ok(query_end, queries.size()))
    throw Error("PlanBuilder: add_units: " + std::to_string(seg_end.size()) + " segment ends over " +
                std::to_string(segs.size()) + " segments, " + std::to_string(query_end.size()) + " query ends over " +
                std::to_string(queries.size()) + " queries and " + std::to_string(masks.size()) + " masks");
  const int32_t s0 = static_cast<int32_t>(plan_.segments.size());
  const int32_t e0 = static_cast<int32_t>(plan_.entry_query.size());
  plan_.segments.insert(plan_.segments.end(), segs.begin(), segs.end());
  plan_.entry_query.insert(plan_.entry_query.end(), queries.begin(), queries.end());
  plan_.entry_mask.insert(plan_.entry_mask.end(), masks.begin(), masks.end());
  plan_.entry_slot.resize(plan_.entry_query.size(), -1);
  const size_t u0 = plan_.unit_tile.size(), n = seg_end.size();
  plan_.unit_segment_offset.resize(u0 + 1 + n);
  plan_.unit_query_offset.resize(u0 + 1 + n);
  plan_.unit_tile.resize(u0 + n);
  plan_.unit_masked.resize(u0 + n);
  for (size_t i = 0; i < n; ++i) {
    plan_.unit_segment_offset[u0 + 1 + i] = s0 + seg_end[i];
    plan_.unit_query_offset[u0 + 1 + i] = e0 + query_end[i];
  }
  for (size_t u = u0; u < u0 + n; ++u) settle_unit(u, -1);
}

void PlanBuilder::close_unit(int32_t seg_end, int32_t entry_end, int tile) {
  plan_.unit_segment_offset.push_back(seg_end);
  plan_.unit_query_offset.push_back(entry_end);
  plan_.unit_tile.push_back(0);
  plan_.unit_masked.push_back(0);
  settle_unit(plan_.unit_tile.size() - 1, tile);
}

void PlanBuilder::settle_unit(size_t u, int tile) {
  const int32_t seg_begin = plan_.unit_segment_offset[u], seg_end = plan_.unit_segment_offset[u + 1];
  const int32_t q_begin = plan_.unit_query_offset[u], entry_end = plan_.unit_query_offset[u + 1];
  const uint64_t full = full_mask(std::min(seg_end - seg_begin, kMaxSegmentsPerUnit));
  uint64_t* const mask = plan_.entry_mask.data();
  bool masked = false;
  for (int32_t e = q_begin; e < entry_end; ++e) {
    if (mask[e] == ~0ull) mask[e] = full;
    masked |= mask[e] != full;
  }
  const int rows = (entry_end - q_begin) * w_.heads.group_size();
  plan_.unit_tile[u] = static_cast<uint8_t>(tile < 0 ? smallest_tile_for_rows(std::max(rows, 1)) : tile);
  plan_.unit_masked[u] = masked ? 1 : 0;
}

Plan PlanBuilder::finish() {
  if (open_) throw Error("PlanBuilder: finish with an open unit");
  const int32_t nq = w_.num_queries();
  // off[q + 1] first counts q's entries, then becomes the CSR end of q's
  // merge list: no memory beyond the plan's own arrays. Meanwhile an entry's
  // slot holds its rank among its query's entries.
  std::vector<int32_t>& off = plan_.query_slot_offset;
  off.assign(size_t(nq) + 1, 0);
  for (size_t e = 0; e < plan_.entry_query.size(); ++e)
    if (const int32_t q = plan_.entry_query[e]; q >= 0 && q < nq) plan_.entry_slot[e] = off[size_t(q) + 1]++;

  // A query whose whole path is empty still needs a unit to write its zeros;
  // such queries go to units in id order, per_unit to a unit.
  const int per_unit = std::max(1, kMaxTileRows / w_.heads.group_size());
  int in_unit = 0;
  for (int32_t q = 0; q < nq; ++q) {
    if (off[size_t(q) + 1] != 0) continue;
    int64_t tokens = 0;
    for (int32_t v = w_.query_nodes[q]; v >= 0; v = w_.tree.nodes[v].parent) tokens += w_.tree.nodes[v].num_tokens;
    if (tokens != 0) continue;
    if (in_unit == per_unit) end_unit(), in_unit = 0;
    if (in_unit == 0) begin_unit();
    add_query(q);
    ++in_unit;
    ++off[size_t(q) + 1];
  }
  if (in_unit > 0) end_unit();

  // Only queries covered by more than one unit get partial slots; slots of a
  // query are consecutive, in the order of its entries (their ranks), so its
  // merge list is a range, and slot s is query_slots[s] = s.
  for (int32_t q = 0; q < nq; ++q) {
    const int32_t count = off[size_t(q) + 1];
    off[size_t(q) + 1] = off[q] + (count > 1 ? count : 0);
  }
  plan_.num_slots = off[nq];
  for (size_t e = 0; e < plan_.entry_query.size(); ++e) {
    const int32_t q = plan_.entry_query[e];
    if (q < 0 || q >= nq) continue;
    // Selected without a branch: which queries have slots is data.
    plan_.entry_slot[e] = off[size_t(q) + 1] != off[q] ? off[q] + plan_.entry_slot[e] : -1;
  }
  plan_.query_slots.resize(size_t(plan_.num_slots));
  std::iota(plan_.query_slots.begin(), plan_.query_slots.end(), 0);
  return std::move(plan_);
}

PlanSummary summarize(const Workload& w, const Plan& p) {
  PlanSummary s;
  s.planner = p.planner;
  s.units = p.num_units();
  s.segments = static_cast<int64_t>(p.segments.size());
  s.unique_kv_bytes = w.unique_kv_bytes();
  const int g = w.heads.group_size();
  int64_t tokens = 0;
  for (int32_t u = 0; u < p.num_units(); ++u) {
    int64_t unit_tokens = 0;
    for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k)
      unit_tokens += p.segments[k].size();
    tokens += unit_tokens;
    s.max_unit_tokens = std::max(s.max_unit_tokens, unit_tokens);
    const int64_t rows = int64_t(p.unit_num_queries(u)) * g;
    s.rows += rows;
    s.padded_rows += kTileConfigs[p.unit_tile[u]].m - rows;
    s.masked_units += p.unit_masked[u];
  }
  s.kv_bytes = tokens * w.kv_bytes_per_token();
  // fp32 partial O + lse per (slot, qo head), written once and read once.
  s.partial_bytes = int64_t(p.num_slots) * w.heads.num_qo_heads * (w.heads.head_dim + 1) * 4 * 2;
  // Path tokens per node, each node resolved once (walk up to a resolved
  // ancestor, then fill the walked nodes top-down).
  std::vector<int64_t> path_tokens(w.tree.nodes.size(), -1);
  std::vector<int32_t> walk;
  int64_t visible = 0;  // sum over queries of the tokens on their path
  for (const int32_t q : w.query_nodes) {
    for (int32_t v = q; v >= 0 && path_tokens[size_t(v)] < 0; v = w.tree.nodes[size_t(v)].parent) walk.push_back(v);
    for (; !walk.empty(); walk.pop_back()) {
      const Node& n = w.tree.nodes[size_t(walk.back())];
      path_tokens[size_t(walk.back())] = n.num_tokens + (n.parent >= 0 ? path_tokens[size_t(n.parent)] : 0);
    }
    visible += path_tokens[size_t(q)];
  }
  s.flops = visible * w.heads.num_qo_heads * 4 * w.heads.head_dim;
  return s;
}

}  // namespace treeattn

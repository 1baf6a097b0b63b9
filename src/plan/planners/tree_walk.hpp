// Depth-first view of a workload and unit-emission helpers shared by the
// paper planners (node-chunk, flatten, fasttree, pat, forge): every subtree's
// queries form one contiguous span, and KV lists are cut into pieces that
// respect the per-unit segment limit without allocating per piece.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "treeattn/plan.hpp"

namespace treeattn::planning {

struct DfsView {
  TreeIndex ix;
  std::vector<int32_t> preorder;  // parents before children, children in index order
  std::vector<int32_t> tin;       // position of v in preorder
  std::vector<int32_t> tout;      // v's subtree is preorder[tin[v] .. tout[v])
  // Query ids in preorder of their nodes (ties by id). The queries of v's
  // subtree are queries[q_begin[v] .. q_end[v]); v's own queries come first:
  // queries[q_begin[v] .. q_begin[v] + own[v]).
  std::vector<int32_t> queries;
  std::vector<int32_t> q_begin, q_end, own;

  explicit DfsView(const Workload& w);
  bool ancestor_or_self(int32_t a, int32_t v) const { return tin[a] <= tin[v] && tin[v] < tout[a]; }
  int32_t subtree_queries(int32_t v) const { return q_end[v] - q_begin[v]; }
};

// Queries per unit so that queries x group size fits the largest tile (or
// `max_rows` when smaller). Group sizes above every tile were rejected by
// HeadConfig::validate.
inline int queries_per_unit(const Workload& w, int max_rows = kMaxTileRows) {
  return std::max(1, std::min(max_rows, kMaxTileRows) / w.heads.group_size());
}

// One unit per consecutive group of at most `per_unit` queries, all over the
// same segments (the KV is loaded once per group). tile < 0: smallest tile.
void emit_query_groups(PlanBuilder& b, const Segment* segs, int nseg, const int32_t* queries, int64_t nq,
                       int per_unit, int tile = -1);

// Cuts an ordered list of segments into consecutive pieces of at most
// `max_tokens` tokens and kMaxSegmentsPerUnit segments, dropping empty
// segments, and calls fn(const Segment*, int count, int64_t tokens) per piece.
template <class Fn>
void for_each_piece(const Segment* segs, size_t n, int64_t max_tokens, Fn&& fn) {
  max_tokens = std::max<int64_t>(max_tokens, 1);
  std::array<Segment, kMaxSegmentsPerUnit> buf;
  int count = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    Segment s = segs[i];
    while (s.end > s.begin) {
      if (tokens == max_tokens || count == kMaxSegmentsPerUnit) {
        fn(buf.data(), count, tokens);
        count = 0;
        tokens = 0;
      }
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(s.size(), max_tokens - tokens));
      buf[count++] = {s.node, s.begin, s.begin + take};
      tokens += take;
      s.begin += take;
    }
  }
  if (count > 0) fn(buf.data(), count, tokens);
}

// The whole-node segments of `chain` (root-most first), empty nodes dropped.
inline void chain_segments(const Workload& w, const int32_t* chain, size_t n, std::vector<Segment>& out) {
  out.clear();
  for (size_t i = 0; i < n; ++i)
    if (const int32_t t = w.tree.nodes[chain[i]].num_tokens; t > 0) out.push_back({chain[i], 0, t});
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace treeattn::planning

// flatten (DeFT-Flatten, DeFT ICLR'25 §3.2): the tree's KV is laid out in
// depth-first order and cut into even blocks of S_t tokens regardless of node
// boundaries, so every unit carries the same amount of KV (load balance) and
// every token is loaded once per Q tile of the queries that see it. A block's
// queries are the union of the queries below the nodes it touches; a query's
// 64-bit mask says which of the block's segments are on its path (a block may
// hold the tail of one branch and the head of its sibling). Queries attached to
// internal nodes (speculative-decoding token trees) see their ancestors and
// themselves but not their descendants in the same block: the same mask rule.
//
// S_t = opt.chunk_tokens (default 128); with extra "fill" = 1 (default) it
// shrinks (down to 16 tokens) when the blocks x kv heads would not fill the
// resident CTA slots. A block is also closed at 64 segments.
// Deviation: a block whose queries exceed one Q tile gets one unit per Q tile
// (DeFT's kernel keeps all of a block's queries in one CTA).
#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"

namespace treeattn {

namespace {

int64_t block_tokens(const Workload& w, const PlanOptions& opt) {
  int64_t st = std::max(1, opt.chunk_tokens);
  if (opt.get("fill", 1) == 0) return st;
  const int64_t slots = std::max(1, opt.target_ctas(w.heads) / w.heads.num_kv_heads);
  const int64_t total = w.total_tokens();
  if (planning::ceil_div(total, st) < slots) {
    const int64_t even = planning::ceil_div(planning::ceil_div(total, slots), 16) * 16;
    st = std::min(st, std::max<int64_t>(16, even));
  }
  return st;
}

}  // namespace

Plan plan_flatten(const Workload& w, const PlanOptions& opt) {
  const planning::DfsView dv(w);
  const int per_unit = planning::queries_per_unit(w);
  const int64_t st = block_tokens(w, opt);
  PlanBuilder b(w, "flatten");

  std::vector<Segment> block;
  block.reserve(kMaxSegmentsPerUnit);
  std::vector<int32_t> pos;  // positions in dv.queries of the block's queries, ascending
  std::vector<uint64_t> masks;
  int64_t tokens = 0;

  const auto flush = [&] {
    if (block.empty()) return;
    if (block.size() == 1) {  // most blocks: one node's piece, seen by its whole subtree
      const int32_t v = block[0].node;
      planning::emit_query_groups(b, block.data(), 1, dv.queries.data() + dv.q_begin[v], dv.subtree_queries(v), per_unit);
      block.clear();
      tokens = 0;
      return;
    }
    // The block's queries: the union of its segments' subtree query spans,
    // which in preorder are nested or disjoint and sorted by start.
    pos.clear();
    int32_t lo = 0, hi = 0;
    for (const Segment& s : block) {
      const int32_t a = dv.q_begin[s.node], e = dv.q_end[s.node];
      if (a >= hi) {
        for (int32_t i = lo; i < hi; ++i) pos.push_back(i);
        lo = a;
        hi = e;
      } else {
        hi = std::max(hi, e);
      }
    }
    for (int32_t i = lo; i < hi; ++i) pos.push_back(i);
    // A query sees segment k exactly when it lies in the subtree of k's node,
    // i.e. when its position falls in that node's span.
    const int nseg = static_cast<int>(block.size());
    masks.assign(pos.size(), 0ull);
    for (int k = 0; k < nseg; ++k) {
      const int32_t a = dv.q_begin[block[k].node], e = dv.q_end[block[k].node];
      for (auto it = std::lower_bound(pos.begin(), pos.end(), a); it != pos.end() && *it < e; ++it)
        masks[it - pos.begin()] |= 1ull << k;
    }
    for (size_t q0 = 0; q0 < pos.size(); q0 += per_unit) {
      const size_t q1 = std::min(pos.size(), q0 + per_unit);
      b.begin_unit();
      for (const Segment& s : block) b.add_segment(s.node, s.begin, s.end);
      for (size_t i = q0; i < q1; ++i) b.add_query(dv.queries[pos[i]], masks[i]);
      b.end_unit();
    }
    block.clear();
    tokens = 0;
  };

  for (const int32_t v : dv.preorder) {
    const int32_t len = w.tree.nodes[v].num_tokens;
    for (int32_t t = 0; t < len;) {
      if (tokens == st || block.size() == size_t(kMaxSegmentsPerUnit)) flush();
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(len - t, st - tokens));
      block.push_back({v, t, t + take});
      tokens += take;
      t += take;
    }
  }
  flush();
  return b.finish();
}

}  // namespace treeattn

// Helpers shared by planners: KV splitting and query grouping.
#include <algorithm>
#include <cmath>
#include <limits>

#include "plan/planners/planners.hpp"
#include "plan/planners/tree_walk.hpp"

namespace treeattn::planning {

namespace {
// CTA slots per kv head at ctas_per_sm resident CTAs per SM.
int64_t slots_per_kv_head(const Workload& w, const PlanOptions& opt, int64_t ctas_per_sm) {
  return std::max<int64_t>(1, int64_t(opt.num_sms) * ctas_per_sm / w.heads.num_kv_heads);
}
// The even share of work_tokens over `slots`, at least opt.min_split_tokens.
int64_t even_share(int64_t work_tokens, int64_t slots, const PlanOptions& opt) {
  const int64_t even = (std::max<int64_t>(work_tokens, 1) + slots - 1) / slots;
  return std::max<int64_t>(even, opt.min_split_tokens);
}
}  // namespace

int64_t split_length(int64_t work_tokens, const Workload& w, const PlanOptions& opt) {
  return even_share(work_tokens, slots_per_kv_head(w, opt, opt.ctas_per_sm), opt);
}

int64_t longest_first_finish(const std::vector<std::pair<int64_t, int64_t>>& jobs, int64_t p, int64_t slots,
                             int64_t piece_cost, SplitScratch& scratch) {
  using Group = std::pair<int64_t, int64_t>;  // (a length or a load, how many)
  const auto longer_first = [](const Group& x, const Group& y) { return x.first > y.first; };
  // Pieces that fit one wave end with the longest.
  int64_t pieces = 0, end = 0;
  for (const auto& [tokens, copies] : jobs) {
    const int64_t k = (tokens + p - 1) / p;
    pieces += k * copies;
    end = std::max(end, (tokens + k - 1) / k + piece_cost);
  }
  if (pieces <= slots) return end;
  // Else the first `slots` pieces (the longest) take a slot each and each
  // later piece goes to the least loaded slot. Pieces and slots are counted
  // in groups of equal length (load): c pieces of length L given to a group
  // of g slots of the least load a make min(g, c) slots of load a + L, since
  // a slot that took a piece is loaded more than the others at a. (Which of
  // equally loaded slots takes a piece does not change the loads' multiset,
  // so neither the finish.)
  std::vector<Group>& len = scratch.pieces;  // (length, pieces), longest first
  len.clear();
  for (const auto& [tokens, copies] : jobs) {
    const int64_t k = (tokens + p - 1) / p, longer = tokens % k;
    if (longer > 0) len.emplace_back(tokens / k + 1 + piece_cost, longer * copies);
    len.emplace_back(tokens / k + piece_cost, (k - longer) * copies);
  }
  std::sort(len.begin(), len.end(), longer_first);
  std::vector<Group>& heap = scratch.slots;  // a min-heap of (load, slots)
  heap.clear();
  size_t g = 0;
  int64_t left = len[0].second;  // pieces of group g without a slot yet
  for (int64_t free = slots; free > 0;) {
    const int64_t take = std::min(left, free);
    heap.emplace_back(len[g].first, take);
    free -= take;
    left -= take;
    if (left == 0 && ++g < len.size()) left = len[g].second;
  }
  std::make_heap(heap.begin(), heap.end(), longer_first);
  end = len.front().first;
  for (; g < len.size(); left = ++g < len.size() ? len[g].second : 0) {
    const int64_t length = len[g].first;
    while (left > 0) {
      std::pop_heap(heap.begin(), heap.end(), longer_first);
      const auto [load, count] = heap.back();
      const int64_t given = std::min(count, left);
      heap.back() = {load + length, given};
      std::push_heap(heap.begin(), heap.end(), longer_first);
      if (given < count) {  // the group's other slots keep their load
        heap.emplace_back(load, count - given);
        std::push_heap(heap.begin(), heap.end(), longer_first);
      }
      end = std::max(end, load + length);
      left -= given;
    }
  }
  return end;
}

int64_t balanced_split_length(const std::vector<std::pair<int64_t, int64_t>>& jobs, const Workload& w,
                              const PlanOptions& opt, SplitScratch& scratch, int64_t ctas_per_sm) {
  const int64_t slots = slots_per_kv_head(w, opt, ctas_per_sm > 0 ? ctas_per_sm : opt.ctas_per_sm);
  constexpr int64_t kPieceCost = 64;  // fixed cost of a CTA, in tokens
  constexpr int64_t kFewerPieces = 3, kMinGainPercent = 5;
  int64_t work = 0, longest = 0;
  for (const auto& [tokens, copies] : jobs) {
    work += tokens * copies;
    longest = std::max(longest, tokens);
  }
  // The jobs that pieces() walks: `jobs`, then (once a schedule is needed)
  // `alike`: the jobs with tokens, those of equal tokens as one (many are
  // alike: a token tree's one-token drafts, the Q tiles of one node).
  const std::vector<std::pair<int64_t, int64_t>>* walked = &jobs;
  std::vector<std::pair<int64_t, int64_t>>& alike = scratch.jobs;
  const auto group_alike_jobs = [&] {
    alike.clear();
    for (const auto& job : jobs)
      if (job.first > 0 && job.second > 0) alike.push_back(job);
    std::sort(alike.begin(), alike.end());
    size_t n = 0;
    for (size_t i = 0; i < alike.size(); ++i)
      if (n > 0 && alike[n - 1].first == alike[i].first) alike[n - 1].second += alike[i].second;
      else alike[n++] = alike[i];
    alike.resize(n);
    walked = &alike;
  };
  auto pieces = [&](int64_t p) {
    int64_t n = 0;
    for (const auto& [tokens, copies] : *walked) n += (tokens > 0 && tokens <= p ? 1 : (tokens + p - 1) / p) * copies;  // one piece: no division
    return n;
  };
  auto makespan = [&](int64_t p) { return longest_first_finish(alike, p, slots, kPieceCost, scratch); };
  const int64_t even = even_share(work, slots, opt);
  const int64_t min_piece = std::max<int64_t>(opt.min_split_tokens, 1);
  const int64_t at_even = (longest + even - 1) / even;
  const bool one_wave = pieces(std::max(min_piece, longest)) <= slots;
  if (at_even < 2 && !one_wave) return even;
  group_alike_jobs();
  const int64_t even_end = makespan(even);
  if (one_wave) {  // the least length whose pieces all fit one wave, where it finishes first
    int64_t lo = min_piece, hi = std::max(lo, longest);
    while (lo < hi) {  // pieces(p) does not grow with p
      const int64_t mid = lo + (hi - lo) / 2;
      if (pieces(mid) <= slots) hi = mid; else lo = mid + 1;
    }
    if (makespan(lo) < even_end) return lo;
  }
  // even is the choice: the longest job in 1-3 pieces fewer than at even,
  // taken where the schedule finishes at least kMinGainPercent earlier.
  int64_t best = even, best_end = even_end;
  for (int64_t c = std::max<int64_t>(1, at_even - kFewerPieces); c < at_even; ++c) {
    const int64_t p = (longest + c - 1) / c;
    if (p < min_piece) continue;
    if (const int64_t end = makespan(p); end < best_end) best = p, best_end = end;
  }
  return 100 * best_end <= (100 - kMinGainPercent) * even_end ? best : even;
}

bool fills_slots(size_t units, const Workload& w, const PlanOptions& opt) {
  return 4 * int64_t(units) * w.heads.num_kv_heads >= 3 * opt.target_ctas(w.heads);
}

int64_t integer_option(const PlanOptions& opt, const char* planner, const char* key, int64_t fallback, int64_t min) {
  const double v = opt.get(key, double(fallback));
  if (!(v >= double(min) && v <= 1e9 && v == std::floor(v)))
    throw Error(std::string(planner) + ": " + key + " = " + std::to_string(v) + " must be an integer in [" +
                std::to_string(min) + ", 1000000000]");
  return int64_t(v);
}

void ProtoUnits::clear() {
  segs_.clear();
  queries_.clear();
  masks_.clear();
  seg_end_.clear();
  query_end_.clear();
}

void ProtoUnits::emit(PlanBuilder& b) const {
  const size_t segs = seg_end_.empty() ? 0 : size_t(seg_end_.back());
  const size_t queries = query_end_.empty() ? 0 : size_t(query_end_.back());
  b.add_units({segs_.data(), segs}, seg_end_, {queries_.data(), queries}, {masks_.data(), queries}, query_end_);
}

void ProtoUnits::plan(const Workload& w, const std::string& planner, Plan& out) const {
  PlanBuilder b(w, planner, std::move(out));
  emit(b);
  out = b.finish();
}

void ProtoUnits::discard_open() {
  segs_.resize(seg_end_.empty() ? 0 : size_t(seg_end_.back()));
  queries_.resize(query_end_.empty() ? 0 : size_t(query_end_.back()));
  masks_.resize(queries_.size());
}

void ProtoUnits::append(const ProtoUnits& from, size_t i) {
  const auto s = from.segs(i);
  const auto q = from.queries(i);
  const auto m = from.masks(i);
  segs_.insert(segs_.end(), s.begin(), s.end());
  queries_.insert(queries_.end(), q.begin(), q.end());
  masks_.insert(masks_.end(), m.begin(), m.end());
  close();
}

bool pack_short_units(const ProtoUnits& units, int64_t max_tokens, const Workload& w, const PlanOptions& opt,
                      ProtoUnits& out, PackScratch& scratch) {
  constexpr int kPackRows = 16;      // the decode tile (32- and 64-row packs measured slower)
  constexpr int kMinPerPack = 8;     // packs of 4 measured slower, of 16 faster
  const int64_t G = w.heads.group_size();
  // Each unit has a query: where one query's rows are too many, none packs.
  if (max_tokens <= 0 || kMinPerPack * G > kPackRows) return false;
  const auto rows = [&](size_t u) { return int64_t(units.queries(u).size()) * G; };
  const auto packable = [&](size_t u) { return kMinPerPack * rows(u) <= kPackRows && units.tokens(u) <= max_tokens; };
  int64_t candidates = 0, candidate_rows = 0;
  for (size_t u = 0; u < units.size(); ++u)
    if (packable(u)) ++candidates, candidate_rows += rows(u);
  // Packs needed: by rows, and so that the units still fill the CTA slots.
  const int64_t others = int64_t(units.size()) - candidates;
  const int64_t fill = ceil_div(opt.target_ctas(w.heads), w.heads.num_kv_heads) - others;
  const int64_t packs = std::max(ceil_div(candidate_rows, kPackRows), fill);
  if (candidates < 2 || packs >= candidates) return false;
  out.clear();
  const int64_t row_budget = std::min<int64_t>(kPackRows, ceil_div(candidate_rows, packs));

  // The pack being filled is `pack`'s open unit; units that are not packed
  // go to `out` as they come, a pack when it is full.
  ProtoUnits& pack = scratch.pack;
  pack.clear();
  int64_t pack_rows = 0;
  std::vector<int32_t>& pack_queries = scratch.queries;
  pack_queries.clear();
  const auto flush = [&] {
    pack.close();
    if (!pack.segs(0).empty()) out.append(pack, 0);
    pack.clear();
    pack_rows = 0;
    pack_queries.clear();
  };
  for (size_t u = 0; u < units.size(); ++u) {
    if (!packable(u)) {
      out.append(units, u);
      continue;
    }
    const auto segs = units.segs(u);
    const auto queries = units.queries(u);
    const auto masks = units.masks(u);
    const bool shares = std::any_of(queries.begin(), queries.end(), [&](int32_t q) {
      return std::binary_search(pack_queries.begin(), pack_queries.end(), q);
    });
    if (shares || pack_rows + rows(u) > row_budget ||
        pack.open_segs().size() + segs.size() > size_t(kMaxSegmentsPerUnit))
      flush();
    const int shift = int(pack.open_segs().size());
    for (const Segment& s : segs) pack.add_segment(s);
    for (size_t i = 0; i < queries.size(); ++i) {
      pack.add_query(queries[i], (masks[i] & full_mask(int(segs.size()))) << shift);
      pack_queries.insert(std::upper_bound(pack_queries.begin(), pack_queries.end(), queries[i]), queries[i]);
    }
    pack_rows += rows(u);
  }
  flush();
  return true;
}

void DownPaths::build(const Workload& w, const TreeIndex& ix) {
  const size_t n = w.tree.nodes.size();
  std::vector<int64_t>&tok = tokens, &segs = segments;
  tok.assign(n, 0);
  segs.assign(n, 0);
  leaf.assign(n, 0);
  branches.assign(n, 0);
  with_tokens.assign(n, 0);
  path_nodes.assign(n, 0);
  // Children before parents: when v is reached, its entries hold the
  // maxima its children with queries pushed up; v's own are set from them
  // and pushed to its parent. Selects instead of branches (which nodes have
  // queries is data); a node without queries below it gets zeros.
  for (auto it = ix.bfs_order.rbegin(); it != ix.bfs_order.rend(); ++it) {
    const int32_t v = *it, own = ix.tokens[v], p = ix.parent[v];
    const bool here = ix.subtree_queries[v] > 0;
    tok[v] = here ? tok[v] + own : 0;
    segs[v] = here ? segs[v] + (own > 0 ? 1 : 0) : 0;
    leaf[v] = !here ? 0 : branches[v] ? leaf[v] : own;
    branches[v] = here ? branches[v] : 0;
    with_tokens[v] = own > 0 ? ix.subtree_queries[v] : with_tokens[v];  // a path through v holds its tokens
    path_nodes[v] += int32_t(here & (own > 0));
    if (p < 0) continue;
    tok[p] = std::max(tok[p], tok[v]);
    segs[p] = std::max(segs[p], segs[v]);
    leaf[p] = std::max(leaf[p], leaf[v]);
    branches[p] |= char(here);
    with_tokens[p] += with_tokens[v];
    path_nodes[p] += path_nodes[v];
  }
}

int64_t shortest_deeper_compact_paths(const Workload& w, const TreeIndex& ix, const DownPaths& down, int64_t shorter,
                                      int64_t rows) {
  // A subtree's leaves lie on its paths: its limit is the longer of the two.
  const int64_t G = w.heads.group_size();
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t v = 0; v < down.tokens.size(); ++v) {
    const int64_t needs = std::max(down.tokens[v], down.leaf[v]);
    if (ix.subtree_queries[v] * G > rows && down.tokens[v] > shorter && needs < least &&
        compact_subtree_root(ix, down, v, needs, needs))
      least = needs;
  }
  return least;
}

void compact_subtree_units(const Workload& w, const TreeIndex& ix, const SubtreeQueries& sub, const DownPaths& down,
                           int64_t max_tokens, int64_t max_leaf_tokens, int64_t rows, const PlanOptions& opt,
                           std::vector<char>& covered, ProtoUnits& out, CompactUnitsSummary& summary,
                           CompactScratch& scratch) {
  const int32_t n = static_cast<int32_t>(w.tree.nodes.size());
  const int64_t G = w.heads.group_size();
  covered.assign(n, 0);
  out.clear();
  summary = {};
  summary.max_tokens = max_tokens;
  summary.max_leaf_tokens = max_leaf_tokens;
  if (max_tokens <= 0) return;
  // is_compact[v]: v's subtree qualifies (its parent's may too), found in
  // node order (each node on its own: one sequential pass). `roots`: the
  // highest compact subtrees (whose parent's is not), in BFS order.
  std::vector<char>& is_compact = scratch.is_compact;
  is_compact.resize(size_t(n));
  for (int32_t v = 0; v < n; ++v)
    is_compact[v] = char(compact_subtree_root(ix, down, size_t(v), max_tokens, max_leaf_tokens));
  std::vector<int32_t>&roots = scratch.roots, &best_roots = scratch.best_roots, &next = scratch.next;
  roots.resize(size_t(n));
  size_t highest = 0;
  for (const int32_t v : ix.bfs_order) {
    const int32_t p = ix.parent[v];
    roots[highest] = v;
    highest += is_compact[v] && !(p >= 0 && is_compact[p]);
  }
  roots.resize(highest);

  // Consecutive queries of each subtree in `roots`, `cap` rows per unit.
  // Node x is in the open unit when opened_in[x] is the open unit's number
  // `open` (each unit, of every call, has its own); then path_mask[x] holds
  // the segment positions of the non-empty nodes from the unit's root down to
  // x. The unit's nodes are the union of its queries' paths from the root:
  // a connected subtree. So a query's nodes missing from the unit are those
  // below its deepest ancestor in it, and a query costs a walk over those
  // (its whole path only after a unit closed), not over its path.
  std::vector<int32_t>&path = scratch.path, &opened_in = scratch.opened_in;
  std::vector<uint64_t>& path_mask = scratch.path_mask;
  opened_in.assign(size_t(n), -1);
  path_mask.resize(size_t(n));
  int32_t open = 0;
  // Units closed by a limit (rows or segments) before their subtree's end:
  // the only ones a grouping of more rows could merge away.
  int64_t full_units = 0, full_tokens = 0, full_segments = 0;
  const auto group = [&](const std::vector<int32_t>& roots, int64_t cap, ProtoUnits& units) {
    units.clear();
    full_units = full_tokens = full_segments = 0;
    const auto flush = [&](bool by_limit) {
      if (units.open_queries() > 0) {
        units.close();
        full_units += by_limit;
        full_tokens += by_limit ? units.tokens(units.size() - 1) : 0;
        full_segments += by_limit ? int64_t(units.segs(units.size() - 1).size()) : 0;
      } else {
        units.discard_open();
      }
      ++open;
    };
    ++open;
    // q's nodes from v down that the open unit lacks, bottom up, into
    // `path`; returns the mask of the path above them (the unit's) and sets
    // `fresh` to how many of them are non-empty.
    const auto missing = [&](int32_t v, int32_t q, size_t& fresh) {
      path.clear();
      fresh = 0;
      for (int32_t x = w.query_nodes[q];; x = ix.parent[x]) {
        if (opened_in[x] == open) return path_mask[x];
        path.push_back(x);
        fresh += ix.tokens[x] > 0;
        if (x == v) return uint64_t(0);
      }
    };
    for (const int32_t v : roots) {
      for (const int32_t q : sub[v]) {
        size_t fresh = 0;
        uint64_t mask = missing(v, q, fresh);
        if (mask == 0 && fresh == 0) continue;  // nothing of q's path is here
        if (units.open_queries() > 0 && (int64_t(units.open_queries() + 1) * G > cap ||
                                         units.open_segs().size() + fresh > size_t(kMaxSegmentsPerUnit))) {
          flush(true);
          mask = missing(v, q, fresh);  // the new unit lacks all of it
        }
        for (auto it = path.rbegin(); it != path.rend(); ++it) {  // top down: segments in path order
          const int32_t x = *it;
          if (ix.tokens[x] > 0) {
            mask |= 1ull << units.open_segs().size();
            units.add_segment({x, 0, ix.tokens[x]});
          }
          opened_in[x] = open;
          path_mask[x] = mask;
        }
        units.add_query(q, mask);
      }
      flush(false);
    }
  };
  // A cut's units, counted where no unit of a root can reach the segment
  // limit (its subtree has at most that many path nodes, or cap / G queries
  // of paths of at most down.segments[v] nodes cannot have more): grouping
  // then closes a unit every cap / G queries whose path from the root holds
  // a token (down.with_tokens). Elsewhere made, into `made`.
  const std::vector<int32_t>&with_tokens = down.with_tokens, &path_nodes = down.path_nodes;
  ProtoUnits& made = scratch.made;
  const auto units_at = [&](const std::vector<int32_t>& cut, int64_t cap, bool& is_made) {
    const int64_t per_unit = cap / G;  // cap >= G: at least one query
    is_made = std::any_of(cut.begin(), cut.end(), [&](int32_t v) {
      return std::min<int64_t>(path_nodes[v], per_unit * down.segments[v]) > kMaxSegmentsPerUnit;
    });
    if (is_made) {
      group(cut, cap, made);
      return made.size();
    }
    size_t units = 0;
    for (const int32_t v : cut) units += size_t((with_tokens[v] + per_unit - 1) / per_unit);
    return units;
  };
  // The rows of a cut's units: the larger decode tile (32 rows, else 16)
  // whose CTAs still fill the resident slots (not 64: those go to wgmma CTAs
  // too few per SM to keep their loads in flight; docs/planners.md, "node").
  const auto cap_at = [&](const std::vector<int32_t>& cut, size_t& units, bool& is_made) {
    if (rows > 0) {
      const int64_t cap = std::max(std::min<int64_t>(rows, kMaxTileRows), G);
      units = units_at(cut, cap, is_made);
      return cap;
    }
    units = units_at(cut, std::max<int64_t>(32, G), is_made);
    if (fills_slots(units, w, opt)) return std::max<int64_t>(32, G);
    units = units_at(cut, std::max<int64_t>(16, G), is_made);
    return std::max<int64_t>(16, G);
  };

  // The highest cut (subtree roots) whose units fill the slots; failing that,
  // the one with the most units (a lower cut splits a subtree that is too
  // small to fill the GPU into its compact children, for more CTAs). `out`
  // holds the best cut's units: copied where they were made, else made once
  // the cut is chosen.
  best_roots.clear();
  size_t best_units = 0;
  int64_t best_cap = 0;
  bool taken = false, best_made = false;
  while (!roots.empty()) {
    size_t units = 0;
    bool is_made = false;
    const int64_t cap = cap_at(roots, units, is_made);
    const bool full = fills_slots(units, w, opt);
    if (units > best_units || full) {
      summary.highest_cut = !taken;
      taken = true;
      best_units = units;
      best_cap = cap;
      best_roots = roots;
      best_made = is_made;
      if (is_made) {
        out = made;  // a copy: each buffer keeps its capacity (no allocation once grown)
        summary.full_units = full_units;
        summary.full_tokens = full_tokens;
        summary.full_segments = full_segments;
      }
    }
    if (full || rows > 0) break;
    next.clear();
    for (const int32_t v : roots)
      for (int32_t k = ix.child_offset[v]; k < ix.child_offset[v + 1]; ++k)
        if (is_compact[ix.children[k]]) next.push_back(ix.children[k]);
    std::swap(roots, next);
  }
  if (!taken) return;
  if (!best_made) {
    group(best_roots, best_cap, out);
    summary.full_units = full_units;
    summary.full_tokens = full_tokens;
    summary.full_segments = full_segments;
  }
  if (out.size() == 0) return;
  summary.units = int64_t(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    summary.queries += int64_t(out.queries(i).size());
    summary.tokens += out.tokens(i);
    summary.segments += int64_t(out.segs(i).size());
  }
  for (const int32_t v : best_roots) covered[v] = 1;
  for (const int32_t v : ix.bfs_order) {
    const int32_t p = ix.parent[v];
    covered[v] |= p >= 0 ? covered[p] : 0;
  }
}

void SubtreeQueries::build(const Workload& w, const TreeIndex& ix) {
  const size_t n = w.tree.nodes.size();
  // The index numbers the queries in this order: its ranges are these.
  begin.assign(ix.query_begin.begin(), ix.query_begin.end());
  end.resize(n);
  for (size_t v = 0; v < n; ++v) end[v] = begin[v] + ix.subtree_queries[v];
  // Each node's own queries, by id, at the front of its range.
  fill_.assign(begin.begin(), begin.end());
  queries.resize(w.query_nodes.size());
  for (int32_t q = 0; q < w.num_queries(); ++q) queries[size_t(fill_[w.query_nodes[q]]++)] = q;
}

}  // namespace treeattn::planning

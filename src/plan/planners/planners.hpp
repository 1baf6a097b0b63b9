// Declarations of the built-in planners and the helpers they share. Each
// planner is a pure function; src/plan/registry.cpp lists them by name. The
// helpers take the memory they reuse (PlanScratch::Buffers) as arguments.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "treeattn/cost_models.hpp"
#include "treeattn/planner.hpp"

namespace treeattn {

Plan plan_auto(const Workload& w, const PlanOptions& opt);
Plan plan_per_query(const Workload& w, const PlanOptions& opt);
Plan plan_node(const Workload& w, const PlanOptions& opt);
// The same into reused memory (ReusingPlannerFn).
void plan_auto_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch, Plan& out);
void plan_per_query_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch,
                            Plan& out);
void plan_node_reusing(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, PlanScratch& scratch, Plan& out);
Plan plan_node_chunk(const Workload& w, const PlanOptions& opt);
Plan plan_flatten(const Workload& w, const PlanOptions& opt);
Plan plan_fasttree(const Workload& w, const PlanOptions& opt);
Plan plan_pat(const Workload& w, const PlanOptions& opt);
Plan plan_forge(const Workload& w, const PlanOptions& opt);

namespace planning {

// A reusing planner run as a pure function: the index and memory made for this call.
Plan plan_once(ReusingPlannerFn fn, const Workload& w, const PlanOptions& opt);

// The longest unit (in tokens) that keeps the GPU evenly busy: the even share
// of `work_tokens` over the resident CTA slots per kv head, never below
// opt.min_split_tokens. Longer units are split along KV (flash-decoding), so
// one long node cannot become the tail of the whole launch.
int64_t split_length(int64_t work_tokens, const Workload& w, const PlanOptions& opt);

// For jobs of (tokens, copies), each cut into ceil(tokens / P) equal pieces:
// the P whose pieces finish first when scheduled longest first onto the
// resident CTA slots per kv head (each piece costing its tokens plus one
// 64-token tile of fixed cost), of these candidates: split_length of the
// total work, and the least P >= opt.min_split_tokens that fits every piece
// in one wave (no piece waits for a slot). A second, partial wave costs a
// whole piece; one long unsplit job in one wave costs more (a 4000-token
// prompt beside 32 leaves). Where split_length is the choice (no P fits one
// wave, or the one that does finishes later) and it cuts the longest job,
// the lengths that cut that job into 1-3 pieces fewer are candidates too,
// taken where the schedule finishes at least 5 % earlier: many short jobs
// beside a long one (a speculative token tree on its prefix) leave the long
// job's pieces a partial wave at split_length. The model leaves out what a
// piece costs beyond its tokens (its partial slot, the merge) and errs by
// more than 5 % both ways: more pieces than split_length's ran slower where
// it predicted faster, and gains it put under 5 % went either way
// (docs/planners.md, "node").
// ctas_per_sm: the resident CTAs per SM whose slots the pieces fill (0:
// opt.ctas_per_sm).
struct SplitScratch {  // balanced_split_length's memory: groups (value, count)
  std::vector<std::pair<int64_t, int64_t>> jobs, pieces, slots;
};
int64_t balanced_split_length(const std::vector<std::pair<int64_t, int64_t>>& jobs, const Workload& w,
                              const PlanOptions& opt, SplitScratch& scratch, int64_t ctas_per_sm = 0);
// balanced_split_length's schedule: the latest finish of `jobs` (tokens,
// copies; both > 0), each cut into k = ceil(tokens / p) pieces of
// ceil(tokens / k) and floor(tokens / k) tokens, scheduled longest first onto
// `slots` equal slots, a piece taking its tokens plus piece_cost.
int64_t longest_first_finish(const std::vector<std::pair<int64_t, int64_t>>& jobs, int64_t p, int64_t slots,
                             int64_t piece_cost, SplitScratch& scratch);

// node's longest path in a compact subtree, in tokens (option flat_tokens).
constexpr int64_t kDefaultFlatTokens = 512;
// Compact subtrees with leaves of at most this many tokens are always taken;
// longer ones by a byte rule (node.cpp).
constexpr int64_t kShortLeafTokens = 2 * kDefaultKvTile;
// node's ratios for its compact-subtree trades (NodeShape; measured, in
// docs/planners.md "node").
constexpr double kDefaultRereadPerSlotByte = 2.5, kDefaultCompactStretch = 2.5;
// node's shape: the Q rows of a compact subtree's units (0: node's own
// choice, 32 or else 16) and the most Q rows of a node's tiles (options
// flat_rows, tile_rows); the CTAs per SM whose slots node's KV split fills
// (split_sm_ctas; 0: opt.ctas_per_sm); the longest path in a compact
// subtree (flat_tokens). node takes them from the options (node_shape, which
// checks them); auto prices other shapes.
struct NodeShape {
  int64_t compact_rows = 0;
  int64_t tile_rows = kMaxTileRows;
  int64_t split_ctas_per_sm = 0;
  int64_t flat_tokens = kDefaultFlatTokens;  // the longest path in a compact subtree (0: none)
  // node's two trades of compact subtrees, as ratios (options reread_ratio
  // and compact_stretch; measured: docs/planners.md "node" and "auto"):
  // compact subtrees with long leaves are taken where the KV they re-read is
  // at most `reread_per_slot_byte` bytes per byte of partial slots they save;
  // compact units too few to fill the GPU are kept where their longest is at
  // most `compact_stretch` times the longest unit of the plan without them.
  double reread_per_slot_byte = kDefaultRereadPerSlotByte;
  double compact_stretch = kDefaultCompactStretch;

  NodeShape with_compact_rows(int64_t v) const { NodeShape s = *this; s.compact_rows = v; return s; }
  NodeShape with_tile_rows(int64_t v) const { NodeShape s = *this; s.tile_rows = v; return s; }
  NodeShape with_split_ctas_per_sm(int64_t v) const { NodeShape s = *this; s.split_ctas_per_sm = v; return s; }
  NodeShape with_flat_tokens(int64_t v) const { NodeShape s = *this; s.flat_tokens = v; return s; }
};
NodeShape node_shape(const PlanOptions& opt);
// node (plan_node_reusing) of the given shape, with the tree's subtree
// queries and down paths (scratch's sub and down, which do not depend on the
// shape) already built: plan_node_reusing builds them, and auto's other
// shapes of the same tree reuse them. Leaves in scratch (compact_units) the
// summary of the plan's compact-subtree units.
void plan_node_shaped(const Workload& w, const TreeIndex& ix, const PlanOptions& opt, const NodeShape& shape,
                      PlanScratch& scratch, Plan& out);
// The same plan's units before the plan is built from them (ProtoUnits::
// emit, PlanBuilder::finish): what auto prices a shape by. They live in
// scratch, until its next plan.
class ProtoUnits;
const ProtoUnits& node_shaped_units(const Workload& w, const TreeIndex& ix, const PlanOptions& opt,
                                    const NodeShape& shape, PlanScratch& scratch);
// auto_cost_features of the plan `units` make (PlanBuilder: a unit's tile
// from its rows, masked where a mask is neither ~0 nor full, k partial slots
// for a query in k > 1 units), the unique KV left 0, without making it;
// nothing where that plan would hold more (a query in no unit: its path is
// empty). units_of_query: memory.
std::optional<AutoCostFeatures> unit_cost_features(const Workload& w, const ProtoUnits& units, const PlanOptions& opt,
                                                   std::vector<int32_t>& units_of_query);

// Whether `units` units (each run once per kv head) fill three quarters of
// the resident CTA slots.
bool fills_slots(size_t units, const Workload& w, const PlanOptions& opt);

// The planner knob `key` of opt.extra as an integer >= `min` (`fallback` when
// unset); throws Error naming the planner, the knob and the value otherwise.
int64_t integer_option(const PlanOptions& opt, const char* planner, const char* key, int64_t fallback, int64_t min);

// Units before they are handed to PlanBuilder, in flat arrays reused from
// call to call: unit i has its segments, and its queries each with a mask of
// the segments it sees (bit k: segment k of the unit). Units are built at the
// end: add_segment / add_query extend the open unit, close() ends it.
class ProtoUnits {
 public:
  size_t size() const { return seg_end_.size(); }  // closed units
  void clear();
  std::span<const Segment> segs(size_t i) const {
    return {segs_.data() + first(seg_end_, i), segs_.data() + seg_end_[i]};
  }
  std::span<const int32_t> queries(size_t i) const {
    return {queries_.data() + first(query_end_, i), queries_.data() + query_end_[i]};
  }
  std::span<const uint64_t> masks(size_t i) const {
    return {masks_.data() + first(query_end_, i), masks_.data() + query_end_[i]};
  }
  int64_t tokens(size_t i) const {
    int64_t n = 0;
    for (const Segment& s : segs(i)) n += s.size();
    return n;
  }

  // The open unit.
  std::span<const Segment> open_segs() const {
    return {segs_.data() + (seg_end_.empty() ? 0 : seg_end_.back()), segs_.data() + segs_.size()};
  }
  size_t open_queries() const { return queries_.size() - (query_end_.empty() ? 0 : query_end_.back()); }
  void add_segment(const Segment& s) { segs_.push_back(s); }
  void add_query(int32_t q, uint64_t mask) {
    queries_.push_back(q);
    masks_.push_back(mask);
  }
  void add_queries(std::span<const int32_t> qs, uint64_t mask) {
    queries_.insert(queries_.end(), qs.begin(), qs.end());
    masks_.resize(queries_.size(), mask);
  }
  void close() {
    seg_end_.push_back(int32_t(segs_.size()));
    query_end_.push_back(int32_t(queries_.size()));
  }
  void discard_open();
  // Appends unit i of `from` as a closed unit.
  void append(const ProtoUnits& from, size_t i);
  // Hands the closed units to b (PlanBuilder::add_units).
  void emit(PlanBuilder& b) const;
  // The plan of the closed units alone, into `out` (whose memory it reuses).
  void plan(const Workload& w, const std::string& planner, Plan& out) const;

 private:
  static size_t first(const std::vector<int32_t>& end, size_t i) { return i == 0 ? 0 : size_t(end[i - 1]); }
  std::vector<Segment> segs_;
  std::vector<int32_t> queries_;
  std::vector<uint64_t> masks_;
  std::vector<int32_t> seg_end_, query_end_;  // per closed unit: one past its last segment, query
};

// Each node's subtree queries in depth-first order (so groups of consecutive
// queries share paths): a node's own queries by id, then each child's list in
// child order. One array; sub[v] is v's range of it.
struct SubtreeQueries {
  std::vector<int32_t> queries;
  std::vector<int32_t> begin, end;  // per node
  std::span<const int32_t> operator[](int32_t v) const {
    return {queries.data() + begin[v], queries.data() + end[v]};
  }
  void build(const Workload& w, const TreeIndex& ix);

 private:
  std::vector<int32_t> fill_;  // memory of build()
};

// Per node v with queries below it: the longest path from v down to one of
// them, in tokens and in non-empty segments, the longest leaf (node without
// queries below) under v, and whether v has a child with queries; zeros
// for the other nodes.
struct DownPaths {
  std::vector<int64_t> tokens, segments, leaf;
  std::vector<char> branches;
  // Of v's subtree: the queries whose path from v holds a token
  // (with_tokens), and the non-empty nodes with queries below (path_nodes):
  // what compact_subtree_units counts a cut's units by.
  std::vector<int32_t> with_tokens, path_nodes;
  void build(const Workload& w, const TreeIndex& ix);
};

// Whether v's subtree qualifies as a compact subtree of paths of at most
// `max_tokens` tokens and leaves of at most `max_leaf_tokens` (its parent's
// may too): queries below it, a child with queries, at most 64 non-empty
// nodes on a path.
inline bool compact_subtree_root(const TreeIndex& ix, const DownPaths& down, size_t v, int64_t max_tokens,
                                 int64_t max_leaf_tokens) {
  return (ix.subtree_queries[v] > 0) & (down.branches[v] != 0) & (down.tokens[v] <= max_tokens) &
         (down.segments[v] <= kMaxSegmentsPerUnit) & (down.leaf[v] <= max_leaf_tokens);
}

// The least `flat_tokens` at which compact subtrees of paths (and leaves)
// of up to `flat_tokens` tokens hold a subtree that paths of up to `shorter`
// tokens leave out (its paths are all longer than `shorter`) with more than
// `rows` Q rows of queries; INT64_MAX where none does at any length. A
// subtree qualifies at every length from the longer of its longest path and
// its longest leaf on. `down` of the tree.
int64_t shortest_deeper_compact_paths(const Workload& w, const TreeIndex& ix, const DownPaths& down, int64_t shorter,
                                      int64_t rows);

// Packs short units (at most `max_tokens` tokens) of at most 2 Q rows (a
// tree's leaves at GQA ratio 1 or 2) into shared 16-row units, each query
// masked to its own segments. The rows were padded to 16 anyway, so the
// tensor-core work is unchanged, while one CTA streams 8-16 short nodes
// through its pipeline instead of each waiting for its one K/V tile and
// leaving; packs of 4 four-row leaves and 32- or 64-row packs measured
// slower (docs/cuda.md, "Tried and measured"). Packs stay small
// enough that the units x kv heads still fill the resident CTA slots; units
// that share a query are not packed. Returns whether any are: `out` then
// holds the units, packed; else it is left as it was and `units` stand.
// pack: memory for the pack being filled.
struct PackScratch {
  ProtoUnits pack;
  std::vector<int32_t> queries;  // the pack's, sorted
};
bool pack_short_units(const ProtoUnits& units, int64_t max_tokens, const Workload& w, const PlanOptions& opt,
                      ProtoUnits& out, PackScratch& pack);
// Units for a tree's compact subtrees: the highest subtrees (of more than one
// node with queries) in which every query's path is at most `max_tokens`
// tokens and 64 segments, whose leaves (nodes without queries below) are at
// most `max_leaf_tokens` long. Each unit takes consecutive (depth-first) queries of
// one such subtree, up to `rows` Q rows (0: 32, or 16 when 32-row units
// would not fill three quarters of the resident CTA slots), and the union of
// their paths inside it, each query masked to its own path. The subtrees are
// the highest such, or, where their units do not fill the slots, the cut
// below them (their compact children) that gives the most units. The subtree's shared nodes are then read once
// per unit (mostly from L2, being short) instead of once per node and query
// tile into partial slots that a merge must fold: a query whose whole path is
// in one compact subtree is written directly. covered[v] is set for the
// subtrees' nodes (the caller plans the rest). `out`: the units (replaced).
// down: the tree's DownPaths (the same for every max_tokens).
// Totals of compact_subtree_units' units (0: none), of those among them
// closed by the rows or segment limit before their subtree's end (the only
// units more rows could merge away, in subtrees of the same cut), whether
// they are the highest cut's, and the limits they were found with.
struct CompactUnitsSummary {
  int64_t units = 0, queries = 0, tokens = 0, segments = 0;
  int64_t full_units = 0, full_tokens = 0, full_segments = 0;
  bool highest_cut = false;
  int64_t max_tokens = 0, max_leaf_tokens = 0;
};
struct CompactScratch {
  std::vector<int32_t> path, roots, best_roots, next, opened_in;
  std::vector<uint64_t> path_mask;
  std::vector<char> is_compact;
  ProtoUnits made;
};
void compact_subtree_units(const Workload& w, const TreeIndex& ix, const SubtreeQueries& sub, const DownPaths& down,
                           int64_t max_tokens, int64_t max_leaf_tokens, int64_t rows, const PlanOptions& opt,
                           std::vector<char>& covered, ProtoUnits& out, CompactUnitsSummary& summary,
                           CompactScratch& scratch);

// node's folds (plan_node): folded[v]: v has no units of its own; its
// segment opens the first KV piece of each child with queries. The first
// piece of a node whose parent is folded opens with the segments of the
// chain[v] folded ancestors directly above it (chain_tokens[v] tokens); both
// are read only for such nodes. Only uncovered nodes with tokens are folded
// into or receive a prefix, so every query still sees each token of its path
// exactly once. planned: the nodes planned as nodes, in BFS order.
struct FoldPlan {
  std::vector<char> folded;
  std::vector<int32_t> chain;
  std::vector<int64_t> chain_tokens;
  std::vector<int32_t> planned;
};

// What node's folds need of a tree, the same for each candidate: the nodes
// with tokens and queries below them, in BFS order (a candidate plans those
// it does not cover), and whether each may be folded where none of its
// children is covered and its prefix is short enough: it has no queries of
// its own, every child with queries has tokens, and re-reading it per extra
// Q tile of its children costs fewer bytes than its queries' partial slots.
struct FoldCandidates {
  std::vector<int32_t> with_queries;
  std::vector<char> foldable;
};

// One way node may plan a tree (plan_node): the units of its compact
// subtrees and the nodes they cover, then the folds and the KV piece length
// of the nodes left.
struct NodeCandidate {
  ProtoUnits compact;
  CompactUnitsSummary summary;  // of `compact`
  std::vector<char> covered;
  FoldPlan fold;
  int64_t piece = 0;
  bool cuts = false;     // some node (with its folded prefix) is longer than `piece`: cut into pieces
  int32_t per_tile = 1;  // queries per Q tile of a node's units
};

}  // namespace planning

// Everything the reusing planners keep between calls.
struct PlanScratch::Buffers {
  planning::SubtreeQueries sub;
  planning::DownPaths down;
  // node: the taken candidate's units and the alternative's, each unpacked (raw) and packed
  planning::ProtoUnits raw, packed, raw_alternative, packed_alternative;
  planning::CompactScratch compact;
  planning::PackScratch pack;
  planning::NodeCandidate candidates[2];
  planning::FoldCandidates fold_candidates;
  std::vector<std::pair<int64_t, int64_t>> jobs;
  planning::SplitScratch split;
  std::vector<int32_t> units_of_query, query_diff, path;
  std::vector<int32_t> query_tiles;  // node: query_tiles[k], the Q tiles of k queries (a table: no division)
  std::vector<Segment> segments;
  planning::CompactUnitsSummary compact_units;  // of node's last plan (plan_node_shaped)
  bool node_cuts = false;                        // node's last plan cut a node into KV pieces
  planning::ProtoUnits wider;                    // auto: compact units of more rows
  planning::CompactUnitsSummary wider_summary;
  std::vector<char> wider_covered;
  std::vector<int64_t> estimate_tokens, estimate_segments;  // auto: whole-tree compact units, estimated
  Plan other;  // auto: the candidate beside `out`
  std::vector<int32_t> candidate_units_of_query;  // auto: a candidate's units per query
};

}  // namespace treeattn

// Declarations of the built-in planners and the helpers they share. Each
// planner is a pure function; src/plan/registry.cpp lists them by name.
#pragma once

#include <utility>
#include <vector>

#include "treeattn/planner.hpp"

namespace treeattn {

Plan plan_auto(const Workload& w, const PlanOptions& opt);
Plan plan_per_query(const Workload& w, const PlanOptions& opt);
Plan plan_node(const Workload& w, const PlanOptions& opt);
Plan plan_node_chunk(const Workload& w, const PlanOptions& opt);
Plan plan_flatten(const Workload& w, const PlanOptions& opt);
Plan plan_fasttree(const Workload& w, const PlanOptions& opt);
Plan plan_pat(const Workload& w, const PlanOptions& opt);
Plan plan_forge(const Workload& w, const PlanOptions& opt);

namespace planning {

// Cuts an ordered list of segments into pieces of at most `max_tokens` tokens
// (cuts may fall inside a segment) and at most kMaxSegmentsPerUnit segments.
// Empty segments are dropped; an all-empty list gives no piece.
std::vector<std::vector<Segment>> split_segments(const std::vector<Segment>& segs, int64_t max_tokens);

// The longest unit (in tokens) that keeps the GPU evenly busy: the even share
// of `work_tokens` over the resident CTA slots per kv head, never below
// opt.min_split_tokens. Longer units are split along KV (flash-decoding), so
// one long node cannot become the tail of the whole launch.
int64_t split_length(int64_t work_tokens, const Workload& w, const PlanOptions& opt);

// For jobs of (tokens, copies), each cut into ceil(tokens / P) equal pieces:
// the P, of two candidates, whose pieces finish first when scheduled longest
// first onto the resident CTA slots per kv head (each piece costing its tokens
// plus one 64-token tile of fixed cost): split_length of the total work, and
// the least P >= opt.min_split_tokens that fits every piece in one wave (no
// piece waits for a slot). A second, partial wave costs a whole piece; one
// long unsplit job in one wave costs more (a 4000-token prompt beside 32
// leaves).
int64_t balanced_split_length(const std::vector<std::pair<int64_t, int64_t>>& jobs, const Workload& w,
                              const PlanOptions& opt);

// Whether `units` units (each run once per kv head) fill three quarters of
// the resident CTA slots.
bool fills_slots(size_t units, const Workload& w, const PlanOptions& opt);

// [begin, end) of `seg` cut into ceil(size / max_tokens) pieces whose sizes
// differ by at most one token.
std::vector<Segment> split_evenly(const Segment& seg, int64_t max_tokens);

// The planner knob `key` of opt.extra as an integer >= `min` (`fallback` when
// unset); throws Error naming the planner, the knob and the value otherwise.
int64_t integer_option(const PlanOptions& opt, const char* planner, const char* key, int64_t fallback, int64_t min);

// A unit before it is handed to PlanBuilder: its segments and queries, query
// i seeing the segments whose bits are set in masks[i].
struct ProtoUnit {
  std::vector<Segment> segs;
  std::vector<int32_t> queries;
  std::vector<uint64_t> masks;
  int64_t tokens() const;
};

// Packs short units (at most `max_tokens` tokens) of at most 2 Q rows (a
// tree's leaves at GQA ratio 1 or 2) into shared 16-row units, each query
// masked to its own segments. The rows were padded to 16 anyway, so the
// tensor-core work is unchanged, while one CTA streams 8-16 short nodes
// through its pipeline instead of each waiting for its one K/V tile and
// leaving. Measured (node, 32/32, same machine, two rounds):
// fasttree:N=1,256:C=256,32 80-82 -> 75 us, C=256,16 72 -> 56.5 us; packs of
// 4 four-row leaves at 32/8 were slower (C=256,32 37.6 -> 38.4 us, C=256,64
// 52.5 -> 56.1 us), and so were 32- and 64-row packs. Packs stay small
// enough that the units x kv heads still fill the resident CTA slots; units
// that share a query are not packed.
std::vector<ProtoUnit> pack_short_units(std::vector<ProtoUnit> units, int64_t max_tokens, const Workload& w,
                                        const PlanOptions& opt);
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
// subtrees' nodes (the caller plans the rest).
std::vector<ProtoUnit> compact_subtree_units(const Workload& w, const TreeIndex& ix,
                                             const std::vector<std::vector<int32_t>>& sub, int64_t max_tokens,
                                             int64_t max_leaf_tokens, int64_t rows, const PlanOptions& opt,
                                             std::vector<char>& covered);
void emit_units(PlanBuilder& b, const std::vector<ProtoUnit>& units);

// Queries grouped by the node they attach to, and each node's subtree
// queries in depth-first order (so groups of consecutive queries share paths).
std::vector<std::vector<int32_t>> subtree_queries(const Workload& w, const TreeIndex& ix);

}  // namespace planning
}  // namespace treeattn

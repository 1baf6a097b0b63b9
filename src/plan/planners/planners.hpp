// Declarations of the built-in planners and the helpers they share. Each
// planner is a pure function; src/plan/registry.cpp lists them by name.
#pragma once

#include <utility>
#include <vector>

#include "treeattn/planner.hpp"

namespace treeattn {

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

// [begin, end) of `seg` cut into ceil(size / max_tokens) pieces whose sizes
// differ by at most one token.
std::vector<Segment> split_evenly(const Segment& seg, int64_t max_tokens);

// Queries grouped by the node they attach to, and each node's subtree
// queries in depth-first order (so groups of consecutive queries share paths).
std::vector<std::vector<int32_t>> subtree_queries(const Workload& w, const TreeIndex& ix);

}  // namespace planning
}  // namespace treeattn

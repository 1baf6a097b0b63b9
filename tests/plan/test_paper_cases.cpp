// The papers' worked cases, reproduced on the planners and their cost models:
// FastTree Fig. 4, PAT Fig. 6, DeFT Fig. 3 and FlashForge's makespan bound.
#include <gtest/gtest.h>

#include <set>

#include "treeattn/cost_models.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/pat_planner.hpp"
#include "treeattn/planner.hpp"

using namespace treeattn;

namespace {

struct NodeSpec {
  int32_t parent;
  int32_t tokens;
  int queries;  // attached to this node
};

Workload make_tree(const std::vector<NodeSpec>& nodes, HeadConfig heads = {1, 1, 128}, int page = 16) {
  Workload w;
  w.heads = heads;
  w.layout.page_size = page;
  w.layout.dtype = DType::fp32;
  PageAllocator alloc(page, 11);
  for (const NodeSpec& n : nodes) {
    const int32_t v = alloc.add_node(w.tree, n.parent, n.tokens);
    for (int i = 0; i < n.queries; ++i) w.query_nodes.push_back(v);
  }
  w.layout.num_pages = alloc.finish(w.tree);
  w.validate();
  return w;
}

void expect_matches_reference(const Workload& w, const Plan& p) {
  validate_plan(w, p);
  HostTensors t = make_random_inputs(w, 17);
  const auto ref = reference_attention(w, t.args());
  run_cpu(w, p, t.args(), 1);
  EXPECT_LE(relative_error(w, t.out.data(), ref), 1e-5) << p.planner;
}

// Units of a plan that contain a segment of `node`.
std::vector<int32_t> units_with_node(const Plan& p, int32_t node) {
  std::vector<int32_t> us;
  for (int32_t u = 0; u < p.num_units(); ++u)
    for (int32_t k = p.unit_segment_offset[u]; k < p.unit_segment_offset[u + 1]; ++k)
      if (p.segments[k].node == node) {
        us.push_back(u);
        break;
      }
  return us;
}

}  // namespace

// ---- FastTree Fig. 4 ---------------------------------------------------------
// A node v shared by two children. Plan 1 splits KV: v is one group of all
// queries, each child its own group. Plan 2 concatenates v into each child's
// group. With a Q tile of 16: 8 queries per child fill the tile only when v's
// group holds both children's queries, so plan 1 wins; with 128 per child every
// tile is full either way and plan 1 only adds partials, so plan 2 wins.

TEST(PaperCases, FastTreeFig4Plan1WinsWithEightQueriesPerChild) {
  FastTreeParams p;
  p.q_tile_rows = {16, 16};
  p.group_size = 1;
  p.head_dim = 128;
  const int64_t len_v = 256, len_l = 256;
  // First child: v's group has 16 queries (both children).
  const double split_kv = fasttree_split_kv_cost(p, 16, 8, len_v, len_l);
  const double split_q = fasttree_split_q_cost(p, 16, 8, len_v, len_l);
  EXPECT_LT(split_kv, split_q);
  // Hand values: split KV pads only the child's tile (8 empty rows x 256 tokens x d)
  // and writes 8 partials; concatenating pads v's remaining 8 rows over 256 tokens
  // and the child's 8 rows over 512 tokens.
  EXPECT_NEAR(split_kv, 0.66 * 8 * 256 * 128 + 0.1 * 8 * 128, 1e-6);
  EXPECT_NEAR(split_q, 0.66 * 8 * 256 * 128 + 0.66 * 8 * 512 * 128, 1e-6);

  const Workload w = make_tree({{-1, len_v, 0}, {0, len_l, 8}, {0, len_l, 8}});
  PlanOptions opt;
  opt.extra = {{"q_tile0", 16}, {"q_tile1", 16}};
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  const FastTreeAssignment a = fasttree_assign(w, ix, FastTreeParams::from(w, opt));
  EXPECT_EQ(a.concat, (std::vector<uint8_t>{0, 0, 0}));  // plan 1
  const Plan plan = make_plan("fasttree", w, opt);
  expect_matches_reference(w, plan);
  // v's KV is loaded once (one 16-query tile), so the plan moves exactly the unique KV.
  EXPECT_EQ(summarize(w, plan).kv_bytes, w.unique_kv_bytes());
}

TEST(PaperCases, FastTreeFig4Plan2WinsWithManyQueriesPerChild) {
  FastTreeParams p;
  p.q_tile_rows = {16, 16};
  const int64_t len_v = 256, len_l = 256;
  const double split_kv = fasttree_split_kv_cost(p, 256, 128, len_v, len_l);
  const double split_q = fasttree_split_q_cost(p, 256, 128, len_v, len_l);
  EXPECT_GT(split_kv, split_q);
  EXPECT_NEAR(split_kv, 0.1 * 128 * 128, 1e-9);  // no padding at all, only the partials
  EXPECT_DOUBLE_EQ(split_q, 0.0);
  // Second child, after the first was concatenated: v keeps 128 queries.
  EXPECT_GT(fasttree_split_kv_cost(p, 128, 128, len_v, len_l), fasttree_split_q_cost(p, 128, 128, len_v, len_l));

  const Workload w = make_tree({{-1, len_v, 0}, {0, len_l, 128}, {0, len_l, 128}});
  PlanOptions opt;
  opt.num_sms = 1;  // the grid fills: no long-context split cuts v from its child
  opt.extra = {{"q_tile0", 16}, {"q_tile1", 16}};
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  const FastTreeAssignment a = fasttree_assign(w, ix, FastTreeParams::from(w, opt));
  EXPECT_EQ(a.concat, (std::vector<uint8_t>{0, 1, 1}));  // plan 2
  EXPECT_EQ(a.virtual_len[1], len_v + len_l);
  const Plan plan = make_plan("fasttree", w, opt);
  expect_matches_reference(w, plan);
  // No query needs a partial for v: every unit holding v also holds the child.
  for (const int32_t u : units_with_node(plan, 0)) EXPECT_EQ(plan.unit_num_segments(u), 2) << "unit " << u;
}

TEST(PaperCases, FastTreePadFormula) {
  EXPECT_EQ(fasttree_pad(16, 8), 8);
  EXPECT_EQ(fasttree_pad(16, 16), 0);
  EXPECT_EQ(fasttree_pad(16, 17), 15);
  EXPECT_EQ(fasttree_pad(64, 1), 63);
  EXPECT_EQ(fasttree_pad(16, 0), 0);
}

// ---- PAT Fig. 6 --------------------------------------------------------------
// Node u (l_u = 100 tokens) with children c (s_c queries) and d (20 queries),
// all in one CTA: merging u into c costs one more load of u's 100 tokens and
// saves 4 units per query of c, so c is merged exactly when 4 * s_c > 100.

TEST(PaperCases, PatFig6MergeRule) {
  EXPECT_FALSE(pat_should_merge(44, 24, 100, 64));  // 96 < 100: split
  EXPECT_FALSE(pat_should_merge(45, 25, 100, 64));  // 100 = 100: split (strict)
  EXPECT_TRUE(pat_should_merge(46, 26, 100, 64));   // 104 > 100: merge
  // u has no other queries: merging never adds a load.
  EXPECT_TRUE(pat_should_merge(5, 5, 100000, 64));
  // Groups spanning several CTAs: u's KV is loaded ceil(S/mm) times either way.
  EXPECT_TRUE(pat_should_merge(128, 64, 1000, 64));
}

TEST(PaperCases, PatFig6SplitBelowAndMergeAbove) {
  for (const int s_c : {24, 26}) {
    const Workload w = make_tree({{-1, 100, 0}, {0, 16, s_c}, {0, 16, 20}});
    const Plan plan = make_plan("pat", w);
    expect_matches_reference(w, plan);
    const auto u_units = units_with_node(plan, 0);
    const auto c_units = units_with_node(plan, 1);
    ASSERT_EQ(c_units.size(), 1u);
    const bool c_has_u = std::count(u_units.begin(), u_units.end(), c_units[0]) > 0;
    if (s_c == 24) {
      EXPECT_FALSE(c_has_u) << "4 * 24 < 100: c keeps its own KV only";
      EXPECT_EQ(u_units.size(), 1u) << "u's KV loaded once, for c's and d's 44 queries";
    } else {
      EXPECT_TRUE(c_has_u) << "4 * 26 > 100: u's KV is merged into c's unit";
      // c merged, then d (20 queries, all that is left in u): merged too.
      EXPECT_EQ(u_units.size(), 2u);
      EXPECT_EQ(plan.num_slots, 0) << "every query is in exactly one unit";
    }
  }
}

TEST(PaperCases, PatUnitsAreGroupedByTile) {
  // Mixed group sizes give several tile configs; each appears as one run.
  const Workload w = make_tree({{-1, 600, 0}, {0, 50, 3}, {0, 70, 40}, {0, 10, 1}, {2, 300, 70}}, {4, 2, 64});
  const Plan plan = make_plan("pat", w);
  expect_matches_reference(w, plan);
  std::set<int> seen;
  for (const TileRun& r : tile_runs(plan)) EXPECT_TRUE(seen.insert(r.tile).second) << "tile " << r.tile << " split into two runs";
}

// ---- DeFT Fig. 3 -------------------------------------------------------------
// KV0 (200 tokens) shared by Q1 (KV1, 40 tokens) and Q2 (KV2, 40 tokens),
// flattened depth-first and cut into 128-token blocks:
//   block 0: KV0[0, 128)                    Q1, Q2 see everything
//   block 1: KV0[128, 200) KV1[0, 40) KV2[0, 16)  mixed: Q1 0b011, Q2 0b101
//   block 2: KV2[16, 40)                    Q2
// Every token of KV0 is loaded once.

TEST(PaperCases, DeftFig3FlattenLoadsKV0OnceAndMasksMixedBlock) {
  const Workload w = make_tree({{-1, 200, 0}, {0, 40, 1}, {0, 40, 1}});
  PlanOptions opt;
  opt.chunk_tokens = 128;
  opt.extra["fill"] = 0;
  const Plan plan = make_plan("flatten", w, opt);
  expect_matches_reference(w, plan);
  ASSERT_EQ(plan.num_units(), 3);
  EXPECT_EQ(summarize(w, plan).kv_bytes, w.unique_kv_bytes());

  int64_t kv0_tokens = 0;
  for (const Segment& s : plan.segments)
    if (s.node == 0) kv0_tokens += s.size();
  EXPECT_EQ(kv0_tokens, 200) << "KV0 loaded once";

  // Block 1 is the mixed one.
  const int32_t u = 1;
  ASSERT_EQ(plan.unit_num_segments(u), 3);
  const Segment* s = &plan.segments[plan.unit_segment_offset[u]];
  EXPECT_EQ((std::vector<int32_t>{s[0].node, s[0].begin, s[0].end}), (std::vector<int32_t>{0, 128, 200}));
  EXPECT_EQ((std::vector<int32_t>{s[1].node, s[1].begin, s[1].end}), (std::vector<int32_t>{1, 0, 40}));
  EXPECT_EQ((std::vector<int32_t>{s[2].node, s[2].begin, s[2].end}), (std::vector<int32_t>{2, 0, 16}));
  EXPECT_TRUE(plan.unit_masked[u]);
  ASSERT_EQ(plan.unit_num_queries(u), 2);
  const int32_t e = plan.unit_query_offset[u];
  EXPECT_EQ(plan.entry_query[e], 0);
  EXPECT_EQ(plan.entry_mask[e], 0b011u);
  EXPECT_EQ(plan.entry_query[e + 1], 1);
  EXPECT_EQ(plan.entry_mask[e + 1], 0b101u);
  EXPECT_FALSE(plan.unit_masked[0]);
  EXPECT_EQ(plan.unit_num_queries(2), 1);
}

// ---- FlashForge makespan bound -------------------------------------------------
// Four tasks of cost 8, 4, 2, 2 (C linear in KV): on 4 slots (as many tasks
// as slots) the paper's bisection would divide nothing (cost_l = 8); ours
// takes the average load 16 / 4 = 4 as the bound there, so 8 -> 2 parts and
// LPT reaches a makespan of 4 instead of 8; on 6 slots cost_l = 4: 8 -> 2 parts, 4, 2, 2 -> 1 each
// (5 subtasks); 3.99 would need 3 + 2 + 1 + 1 = 7 > 6. LPT then reaches a
// makespan of 4 = cost_l.

TEST(PaperCases, ForgeBoundOnHandComputedCase) {
  const std::vector<double> cost = {8, 4, 2, 2};
  const std::vector<int32_t> caps = {100, 100, 100, 100};
  ForgeDivision d4 = forge_divide(cost, caps, 4);
  EXPECT_DOUBLE_EQ(d4.cost_l, 4);
  EXPECT_EQ(d4.parts, (std::vector<int32_t>{2, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(forge_lpt({4, 4, 4, 2, 2}, 4).makespan, 4);
  ForgeDivision d6 = forge_divide(cost, caps, 6);
  EXPECT_DOUBLE_EQ(d6.cost_l, 4);
  EXPECT_EQ(d6.parts, (std::vector<int32_t>{2, 1, 1, 1}));
  ForgeDivision d7 = forge_divide(cost, caps, 7);  // c = 8/3: 3 + 2 + 1 + 1 = 7; below, 8/c > 3
  EXPECT_NEAR(d7.cost_l, 8.0 / 3, 1e-9);
  EXPECT_EQ(d7.parts, (std::vector<int32_t>{3, 2, 1, 1}));
  ForgeDivision d8 = forge_divide(cost, caps, 8);  // the average load 16 / 8 = 2 is reachable
  EXPECT_DOUBLE_EQ(d8.cost_l, 2);
  EXPECT_EQ(d8.parts, (std::vector<int32_t>{4, 2, 1, 1}));
  // Never below the average load per slot, whatever the caps say.
  EXPECT_GE(forge_divide(cost, caps, 64).cost_l, 16.0 / 64);

  const ForgeAssignment a = forge_lpt({4, 4, 4, 2, 2}, 6);
  EXPECT_DOUBLE_EQ(a.makespan, 4);
  EXPECT_EQ(a.order, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const ForgeAssignment b = forge_lpt({3, 3, 2, 2, 2}, 2);  // LPT: {3, 2, 2} and {3, 2}
  EXPECT_DOUBLE_EQ(b.makespan, 7);

  // The planner on the same case: four roots of 8, 4, 2, 2 x 256 tokens, one
  // query each, a table where C = KV tokens / 256.
  ForgeCostTable table;
  table.q_rows = {1, 128};
  table.kv_tokens = {256, 512};  // exactly C = kv / 256 from 256 tokens on (extrapolated)
  table.cost_us = {1, 2, 1, 2};
  const Workload w = make_tree({{-1, 8 * 256, 1}, {-1, 4 * 256, 1}, {-1, 2 * 256, 1}, {-1, 2 * 256, 1}});
  PlanOptions opt;
  opt.ctas_per_sm = 1;
  opt.min_split_tokens = 16;
  opt.num_sms = 4;
  EXPECT_EQ(plan_forge_with(w, opt, table).num_units(), 5);
  opt.num_sms = 6;
  const Plan p6 = plan_forge_with(w, opt, table);
  expect_matches_reference(w, p6);
  ASSERT_EQ(p6.num_units(), 5);
  // Emitted longest first: the two halves of the 2048-token root and the 1024-token root.
  for (int32_t u = 0; u < 3; ++u) EXPECT_EQ(p6.segments[p6.unit_segment_offset[u]].size(), 1024) << "unit " << u;
}

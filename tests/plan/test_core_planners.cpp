// Property tests of the foundation planners (per-query, node) and the CPU
// executor: over 1000+ seeded random trees, cycling through GQA ratios
// {1, 4, 8, 16}, page sizes {1, 16}, head dims {64, 128} and fp32/fp16, every
// plan passes the validator and the CPU result matches the fp64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <queue>
#include <random>

#include "plan/planners/planners.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"
#include "support/error_text.hpp"
#include "tree/builder_test_util.hpp"

using namespace treeattn;

namespace {

struct Case {
  WorkloadParams params;
  PlanOptions opt;
};

Case case_for_seed(uint64_t seed) {
  static const int ratios[] = {1, 4, 8, 16};
  Case c;
  const int ratio = ratios[seed % 4];
  c.params.heads.num_kv_heads = 1 + int(seed / 4 % 2);
  c.params.heads.num_qo_heads = c.params.heads.num_kv_heads * ratio;
  c.params.page_size = seed / 8 % 2 ? 16 : 1;
  c.params.heads.head_dim = seed / 16 % 2 ? 128 : 64;
  c.params.dtype = seed / 32 % 2 ? DType::fp16 : DType::fp32;
  if (seed % 3 == 0) c.params.kv_dtype = DType::fp8_e4m3;  // scaled fp8 pools (make_random_inputs)
  c.params.seed = seed;
  // Small GPUs and short pieces so KV splitting and merging are exercised too.
  c.opt.num_sms = int(1 + seed % 7 * 20);
  c.opt.ctas_per_sm = 1;
  c.opt.min_split_tokens = int(1 + seed % 5 * 16);
  return c;
}

double tolerance_for(DType t) { return t == DType::fp32 ? 1e-5 : 2e-3; }

}  // namespace

class CorePlanners : public ::testing::TestWithParam<const char*> {};

TEST_P(CorePlanners, ValidAndMatchReferenceOnRandomTrees) {
  const std::string planner = GetParam();
  RandomTreeOptions shape;
  shape.max_nodes = 14;
  shape.max_tokens = 48;
  int split_plans = 0;
  // $TREEATTN_PROPERTY_TREES raises the count for long runs (scripts/stress.sh).
  const uint64_t trees = treeattn_test::property_trees(1024);
  for (uint64_t seed = 0; seed < trees; ++seed) {
    const Case c = case_for_seed(seed);
    const Workload w = random_workload(seed, c.params, shape);
    const Plan p = make_plan(planner, w, c.opt);
    ASSERT_NO_THROW(validate_plan(w, p)) << "seed " << seed;
    split_plans += p.num_slots > 0;
    HostTensors t = make_random_inputs(w, seed * 7 + 1);
    const std::vector<double> ref = reference_attention(w, t.args());
    run_cpu(w, p, t.args(), 1);
    const double err = relative_error(w, t.out.data(), ref);
    ASSERT_LE(err, tolerance_for(w.layout.dtype))
        << planner << " seed " << seed << " heads " << w.heads.num_qo_heads << "/" << w.heads.num_kv_heads
        << " d " << w.heads.head_dim << " page " << w.layout.page_size << " " << to_string(w.layout.dtype) << " kv "
        << to_string(w.layout.kv_type());
  }
  EXPECT_GT(split_plans, 100) << "the random cases should exercise partials and the merge";
}

INSTANTIATE_TEST_SUITE_P(Foundation, CorePlanners, ::testing::Values("per-query", "node", "auto"));

TEST(CorePlanners, NodePlannerLoadsSharedPrefixOnce) {
  WorkloadParams p;
  const Workload w = fewshot_workload(4000, 32, 256, p);
  const PlanSummary pq = summarize(w, make_plan("per-query", w));
  const PlanSummary node = summarize(w, make_plan("node", w));
  EXPECT_EQ(node.kv_bytes, w.unique_kv_bytes());  // every token exactly once
  EXPECT_EQ(pq.kv_bytes, int64_t(32) * (4000 + 256) * w.kv_bytes_per_token());
  EXPECT_GE(double(pq.kv_bytes) / node.kv_bytes, 10.0);
}

// The useful FLOPs count each (query, path token) pair once, 4·d per qo head,
// whatever the plan: a 3-level tree, a query on an inner node and one on a
// leaf that continues an empty node.
TEST(CorePlanners, SummaryCountsUsefulFlops) {
  WorkloadParams p;  // heads 32/8, d 128
  Workload w = fasttree_workload({1, 2}, {100, 30}, p);  // root of 100 tokens, two leaves of 30
  const int32_t empty = int32_t(w.tree.nodes.size());
  w.tree.nodes.push_back(Node{1, 0, {}, 0});  // empty node under leaf 1
  w.query_nodes = {1, 2, 0, empty};
  w.validate();
  const int64_t visible = 130 + 130 + 100 + 130;
  for (const char* planner : {"per-query", "node"})
    EXPECT_EQ(summarize(w, make_plan(planner, w)).flops, visible * 32 * 4 * 128) << planner;
}

// node's KV split: a long prompt beside many short leaves is still split (one
// unsplit 4000-token unit would be the whole run's tail), and a tree whose
// pieces can all fit in one wave of CTA slots gets exactly such pieces, of
// equal length per node.
TEST(CorePlanners, NodeSplitBalancesTheSlots) {
  WorkloadParams p;  // heads 32/8: 264 target CTAs = 33 slots per kv head
  const Workload fewshot = fewshot_workload(4000, 32, 256, p);
  const Plan a = make_plan("node", fewshot);
  validate_plan(fewshot, a);
  int32_t longest = 0;
  for (const Segment& s : a.segments) longest = std::max(longest, s.size());  // node plans: one segment per unit
  EXPECT_LE(longest, 512) << "the 4000-token prompt must be split";

  const Workload tree = fasttree_workload({1, 10}, {4000, 400}, p);
  const Plan b = make_plan("node", tree);
  validate_plan(tree, b);
  EXPECT_LE(b.num_units(), 33) << "every piece fits one wave of slots";
  std::map<int32_t, std::pair<int32_t, int32_t>> by_node;  // node -> (shortest, longest) piece
  for (int u = 0; u < b.num_units(); ++u) {
    const Segment& s = b.segments[b.unit_segment_offset[u]];
    auto [it, fresh] = by_node.try_emplace(s.node, s.size(), s.size());
    it->second = {std::min(it->second.first, s.size()), std::max(it->second.second, s.size())};
  }
  for (const auto& [node, range] : by_node) EXPECT_LE(range.second - range.first, 1) << "node " << node;
}

// A speculative token tree on a long prefix (Medusa, 64 drafts on 16384
// tokens at 32/8: 2 Q tiles of the prefix beside ~20 short draft units on 33
// slots a kv head). The even share of the work cuts the prefix into 17
// pieces, 34 prefix units for 33 slots: a second wave of one piece. node
// cuts it into fewer pieces, so that its units fit one wave.
TEST(CorePlanners, NodeSplitLeavesTheLongPrefixNoPartialWave) {
  WorkloadParams p;  // heads 32/8: 264 target CTAs = 33 slots per kv head
  const Workload w =
      medusa_workload(std::string(TREEATTN_SOURCE_DIR) + "/data/workloads/APPS_tree_size64.json", 0, 10, 16384, p);
  const Plan plan = make_plan("node", w);
  validate_plan(w, plan);
  int32_t prefix = 0;  // the longest node: the prefix
  for (size_t v = 0; v < w.tree.nodes.size(); ++v)
    if (w.tree.nodes[v].num_tokens > w.tree.nodes[prefix].num_tokens) prefix = int32_t(v);
  ASSERT_GT(w.tree.nodes[prefix].num_tokens, 16000);
  int32_t prefix_units = 0, longest_piece = 0;
  for (int u = 0; u < plan.num_units(); ++u)
    for (int32_t k = plan.unit_segment_offset[u]; k < plan.unit_segment_offset[u + 1]; ++k)
      if (plan.segments[k].node == prefix) {
        ++prefix_units;
        longest_piece = std::max(longest_piece, plan.segments[k].size());
      }
  EXPECT_LE(prefix_units, 33) << "the prefix's pieces x Q tiles fit one wave of slots";
  EXPECT_GT(prefix_units, 16) << "and are not the few long pieces of the one-wave length";
  EXPECT_LE(longest_piece, 16414 / 8 + 1);
}

// node packs short leaves of at most 2 Q rows into shared 16-row units (each
// query masked to its own leaf), as long as the units x kv heads still fill
// the CTA slots.
TEST(CorePlanners, NodePacksShortLeavesIntoSixteenRowUnits) {
  WorkloadParams p;
  p.heads = {32, 32, 128};  // one row per leaf: 16 leaves of 32 tokens per unit
  const Workload w = fasttree_workload({1, 256}, {256, 32}, p);
  PlanOptions nodes;  // node units (the tree is compact: unflattened here)
  nodes.extra["flat_tokens"] = 0;
  const Plan packed = make_plan("node", w, nodes);
  validate_plan(w, packed);
  PlanOptions off = nodes;
  off.extra["pack_tokens"] = 0;
  const Plan plain = make_plan("node", w, off);
  validate_plan(w, plain);
  int leaf_units = 0;
  for (int u = 0; u < packed.num_units(); ++u) {
    if (packed.segments[packed.unit_segment_offset[u]].node == 0) continue;  // the root
    ++leaf_units;
    EXPECT_EQ(packed.unit_num_segments(u), 16);
    EXPECT_EQ(packed.unit_num_queries(u), 16);
    EXPECT_EQ(kTileConfigs[packed.unit_tile[u]].m, 16);
    EXPECT_TRUE(packed.unit_masked[u]);
    for (int e = packed.unit_query_offset[u]; e < packed.unit_query_offset[u + 1]; ++e)
      EXPECT_EQ(std::popcount(packed.entry_mask[e]), 1) << "a query sees its own leaf only";
  }
  EXPECT_EQ(leaf_units, 16);
  EXPECT_GE(int64_t(packed.num_units()) * 32, PlanOptions{}.target_ctas(p.heads));
  EXPECT_EQ(plain.num_units() - packed.num_units(), 256 - leaf_units) << "pack_tokens = 0: one leaf per unit";
  EXPECT_EQ(summarize(w, packed).kv_bytes, summarize(w, plain).kv_bytes);
  HostTensors t = make_random_inputs(w, 3);
  const std::vector<double> ref = reference_attention(w, t.args());
  run_cpu(w, packed, t.args(), 2);
  EXPECT_LE(relative_error(w, t.out.data(), ref), tolerance_for(w.layout.dtype));

  // Not packed: at 32/8 a leaf has 4 rows (packs of 4 measured slower);
  // 16 leaves x 8 kv heads cannot fill 264 slots even unpacked.
  for (const Workload& small : {fasttree_workload({1, 256}, {256, 32}, WorkloadParams{}),
                                fasttree_workload({1, 16}, {256, 32}, WorkloadParams{})})
    EXPECT_EQ(make_plan("node", small, nodes).num_units(), make_plan("node", small, off).num_units());
}

// node's compact subtrees: fasttree:N=1,256:C=256,32 (every path 288 tokens)
// becomes units of 32 rows over the root and their queries' leaves, each query
// seeing the root and its own leaf, in no other unit (no slots); flat_tokens
// = 0 turns it off. Above a fan, a chain of 70 one-token nodes is more
// segments than a unit holds: the flattened subtree starts inside the chain.
TEST(CorePlanners, NodeFlattensCompactSubtrees) {
  for (const HeadConfig heads : {HeadConfig{32, 8, 128}, HeadConfig{32, 32, 128}}) {
    WorkloadParams p;
    p.heads = heads;
    const Workload w = fasttree_workload({1, 256}, {256, 32}, p);
    const Plan plan = make_plan("node", w);
    validate_plan(w, plan);
    EXPECT_EQ(plan.num_slots, 0);
    const int per_unit = 32 / heads.group_size();
    EXPECT_EQ(plan.num_units(), 256 / per_unit);
    for (int u = 0; u < plan.num_units(); ++u) {
      EXPECT_EQ(plan.unit_num_queries(u), per_unit);
      EXPECT_EQ(plan.unit_num_segments(u), per_unit + 1);
      EXPECT_EQ(plan.segments[plan.unit_segment_offset[u]].node, 0) << "the root first";
      for (int e = plan.unit_query_offset[u]; e < plan.unit_query_offset[u + 1]; ++e) {
        EXPECT_EQ(std::popcount(plan.entry_mask[e]), 2) << "the root and its own leaf";
        EXPECT_EQ(plan.entry_mask[e] & 1, 1u);
      }
    }
    PlanOptions off;
    off.extra["flat_tokens"] = 0;
    EXPECT_GT(make_plan("node", w, off).num_slots, 0);
  }

  Workload chain;  // 70 one-token nodes, then a fan of 40 leaves of 8 tokens
  chain.heads = {32, 8, 128};
  chain.layout.page_size = 16;
  chain.layout.dtype = DType::fp16;
  PageAllocator pages(16, 3);
  int32_t at = -1;
  for (int i = 0; i < 70; ++i) at = pages.add_node(chain.tree, at, 1);
  const int32_t fan = pages.add_node(chain.tree, at, 16);
  for (int i = 0; i < 40; ++i) chain.query_nodes.push_back(pages.add_node(chain.tree, fan, 8));
  chain.layout.num_pages = pages.finish(chain.tree);
  chain.validate();
  const Plan plan = make_plan("node", chain);
  validate_plan(chain, plan);
  int flat = 0;
  for (int u = 0; u < plan.num_units(); ++u) {
    EXPECT_LE(plan.unit_num_segments(u), kMaxSegmentsPerUnit);
    flat += plan.unit_num_segments(u) > 1;
  }
  EXPECT_GT(flat, 0) << "the fan and its leaves";
  HostTensors t = make_random_inputs(chain, 4);
  const std::vector<double> ref = reference_attention(chain, t.args());
  run_cpu(chain, plan, t.args(), 2);
  EXPECT_LE(relative_error(chain, t.out.data(), ref), tolerance_for(chain.layout.dtype));
}

// node's compact subtrees give way to node units where too few compact units
// to fill the GPU include one far longer than any node piece: the ToT
// sorting128 tree of task 1 at iteration 2000 (32/8) would get 16 units of up
// to 836 tokens, against 24 of at most 237 as nodes (measured 36.9 vs 26.6 us).
TEST(CorePlanners, NodeKeepsNodesWhereCompactUnitsWouldBeTheTail) {
  WorkloadParams p;
  const Workload tot = make_workload(
      "tot:" + std::string(TREEATTN_SOURCE_DIR) + "/data/workloads/sorting128ToT.json:task=1:iter=2000", p);
  PlanOptions nodes;
  nodes.extra["flat_tokens"] = 0;
  const Plan chosen = make_plan("node", tot), plain = make_plan("node", tot, nodes);
  validate_plan(tot, chosen);
  EXPECT_EQ(chosen.num_units(), plain.num_units());
  EXPECT_EQ(summarize(tot, chosen).kv_bytes, summarize(tot, plain).kv_bytes);
  EXPECT_EQ(summarize(tot, chosen).partial_bytes, summarize(tot, plain).partial_bytes);
  // Filling the GPU (fasttree:N=1,256 at 32/8: 32 units x 8 kv heads), compact units stay.
  const Workload fan = fasttree_workload({1, 256}, {256, 32}, p);
  EXPECT_EQ(make_plan("node", fan).num_slots, 0);
  // The option compact_stretch (2.5) sets how much longer they may be: at
  // 1000 the ToT tree keeps them (fewer slots, more KV re-read).
  PlanOptions stretch;
  stretch.extra["compact_stretch"] = 1000;
  const Plan kept = make_plan("node", tot, stretch);
  validate_plan(tot, kept);
  EXPECT_LT(summarize(tot, kept).partial_bytes, summarize(tot, plain).partial_bytes);
  EXPECT_GT(summarize(tot, kept).kv_bytes, summarize(tot, plain).kv_bytes);
  stretch.extra["compact_stretch"] = -1;
  const std::string stretch_error = test_support::error_text([&] { make_plan("node", tot, stretch); });
  EXPECT_NE(stretch_error.find("node: compact_stretch = -1"), std::string::npos) << stretch_error;
}

// Compact subtrees with long leaves are taken only where the partials they
// save outweigh the KV they re-read: the 6-level tree's 32-token nodes over 4
// leaves of 256 tokens each (half the slots saved, 17 MB re-read at 32/8),
// not pat:B=1,2,64's 256-token level under 16-row units of 256-token leaves.
TEST(CorePlanners, NodeTakesLongLeafCompactSubtreesBySavedBytes) {
  WorkloadParams p;
  PlanOptions nodes;
  nodes.extra["flat_tokens"] = 0;
  const Workload deep = fasttree_workload({1, 4, 16, 64, 256, 1024}, {256, 8, 256, 64, 32, 256}, p);
  const Plan flat = make_plan("node", deep), plain = make_plan("node", deep, nodes);
  validate_plan(deep, flat);
  EXPECT_LT(summarize(deep, flat).partial_bytes, summarize(deep, plain).partial_bytes * 2 / 3);
  EXPECT_LT(flat.num_units(), plain.num_units() / 4);
  const Workload wide = pat_workload({1, 2, 64}, {1024, 256, 256}, p);
  EXPECT_EQ(summarize(wide, make_plan("node", wide)).partial_bytes,
            summarize(wide, make_plan("node", wide, nodes)).partial_bytes);
  EXPECT_EQ(make_plan("node", wide).num_units(), make_plan("node", wide, nodes).num_units());
  // The ratio is the option reread_ratio (2.5 bytes re-read per byte saved):
  // at 0 the deep tree's long leaves are not taken, at 1000 the wide tree's are.
  PlanOptions never, always;
  never.extra["reread_ratio"] = 0;
  always.extra["reread_ratio"] = 1000;
  EXPECT_GT(summarize(deep, make_plan("node", deep, never)).partial_bytes, summarize(deep, flat).partial_bytes);
  const Plan taken = make_plan("node", wide, always);
  validate_plan(wide, taken);
  EXPECT_LT(summarize(wide, taken).partial_bytes, summarize(wide, make_plan("node", wide)).partial_bytes);
  never.extra["reread_ratio"] = -0.5;
  const std::string ratio_error = test_support::error_text([&] { make_plan("node", wide, never); });
  EXPECT_NE(ratio_error.find("node: reread_ratio = -0.5"), std::string::npos) << ratio_error;
}

// node folds a short shared node into its children's first KV pieces when
// re-reading it costs fewer bytes than a partial slot per query: the 32-token
// root of pat:B=1,8,512 opens each 2048-token child's units (2 slots a query
// instead of 3), while a 100-token root over 512 one-row leaves (re-read 508
// extra times for 512 slots) keeps its own unit, and folds saving less than
// 12 MB of slots are not made.
TEST(CorePlanners, NodeFoldsShortSharedNodesIntoChildren) {
  WorkloadParams p;
  const Workload w = pat_workload({1, 8, 512}, {32, 2048, 256}, p);
  const Plan folded = make_plan("node", w);
  validate_plan(w, folded);
  PlanOptions off;
  off.extra["fold_tokens"] = 0;
  const Plan plain = make_plan("node", w, off);
  validate_plan(w, plain);
  EXPECT_EQ(folded.num_slots, 2 * 512);
  EXPECT_EQ(plain.num_slots, 3 * 512);
  int with_root = 0;
  for (int u = 0; u < folded.num_units(); ++u) {
    const Segment& first = folded.segments[folded.unit_segment_offset[u]];
    if (first.node != 0) continue;
    ++with_root;
    ASSERT_EQ(folded.unit_num_segments(u), 2) << "the root, then its child's first piece";
    EXPECT_EQ(first.size(), 32);
    EXPECT_EQ(w.tree.nodes[folded.segments[folded.unit_segment_offset[u] + 1].node].parent, 0);
    EXPECT_FALSE(folded.unit_masked[u]);
  }
  EXPECT_EQ(with_root, 8 * 2) << "once per Q tile of each child";
  EXPECT_EQ(summarize(w, folded).kv_bytes, summarize(w, plain).kv_bytes) << "the root was read per tile anyway";

  // Right on the CPU (the root folded into 64-token mids, over 160-token
  // leaves; node units only: no compact subtrees).
  const Workload small = pat_workload({1, 8, 512}, {32, 64, 160}, p);
  PlanOptions nodes, no_fold;
  nodes.extra["flat_tokens"] = no_fold.extra["flat_tokens"] = 0;
  no_fold.extra["fold_tokens"] = 0;
  const Plan sp = make_plan("node", small, nodes);
  validate_plan(small, sp);
  EXPECT_LT(sp.num_slots, make_plan("node", small, no_fold).num_slots);
  HostTensors t = make_random_inputs(small, 5);
  const std::vector<double> ref = reference_attention(small, t.args());
  run_cpu(small, sp, t.args(), 2);
  EXPECT_LE(relative_error(small, t.out.data(), ref), tolerance_for(small.layout.dtype));

  // Too few slots saved: 256 queries at 32/8 (8.4 MB).
  const Workload few = pat_workload({1, 4, 256}, {32, 2048, 256}, p);
  EXPECT_EQ(make_plan("node", few, nodes).num_slots, make_plan("node", few, no_fold).num_slots);

  WorkloadParams mha;
  mha.heads = {32, 32, 128};
  const Workload fan = fasttree_workload({1, 512}, {100, 300}, mha);
  const Plan kept = make_plan("node", fan, nodes);
  validate_plan(fan, kept);
  int root_alone = 0;
  for (int u = 0; u < kept.num_units(); ++u)
    root_alone += kept.unit_num_segments(u) == 1 && kept.segments[kept.unit_segment_offset[u]].node == 0;
  EXPECT_GT(root_alone, 0) << "re-reading the root per leaf costs more than the slots";
}

TEST(CorePlanners, PerQuerySplitsOnlyWhenTheGridWouldNotFill) {
  WorkloadParams p;
  const Workload many = pat_workload({256}, {1024}, p);  // 256 x 8 = 2048 CTAs
  EXPECT_EQ(make_plan("per-query", many).num_slots, 0);
  const Workload few = pat_workload({4}, {8192}, p);     // 4 x 8 = 32 CTAs: split
  const Plan split = make_plan("per-query", few);
  validate_plan(few, split);
  EXPECT_GT(split.num_units(), 4);
  EXPECT_EQ(split.num_slots, split.num_units());
}

TEST(CorePlanners, QueriesWithEmptyContextGetZeros) {
  Workload w;
  w.heads = {4, 2, 64};
  w.layout = {16, 0, DType::fp32};
  w.tree.nodes = {Node{-1, 0, {}}, Node{0, 0, {}}};
  w.query_nodes = {0, 1, 1};
  w.validate();
  for (const char* name : {"per-query", "node"}) {
    const Plan p = make_plan(name, w);
    validate_plan(w, p);
    HostTensors t = make_random_inputs(w, 1);
    run_cpu(w, p, t.args());
    for (size_t i = 0; i < t.out.size() / 4; ++i) ASSERT_EQ(load_element(t.out.data(), DType::fp32, i), 0.f);
  }
}

// Options by name (the CLI's --plan-opt and Python's plan_options): the
// fields, the knobs, and an error naming the key and the value otherwise.
TEST(PlanOptionsByName, SetsFieldsAndKnobsAndRejectsTheRest) {
  PlanOptions opt;
  set_plan_option(opt, "ctas_per_sm", 1);
  set_plan_option(opt, "min_split_tokens", 512);
  set_plan_option(opt, "split_sm_ctas", 1);
  EXPECT_EQ(opt.ctas_per_sm, 1);
  EXPECT_EQ(opt.min_split_tokens, 512);
  EXPECT_EQ(opt.get("split_sm_ctas", 0), 1);
  EXPECT_TRUE(std::is_sorted(planner_knobs().begin(), planner_knobs().end()));
  EXPECT_ERROR_WITH(set_plan_option(opt, "ctas_per_sm", 65), "ctas_per_sm = 65", "[1, 64]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "chunk_tokens", 1.5), "chunk_tokens = 1.5", "integer");
  EXPECT_ERROR_WITH(set_plan_option(opt, "alpha", 1e12), "alpha = 1000000000000", "[-1000000000, 1000000000]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "alpha", std::nan("")), "alpha = nan", "a number in");
  // A knob's own range, checked when it is set (not at the first plan).
  EXPECT_ERROR_WITH(set_plan_option(opt, "tile_rows", -1), "tile_rows = -1", "an integer in [1, 128]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "split_tokens", -5), "split_tokens = -5", "[0, 1000000000]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "pack_tokens", 1 << 30), "pack_tokens = 1073741824", "[0, 1000000000]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "q_tile0", 1000), "q_tile0 = 1000", "[1, 128]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "kv_split_long", 0.5), "kv_split_long = 0.5", "an integer");
  EXPECT_ERROR_WITH(set_plan_option(opt, "split_sm_ctas", 65), "split_sm_ctas = 65", "[0, 64]");
  EXPECT_ERROR_WITH(set_plan_option(opt, "fill", 2), "fill = 2", "[0, 1]");
  set_plan_option(opt, "reread_ratio", 0.25);  // a real-valued knob
  EXPECT_EQ(opt.get("reread_ratio", 0), 0.25);
  EXPECT_ERROR_WITH(set_plan_option(opt, "tile_row", 64), "unknown key 'tile_row'", "tile_rows");
  EXPECT_EQ(opt.ctas_per_sm, 1);  // a rejected value leaves the options as they were
  EXPECT_EQ(opt.extra.count("alpha"), 0u);
}

// Options set on the struct directly (a C++ TreeAttentionConfig): the same
// ranges, num_sms's too, checked at once.
TEST(PlanOptionsByName, CheckPlanOptionsAppliesTheSameRanges) {
  PlanOptions opt;
  EXPECT_NO_THROW(check_plan_options(opt));
  opt.extra["alpha"] = 2;
  EXPECT_NO_THROW(check_plan_options(opt));
  PlanOptions bad = opt;
  bad.num_sms = 0;
  EXPECT_ERROR_WITH(check_plan_options(bad), "num_sms = 0", "[1, 1024]");
  bad = opt;
  bad.num_sms = kMaxNumSms + 1;
  EXPECT_ERROR_WITH(check_plan_options(bad), "num_sms = 1025");
  bad = opt;
  bad.ctas_per_sm = 0;
  EXPECT_ERROR_WITH(check_plan_options(bad), "ctas_per_sm = 0", "[1, 64]");
  bad = opt;
  bad.min_split_tokens = -1;
  EXPECT_ERROR_WITH(check_plan_options(bad), "min_split_tokens = -1");
  bad = opt;
  bad.extra["tile_rows"] = 1000;
  EXPECT_ERROR_WITH(check_plan_options(bad), "tile_rows = 1000", "[1, 128]");
  bad = opt;
  bad.extra["nope"] = 1;
  EXPECT_ERROR_WITH(check_plan_options(bad), "unknown key 'nope'");
}

// node's KV piece length schedules the pieces longest first onto the CTA
// slots (planning::balanced_split_length). Its schedule counts pieces and
// slots in groups of equal length; here it must finish when the textbook
// schedule does (every piece, longest first, onto the least loaded slot),
// over jobs of few distinct lengths (grouped) and of many, with fewer pieces
// than slots and more.
TEST(NodeSplit, GroupedScheduleFinishesWithThePieceByPieceOne) {
  std::mt19937_64 rng(5);
  planning::SplitScratch scratch;
  int more_pieces_than_slots = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t slots = 1 + int64_t(rng() % 300), p = 1 + int64_t(rng() % 700), cost = int64_t(rng() % 100);
    const int64_t distinct = 1 + int64_t(rng() % (trial % 2 ? 4 : 60));
    std::vector<std::pair<int64_t, int64_t>> jobs(1 + rng() % 40);
    for (auto& [tokens, copies] : jobs) {
      tokens = 1 + int64_t(rng() % uint64_t(distinct)) * 37 + (rng() % 8 == 0 ? int64_t(rng() % 5000) : 0);
      copies = 1 + int64_t(rng() % (rng() % 2 ? 3 : 40));
    }
    std::vector<int64_t> pieces;
    for (const auto& [tokens, copies] : jobs) {
      const int64_t k = (tokens + p - 1) / p;
      for (int64_t c = 0; c < copies; ++c)
        for (int64_t i = 0; i < k; ++i) pieces.push_back(tokens / k + (i < tokens % k ? 1 : 0) + cost);
    }
    std::sort(pieces.begin(), pieces.end(), std::greater<>());
    std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> loads;
    for (int64_t s = 0; s < slots; ++s) loads.push(0);
    int64_t finish = 0;
    for (const int64_t piece : pieces) {
      const int64_t at = loads.top() + piece;
      loads.pop();
      loads.push(at);
      finish = std::max(finish, at);
    }
    more_pieces_than_slots += int64_t(pieces.size()) > slots;
    ASSERT_EQ(planning::longest_first_finish(jobs, p, slots, cost, scratch), finish)
        << "trial " << trial << ": " << jobs.size() << " jobs, " << pieces.size() << " pieces, " << slots << " slots";
  }
  EXPECT_GT(more_pieces_than_slots, 1000);
  EXPECT_LT(more_pieces_than_slots, 2900);
}

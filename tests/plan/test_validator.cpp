// The validator must reject each way a plan can break DESIGN.md's invariants.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>

#include "tests/support/error_text.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

// root (40 tokens) -> a (10), b (20); queries on a, b, b.
Workload small_tree() {
  Workload w;
  w.heads = {8, 2, 64};
  w.layout = {16, 0, DType::fp16};
  PageAllocator pages(16);
  pages.add_node(w.tree, -1, 40);
  pages.add_node(w.tree, 0, 10);
  pages.add_node(w.tree, 0, 20);
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {1, 2, 2};
  w.validate();
  return w;
}

void expect_invalid(const Workload& w, const std::function<void(Plan&)>& breakit, const std::string& needle) {
  PlanOptions nodes;  // one unit per node and query tile, slots and merges (the tree is compact)
  nodes.extra["flat_tokens"] = 0;
  Plan p = make_plan("node", w, nodes);
  ASSERT_NO_THROW(validate_plan(w, p));
  breakit(p);
  try {
    validate_plan(w, p);
    FAIL() << "expected a validation error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Validator, AcceptsBuiltInPlanners) {
  const Workload w = small_tree();
  for (const PlannerInfo& p : planners()) EXPECT_NO_THROW(validate_plan(w, p.fn(w, {}))) << p.name;
}

TEST(Validator, RejectsMissingTokens) {
  expect_invalid(small_tree(), [](Plan& p) { p.segments[0].end -= 1; }, "covered up to");
}

TEST(Validator, RejectsTokensSeenTwice) {
  expect_invalid(small_tree(), [](Plan& p) {
    // Duplicate the first unit's segment into the second unit's segment list.
    p.segments[1] = p.segments[0];
  }, "overlap");
}

TEST(Validator, RejectsSegmentsOffThePath) {
  const Workload w = small_tree();
  expect_invalid(w, [](Plan& p) {
    for (Segment& s : p.segments)
      if (s.node == 1) s = {2, 0, 10};  // node 2 is not on query 0's path
  }, "not on its path");
}

TEST(Validator, RejectsOverfullTiles) {
  Workload w = small_tree();
  w.heads = {16, 2, 64};  // the root unit holds 3 queries x 8 heads = 24 rows
  expect_invalid(w, [](Plan& p) { p.unit_tile[0] = 0; }, "exceed the tile");
}

TEST(Validator, RejectsUnknownTiles) {
  expect_invalid(small_tree(), [](Plan& p) { p.unit_tile[0] = uint8_t(kTileConfigs.size()); }, "unit 0: tile 9 unknown");
}

TEST(Validator, RejectsTilesThatDoNotFitTheHeadDim) {
  // The n = 128 tiles need (m + 512) x 256 x 2 bytes + 8 KB of shared memory at head_dim 256.
  Workload w = small_tree();
  w.heads = {8, 2, 256};
  static_assert(!tile_fits_head_dim(tile_index(32, 128), 256) && tile_fits_head_dim(tile_index(32, 128), 128));
  expect_invalid(w, [](Plan& p) { p.unit_tile[0] = uint8_t(tile_index(32, 128)); },
                 "tile m=32 n=128 does not fit shared memory at head_dim 256");
}

TEST(Validator, RejectsUnitsWithoutQueries) {
  expect_invalid(small_tree(), [](Plan& p) {
    // Unit 0's entries move to unit 1: unit 0 keeps its segments and no queries.
    p.unit_query_offset[1] = p.unit_query_offset[0];
  }, "unit 0: has no queries");
}

TEST(Validator, RejectsMaskBitsBeyondSegments) {
  expect_invalid(small_tree(), [](Plan& p) { p.entry_mask[0] = 0b10; }, "mask has bits beyond");
}

TEST(Validator, RejectsWrongMaskedFlag) {
  expect_invalid(small_tree(), [](Plan& p) { p.unit_masked[0] = 1; }, "unit_masked");
}

TEST(Validator, RejectsSlotWrittenTwice) {
  expect_invalid(small_tree(), [](Plan& p) {
    int first = -1;
    for (int32_t& s : p.entry_slot) {
      if (s < 0) continue;
      if (first < 0) first = s; else { s = first; break; }
    }
  }, "written");
}

TEST(Validator, RejectsSlotForSingleUnitQuery) {
  const Workload w = small_tree();
  Workload one = w;
  one.query_nodes = {1};
  Plan p = make_plan("per-query", one);
  p.entry_slot[0] = 0;
  EXPECT_THROW(validate_plan(one, p), Error);
}

TEST(Validator, RejectsTooManySegments) {
  Workload w;
  w.heads = {1, 1, 64};
  w.layout = {1, 0, DType::fp32};
  PageAllocator pages(1);
  int32_t parent = -1;
  for (int i = 0; i < 70; ++i) parent = pages.add_node(w.tree, parent, 1);
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {parent};
  w.validate();
  PlanBuilder b(w, "bad");
  b.begin_unit();
  for (int32_t v = 0; v < 70; ++v) b.add_segment(v, 0, 1);
  b.add_query(0, 0);
  b.end_unit();
  const Plan p = b.finish();
  try {
    validate_plan(w, p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("segments exceed 64"), std::string::npos) << e.what();
  }
  // The built-in planners cut deep chains into pieces of at most 64 segments.
  for (const PlannerInfo& pl : planners()) EXPECT_NO_THROW(validate_plan(w, pl.fn(w, {}))) << pl.name;
}

// A tile past the compiled table is refused: unit_tile is 8-bit, and tile
// 259 was stored as tile 3 (another tile than asked for, which the validator
// cannot tell).
TEST(Validator, PlanBuilderRefusesATilePastTheTable) {
  Workload w;
  w.heads = {1, 1, 64};
  w.layout = {1, 0, DType::fp32};
  PageAllocator pages(1);
  pages.add_node(w.tree, -1, 1);
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {0};
  PlanBuilder b(w, "bad");
  for (const int tile : {num_tile_configs(), 259}) {
    const std::string error = test_support::error_text([&] { b.begin_unit(tile); });
    EXPECT_NE(error.find("tile = " + std::to_string(tile) + " is out of range [0, 9)"), std::string::npos) << error;
  }
  b.begin_unit(num_tile_configs() - 1);
  b.add_segment(0, 0, 1);
  b.add_query(0);
  b.end_unit();
  EXPECT_NO_THROW(validate_plan(w, b.finish()));
}

namespace {

// Coverage by brute force: every token of each query's path seen exactly
// once over its visible ranges, and no other token.
bool covers_paths(const Workload& w, const Plan& p) {
  for (int32_t q = 0; q < w.num_queries(); ++q) {
    std::map<std::pair<int32_t, int32_t>, int> seen;  // (node, token) -> times seen
    for (int32_t u = 0; u < p.num_units(); ++u)
      for (int32_t e = p.unit_query_offset[u]; e < p.unit_query_offset[u + 1]; ++e) {
        if (p.entry_query[e] != q) continue;
        for (int32_t k = 0; k < p.unit_num_segments(u); ++k)
          if (p.entry_mask[e] >> k & 1) {
            const Segment& s = p.segments[p.unit_segment_offset[u] + k];
            for (int32_t t = s.begin; t < s.end; ++t) ++seen[{s.node, t}];
          }
      }
    size_t path_tokens = 0;
    for (int32_t v = w.query_nodes[q]; v >= 0; v = w.tree.nodes[v].parent)
      for (int32_t t = 0; t < w.tree.nodes[v].num_tokens; ++t, ++path_tokens) {
        const auto it = seen.find({v, t});
        if (it == seen.end() || it->second != 1) return false;
      }
    if (seen.size() != path_tokens) return false;
  }
  return true;
}

// A forest of a random tree and a chain of 70 nodes, some empty (paths over
// a unit's 64 segments), with queries on the chain at depths 10, 63, 64 and 69.
// A seeded random tree of up to `max_nodes` nodes of up to 40 tokens, heads
// 4/2, page 4, some nodes empty, some queries on internal nodes.
Workload small_random_workload(uint64_t seed, int max_nodes) {
  WorkloadParams wp;
  wp.heads = {4, 2, 64};
  wp.page_size = 4;
  RandomTreeOptions ro;
  ro.max_nodes = max_nodes;
  ro.max_tokens = 40;
  ro.empty_node_prob = 0.2;
  ro.internal_query_prob = 0.3;
  return random_workload(seed, wp, ro);
}

Workload deep_workload(uint64_t seed) {
  Workload w = small_random_workload(seed, 12);
  std::mt19937_64 rng(seed);
  int32_t page = int32_t(w.layout.num_pages), parent = -1;
  for (int d = 0; d < 70; ++d) {
    Node n;
    n.parent = parent;
    n.num_tokens = int32_t(rng() % 4);  // some empty
    for (int32_t t = 0; t < n.num_tokens; t += w.layout.page_size) n.pages.push_back(page++);
    parent = int32_t(w.tree.nodes.size());
    w.tree.nodes.push_back(n);
    if (d == 10 || d == 63 || d == 64 || d == 69) w.query_nodes.push_back(parent);
  }
  w.layout.num_pages = page;
  w.validate();
  return w;
}

}  // namespace

// Mutated segments (moved to another node whole or in part, duplicated,
// swapped, shifted, all widened to whole nodes) over every planner's plans of random and deep trees:
// the validator accepts exactly the plans whose coverage is right.
TEST(Validator, CoverageCheckAgreesWithTokenCountsOnMutatedSegments) {
  int accepted = 0, rejected = 0, rejected_whole = 0;
  PlanOptions opt;
  opt.num_sms = 3;
  opt.chunk_tokens = 8;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Workload w = seed % 2 ? deep_workload(seed) : small_random_workload(seed, 16);
    const int32_t N = int32_t(w.tree.nodes.size());
    std::mt19937_64 rng(seed * 977);
    for (const PlannerInfo& info : planners()) {
      const Plan valid = make_plan(info.name, w, opt);
      ASSERT_NO_THROW(validate_plan(w, valid)) << info.name << " seed " << seed;
      for (int trial = 0; trial < 24; ++trial) {
        Plan p = valid;
        const size_t S = p.segments.size();
        bool all_whole = true;
        for (int m = 0, count = 1 + int(rng() % 2); m < count; ++m) {
          Segment& s = p.segments[rng() % S];
          switch (rng() % 5) {
            case 0: {  // another node, whole
              const int32_t v = int32_t(rng() % N);
              s = {v, 0, w.tree.nodes[v].num_tokens};
              break;
            }
            case 1: s = p.segments[rng() % S]; break;  // a copy of another segment
            case 2: std::swap(s, p.segments[rng() % S]); break;
            case 3:  // every piece widened to its whole node: a node cut in pieces is then seen twice or more
              for (Segment& x : p.segments) x = {x.node, 0, w.tree.nodes[x.node].num_tokens};
              break;
            default: {  // a part of its node
              const int32_t n = w.tree.nodes[s.node].num_tokens;
              const int32_t a = int32_t(rng() % (n + 1)), b = int32_t(rng() % (n + 1));
              s.begin = std::min(a, b), s.end = std::max(a, b);
            }
          }
        }
        for (const Segment& s : p.segments) all_whole &= s.begin == 0 && s.end == w.tree.nodes[s.node].num_tokens;
        const bool right = covers_paths(w, p);
        bool threw = false;
        try {
          validate_plan(w, p);
        } catch (const Error& e) {
          threw = true;
          ASSERT_FALSE(right) << info.name << " seed " << seed << ": rejected a right plan: " << e.what();
        }
        ASSERT_TRUE(threw || right) << info.name << " seed " << seed << " trial " << trial << ": accepted a wrong plan";
        accepted += !threw;
        rejected += threw;
        rejected_whole += threw && all_whole;
      }
    }
  }
  // Both outcomes must be common, and so must wrong plans made of whole
  // nodes only (the validator's quick path takes a query whose ranges come
  // in token order per node: whole nodes, or pieces in order; swapped and
  // shifted pieces reach its sorted path).
  EXPECT_GT(accepted, 500);
  EXPECT_GT(rejected, 2000);
  EXPECT_GT(rejected_whole, 300);
}

namespace {

// A chain root (10) -> a (10) -> b (10), and c (10) beside a under the root;
// one query on b, one on c. Plans are built unit by unit from `units`: each
// unit's segments, seen by both of its queries.
Workload chain_tree() {
  Workload w;
  w.heads = {4, 2, 64};
  w.layout = {16, 0, DType::fp16};
  PageAllocator pages(16);
  pages.add_node(w.tree, -1, 10);  // 0: root
  pages.add_node(w.tree, 0, 10);   // 1: a
  pages.add_node(w.tree, 1, 10);   // 2: b
  pages.add_node(w.tree, 0, 10);   // 3: c
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {2, 3};
  w.validate();
  return w;
}

struct UnitSpec {
  std::vector<Segment> segments;
  std::vector<int32_t> queries;
};

Plan plan_of(const Workload& w, const std::vector<UnitSpec>& units) {
  PlanBuilder b(w, "hand");
  for (const UnitSpec& u : units) {
    b.begin_unit();
    for (const Segment& s : u.segments) b.add_segment(s.node, s.begin, s.end);
    for (const int32_t q : u.queries) b.add_query(q);
    b.end_unit();
  }
  return b.finish();
}

// validate_plan's verdict, with and without the tree's index: "" if accepted.
std::string verdict(const Workload& w, const Plan& p) {
  std::string with, without;
  const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
  try {
    validate_plan(w, p, nullptr, &ix);
  } catch (const Error& e) {
    with = e.what();
  }
  try {
    validate_plan(w, p);
  } catch (const Error& e) {
    without = e.what();
  }
  EXPECT_EQ(with, without);
  return with;
}

}  // namespace

// The index's query numbers: node v's range holds exactly the queries of
// its subtree, and a query's node lies in the range of exactly its path's
// nodes (what validate_plan's path test relies on).
TEST(Validator, QueryNumbersHoldEachSubtreesQueries) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const Workload w = seed % 3 ? small_random_workload(seed, 24) : deep_workload(seed);
    const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
    const int32_t N = int32_t(w.tree.nodes.size());
    for (int32_t q = 0; q < w.num_queries(); ++q) {
      const int32_t x = w.query_nodes[q];
      std::vector<char> on_path(size_t(N), 0);
      for (int32_t v = x; v >= 0; v = w.tree.nodes[v].parent) on_path[v] = 1;
      for (int32_t v = 0; v < N; ++v) {
        const bool in_range = ix.query_begin[x] >= ix.query_begin[v] &&
                              ix.query_begin[x] < ix.query_begin[v] + ix.subtree_queries[v];
        EXPECT_EQ(in_range, bool(on_path[v])) << "seed " << seed << " query " << q << " node " << v;
      }
    }
    // Ranges of siblings are disjoint and lie in their parent's.
    for (int32_t v = 0; v < N; ++v) {
      const int32_t p = w.tree.nodes[v].parent;
      if (p >= 0) {
        EXPECT_GE(ix.query_begin[v], ix.query_begin[p]);
        EXPECT_LE(ix.query_begin[v] + ix.subtree_queries[v], ix.query_begin[p] + ix.subtree_queries[p]);
      }
    }
  }
}

// Whole nodes: the token count alone would pass these (the same tokens in
// all); the validator must not.
TEST(Validator, RejectsANodeSeenTwiceWhileAnotherIsMissing) {
  const Workload w = chain_tree();
  // Query 0 (on b) sees the root twice and not a: 30 tokens, as its path.
  const Plan p = plan_of(w, {{{{0, 0, 10}}, {0, 1}}, {{{0, 0, 10}, {2, 0, 10}}, {0}}, {{{3, 0, 10}}, {1}}});
  EXPECT_NE(verdict(w, p).find("query 0: node 0 tokens overlap at 0"), std::string::npos) << verdict(w, p);
}

TEST(Validator, RejectsANodeOffThePathWithThePathNodesTokens) {
  const Workload w = chain_tree();
  // Query 0 (on b) sees c (beside a, 10 tokens) instead of a.
  const Plan p = plan_of(w, {{{{0, 0, 10}}, {0, 1}}, {{{3, 0, 10}, {2, 0, 10}}, {0}}, {{{3, 0, 10}}, {1}}});
  EXPECT_NE(verdict(w, p).find("query 0: sees node 3 which is not on its path"), std::string::npos) << verdict(w, p);
  // The same with c deeper than the query's own path could reach: query 1
  // (on c, depth 1) sees b (depth 2).
  const Plan q = plan_of(w, {{{{0, 0, 10}}, {0, 1}}, {{{1, 0, 10}, {2, 0, 10}}, {0}}, {{{2, 0, 10}}, {1}}});
  EXPECT_NE(verdict(w, q).find("query 1: sees node 2 which is not on its path"), std::string::npos) << verdict(w, q);
}

// KV pieces of a node: in token order (the quick path), in another order
// (the sorted path: still right), with a gap, overlapping, or mixed with
// the whole node.
TEST(Validator, PiecesInAnyOrderAreAcceptedAndGapsOrOverlapsNamed) {
  const Workload w = chain_tree();
  const UnitSpec rest0{{{0, 0, 10}, {2, 0, 10}}, {0}}, rest1{{{0, 0, 10}, {3, 0, 10}}, {1}};
  const auto with_pieces = [&](std::vector<Segment> pieces) {
    std::vector<UnitSpec> units{rest0, rest1};
    for (const Segment& s : pieces) units.push_back({{s}, {0}});
    return plan_of(w, units);
  };
  EXPECT_EQ(verdict(w, with_pieces({{1, 0, 4}, {1, 4, 10}})), "");
  EXPECT_EQ(verdict(w, with_pieces({{1, 4, 10}, {1, 0, 4}})), "");
  EXPECT_EQ(verdict(w, with_pieces({{1, 6, 10}, {1, 3, 6}, {1, 0, 3}})), "");
  EXPECT_NE(verdict(w, with_pieces({{1, 0, 4}, {1, 5, 10}})).find("query 0: node 1 tokens missing at 4"),
            std::string::npos);
  EXPECT_NE(verdict(w, with_pieces({{1, 0, 6}, {1, 4, 10}})).find("query 0: node 1 tokens overlap at 4"),
            std::string::npos);
  EXPECT_NE(verdict(w, with_pieces({{1, 0, 4}, {1, 4, 8}})).find("query 0: node 1 covered up to 8 of 10 tokens"),
            std::string::npos);
  // The whole node and a piece of it, with another node's tokens short by as
  // many: the total is the path's.
  std::vector<UnitSpec> units{{{{0, 0, 10}, {2, 0, 6}}, {0}}, rest1, {{{1, 0, 10}}, {0}}, {{{1, 0, 4}}, {0}}};
  EXPECT_NE(verdict(w, plan_of(w, units)).find("query 0: node 1 tokens overlap at 0"), std::string::npos);
}
